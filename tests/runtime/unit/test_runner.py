"""The runner library without a broker: what it executes, what it refuses, what it answers."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from worker.runtime.config import Config
from worker.runtime.runner import MemoryStore, Runner
from worker.runtime.schemas import validator

SECRET = "hunter2-SECRET-token"


def committed(call_id: str = "call_1", name: str = "add", arguments: Any = None) -> bytes:
    return orjson.dumps({
        "v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat", "call_id": call_id,
        "name": name, "index": 0, "arguments": arguments if arguments is not None else
        {"a": 1, "b": 2}, "idempotency_key": f"r1:{call_id}"})


@pytest.fixture
def runner() -> Runner:
    calls: list[Any] = []

    def add(args: dict[str, int]) -> int:
        calls.append(args)
        return args["a"] + args["b"]

    def boom(args: Any) -> None:
        raise ValueError("bad input")

    made = Runner(Config(), {"add": add, "boom": boom}, consumer=object(), producer=object())
    made.calls = calls  # type: ignore[attr-defined]
    return made


def test_a_committed_call_runs_once_and_is_answered_by_its_id(runner: Runner) -> None:
    """The function runs with the decoded arguments; the result record is schema-valid, keyed
    by run_id, paired by tool_call_id; a second delivery (once remembered) runs nothing."""
    outcome = runner.handle(committed(), "tool.calls.committed")
    assert outcome.status == "executed" and outcome.key == b"r1"
    result = orjson.loads(outcome.value or b"")
    assert validator("tool-result").is_valid(result)
    assert (result["tool_call_id"], result["content"], result["is_error"]) == ("call_1", "3",
                                                                              False)
    runner.store.remember(outcome.idempotency_key or "")
    assert runner.handle(committed(), "tool.calls.committed").status == "duplicate"
    assert runner.calls == [{"a": 1, "b": 2}]  # type: ignore[attr-defined]


def test_a_failing_or_unknown_tool_gets_an_error_result(runner: Runner) -> None:
    """An exception and an unregistered name both become is_error results (schema-valid)."""
    for name in ("boom", "nope"):
        outcome = runner.handle(committed(name=name), None)
        result = orjson.loads(outcome.value or b"")
        assert result["is_error"] is True and validator("tool-result").is_valid(result)
    assert "ValueError: bad input" in orjson.loads(
        runner.handle(committed("c2", name="boom"), None).value or b"")["content"]


def test_anything_not_a_committed_call_is_refused_and_counted(runner: Runner) -> None:
    """Garbage, an error result, a call missing its idempotency key and a record from another
    topic run nothing and count tool_execute_rejected_not_committed_total by reason."""
    error_result = orjson.dumps({"v": 1, "run_id": "r1", "tool_call_id": "c", "is_error": True,
                                 "content": SECRET})
    no_key = orjson.loads(committed())
    del no_key["idempotency_key"]
    cases = [(b"{not json", None), (error_result, None), (orjson.dumps(no_key), None),
             (committed(), "tool.calls.errors")]
    assert [runner.handle(value, topic).status for value, topic in cases] == ["rejected"] * 4
    assert runner.calls == []  # type: ignore[attr-defined]
    assert runner.metrics.rejected == {"undecodable": 1, "not_a_committed_call": 2,
                                       "wrong_topic": 1}
    runner.metrics.shutdown()


def test_memory_store_is_bounded() -> None:
    """The memory store keeps the last max_keys keys."""
    store = MemoryStore(max_keys=2)
    for key in "abc":
        store.remember(key)
    assert not store.seen("a") and store.seen("b") and store.seen("c")


def test_a_result_that_is_not_json_or_too_large_is_an_error(runner: Runner) -> None:
    """A non-JSON return value and one over max_result_bytes become error results."""
    runner.tools["obj"] = lambda args: object()
    runner.tools["big"] = lambda args: "x" * 100
    runner.max_result_bytes = 50
    for name in ("obj", "big"):
        result = orjson.loads(runner.handle(committed(name=name), None).value or b"")
        assert result["is_error"] is True


def test_the_example_runner_answers_every_committed_call_of_the_demo() -> None:
    """examples/runner.py registers a function for each tool the demo's committed calls name:
    each runs and is answered by its call id (get_stock_price's failure as an error result, by
    design), none is refused as an unregistered tool."""
    import importlib.util
    from pathlib import Path

    from worker.core import Assembler, Topic
    from worker.tools.demo import example_file, load_envelopes

    path = Path(__file__).resolve().parents[3] / "examples" / "runner.py"
    spec = importlib.util.spec_from_file_location("example_runner", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    runner = Runner(Config(), example.TOOLS, consumer=object(), producer=object())
    assembler, answered = Assembler(), {}
    for envelope in load_envelopes(example_file(), "ex/"):
        for emit in assembler.feed_record(None, orjson.dumps(envelope)):
            if emit.topic is Topic.COMMITTED:
                outcome = runner.handle(orjson.dumps(emit.value), None)
                assert outcome.status == "executed"
                result = orjson.loads(outcome.value or b"")
                assert result["tool_call_id"] == emit.value["call_id"]
                answered[result["name"]] = result
    assert len(answered) == 6
    errors = {name for name, result in answered.items() if result["is_error"]}
    assert errors == {"get_stock_price"}, {n: answered[n]["content"] for n in errors}
