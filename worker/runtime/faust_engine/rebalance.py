"""The faust engine's rebalances: what faust's ``on_partitions_assigned`` and
``on_partitions_revoked`` signals do, and the takeover of an events partition (a rebuild of it
as it was at the group's committed offset: worker/runtime/takeover.py's generator, fed with
this engine's reads).

* **Assigned** (:meth:`Rebalance._on_assigned`): the local heads of partitions no longer
  owned go (``FaustHeadsMap.keep_only``), the driver notes the owned partitions
  (:meth:`Assignment.assigned`) and logs them.
* **Revoked** (:meth:`Rebalance._on_revoked`): the driver drops the partitions' states and
  control offsets (:meth:`Assignment.revoked`); the next owner rebuilds them from the log.
* **Taken over** (:meth:`Rebalance._take_over`): the first record of an events partition this
  worker does not hold resumes it from the group's committed offset
  (:func:`~worker.runtime.faust_engine.kafka_io.resume_offset`): the open runs' records
  before it are read from the log and fed to a fresh assembler, their outputs discarded;
  what the rebuild returns to send (runs that finished during it) is sent, confirmed, then
  recorded, like any record's work.

A mix-in of :class:`~worker.runtime.faust_engine.engine.FaustEngine`: the attributes it reads
are the engine's, declared below.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import faust
from faust.types import TP

from worker.runtime import takeover
from worker.runtime.assignment import Assignment
from worker.runtime.config import Config
from worker.runtime.driver import Driver
from worker.runtime.faust_engine import kafka_io
from worker.runtime.faust_engine.heads import FaustHeadsMap, StagedHeads
from worker.runtime.faust_engine.sends import Sends
from worker.runtime.partition import PartitionState
from worker.runtime.step import Record


class Rebalance:
    """faust's rebalance signals and the takeover (mixed into the engine)."""

    config: Config
    events: faust.TopicT
    control: faust.TopicT
    results: faust.TopicT | None
    results_next: dict[int, int]
    driver: Driver
    owned: Assignment
    partitions: dict[int, PartitionState]
    reader_options: dict[str, Any]
    heads_store: FaustHeadsMap
    staged: StagedHeads
    sends: Sends
    #: Revocations so far: a takeover that a revocation overtook keeps its state to itself.
    revocations: int

    if TYPE_CHECKING:  # the engine's (engine.py)
        def _read(self, topic: str, partition: int, start: int,
                  end: int) -> AsyncGenerator[Record, None]: ...

    async def _on_revoked(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """faust's ``on_partitions_revoked`` signal: ``(app, revoked: set[TP], signal=...)``.
        Drop the assemblers; the next owner rebuilds them from the log."""
        revoked: set[TP] = args[0]
        self.revocations += 1
        events, control = self.events.get_topic_name(), self.control.get_topic_name()
        self.owned.revoked([tp.partition for tp in revoked if tp.topic == events],
                           [tp.partition for tp in revoked if tp.topic == control])
        results = self.results.get_topic_name() if self.results is not None else None
        for tp in revoked:
            if tp.topic == results:
                self.results_next.pop(tp.partition, None)

    async def _on_assigned(self, sender: Any, *args: Any, **kwargs: Any) -> None:
        """faust's ``on_partitions_assigned`` signal: drop the local heads of partitions we
        no longer own (``FaustHeadsMap.keep_only``) and log the ones we own."""
        events, control = self.events.get_topic_name(), self.control.get_topic_name()
        owned = sorted(tp.partition for tp in args[0] if tp.topic == events)
        dropped = self.heads_store.keep_only(owned)
        self.owned.assigned(owned, [tp.partition for tp in args[0] if tp.topic == control])
        self.owned.log_assigned(owned, dropped)

    async def _take_over(self, topic: str, partition: int) -> PartitionState:
        """A fresh assembler for ``partition``, in the state it had at the group's committed
        offset: the open runs' records before it are read from the log and fed again, their
        outputs discarded (they were flushed before that offset was committed)."""
        revocations = self.revocations
        resume = await kafka_io.resume_offset(self.reader_options, self.config.worker.app_id,
                                              topic, partition)
        # the driver's takeover (worker/runtime/takeover.py), driven with this engine's reads
        rebuild = self.driver.rebuild(topic, partition, resume)
        read = next(rebuild)
        assert read is not None  # (the first thing a rebuild yields: what to read)
        chunk: list[Record] = []
        if read.start < read.end:
            async for record in self._read(topic, partition, read.start, read.end):
                chunk.append(record)
                if len(chunk) >= takeover.CHUNK:
                    rebuild.send(chunk)
                    chunk = []
                    await asyncio.sleep(0)  # heartbeats, fetchers
        if chunk:
            rebuild.send(chunk)
        state, work = takeover.end(rebuild)
        # Runs that finished during a rebuild lost their ``done`` head: send their outputs
        # again (the same bytes), then write their heads.
        if work.out:
            await self.sends.publish(state, work.out)
            await state.confirm()
        if work.heads:
            self.staged.write(work.heads)
        if revocations == self.revocations:
            self.partitions[partition] = state
        return state
