"""The results topic forwarded into the events log (worker/runtime/results.py), and the driver
with the result latch on: a run's head stays open after its final message until its turn
record, whose ``done`` head keeps the closed turn's call ids; a take-over between the two
decides what the live partition decides.

Who may write the results topic: the runners. Anything else written there (not JSON, another
key, a field missing, the latch's own word) never pairs: a DLQ record, or nothing."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import driving
import orjson
from builders import chat_calls, chat_run, chat_tool

from worker.client.results import answer, result_record
from worker.core import Assembler, Topic
from worker.core.settings import ResultSettings, ToolResultLimits
from worker.runtime import results, step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads, PartitionState

CALL = {"run_id": "r1", "tenant": "t1", "provider": "openai.chat", "call_id": "c1",
        "name": "get_weather", "idempotency_key": "r1:c1"}


def _record(value: bytes, key: bytes | None = b"r1", offset: int = 4) -> step.Record:
    return step.record(key, value, 1_000, "results", 2, offset)


def test_a_runners_result_becomes_a_tool_result_record_for_its_run() -> None:
    """A runner's result goes to the events topic keyed by its run: the call it answers, its
    size, its content and where it was read."""
    key, value = results.route(_record(answer(CALL, False, "sunny", 1000)), 100)  # type: ignore[misc]
    marker = orjson.loads(value)
    assert key == b"r1" and marker == {
        "v": 1, "run_id": "r1", "type": "tool.result", "tool_call_id": "c1",
        "name": "get_weather", "idempotency_key": "r1:c1", "is_error": False, "size": 5,
        "content": "sunny", "source": [2, 4]}


def test_content_over_the_limit_is_left_in_the_results_topic() -> None:
    """Over the largest ``max_bytes``, or a forwarded record over 900,000 bytes (escapes),
    only the size goes on: the core answers ``result_too_large``."""
    _, value = results.route(_record(answer(CALL, False, "x" * 101, 1000)), 100)  # type: ignore[misc]
    assert "content" not in orjson.loads(value) and orjson.loads(value)["size"] == 101
    escaped = "\x01" * 200_000  # six bytes each in JSON
    raw = orjson.dumps(result_record(CALL, False, escaped))
    _, value = results.route(_record(raw), 10**6)  # type: ignore[misc]
    assert len(value) < results.FORWARD_RECORD_BYTES and "content" not in orjson.loads(value)


def test_what_is_not_a_runners_result_goes_to_the_dlq_with_its_bytes() -> None:
    """Not JSON, another key than its run, a field missing or of the wrong type: a DLQ record
    with the original bytes and why."""
    good = orjson.loads(answer(CALL, False, "ok", 100))
    cases = [(b"nope", b"r1", "undecodable"),
             (orjson.dumps(good), b"r2", "key_mismatch"),
             (orjson.dumps({**good, "is_error": "no"}), b"r1", "invalid_envelope"),
             (orjson.dumps({k: v for k, v in good.items() if k != "idempotency_key"}), b"r1",
              "invalid_envelope"),
             (orjson.dumps({**good, "v": 2}), b"r1", "unsupported_version"),
             (orjson.dumps([good]), b"r1", "invalid_envelope")]
    for value, key, reason in cases:
        routed = results.route(_record(value, key), 100)
        assert not isinstance(routed, tuple) and routed is not None
        assert routed.topic is Topic.DLQ and routed.value["reason"] == reason
        assert base64.b64decode(routed.value["original_b64"]) == value


def test_the_latchs_own_results_are_never_forwarded() -> None:
    """A record saying ``"by": "latch"`` (the latch's ``tool_timeout``, or anyone's claim to
    be it) is not forwarded: it cannot answer a call, nor loop."""
    value = orjson.loads(answer(CALL, True, "tool_timeout: ...", 100)) | {"by": "latch"}
    assert results.route(_record(orjson.dumps(value)), 100) is None


def test_the_forward_limit_is_the_largest_configured() -> None:
    """The forwarder keeps content up to the largest ``max_bytes``; the core decides each
    call's own."""
    settings = ResultSettings(True, 10, 100, (("a", ToolResultLimits(max_bytes=500)),
                                              ("b", ToolResultLimits(deadline_s=1))))
    assert results.forward_limit(settings) == 500


def _config() -> Any:
    return load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                  "LATCH_RESULTS__DEADLINE_S": "30"})


def _records(envelopes: list[dict[str, Any]]) -> Iterator[step.Record]:
    for n, envelope in enumerate(envelopes):
        yield step.record(envelope["run_id"].encode(), orjson.dumps(envelope), 1_000 + n,
                          "ev", 0, n)


def _run() -> list[dict[str, Any]]:
    tools = [chat_tool("get_weather", {"type": "object"})]
    return chat_run("r1", tools, chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))


def _forwarded(driver: Driver, committed: dict[str, Any], offset: int) -> step.Record:
    routed = driver.forward(step.record(b"r1", answer(committed, False, "sunny", 1000), 2_000,
                                        driver.config.topics.results, 0, 9))
    assert routed is not None and routed[0] is None
    return step.record(routed[1], routed[2], 2_000, "ev", 0, offset)


def test_the_head_stays_open_until_the_turn_and_a_takeover_between_decides_the_same() -> None:
    """With the result latch on, the run's final message closes nothing: its head keeps its
    start until the turn record, whose ``done`` head names the answered call. A worker that
    takes the partition over between the final and the result rebuilds the wait and writes
    the same turn record, byte for byte."""
    table: dict[bytes, Any] = {}
    driver = Driver(_config(), EngineHooks(_config()), Heads(table, 3600))
    state = PartitionState(Assembler(driver.assemble), next_offset=0)
    records = list(_records(_run()))
    emits = [e for r in records if (a := driving.apply(driver, state, r)) for e in a.emits]
    [committed] = [e.value for e in emits if e.topic is Topic.COMMITTED]
    assert any(e.topic is Topic.FINAL for e in emits)
    assert table[b"r1"] == {"p": 0, "start": 0}  # open: its turn waits for the result
    result = _forwarded(driver, committed, len(records))
    live = driver.apply_all({0: state}, (result,))
    [turn] = [o.emit.value for o in live.out if o.emit.topic is Topic.TURNS]
    assert [m["content"] for m in turn["messages"]] == ["sunny"]
    # (the answered call and where its answer was read: [results partition, offset])
    assert table[b"r1"]["done"] is True and table[b"r1"]["r"] == [[["c1", 0, 9]], []]
    # a successor that took over after the final, before the result
    other: dict[bytes, Any] = {b"r1": {"p": 0, "start": 0}}
    successor = Driver(_config(), EngineHooks(_config()), Heads(other, 3600))
    takeover = successor.takeover(0, resume=len(records))
    for record in records:
        takeover.feed(record)
    assert successor.rebuilt(takeover, "ev") == []
    again = successor.apply_all({0: takeover.state}, (result,))
    assert [o.value for o in again.out if o.emit.topic is Topic.TURNS] == [
        o.value for o in live.out if o.emit.topic is Topic.TURNS]
    # and after the turn, a successor knows the call was answered: a repeat is a duplicate
    late = Driver(_config(), EngineHooks(_config()), Heads(dict(table), 3600))
    rebuilt = late.takeover(0, resume=len(records) + 1)
    assert late.rebuilt(rebuilt, "ev") == []
    second = step.record(result.key, result.value.replace(b"[0,9]", b"[0,10]"), 3_000, "ev",
                         0, len(records) + 1)
    dlq = [o.emit.value for o in late.apply_all({0: rebuilt.state}, (second,)).out]
    assert [d["reason"] for d in dlq] == ["result_duplicate"]
    # the same answer forwarded again (the faust engine after a crash) is only a repeat
    again_forwarded = step.record(result.key, result.value, 3_000, "ev", 0, len(records) + 2)
    assert late.apply_all({0: rebuilt.state}, (again_forwarded,)).out == []
