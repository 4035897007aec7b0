"""What a worker holds for one events partition, and the run heads behind it
(worker/runtime/partition.py): the heads as a table keeps them (packed) and as the changelog
holds them (JSON objects, anything else ignored), :class:`PartitionState` applying records and
confirming its sends, :func:`replay`'s filter of a rebuild, and the heads that keep a cancel
across a takeover.

A cancel that reaches the events log before its run's ``run.start`` survives a takeover
(issue 9, item 7, in the runtime).

The core remembers such a cancel (``remember_early_cancels``, ``early_cancel_ttl_s`` of record
time), but a worker that takes the partition over rebuilds its assembler only from the heads:
the open runs' records from the earliest ``start``. Without a head at the cancel's offset, the
new owner never read the cancel, and the run committed the calls the user had stopped. These
tests drive the shared per-partition logic (:mod:`worker.runtime.partition`) the way both
engines do, record by record, without Kafka:

* a cancel held by the core gets ``{"p", "start", "cancel": true}`` at its offset (and a second
  cancel, a record of another run, or a finished run's head changes nothing);
* a worker that loads those heads and rebuilds reads from that offset, and the run is cancelled
  as it starts: no committed call;
* the head goes at the first tick after the cancel expired in record time, and is replaced
  when its run starts (by its ``done`` head, the run cancelled at once);
* a rebuild feeds a run's records only from its head's start: a cancel the live core let go
  before the run opened is not applied by the rebuilt one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import driving
import orjson
import pytest
from builders import cancel, chat_calls, chat_run, chat_tool

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.envelope import TICK_KEY
from worker.runtime import step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import (
    POLICY_AT,
    TICK,
    Heads,
    PartitionState,
    decode_head,
    encode_head,
    finished_runs,
    head_partition,
    head_policy,
    pack_head,
    refinished,
    replay,
    unpack_head,
)
from worker.runtime.step import Record

TOOLS = [chat_tool("read_file", {"type": "object"})]
TTL_S = 300.0


def _settings(**overrides: Any) -> AssembleSettings:
    return AssembleSettings(early_cancel_ttl_s=TTL_S, **overrides)


class Log:
    """One events partition: records appended with offsets and record times."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def append(self, key: bytes | None, value: bytes, ts: int) -> Record:
        record = step.record(key, value, ts, "ev", 0, len(self.records))
        self.records.append(record)
        return record

    def envelopes(self, envelopes: Iterable[dict[str, Any]], ts: int) -> list[Record]:
        return [self.append(e["run_id"].encode(), orjson.dumps(e), ts) for e in envelopes]

    def cancel(self, run_id: str, ts: int) -> Record:
        return self.append(run_id.encode(), orjson.dumps(cancel(run_id)), ts)

    def tick(self, ts: int) -> Record:
        return self.append(TICK_KEY.encode(), orjson.dumps({"v": 1, "type": "tick", "ts": ts}), ts)


def _driver(heads: Heads, settings: AssembleSettings | None = None) -> Driver:
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0"})
    if settings is not None:
        config = dataclasses.replace(config, assemble=settings)
    return Driver(config, EngineHooks(config), heads)


def process(state: PartitionState, heads: Heads, records: Sequence[Record]) -> list[Emit]:
    """What each engine does with a record of the partition, through the driver: apply it
    (``Driver.apply`` writes a run's start head and a waiting cancel's), then, its outputs
    delivered, ``Driver.recorded`` (the done heads of the runs it finished, and at a tick
    ``Heads.forget_finished``)."""
    driver = _driver(heads)
    out: list[Emit] = []
    for record in records:
        applied = driving.apply(driver, state, record)
        if applied is not None:
            out += applied.emits
        state.next_offset = record.source.offset + 1
    return out


def take_over(table: dict[bytes, Any], log: Log, resume: int,
              settings: AssembleSettings) -> PartitionState:
    """A new owner: heads loaded, the log rebuilt from the earliest head's start up to the
    committed offset ``resume`` (``Driver.takeover``, as both engines run it)."""
    driver = _driver(Heads(table, 3600), settings)
    takeover = driver.takeover(0, resume)
    if takeover.start is not None:
        for record in log.records[takeover.start:resume]:
            takeover.feed(record)
    return takeover.state


def _run(run_id: str) -> list[dict[str, Any]]:
    return chat_run(run_id, TOOLS, chat_calls([(f"call_{run_id}", "read_file", '{"p": 1}')]))


def _ends(emits: Sequence[Emit], run_id: str) -> tuple[str | None, list[str]]:
    final = [e.value["status"] for e in emits if e.topic is Topic.FINAL and e.key == run_id]
    committed = [e.value["call_id"] for e in emits
                 if e.topic is Topic.COMMITTED and e.key == run_id]
    return (final[0] if final else None), committed


def test_a_cancel_before_its_run_gets_a_head_at_its_offset() -> None:
    """The cancel of a run not started yet, held by the core, gets a head at its offset; a
    second cancel of the run, the records of another run and a finished run's cancel write
    no head (the per-record cost is a test of the core's count of waiting cancels)."""
    log, table = Log(), dict[bytes, Any]()
    heads = Heads(table, 3600)
    state = PartitionState(Assembler(_settings()), next_offset=0)
    process(state, heads, log.envelopes(_run("done")[:3], 1000))  # "done" opens at 0
    assert table == {b"done": {"p": 0, "start": 0}}
    process(state, heads, [log.cancel("r", 1001)])
    assert table[b"r"] == {"p": 0, "start": 3, "cancel": True}
    process(state, heads, [log.cancel("r", 1002), *log.envelopes(_run("done")[3:], 1003)])
    assert table[b"r"] == {"p": 0, "start": 3, "cancel": True}
    assert table[b"done"]["done"] and state.waiting == {b"r"}
    process(state, heads, [log.cancel("done", 1004)])  # finished: ignored, its head stays
    assert table[b"done"]["done"] and set(table) == {b"done", b"r"}


def test_a_new_owner_reads_the_waiting_cancel_and_cancels_the_run_as_it_starts() -> None:
    """The cancel of run R is applied and committed past by one worker, which then stops; the
    next owner loads the heads, rebuilds from the cancel's offset, and when R's ``run.start``
    and stream come, R ends ``cancelled`` with no committed call (without the head it
    committed: the old behaviour, checked here by dropping the head)."""
    log, table = Log(), dict[bytes, Any]()
    first = PartitionState(Assembler(_settings()), next_offset=0)
    process(first, Heads(table, 3600), [log.cancel("r", 1000), log.tick(2000)])
    assert first.assembler.early_cancel_pending("r")
    resume = len(log.records)
    stream = log.envelopes(_run("r"), 3000)

    second = take_over(table, log, resume, _settings())
    assert second.assembler.early_cancel_pending("r")
    status, committed = _ends(process(second, Heads(table, 3600), stream), "r")
    assert (status, committed) == ("cancelled", [])
    assert table[b"r"]["done"] and table[b"r"]["status"] == "cancelled"

    without = take_over({}, log, resume, _settings())  # no head: the cancel is never read
    assert _ends(process(without, Heads({}, 3600), stream), "r") == ("completed", ["call_r"])


def test_the_head_goes_when_the_cancel_expires_in_record_time() -> None:
    """A tick within ``early_cancel_ttl_s`` of the cancel's record time keeps its head (and a
    takeover then still cancels the run); the first tick past it, by record time, tombstones
    it, and a run starting later runs as if the cancel had never come, on any worker."""
    log, table = Log(), dict[bytes, Any]()
    heads = Heads(table, 3600)
    state = PartitionState(Assembler(_settings()), next_offset=0)
    ttl_ms = int(TTL_S * 1000)
    process(state, heads, [log.cancel("r", 1000), log.tick(1000 + ttl_ms)])
    assert b"r" in table
    process(state, heads, [log.tick(1001 + ttl_ms)])
    assert b"r" not in table and not state.waiting
    assert not state.assembler.early_cancel_pending("r")
    stream = log.envelopes(_run("r"), 2000 + ttl_ms)
    rebuilt = take_over(table, log, len(log.records) - len(stream), _settings())
    assert _ends(process(rebuilt, Heads(table, 3600), stream), "r") == ("completed", ["call_r"])


def test_a_rebuild_feeds_a_run_only_from_its_heads_start() -> None:
    """Run R's cancel is forgotten by the live core (``remember_early_cancels`` 1, a second
    run's cancel came after it), so R opens and commits. A takeover that rebuilds from an
    earlier open run's start must not feed R's cancel, which lies before R's ``start``
    head: fed, the rebuilt core would hold it (the other cancel, whose run has finished, is
    not fed) and cancel R, which the live worker ran."""
    settings = _settings(remember_early_cancels=1)
    log, table = Log(), dict[bytes, Any]()
    heads = Heads(table, 3600)
    live = PartitionState(Assembler(settings), next_offset=0)
    process(live, heads, log.envelopes(_run("q")[:2], 1000))  # q opens at 0, stays open
    process(live, heads, [log.cancel("r", 1001), log.cancel("s", 1002), log.tick(1003)])
    assert b"r" not in table and table[b"s"]["cancel"]  # r forgotten: its head went
    process(live, heads, log.envelopes(_run("s")[:1], 1004))  # s cancelled as it starts
    r_start = len(log.records)
    live_emits = process(live, heads, log.envelopes(_run("r")[:2], 1005))
    assert live.assembler.is_open("r") and table[b"r"] == {"p": 0, "start": r_start}
    assert not [e for e in live_emits if e.key == "r"]

    rebuilt = take_over(table, log, len(log.records), settings)
    assert rebuilt.assembler.is_open("r") and rebuilt.assembler.is_open("q")
    rest = log.envelopes(_run("r")[2:], 1006)
    assert _ends(process(rebuilt, Heads(table, 3600), rest), "r") == ("completed", ["call_r"])


@pytest.mark.parametrize(("head", "stored"), [
    ({"p": 2, "start": 7}, (2, 7)),
    ({"p": 2, "start": 7, POLICY_AT: 4}, (2, 7, 4)),
    ({"p": 2, "start": 7, "cancel": True}, None),
    ({"p": 2, "start": 7, POLICY_AT: "4"}, None),
    ({"p": True, "start": 7}, None),
    ({"p": 2, "done": True, "seq": 3, "status": "completed", "at": 9}, None),
], ids=["open", "open_with_policy", "waiting_cancel", "policy_not_int", "p_bool", "done"])
def test_an_open_head_is_kept_packed_and_read_back_as_its_dict(
        head: dict[str, Any], stored: tuple[int, ...] | None) -> None:
    """``pack_head``: an open run's head (with its policy version or not) is kept as a tuple,
    any other head (a waiting cancel, a done head, a member of another type) as its dict;
    ``unpack_head`` gives the same dict back, and ``head_partition`` its ``p`` either way."""
    packed = pack_head(head)
    assert packed == (head if stored is None else stored)
    assert unpack_head(packed) == head
    assert head_partition(packed) == head["p"]


def test_a_heads_policy_version_is_read_only_when_it_is_one() -> None:
    """``head_policy``: the ``pv`` of an open head when it is an integer version (1 or
    more); None for a head without one, a value that is no version, or no dict at all."""
    assert head_policy({"p": 0, "start": 1, POLICY_AT: 3}) == 3
    for head in ({"p": 0, "start": 1}, {POLICY_AT: 0}, {POLICY_AT: "3"}, {POLICY_AT: True},
                 {POLICY_AT: 2.0}, (0, 1, 3), None):
        assert head_policy(head) is None, head


def test_the_changelog_holds_a_head_as_a_json_object_and_nothing_else() -> None:
    """``encode_head`` writes the head as JSON and ``decode_head`` reads it back; a value
    that is not JSON, or JSON that is not an object, reads as None (ignored, not trusted)."""
    head = {"p": 1, "done": True, "seq": 4, "status": "cancelled", "at": 12, "d": [[0, 3]]}
    assert orjson.loads(encode_head(head)) == head
    assert decode_head(encode_head(head)) == head
    for value in (b"", b"not json", b"[1, 2]", b'"head"', b"7", b"null"):
        assert decode_head(value) is None, value


def test_applying_a_record_moves_the_partitions_clock_forward_only() -> None:
    """``PartitionState.apply`` gives the core's emits of the record and keeps the latest
    record time seen: an earlier record, or one without a time, leaves it."""
    log = Log()
    state = PartitionState(Assembler(_settings()), next_offset=0)
    first, *rest = log.envelopes(_run("r"), 5_000)
    assert state.apply(first) == [] and state.clock_ms == 5_000
    assert state.assembler.is_open("r")
    state.apply(log.tick(4_000))
    assert state.clock_ms == 5_000
    state.apply(Record(TICK, orjson.dumps({"v": 1, "type": "tick", "ts": 1}), None,
                       step.Source("ev", 0, 99)))
    assert state.clock_ms == 5_000
    emits = [e for record in rest for e in state.apply(record)]
    assert finished_runs(emits) == ["r"] and state.clock_ms == 5_000


def test_confirm_waits_for_every_send_and_raises_when_one_failed() -> None:
    """``PartitionState.confirm`` awaits the sends not yet confirmed and forgets them;
    a send that failed raises from it."""
    async def scenario() -> None:
        state = PartitionState(Assembler(_settings()), next_offset=0)
        await state.confirm()  # none: nothing to wait for
        done: list[int] = []

        async def send(n: int) -> None:
            done.append(n)

        async def failed() -> None:
            raise RuntimeError("not delivered")

        state.unconfirmed += [send(1), send(2)]
        await state.confirm()
        assert done == [1, 2] and state.unconfirmed == []
        state.unconfirmed.append(failed())
        with pytest.raises(RuntimeError, match="not delivered"):
            await state.confirm()
        assert state.unconfirmed == []

    asyncio.run(scenario())


def test_replay_feeds_ticks_and_the_open_runs_from_their_start_only() -> None:
    """``replay``: a record of a run without an open head, or before its head's start, is not
    fed (the assembler never sees it); a tick always is; the records of a run from its
    start are, and its progress records are dropped."""
    log = Log()
    records = log.envelopes(_run("r"), 1_000)
    other = log.envelopes(_run("q")[:1], 1_001)
    state = PartitionState(Assembler(_settings(emit_progress=True)), next_offset=0)
    assert replay(state, {b"r": 1}, records[0]) == []  # before r's head's start
    assert replay(state, {b"r": 0}, other[0]) == []  # q has no head
    assert not state.assembler.is_open("q") and not state.assembler.is_open("r")
    replay(state, {b"r": 0}, log.tick(1_002))
    assert state.clock_ms == 1_002
    live = PartitionState(Assembler(_settings(emit_progress=True)), next_offset=0)
    applied = [e for record in records for e in live.apply(record)]
    fed = [e for record in records for e in replay(state, {b"r": 0}, record)]
    assert any(e.topic is Topic.PROGRESS for e in applied)
    assert fed == [e for e in applied if e.topic is not Topic.PROGRESS]
    assert finished_runs(fed) == ["r"]


def test_runs_finished_in_a_rebuild_are_published_again_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """``refinished``: the emits of the runs whose final message came during a rebuild (their
    done head was lost), all of them and no other run's; a warning names the partition and
    the count; nothing finished, nothing logged."""
    emits = [Emit(Topic.COMMITTED, "r", {"n": 1}), Emit(Topic.COMMITTED, "q", {"n": 2}),
             Emit(Topic.FINAL, "r", {"status": "completed"})]
    with caplog.at_level("WARNING", logger="latch.worker"):
        assert refinished(3, emits) == [emits[0], emits[2]]
    assert "partition 3: 1 runs finished during the rebuild without a done head" in caplog.text
    caplog.clear()
    assert refinished(3, emits[:2]) == [] and not caplog.text
