"""What a worker holds for one events partition, and the run heads behind it.

Engine-independent: the faust worker (:mod:`worker.runtime.app`) drives these, and any other
loop around the core can. Nothing here reads a socket or a clock; the heads go through a
mapping that the engine persists (faust's changelog-backed table).

* :class:`PartitionState`: the partition's :class:`~worker.core.Assembler`, the offset of the
  next record to apply, the sends not yet confirmed, and the latest record time.
* :class:`Heads`: per run, ``{"p", "start"}`` (the offset of its ``run.start``) while it is
  open, and ``{"p", "done", "seq", "status", "at"}`` once it has finished; done heads are
  tombstoned after ``finished_run_retention_s`` of record time.
* :func:`replay`: one record of a rebuild (the log read back from the earliest open run's
  start up to the committed offset), fed only when it belongs to an open run or is a tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Collection, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.core import Assembler, Emit, RunStatus, Topic
from worker.core.envelope import TICK_KEY
from worker.runtime import step
from worker.runtime.step import Record

__all__ = ["TICK", "Heads", "PartitionState", "finished_runs", "rebuild", "refinished",
           "replay"]

log = logging.getLogger("latch.worker")

#: The key of the ticks the worker writes into each events partition.
TICK = TICK_KEY.encode()


@dataclass(slots=True)
class PartitionState:
    """What the worker holds for one events partition it processes."""

    assembler: Assembler
    #: The offset of the next record to apply.
    next_offset: int
    #: Sends not yet known to be delivered (progress records excepted).
    unconfirmed: list[Awaitable[Any]] = field(default_factory=list)
    #: The latest record time applied (ms): the time a run's ``done`` head records.
    clock_ms: int = 0
    #: Done heads of this partition in the order they were written: (record time, key).
    done: deque[tuple[int, bytes]] = field(default_factory=deque)

    def apply(self, record: Record) -> list[Emit]:
        """The emits of the partition's next record, in order (its time moves the clock)."""
        self.clock_ms = max(self.clock_ms, record[2] or 0)
        return step.step(self.assembler, record)

    async def confirm(self) -> None:
        """Wait until every send so far is delivered; raise if one failed."""
        if not self.unconfirmed:  # most records send nothing that needs confirming
            return
        pending, self.unconfirmed = self.unconfirmed, []
        await asyncio.gather(*pending)


def finished_runs(emits: Sequence[Emit]) -> list[str]:
    """The runs that ``emits`` finish (one final message each)."""
    return [e.key for e in emits if e.topic is Topic.FINAL and e.key is not None]


def replay(state: PartitionState, open_runs: Collection[bytes], record: Record) -> list[Emit]:
    """Feed one record of a rebuild: only ticks and the open runs' records count (a finished
    run's records are known to the heads); progress records are never kept."""
    key = record[0]
    if key != TICK and key not in open_runs:
        return []
    return [e for e in state.apply(record) if e.topic is not Topic.PROGRESS]


def refinished(partition: int, replayed: Sequence[Emit]) -> list[Emit]:
    """The emits of the runs that finished during a rebuild: they lost their ``done`` head, so
    their outcomes are published again (the same bytes) and recorded. Expected never to
    happen; logged if it does."""
    runs = {e.key for e in replayed if e.topic is Topic.FINAL}
    if runs:
        log.warning("partition %d: %d runs finished during the rebuild without a done head; "
                    "publishing their outcomes again", partition, len(runs))
    return [e for e in replayed if e.key in runs]


async def rebuild(state: PartitionState, open_runs: Collection[bytes],
                  records: AsyncIterable[Record],
                  pause_every: int = 1000) -> tuple[int, list[Emit]]:
    """Feed the records of a rebuild; return how many were read and what the core emitted
    (which the caller discards, except the outputs of runs that finished during it). Every
    ``pause_every`` records the event loop gets a turn (heartbeats, fetchers)."""
    count = 0
    replayed: list[Emit] = []
    async for record in records:
        count += 1
        replayed += replay(state, open_runs, record)
        if count % pause_every == 0:
            await asyncio.sleep(0)
    return count, replayed


class Heads:
    """The run heads of the partitions one worker owns, over the engine's table."""

    def __init__(self, table: MutableMapping[bytes, Any], retention_s: float) -> None:
        self.table = table
        self.retention_ms = retention_s * 1000

    def opened(self, key: bytes, partition: int, offset: int) -> None:
        """A run opened at ``offset``: a rebuild starts reading there."""
        self.table[key] = {"p": partition, "start": offset}

    def finished(self, state: PartitionState, partition: int, run_ids: Sequence[str]) -> None:
        """Record runs as finished; their outputs must be confirmed first."""
        for run_id in run_ids:
            seq, status = state.assembler.finished(run_id) or (None, None)
            key = run_id.encode()
            self.table[key] = {"p": partition, "done": True, "seq": seq, "status": status,
                               "at": state.clock_ms}
            state.done.append((state.clock_ms, key))

    def forget_finished(self, state: PartitionState) -> None:
        """Tombstone the done heads older than the retention, by record time (the same on
        every worker)."""
        horizon = state.clock_ms - self.retention_ms
        while state.done and state.done[0][0] < horizon:
            _, key = state.done.popleft()
            head = self.table.get(key)
            if head is not None and head.get("done"):
                del self.table[key]

    def load(self, state: PartitionState, partition: int) -> dict[bytes, int]:
        """Register the partition's finished runs with its assembler; return its open runs
        and the offsets where they start."""
        open_runs: dict[bytes, int] = {}
        done: list[tuple[int, bytes]] = []
        for key, head in self.table.items():
            if head.get("p") != partition:
                continue
            if "start" in head:
                open_runs[key] = head["start"]
            elif head.get("seq") is not None:
                state.assembler.remember_finished(key.decode(), head["seq"],
                                                  RunStatus(head["status"]))
                done.append((head.get("at", 0), key))
        state.done.extend(sorted(done))
        return open_runs
