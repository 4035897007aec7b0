"""The worker's offset commits must advance past records that faust skipped and the worker read
from the log itself.

Found by the chaos run (issue 4, ``docs/chaos.md``): around a rebalance faust sometimes
starts a newly assigned partition past the group's committed offset (faust-streaming/faust
#596: records fetched during recovery are dropped, and faust registers no gap for a
partition it has not read yet). ``FaustEngine._in_order`` notices and reads the skipped range
from the log, so no outcome is lost; but faust never saw those offsets acked, and its
``Consumer._new_offset`` withholds every commit while the first acked offset is more than one
past the committed one. The partition's committed offset then stays where it was until the
next rebalance: in one chaos run ``events[3]`` stayed at 9556 while its log grew to 12381.
Every later takeover re-reads from there, and the lag never clears.

The worker now tells faust about the range it read itself
(``await self.app.consumer._add_gap(tp, expected, message.offset - 1)``, what faust does for
gaps it sees), so its next commit moves past them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from worker.runtime.config import load_config
from worker.runtime.faust_engine import engine as worker_app
from worker.runtime.faust_engine import kafka_io

TOPIC = "chaos.events"


def _record(offset: int) -> SimpleNamespace:
    return SimpleNamespace(topic=TOPIC, partition=0, offset=offset, key=b"r1",
                           value=b"{}", timestamp=1_000)


def test_commits_advance_past_records_faust_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group committed 100; faust delivers 110 first (it skipped 100..109); the worker
    reads 100..109 from the log and applies them, then 110 is acked: faust's next commit for
    the partition must be 111, not nothing."""
    async def read_range(options: Any, topic: str, partition: int, start: int,
                         stop: int) -> AsyncIterator[SimpleNamespace]:
        for offset in range(start, stop):
            yield _record(offset)

    monkeypatch.setattr(kafka_io, "read_range", read_range)
    latch = worker_app.FaustEngine(load_config(None, env={
        "LATCH_TOPICS__EVENTS": TOPIC, "LATCH_WORKER__WEB_PORT": "0"}))
    consumer = latch.app.consumer
    tp = TP(TOPIC, 0)
    consumer._committed_offset[tp] = 100  # what the group had committed at assignment

    async def apply() -> list[int]:
        return [r.source.offset async for r in latch._in_order(_record(110), 100)]

    assert asyncio.run(apply()) == list(range(100, 111))  # the worker applies all of them
    consumer._acked[tp].append(110)  # faust's own ack of the one message it delivered
    assert consumer._new_offset(tp) == 111
