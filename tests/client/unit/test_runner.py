"""The runner library without a broker: what it executes, what it refuses, what it answers."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from worker.client.runner import MemoryStore, Runner
from worker.runtime.config import Config
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
    assert {k: v for k, v in runner.metrics.rejected.items() if v} == {
        "undecodable": 1, "not_a_committed_call": 2, "wrong_topic": 1}
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


# -- whatever a tool returns or raises: one result record, one execution -------------------

#: What Python gives for a file name that is not UTF-8 (os.fsdecode(b"\xff")).
LONE_SURROGATE = "\udcff"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class _NotAString(Exception):
    def __str__(self) -> Any:
        return 42


def _answered_once(runner: Runner, tool: Any) -> dict[str, Any]:
    """Run ``tool`` as a committed call; the outcome is one schema-valid result record."""
    ran: list[Any] = []

    def wrapped(args: Any) -> Any:
        ran.append(args)
        return tool(args)

    runner.tools["t"] = wrapped
    outcome = runner.handle(committed(name="t"), "tool.calls.committed")
    assert outcome.status == "executed" and len(ran) == 1
    result = orjson.loads(outcome.value or b"")
    assert validator("tool-result").is_valid(result), result
    return result


def test_a_lone_surrogate_in_a_result_or_an_exception_is_escaped(runner: Runner) -> None:
    """A tool that returns (or raises with) a non-UTF-8 file name as Python decodes it (a lone
    surrogate) still gets its one result record, the surrogate escaped as text; handle() does
    not raise after the tool ran (which ran it again at every restart)."""
    name = "report-" + LONE_SURROGATE + ".txt"
    result = _answered_once(runner, lambda args: name)
    assert (result["is_error"], result["content"]) == (False, "report-\\udcff.txt")

    def raises(args: Any) -> None:
        raise FileNotFoundError(f"no such file: {name}")

    result = _answered_once(runner, raises)
    assert result["is_error"] is True
    assert result["content"] == "FileNotFoundError: no such file: report-\\udcff.txt"
    assert _answered_once(runner, lambda args: {"path": name})["is_error"] is True


def test_an_exception_without_a_readable_message_is_an_error_result(runner: Runner) -> None:
    """An exception whose str() raises, or is not a string, becomes an error result naming
    the exception's type."""
    for exc in (_Unprintable(), _NotAString()):
        def raises(args: Any, exc: BaseException = exc) -> None:
            raise exc

        result = _answered_once(runner, raises)
        assert result["is_error"] is True
        assert result["content"] == f"{type(exc).__name__} (its message could not be read)"


def test_a_tool_calling_sys_exit_is_answered_not_rerun(runner: Runner) -> None:
    """A tool that raises SystemExit (sys.exit in a tool) is answered by an error result:
    the runner does not stop after running it (a restart would run it again)."""
    def exits(args: Any) -> None:
        raise SystemExit(3)

    assert _answered_once(runner, exits)["content"].startswith("SystemExit")


def test_a_result_whose_json_grows_past_the_limit_is_an_error(runner: Runner) -> None:
    """The limit holds for the content as the record carries it (JSON-escaped): 100 NUL
    characters are 600 bytes in the record, over a 500-byte limit, so an error result (the
    record would otherwise be refused by the broker, after the tool ran)."""
    runner.max_result_bytes = 500
    assert _answered_once(runner, lambda args: "\x00" * 100)["is_error"] is True
    assert _answered_once(runner, lambda args: "x" * 400)["is_error"] is False


class _Message:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return "tool.calls.committed"

    def headers(self) -> None:
        return None


class _Producer:
    """Delivers each record with the next error of ``errors`` (None: delivered)."""

    def __init__(self, *errors: Any) -> None:
        self.errors, self.sent, self._pending = list(errors), [], []  # type: ignore[var-annotated]

    def produce(self, topic: str, key: bytes, value: bytes, headers: Any, on_delivery: Any
                ) -> None:
        self.sent.append(orjson.loads(value))
        self._pending.append((on_delivery, self.errors.pop(0) if self.errors else None))

    def flush(self, timeout: float) -> int:
        for callback, error in self._pending:
            callback(error, None)
        self._pending.clear()
        return 0


class _Consumer:
    def __init__(self) -> None:
        self.commits = 0

    def commit(self, message: Any, asynchronous: bool) -> None:
        self.commits += 1


def test_a_result_the_broker_refuses_as_too_large_is_answered_by_an_error() -> None:
    """The results topic refuses the record (MSG_SIZE_TOO_LARGE: its max.message.bytes is
    below max_result_bytes): an error result answers the call instead, then the key is
    remembered and the offset committed; the tool ran once."""
    from confluent_kafka import KafkaError

    producer, consumer = _Producer(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)), _Consumer()
    runner = Runner(Config(), {"add": lambda args: "x" * 1000}, consumer=consumer,
                    producer=producer)
    runner._process(_Message(committed()))
    assert [r["is_error"] for r in producer.sent] == [False, True]
    assert consumer.commits == 1 and runner.store.seen("r1:call_1") and runner.executed == 1


def test_a_failed_delivery_stops_before_the_offset_is_committed() -> None:
    """Any other delivery failure (flush returns 0 all the same) stops the runner: the key is
    not remembered and the offset not committed, so the call is answered after a restart
    (never left without a result)."""
    from confluent_kafka import KafkaError

    producer = _Producer(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    consumer = _Consumer()
    runner = Runner(Config(), {"add": lambda args: 3}, consumer=consumer, producer=producer)
    with pytest.raises(RuntimeError, match="TOPIC_AUTHORIZATION_FAILED"):
        runner._process(_Message(committed()))
    assert consumer.commits == 0 and not runner.store.seen("r1:call_1")
