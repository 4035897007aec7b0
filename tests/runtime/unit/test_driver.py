"""The partition driver (worker/runtime/driver.py, issue 24): what a record needs after the
core, said once for both engines; the heads it writes and when; the control-backlog rule for
ticks, obeyed by the faust engine as by the kafka engine; a takeover's rebuild."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import driving
import orjson
import pytest
from builders import chat_calls, chat_run, chat_tool
from faust.types import TP

from worker.core import Assembler, Topic
from worker.runtime import step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver, TickRule, control_behind, tick_value
from worker.runtime.faust_engine import engine as worker_app
from worker.runtime.hooks import EngineHooks
from worker.runtime.kafka_engine.heads import KafkaHeadsTable
from worker.runtime.partition import TICK, Heads, PartitionState, decode_head, encode_head
from worker.runtime.step import Record


class ChangelogTable(dict[bytes, Any]):
    """A heads table as its changelog holds it (the faust engine's): each key set is written
    as bytes then, and read back decoded, so a head changed in place after it was set is not
    what a successor reads."""

    def __setitem__(self, key: bytes, value: Any) -> None:
        super().__setitem__(key, encode_head(value))

    def __getitem__(self, key: bytes) -> Any:
        return decode_head(super().__getitem__(key))

    def get(self, key: bytes, default: Any = None) -> Any:  # type: ignore[override]
        return self[key] if key in self else default  # noqa: SIM401 (decoded, as __getitem__)

    def items(self) -> list[tuple[bytes, Any]]:  # type: ignore[override]
        return [(k, decode_head(v)) for k, v in super().items()]

    def values(self) -> list[Any]:  # type: ignore[override]
        return [decode_head(v) for v in super().values()]

def _config() -> Any:
    """The driver with the result latch off: a run closes at its final message (with it on,
    at its turn record: tests/runtime/unit/test_results.py)."""
    return load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                  "LATCH_RESULTS__ENABLED": "false"})


def _driver(table: dict[bytes, Any] | None = None) -> Driver:
    config = _config()
    return Driver(config, EngineHooks(config), Heads({} if table is None else table, 3600))


def _records(envelopes: list[dict[str, Any]], first: int = 0) -> Iterator[Record]:
    for n, envelope in enumerate(envelopes):
        yield step.record(envelope["run_id"].encode(), orjson.dumps(envelope), 1_000 + n,
                          "ev", 0, first + n)


def _run(run_id: str = "r1") -> list[dict[str, Any]]:
    """A run with one committed call."""
    tools = [chat_tool("get_weather", {"type": "object"})]
    return chat_run(run_id, tools, chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))


def test_a_record_needs_nothing_more_unless_it_emits_or_is_a_tick() -> None:
    """Most records (a run's start, its deltas) need nothing sent: ``apply_all`` returns no
    outputs for them (the start head is staged in the table's heads). The record that ends
    the run returns its outputs, prepared and in order, with its run's ``done`` head among
    the heads to write (the engine writes them once the outputs are delivered, or in their
    transaction) and the partition's next offset. A tick that emits nothing returns nothing
    to send, and its heads whose time is over go."""
    table = KafkaHeadsTable()
    driver = _driver(table)
    state = PartitionState(Assembler(_config().assemble), next_offset=0)
    records = list(_records(_run()))
    works = []
    for record in records:
        work = driver.apply_all({0: state}, (record,))
        works.append(([o.emit for o in work.out], list(work.heads), dict(work.offsets)))
    first_out, first_heads, first_offsets = works[0]
    assert first_out == [] and first_offsets == {0: 1}
    assert [orjson.loads(v) for _, k, v in first_heads if k == b"r1"] == [{"p": 0, "start": 0}]
    last_out, last_heads, last_offsets = works[-1]
    assert {e.topic for e in last_out} >= {Topic.COMMITTED, Topic.FINAL}
    assert all(out for out, _, _ in works[1:-1] if out) and last_offsets == {0: len(records)}
    (done,) = [orjson.loads(v) for _, k, v in last_heads if k == b"r1"]
    assert done["done"] is True and done["status"] == "completed"
    tick = step.record(TICK, orjson.dumps({"v": 1, "type": "tick", "ts": 0}), 5_000, "ev", 0,
                       len(records))
    work = driver.apply_all({0: state}, (tick,))
    assert work.out == [] and work.offsets == {0: len(records) + 1}


def test_a_tick_waits_for_the_control_backlog_for_a_bounded_time() -> None:
    """``TickRule``: due at once with nothing to forward; held while a control record in the
    log is unread; due once it is read, or ``defer_max_s`` after it first fell due; an
    unknown end counts as unread."""
    rule = TickRule(defer_max_s=10.0)
    assert rule.due(0.0, behind=False)
    assert not rule.due(1.0, behind=True) and not rule.due(5.0, behind=True)
    assert rule.due(6.0, behind=False)
    assert not rule.due(20.0, behind=True)
    assert not rule.due(29.9, behind=True) and rule.due(30.0, behind=True)
    assert control_behind({0: 5, 1: 2}, {0: 5}) and control_behind({0: 4}, {0: 5})
    assert not control_behind({0: 5, 1: 2}, {0: 5, 1: 2})
    assert control_behind({0: 0}, {0: -1})


def test_the_faust_engine_holds_its_tick_until_the_control_backlog_is_forwarded() -> None:
    """The faust engine obeys the driver's tick rule (before issue 24 it wrote its tick at
    once): with a control record in the log not yet forwarded, no tick is sent; once the
    control agent has forwarded it, the tick goes into each owned events partition."""
    config = load_config(None, env={"LATCH_TOPICS__EVENTS": "d.events",
                                    "LATCH_TOPICS__CONTROL": "d.control",
                                    "LATCH_WORKER__WEB_PORT": "0"})
    latch = worker_app.FaustEngine(config)
    owned = [TP("d.events", 0), TP("d.control", 0)]
    latch.app.assignor = SimpleNamespace(assigned_actives=lambda: owned)  # type: ignore[assignment]
    sent: list[tuple[bytes, int]] = []

    async def send(key: bytes, value: bytes, partition: int) -> None:
        sent.append((key, partition))

    latch.events = SimpleNamespace(  # type: ignore[assignment]
        get_topic_name=lambda: "d.events", send=send)
    latch.control_next[0], latch.control_ends = 3, {0: 5}

    async def scenario() -> None:
        tick = asyncio.create_task(latch._tick())
        await asyncio.sleep(0.3)
        assert sent == []  # two control records to forward first
        latch.control_next[0] = 5
        await asyncio.wait_for(tick, 2)

    asyncio.run(scenario())
    assert sent == [(TICK, 0)]


def test_a_takeover_rebuilds_the_open_runs_from_their_heads() -> None:
    """``takeover`` loads the heads (a finished run registered, an open one to read from its
    start), ``feed`` replays the records of the rebuild, and the rebuilt partition emits for
    the rest of the open run what a partition that never stopped emits."""
    envelopes = _run("r2")
    records = list(_records(envelopes))
    whole = PartitionState(Assembler(_config().assemble), next_offset=0)
    expected = [whole.apply(record) for record in records][-1]
    table: dict[bytes, Any] = {b"r2": {"p": 0, "start": 0},
                               b"r0": {"p": 0, "done": True, "seq": 3, "status": "completed"}}
    driver = _driver(table)
    takeover = driver.takeover(0, resume=len(records) - 1)
    assert takeover.start == 0
    for record in records[:-1]:
        takeover.feed(record)
    assert driver.rebuilt(takeover, "ev") == [] and takeover.count == len(records) - 1
    state = takeover.state
    assert state.assembler.finished("r0") == (3, "completed")
    applied = driving.apply(driver, state, records[-1])
    assert applied is not None
    assert [(e.topic, e.value) for e in applied.emits] == [(e.topic, e.value) for e in expected]


_NAMES = {topic: f"t.{topic.value}" for topic in Topic}


def test_outgoing_prepares_each_output_and_replaces_one_over_its_topics_limit() -> None:
    """``Driver.outgoing`` (both engines' publish, issue 24): each emit in order with its
    topic's name, its key (a DLQ record keeps the input record's), its bytes; an emit over
    its topic's limit comes as its ``output_refused`` DLQ record instead, counted, keyed by
    the input record's key, naming the topic and size but not the value."""
    driver = _driver()
    state = PartitionState(Assembler(_config().assemble), next_offset=0)
    emits = [e for r in _records(_run()) if (a := driving.apply(driver, state, r)) for e in a.emits]
    outgoing = list(driver.outgoing(b"r1", emits, _NAMES))
    assert [(o.emit, o.topic, o.name, o.refused) for o in outgoing] == [
        (e, e.topic, _NAMES[e.topic], False) for e in emits]
    assert all(o.value == step.out_value(o.emit) for o in outgoing)
    committed = next(o for o in outgoing if o.topic is Topic.COMMITTED)
    driver.limits.update({_NAMES[Topic.COMMITTED]: len(committed.value) // 2})
    (refused,) = driver.outgoing(b"r1", [committed.emit], _NAMES,
                                 step.Source("ev", 0, 7))
    value = orjson.loads(refused.value)
    assert refused.refused and refused.topic is Topic.DLQ and refused.key == b"r1"
    assert refused.name == _NAMES[Topic.COMMITTED] and refused.headers is None
    assert value["reason"] == "output_refused" and "Oslo" not in refused.value.decode()
    assert driver.hooks.metrics.dlq["output_refused"] == 1


def test_forward_says_where_a_control_record_goes() -> None:
    """``Driver.forward`` (both engines' control forwarding): a cancel goes to the events
    topic (None), keyed by its run, as its cancel marker; anything else to the DLQ, keyed by
    the control record's key, counted."""
    driver = _driver()
    cancel = orjson.dumps({"v": 1, "type": "cancel", "run_id": "r1", "ts": 5})
    topic, key, value = driver.forward(step.record(b"r1", cancel, 5, "ctl", 0, 0))
    assert topic is None and key == b"r1" and orjson.loads(value)["type"] == "cancel"
    topic, key, value = driver.forward(step.record(b"x", b"not json", 5, "ctl", 0, 1))
    assert topic is Topic.DLQ and key == b"x" and orjson.loads(value)["reason"]
    assert sum(driver.hooks.metrics.dlq.values()) == 1


def test_a_tick_value_carries_the_engines_clock() -> None:
    """``tick_value``: the tick record both engines write, with the wall time they read."""
    assert orjson.loads(tick_value(1234)) == {"v": 1, "type": "tick", "ts": 1234}


TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def test_an_audit_record_gets_its_deciding_record_and_its_runs_trace() -> None:
    """``apply`` writes into each audit record the events record that decided it (topic,
    partition, offset: here the run's ``stream.end``) and the trace id of the run's
    ``traceparent`` (from its ``run.start`` record's headers); the other outputs are the
    core's, unchanged."""
    driver = _driver()
    state = PartitionState(Assembler(_config().assemble), next_offset=0)
    records = list(_records(_run()))
    headers = [("traceparent", f"00-{TRACE_ID}-b7ad6b7169203331-01".encode())]
    applied = [driving.apply(driver, state, record, headers) for record in records]
    last = applied[-1]
    assert last is not None
    [audit] = [e.value for e in last.emits if e.topic is Topic.AUDIT]
    assert audit["source"] == {"topic": "ev", "partition": 0, "offset": len(records) - 1}
    assert audit["trace_id"] == TRACE_ID
    assert (audit["outcome"], audit["tool_call_id"]) == ("committed", "c1")


def test_outputs_published_again_after_a_rebuild_carry_the_same_audit_content() -> None:
    """A run that finished during a rebuild (its ``done`` head lost) has its outputs
    published again (``rebuilt``): its audit record is the one the live worker made, the
    deciding record's place included (the trace id aside: a run seen only by a rebuild has
    no trace on this worker)."""
    records = list(_records(_run("r3")))
    live = _driver()
    state = PartitionState(Assembler(_config().assemble), next_offset=0)
    last = [driving.apply(live, state, record) for record in records][-1]
    assert last is not None
    [before] = [e.value for e in last.emits if e.topic is Topic.AUDIT]
    driver = _driver({b"r3": {"p": 0, "start": 0}})
    takeover = driver.takeover(0, resume=len(records))
    for record in records:
        takeover.feed(record)
    [after] = [e.value for e in driver.rebuilt(takeover, "ev") if e.topic is Topic.AUDIT]
    assert after == before


@pytest.mark.parametrize("kind", [dict, ChangelogTable], ids=["dict", "changelog"])
def test_a_decision_read_again_after_a_takeover_is_a_repeat_not_a_second_decision(
        kind: type) -> None:
    """Issue 26 (found by ``latch chaos --approvals`` on the faust engine): a run finished by an
    ``approve`` whose offset was not committed before its partition moved. The ``done`` head
    records the offset the run was read to (``"o"``); the new owner, reading the decision again
    from below it, counts a repeat and sends nothing (before: a DLQ record
    ``call_already_decided``, a mismatch). A decision that arrives later, past that offset, is
    a second decision and still goes to the DLQ."""
    import dataclasses

    from builders import decision

    from worker.core.settings import ApprovalSettings

    config = _config()
    gated = dataclasses.replace(config, assemble=dataclasses.replace(
        config.assemble, approvals=ApprovalSettings(require_approval=("get_weather",))))
    table = kind()
    live = Driver(gated, EngineHooks(gated), Heads(table, 3600))
    state = PartitionState(Assembler(gated.assemble), next_offset=0)
    records = list(_records([*_run("r1"), decision("r1", "approve", "c1")]))
    for record in records:
        applied = driving.apply(live, state, record)
        assert applied is None or applied.emits or applied.tick
    assert table[b"r1"]["done"] and table[b"r1"]["o"] == len(records)
    successor = Driver(gated, EngineHooks(gated), Heads(table, 3600))
    takeover = successor.takeover(0, resume=len(records) - 1)
    again = driving.apply(successor, takeover.state, records[-1])
    assert again is None and takeover.state.assembler.stats["duplicates"] == 1
    (later,) = _records([decision("r1", "approve", "c1")], first=len(records) + 4)
    applied = driving.apply(successor, takeover.state, later)
    assert applied is not None
    (dlq,) = [e.value for e in applied.emits if e.topic is Topic.DLQ]
    assert dlq["reason"] == "call_already_decided"


@pytest.mark.parametrize("kind", [dict, ChangelogTable], ids=["dict", "changelog"])
def test_a_decision_forwarded_twice_is_a_repeat_while_waiting_and_after_a_takeover(
        kind: type) -> None:
    """Issue 26 (``latch chaos --approvals`` on the faust engine, which forwards control
    records at least once): one control record's decision forwarded twice lands at two events
    offsets. The second copy is a repeat, not a second decision: counted, nothing emitted,
    while the run still waits for another call, and after the run finished and its partition
    moved (its ``done`` head keeps the control records it applied, ``"d"``). A different
    control record deciding the same call still goes to the DLQ (``call_already_decided``)."""
    import dataclasses

    from builders import decision

    from worker.core.settings import ApprovalSettings

    config = _config()
    gated = dataclasses.replace(config, assemble=dataclasses.replace(
        config.assemble, approvals=ApprovalSettings(require_approval=("get_weather",))))
    tools = [chat_tool("get_weather", {"type": "object"})]
    run = chat_run("r1", tools, chat_calls([("c1", "get_weather", '{"city": "Oslo"}'),
                                            ("c2", "get_weather", '{"city": "Rome"}')]))
    table = kind()
    live = Driver(gated, EngineHooks(gated), Heads(table, 3600))
    state = PartitionState(Assembler(gated.assemble), next_offset=0)
    records = list(_records(run))
    offset = len(records)

    def forwarded(kind: str, call: str, control_offset: int) -> Record:
        nonlocal offset
        ctl = step.record(b"r1", orjson.dumps(decision("r1", kind, call)), 5_000, "ctl", 0,
                          control_offset)
        topic, key, value = live.forward(ctl)
        assert topic is None
        offset += 1
        return step.record(key, value, 5_000, "ev", 0, offset)

    c1 = forwarded("approve", "c1", 7)
    for record in [*records, c1, forwarded("approve", "c1", 7), forwarded("approve", "c2", 8)]:
        applied = driving.apply(live, state, record)
        if applied is not None:
            assert not [e for e in applied.emits if e.topic is Topic.DLQ], applied.emits
    assert state.assembler.stats["duplicates"] == 1
    assert table[b"r1"]["d"] == [[0, 7], [0, 8]]
    successor = Driver(gated, EngineHooks(gated), Heads(table, 3600))
    takeover = successor.takeover(0, resume=offset + 1)
    assert driving.apply(successor, takeover.state, forwarded("approve", "c1", 7)) is None
    assert takeover.state.assembler.stats["duplicates"] == 1
    applied = driving.apply(successor, takeover.state, forwarded("deny", "c1", 9))
    assert applied is not None
    (dlq,) = [e.value for e in applied.emits if e.topic is Topic.DLQ]
    assert dlq["reason"] == "call_already_decided"
