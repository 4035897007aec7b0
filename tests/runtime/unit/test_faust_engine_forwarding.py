"""The faust engine's control forwarding (``worker/runtime/faust_engine/forwarding.py``),
without a broker: each control record goes, in offset order from the committed offset, into
its run's events partition (a cancel) or to the DLQ, delivered before the control record is
acked; a repeat forwards nothing, a skipped range is read from the log first; the control
repair reports readiness and the tick rule's input, and a failing repair waits for the next
interval. The delivery-before-ack and the repair of a range faust never delivers are pinned
in ``test_faust_engine.py`` too; the real-broker proof is
``tests/runtime/integration/test_control_gap.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.types import TP
from faust_fakes import FaustStream

from worker.core import Topic
from worker.runtime.config import load_config
from worker.runtime.faust_engine import kafka_io
from worker.runtime.faust_engine.engine import FaustEngine
from worker.runtime.faust_engine.forwarding import Forwarding

CANCEL = {"v": 1, "run_id": "r1", "type": "cancel", "reason": "user_stop"}
NOT_AN_ENVELOPE = {"v": 1, "run_id": "r1", "type": "no.such.type"}


class _Topic:
    """A faust topic that notes each send (``(name, key, partition)``) and delivers it, or
    fails it, one loop turn later."""

    def __init__(self, sent: list[tuple[str, bytes | None]], name: str,
                 fail: bool = False) -> None:
        self.sent, self.name, self.fail = sent, name, fail

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, key: bytes | None = None, value: bytes = b"",
                   partition: int | None = None, headers: Any = None) -> asyncio.Future[None]:
        self.sent.append((self.name, key))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail:
            asyncio.get_running_loop().call_soon(future.set_exception,
                                                 RuntimeError("delivery failed"))
        else:
            asyncio.get_running_loop().call_soon(future.set_result, None)
        return future


def _engine(sent: list[tuple[str, bytes | None]], fail: bool = False) -> FaustEngine:
    """An engine whose events and output topics note their sends."""
    latch = FaustEngine(load_config(None, env={"LATCH_TOPICS__EVENTS": "ev",
                                               "LATCH_TOPICS__CONTROL": "ctl",
                                               "LATCH_WORKER__WEB_PORT": "0"}))
    latch.outputs = {t: _Topic(sent, t.value, fail) for t in Topic}  # type: ignore[misc]
    latch.events = _Topic(sent, "ev", fail)  # type: ignore[assignment]
    return latch


def _control(offset: int, doc: dict[str, Any], key: bytes | None = b"r1",
             partition: int = 0) -> SimpleNamespace:
    """A control record as faust delivers it (record times in seconds)."""
    return SimpleNamespace(topic="ctl", partition=partition, offset=offset, key=key,
                           value=orjson.dumps(doc), timestamp=1.0, headers=[])


def _committed_at(monkeypatch: pytest.MonkeyPatch, offset: int, asked: list[int]) -> None:
    """The group's committed offset of each control partition: ``offset`` (each ask noted)."""

    async def resume_offset(options: Any, group: str, topic: str, partition: int) -> int:
        asked.append(partition)
        return offset

    monkeypatch.setattr(kafka_io, "resume_offset", resume_offset)


def test_the_engine_is_the_forwarding_mix_in() -> None:
    """The forwarding room is mixed into the engine: its agent is the engine's."""
    assert issubclass(FaustEngine, Forwarding)
    assert FaustEngine._apply_control is Forwarding._apply_control


def test_a_cancel_goes_to_its_run_and_anything_else_to_the_dlq(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The control agent forwards a cancel into the events topic keyed by its run, and a
    record that is no envelope to the DLQ keeping its key; each is acked after its forward
    was delivered, and the partition's next offset moves past it."""
    sent: list[tuple[str, bytes | None]] = []
    latch = _engine(sent)
    _committed_at(monkeypatch, 0, [])
    log: list[str] = []
    stream = FaustStream(log, [_control(0, CANCEL), _control(1, NOT_AN_ENVELOPE, b"k")])
    asyncio.run(latch._control_agent(stream))
    assert sent == [("ev", b"r1"), (Topic.DLQ.value, b"k")]
    assert log == ["ack 0", "ack 1"]
    assert latch.control_next[0] == 2


def test_a_failed_forward_is_withheld_from_the_ack(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward whose delivery fails: the control record is never acked (so its offset is
    never committed and the cancel is forwarded again after a restart), its partition's next
    offset stays, and the worker stops."""
    sent: list[tuple[str, bytes | None]] = []
    latch = _engine(sent, fail=True)
    _committed_at(monkeypatch, 0, [])
    crashed: list[str] = []

    async def crash(exc: BaseException) -> None:
        crashed.append(type(exc).__name__)

    latch.app.crash = crash  # type: ignore[method-assign]
    log: list[str] = []
    with pytest.raises(RuntimeError, match="delivery failed"):
        asyncio.run(latch._control_agent(FaustStream(log, [_control(0, CANCEL)])))
    assert sent == [("ev", b"r1")] and log == [] and crashed == ["RuntimeError"]
    assert latch.control_next[0] == 0


def test_forwarding_resumes_at_the_committed_offset_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first record of a control partition asks where the group's committed offset is;
    a record below it (a repeat faust delivers again) forwards nothing; the next record
    asks no more."""
    sent: list[tuple[str, bytes | None]] = []
    latch = _engine(sent)
    asked: list[int] = []
    _committed_at(monkeypatch, 5, asked)
    asyncio.run(latch._apply_control(_control(3, CANCEL)))
    assert sent == [] and latch.control_next[0] == 5
    asyncio.run(latch._apply_control(_control(5, CANCEL)))
    assert sent == [("ev", b"r1")] and latch.control_next[0] == 6
    assert asked == [0]


def test_a_range_faust_skipped_is_read_from_the_log_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """faust delivers offset 3 while 1 is next: records 1 and 2 are read from the log and
    forwarded first, in order, faust is told the range is done (its gap), then 3."""
    sent: list[tuple[str, bytes | None]] = []
    latch = _engine(sent)
    latch.control_next[0] = 1
    reads: list[tuple[int, int]] = []
    gaps: list[tuple[TP, int, int]] = []

    async def read_range(options: Any, topic: str, partition: int, start: int,
                         end: int) -> AsyncIterator[SimpleNamespace]:
        reads.append((start, end))
        for offset in range(start, end):
            yield SimpleNamespace(topic=topic, partition=partition, offset=offset,
                                  key=b"r%d" % offset, value=orjson.dumps(
                                      {**CANCEL, "run_id": f"r{offset}"}), timestamp=1_000)

    async def add_gap(tp: TP, start: int, end: int) -> None:
        gaps.append((tp, start, end))

    monkeypatch.setattr(kafka_io, "read_range", read_range)
    monkeypatch.setattr(latch.app.consumer, "_add_gap", add_gap)
    asyncio.run(latch._apply_control(_control(3, {**CANCEL, "run_id": "r3"}, key=b"r3")))
    assert reads == [(1, 3)] and gaps == [(TP("ctl", 0), 1, 2)]
    assert sent == [("ev", b"r1"), ("ev", b"r2"), ("ev", b"r3")]
    assert latch.control_next[0] == 4


def _repairing(monkeypatch: pytest.MonkeyPatch, latch: FaustEngine, owned: list[int],
               ends: dict[int, int]) -> None:
    """The repair's view: ``owned`` control partitions assigned, their ``ends`` in the log,
    each committed at 0."""
    _committed_at(monkeypatch, 0, [])

    async def end_offsets(options: Any, topic: str, partitions: list[int]) -> dict[int, int]:
        return {p: ends[p] for p in partitions}

    monkeypatch.setattr(kafka_io, "end_offsets", end_offsets)
    monkeypatch.setattr(latch.app, "assignor", SimpleNamespace(
        assigned_actives=lambda: {TP("ctl", p) for p in owned} | {TP("ev", 0)}))


def test_the_repair_reports_readiness_and_the_tick_rules_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The repair reads the owned control partitions' ends: a partition forwarded up to its
    end counts as forwarding (readiness), one with records left does not, and the tick waits
    while one is behind (``_control_behind``), until it is forwarded."""
    sent: list[tuple[str, bytes | None]] = []
    latch = _engine(sent)
    latch.health.assigned([0], [0, 1])
    _repairing(monkeypatch, latch, [0, 1], {0: 0, 1: 1})
    asyncio.run(latch._repair_control())
    assert latch.control_ends == {0: 0, 1: 1}
    assert latch.health.forwarded == {0}
    assert latch._control_behind()
    asyncio.run(latch._apply_control(_control(0, CANCEL, partition=1)))
    assert not latch._control_behind()
    assert sent == [("ev", b"r1")]


def test_the_repair_stops_reading_a_partition_revoked_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A range the repair reads for a stalled partition that is revoked meanwhile: nothing
    more is forwarded from it and nothing is committed for it."""
    sent: list[tuple[str, bytes | None]] = []
    latch = _engine(sent)
    _repairing(monkeypatch, latch, [0], {0: 2})
    commits: list[Any] = []

    async def read_range(options: Any, topic: str, partition: int, start: int,
                         end: int) -> AsyncIterator[SimpleNamespace]:
        latch.owned.revoked([], [partition])  # (the revocation, while the read is on)
        yield SimpleNamespace(topic=topic, partition=partition, offset=start, key=b"r1",
                              value=orjson.dumps(CANCEL), timestamp=1_000)

    async def commit(offsets: dict[TP, int]) -> bool:
        commits.append(offsets)
        return True

    monkeypatch.setattr(kafka_io, "read_range", read_range)
    monkeypatch.setattr(latch.app.consumer, "_commit_offsets", commit)
    asyncio.run(latch._repair_control())  # first look: remembered
    asyncio.run(latch._repair_control())  # stood still: read
    assert sent == [] and commits == [] and 0 not in latch.control_next


def test_a_failing_repair_waits_for_the_next_interval(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A repair that fails (a broker away) raises nothing out of its timer: one warning
    naming the error's type, and the next interval tries again."""
    latch = _engine([])
    calls: list[int] = []

    async def repair() -> None:
        calls.append(1)
        raise ConnectionError("broker away: secret-detail")

    monkeypatch.setattr(latch, "_repair_control", repair)
    with caplog.at_level("WARNING", logger="latch.worker"):
        asyncio.run(latch._repair_tick())
        asyncio.run(latch._repair_tick())
    assert len(calls) == 2
    assert "reading unread control records failed (ConnectionError)" in caplog.text
    assert "secret-detail" not in caplog.text
