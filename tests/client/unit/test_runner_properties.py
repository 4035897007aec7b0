"""Whatever a tool returns or raises, the runner answers with exactly one result record and
runs the tool exactly once (hypothesis over return values and exceptions)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.client.runner import Runner
from worker.runtime.config import Config
from worker.runtime.schemas import validator

#: Text as a tool may hold it: any code point, lone surrogates (os.fsdecode) included.
TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | TEXT
           | st.binary(max_size=8) | st.just(object()) | st.just(float("nan")))
VALUES = st.recursive(
    SCALARS,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(TEXT | st.integers(), inner, max_size=4)),
    max_leaves=12)
EXCEPTIONS = st.builds(
    lambda cls, arg: cls(arg),
    st.sampled_from([ValueError, KeyError, OSError, RuntimeError, UnicodeError, SystemExit,
                     Exception, TypeError]),
    VALUES)


def _call() -> bytes:
    return orjson.dumps({
        "v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat", "call_id": "c1",
        "name": "t", "index": 0, "arguments": {}, "idempotency_key": "r1:c1"})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(returned=VALUES, raised=EXCEPTIONS | st.none(), limit=st.sampled_from([50, 900_000]))
def test_any_return_value_or_exception_is_one_result_and_one_execution(
        returned: Any, raised: BaseException | None, limit: int) -> None:
    """handle() never raises after the tool ran: the outcome is 'executed' with a value that
    is JSON, valid against tool-result.schema.json, paired with the call; the tool ran once."""
    ran: list[Any] = []

    def tool(args: Any) -> Any:
        ran.append(args)
        if raised is not None:
            raise raised
        return returned

    runner = Runner(Config(), {"t": tool}, consumer=object(), producer=object(),
                    max_result_bytes=limit)
    outcome = runner.handle(_call(), "tool.calls.committed")
    assert outcome.status == "executed" and len(ran) == 1
    result = orjson.loads(outcome.value or b"")
    assert validator("tool-result").is_valid(result)
    assert result["tool_call_id"] == "c1" and outcome.key == b"r1"
    if raised is not None:
        assert result["is_error"] is True
    runner.metrics.shutdown()
