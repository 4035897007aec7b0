"""The faust engine's rebalances (``worker/runtime/faust_engine/rebalance.py``), without a
broker: a revocation drops the partitions' states and forwarded offsets (only the engine's own
topics'), an assignment keeps only the owned partitions' heads, and a takeover rebuilds a
partition at its committed offset from the log (its open run's records fed again, outputs
discarded), unless a revocation overtook it. The real-broker proofs are
``tests/runtime/integration/test_worker_failover.py`` and ``test_heads_return.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from builders import chat_calls, chat_run, chat_tool
from faust.types import TP

from worker.core import Assembler, Topic
from worker.runtime import takeover
from worker.runtime.config import load_config
from worker.runtime.faust_engine import kafka_io
from worker.runtime.faust_engine.engine import FaustEngine
from worker.runtime.faust_engine.rebalance import Rebalance
from worker.runtime.partition import PartitionState


def _engine(sent: list[Any] | None = None) -> FaustEngine:
    """An engine with its heads in a plain dict (no faust table: no app running), its sends
    noted in ``sent`` instead of sent."""
    latch = FaustEngine(load_config(None, env={"LATCH_TOPICS__EVENTS": "ev",
                                               "LATCH_TOPICS__CONTROL": "ctl",
                                               "LATCH_WORKER__WEB_PORT": "0",
                                               # (done heads at the final message)
                                               "LATCH_RESULTS__ENABLED": "false"}))
    latch.staged.store = {}  # type: ignore[assignment]
    noted = [] if sent is None else sent

    async def publish(state: Any, outs: Any) -> None:
        noted.extend(outs)

    latch.sends.publish = publish  # type: ignore[method-assign]
    return latch


def _envelopes() -> list[dict[str, Any]]:
    """A run that commits one call (its last records end the stream)."""
    tools = [chat_tool("get_weather", {"type": "object"})]
    return chat_run("r1", tools, chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))


def _log(envelopes: list[dict[str, Any]]) -> list[SimpleNamespace]:
    """The events partition 0 as aiokafka reads it (record times in ms)."""
    return [SimpleNamespace(topic="ev", partition=0, offset=n, key=e["run_id"].encode(),
                            value=orjson.dumps(e), timestamp=1_000 + n)
            for n, e in enumerate(envelopes)]


def _message(rec: SimpleNamespace) -> SimpleNamespace:
    """The same record as faust delivers it (record times in seconds)."""
    return SimpleNamespace(topic=rec.topic, partition=rec.partition, offset=rec.offset,
                           key=rec.key, value=rec.value, timestamp=rec.timestamp / 1000,
                           headers=[])


def _reading(monkeypatch: pytest.MonkeyPatch, log: list[SimpleNamespace], resume: int,
             reads: list[tuple[int, int]]) -> None:
    """kafka_io answering from ``log``: the group's committed offset ``resume``; each read
    range noted in ``reads``."""

    async def resume_offset(options: Any, group: str, topic: str, partition: int) -> int:
        return resume

    async def read_range(options: Any, topic: str, partition: int, start: int,
                         end: int) -> AsyncIterator[SimpleNamespace]:
        reads.append((start, end))
        for rec in log[start:end]:
            yield rec

    monkeypatch.setattr(kafka_io, "resume_offset", resume_offset)
    monkeypatch.setattr(kafka_io, "read_range", read_range)


def test_the_engine_is_the_rebalance_mix_in() -> None:
    """The rebalance room is mixed into the engine: its signal handlers are the engine's."""
    assert issubclass(FaustEngine, Rebalance)
    assert FaustEngine._take_over is Rebalance._take_over


def test_a_revocation_drops_the_revoked_states_and_forwarded_offsets_only() -> None:
    """faust's ``on_partitions_revoked``: the revoked events partitions' states and control
    partitions' forwarded offsets go, another topic's partition of the same number and the
    partitions still owned stay; each revocation is counted (a takeover it overtakes keeps
    its state to itself)."""
    latch = _engine()
    latch.health.assigned([0, 1], [0, 1])
    for partition in (0, 1):
        latch.partitions[partition] = PartitionState(Assembler(), next_offset=5)
        latch.control_next[partition] = 2
    asyncio.run(latch._on_revoked(latch.app, {TP("ev", 1), TP("ctl", 0), TP("other", 0)}))
    assert sorted(latch.partitions) == [0]
    assert sorted(latch.control_next) == [1]
    assert latch.revocations == 1
    assert not latch.health.member


def test_an_assignment_keeps_the_owned_heads_and_makes_the_worker_a_member(
        caplog: pytest.LogCaptureFixture) -> None:
    """faust's ``on_partitions_assigned``: the heads of partitions owned elsewhere go from the
    local store, readiness learns the owned events and control partitions, and the owned
    events partitions are logged (the line tests and tools read)."""
    latch = _engine()
    kept: list[list[int]] = []

    def keep_only(owned: list[int]) -> int:
        kept.append(owned)
        return 4

    latch.heads_store.keep_only = keep_only  # type: ignore[method-assign]
    with caplog.at_level("INFO", logger="latch.worker"):
        asyncio.run(latch._on_assigned(latch.app, {TP("ev", 2), TP("ev", 0), TP("ctl", 1)}))
    assert kept == [[0, 2]]
    assert latch.health.member and latch.health.owned == {0, 2}
    assert latch.health.control == {1}
    assert "events partitions assigned: [0, 2] (dropped 4 heads" in caplog.text


def test_a_takeover_feeds_the_open_run_again_and_sends_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition taken over at its committed offset 3, with run ``r1`` open from offset 0:
    records 0..2 are read from the log and fed to a fresh assembler, their outputs
    discarded; the state resumes at 3 and is installed; the rest of the run, applied live,
    commits the call as the whole run would have."""
    sent: list[Any] = []
    latch = _engine(sent)
    log = _log(_envelopes())
    latch.staged.store[b"r1"] = {"p": 0, "start": 0}
    reads: list[tuple[int, int]] = []
    _reading(monkeypatch, log, resume=3, reads=reads)
    state = asyncio.run(latch._take_over("ev", 0))
    assert reads == [(0, 3)]
    assert latch.partitions[0] is state and state.next_offset == 3
    assert state.assembler.is_open("r1")
    assert sent == []

    async def rest() -> None:
        for rec in log[3:]:
            pending = latch._step_event(_message(rec))
            if pending is not None:
                await pending

    asyncio.run(rest())
    committed = [out for out in sent if out.topic is Topic.COMMITTED]
    assert [out.key for out in committed] == [b"r1"]
    assert latch.staged.store[b"r1"]["done"] is True


def test_a_takeover_with_no_open_run_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """No open head in the partition: nothing is read from the log, the state begins at the
    committed offset."""
    latch = _engine()
    reads: list[tuple[int, int]] = []
    _reading(monkeypatch, _log(_envelopes()), resume=4, reads=reads)
    state = asyncio.run(latch._take_over("ev", 0))
    assert reads == [] and state.next_offset == 4 and latch.partitions[0] is state


def test_a_takeover_sends_its_read_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The records read are sent to the driver's rebuild in chunks of ``takeover.CHUNK``
    (the rest in a last, shorter one): every one of them reaches the rebuild."""
    latch = _engine()
    log = _log(_envelopes())
    latch.staged.store[b"r1"] = {"p": 0, "start": 0}
    _reading(monkeypatch, log, resume=len(log) - 1, reads=[])
    monkeypatch.setattr(takeover, "CHUNK", 2)
    chunks: list[list[int]] = []
    rebuild = latch.driver.rebuild

    def watched(topic: str, partition: int, resume: int) -> Any:
        generator = rebuild(topic, partition, resume)

        def relay() -> Any:
            chunk = yield next(generator)
            while True:
                chunks.append([record.source.offset for record in chunk or []])
                try:
                    chunk = yield generator.send(chunk)
                except StopIteration as stop:
                    return stop.value

        return relay()

    monkeypatch.setattr(latch.driver, "rebuild", watched)
    state = asyncio.run(latch._take_over("ev", 0))
    offsets = [offset for chunk in chunks for offset in chunk]
    assert offsets == list(range(len(log) - 1))
    assert all(len(chunk) <= 2 for chunk in chunks)
    assert state.next_offset == len(log) - 1


def test_a_takeover_overtaken_by_a_revocation_is_not_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A revocation that comes while a takeover reads its committed offset: the rebuilt
    state is returned to its caller but never installed (the partition is someone else's)."""
    latch = _engine()
    _reading(monkeypatch, [], resume=0, reads=[])

    async def resume_offset(options: Any, group: str, topic: str, partition: int) -> int:
        await latch._on_revoked(latch.app, {TP("ev", 0)})
        return 0

    monkeypatch.setattr(kafka_io, "resume_offset", resume_offset)
    state = asyncio.run(latch._take_over("ev", 0))
    assert state.next_offset == 0
    assert 0 not in latch.partitions
