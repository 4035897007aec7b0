"""faust's App as the faust engine makes it (``worker/runtime/faust_engine/app.py``; decision
0009), without a broker: its worker consumer reads at ``read_committed``, its table recovery
is :class:`Recovery`, whose highwaters are the last records a ``read_committed`` reader
receives (:func:`last_records`, here over a fake log whose tail holds transaction markers and
aborted records), never a marker's offset it would wait for in vain. Against the broker, after
the kafka engine's transactions: ``tests/runtime/integration/test_engine_switch.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from worker.runtime.faust_engine import app


class _Log:
    """aiokafka's consumer over a fake log at ``read_committed``: per partition, the offsets
    that hold a committed record (the others: markers, aborted records), its start and its
    end; each seek noted. A fetch returns at most two records; with none left below the end
    the position moves to the end, as markers and aborted records move it."""

    def __init__(self, records: dict[int, Sequence[int]], first: dict[int, int],
                 end: dict[int, int], **options: Any) -> None:
        self.records, self.first, self.end, self.options = records, first, end, options
        self.seeks: list[tuple[int, int]] = []
        self.positions: dict[Any, int] = {}
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.first[tp.partition] for tp in tps}

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.end[tp.partition] for tp in tps}

    def assign(self, tps: list[Any]) -> None:
        pass

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append((tp.partition, offset))
        self.positions[tp] = offset

    async def position(self, tp: Any) -> int:
        return self.positions[tp]

    async def getmany(self, *tps: Any, timeout_ms: int) -> dict[Any, list[Any]]:
        batch = {}
        for tp in tps:
            at, end = self.positions[tp], self.end[tp.partition]
            found = [o for o in self.records[tp.partition] if at <= o < end][:2]
            self.positions[tp] = found[-1] + 1 if found else end
            batch[tp] = [SimpleNamespace(offset=o) for o in found]
        return batch


def _reading(monkeypatch: pytest.MonkeyPatch, **log: Any) -> list[_Log]:
    made: list[_Log] = []

    def consumer(**options: Any) -> _Log:
        made.append(_Log(**log, **options))
        return made[-1]

    monkeypatch.setattr(app, "AIOKafkaConsumer", consumer)
    return made


def test_the_last_record_is_found_below_the_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partition 0 ends with a commit marker (offset 10): its last record is 9. Partition 1
    is empty, partition 2 holds only an aborted transaction and its marker: each has the log
    start minus one (nothing to wait for). One consumer of no group, at ``read_committed``,
    stopped after."""
    made = _reading(monkeypatch, records={0: range(10), 1: [], 2: []},
                    first={0: 0, 1: 0, 2: 4}, end={0: 11, 1: 0, 2: 9})
    tps = {TP("cl", 0), TP("cl", 1), TP("cl", 2)}
    found = asyncio.run(app.last_records({"bootstrap_servers": ["b:1"]}, tps))
    assert found == {TP("cl", 0): 9, TP("cl", 1): -1, TP("cl", 2): 3}
    (consumer,) = made
    assert consumer.options["group_id"] is None
    assert consumer.options["isolation_level"] == "read_committed"
    assert consumer.options["bootstrap_servers"] == ["b:1"] and consumer.stopped


def test_a_long_aborted_tail_widens_the_look_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last 200 offsets are aborted records: the first look (``TAIL`` offsets back)
    finds nothing, the next, ``TAIL`` times wider, finds the last record (99)."""
    made = _reading(monkeypatch, records={0: range(100)}, first={0: 0}, end={0: 300})
    found = asyncio.run(app.last_records({}, {TP("cl", 0)}))
    assert found == {TP("cl", 0): 99}
    assert made[0].seeks == [(0, 300 - app.TAIL), (0, 0)]


def test_no_partition_asked_makes_no_consumer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing to recover: no consumer is made."""
    made = _reading(monkeypatch, records={}, first={}, end={})
    assert asyncio.run(app.last_records({}, set())) == {}
    assert made == []


def test_the_app_reads_committed_and_recovers_through_its_recovery() -> None:
    """The app keeps its readers' options, its table manager's recovery is
    :class:`app.Recovery`, and its worker consumer reads at ``read_committed`` (faust picks
    that for exactly-once apps only)."""

    async def build() -> tuple[Any, Any]:
        faust_app = app.App("latch-test", reader_options={"bootstrap_servers": ["b:1"]},
                            broker="kafka://b:1")
        consumer = faust_app.consumer._thread._create_worker_consumer(faust_app.transport)
        try:
            return faust_app, consumer._isolation_level
        finally:
            await consumer.stop()

    faust_app, isolation = asyncio.run(build())
    assert faust_app.reader_options == {"bootstrap_servers": ["b:1"]}
    assert isinstance(faust_app.tables, app.TableManager)
    assert isinstance(faust_app.tables.recovery, app.Recovery)
    assert isolation == "read_committed"


def test_recovery_highwaters_are_the_last_committed_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """faust's recovery takes, as each changelog partition's highwater, the last record
    :func:`last_records` finds (read with the app's reader options), replacing what the
    destination held."""
    asked: list[tuple[dict[str, Any], set[TP]]] = []

    async def last_records(options: dict[str, Any], tps: set[TP]) -> dict[TP, int]:
        asked.append((options, tps))
        return {tp: 41 for tp in tps}

    monkeypatch.setattr(app, "last_records", last_records)

    async def build() -> dict[TP, int]:
        faust_app = app.App("latch-test", reader_options={"bootstrap_servers": ["b:1"]})
        destination = {TP("stale", 0): 7}
        await faust_app.tables.recovery._build_highwaters(
            None, {TP("cl", 0)}, destination, "active")
        return destination

    assert asyncio.run(build()) == {TP("cl", 0): 41}
    assert asked == [({"bootstrap_servers": ["b:1"]}, {TP("cl", 0)})]
