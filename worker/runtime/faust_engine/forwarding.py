"""The faust engine's control forwarding: each record of an owned control partition (a cancel,
an approval, ...) goes into the events topic keyed by its run (murmur2, as the gateway
partitions) or to the DLQ (the driver decides where: :meth:`Driver.forward`), delivered before
the control record is acked; and what readiness and the tick rule ask of it.

* **The control agent** (:meth:`Forwarding._control_agent`) forwards each record in offset
  order from the partition's committed offset (:meth:`Forwarding._control_resume`), reading a
  range faust skipped from the log first and dropping a repeat (the engine's ``_in_order``).
* **The control repair** (:meth:`Forwarding._repair_control`, its own timer) reads the owned
  control partitions' ends, reports readiness (a partition forwarded up to its end,
  :meth:`Assignment.control_forwarding`), and reads from the log and forwards a range faust
  has left undelivered for too long (:class:`~worker.runtime.faust_engine.gaps.StallWatch`),
  then commits it.
* **The tick rule**: a tick waits while a control record in the log (as the repair last read
  the ends) is still to forward (:meth:`Forwarding._control_behind`, ``driver.TickRule``).

One forwarder at a time per control partition: the agent or the repair
(:attr:`Forwarding.control_locks`).

A mix-in of :class:`~worker.runtime.faust_engine.engine.FaustEngine`: the attributes it reads
are the engine's, declared below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import faust
from faust.types import TP

from worker.core import Topic
from worker.runtime.assignment import Assignment
from worker.runtime.config import Config
from worker.runtime.driver import Driver
from worker.runtime.faust_engine import kafka_io
from worker.runtime.faust_engine.app import App
from worker.runtime.faust_engine.gaps import StallWatch
from worker.runtime.step import Record

log = logging.getLogger("latch.worker")


class Forwarding:
    """The control records forwarded into the events topic (mixed into the engine)."""

    config: Config
    app: App
    events: faust.TopicT
    control: faust.TopicT
    outputs: dict[Topic, faust.TopicT]
    driver: Driver
    owned: Assignment
    control_next: dict[int, int]
    reader_options: dict[str, Any]
    #: One forwarder at a time per control partition: faust's agent, or the repair.
    control_locks: defaultdict[int, asyncio.Lock]
    #: The control partitions whose next record faust has not delivered for too long.
    control_watch: StallWatch
    #: The end offsets of the owned control partitions, as the repair last read them.
    control_ends: dict[int, int]
    #: The next offset to forward of each results partition, and one forwarder at a time.
    results_next: dict[int, int]
    results_locks: defaultdict[int, asyncio.Lock]

    if TYPE_CHECKING:  # the engine's (engine.py)
        async def _consume(self, stream: Any,
                           handle: Callable[[Any], Awaitable[None] | None]) -> None: ...
        def _in_order(self, message: Any, expected: int) -> AsyncIterator[Record]: ...
        def _read(self, topic: str, partition: int, start: int,
                  end: int) -> AsyncGenerator[Record, None]: ...

    async def _control_agent(self, stream: Any) -> None:
        """faust's agent of the control topic: each record forwarded (:meth:`_apply_control`),
        acked only once its forward was delivered."""
        await self._consume(stream, self._apply_control)

    async def _apply_control(self, message: Any) -> None:
        """Forward ``message`` and what faust skipped before it, in offset order, from the
        partition's next offset (a repeat forwards nothing)."""
        partition = message.partition
        async with self.control_locks[partition]:
            await self._control_resume(message.topic, partition)
            async for record in self._in_order(message, self.control_next[partition]):
                await self._forward_control(record)
                self.control_next[partition] = record.source.offset + 1

    async def _control_resume(self, topic: str, partition: int) -> None:
        """The partition's next offset to forward, read from the group's committed offset the
        first time this worker forwards from it since it was assigned."""
        if partition not in self.control_next:
            self.control_next[partition] = await kafka_io.resume_offset(
                self.reader_options, self.config.worker.app_id, topic, partition)

    async def _repair_control(self) -> None:
        """Read and forward what faust left unread of the control partitions this worker
        owns (:mod:`worker.runtime.faust_engine.gaps`), then commit it."""
        topic = self.control.get_topic_name()
        owned = sorted(tp.partition for tp in self.app.assignor.assigned_actives()
                       if tp.topic == topic)
        for partition in owned:
            async with self.control_locks[partition]:
                await self._control_resume(topic, partition)
        ends = await kafka_io.end_offsets(self.reader_options, topic, owned)
        self.control_ends = ends  # what the tick waits for (driver.TickRule), and readiness
        # readiness: each forward was delivered before its offset moved
        self.owned.control_forwarding(ends, owned)
        applied = {p: self.control_next[p] for p in owned if p in self.control_next}
        for partition, (start, end) in self.control_watch.stalled(applied, ends).items():
            log.warning("%s[%d]: records %d..%d were not delivered; reading them from the log",
                        topic, partition, start, end - 1)
            async with (self.control_locks[partition],
                        contextlib.aclosing(self._read(topic, partition, start, end)) as records):
                async for record in records:
                    offset = record.source.offset
                    if partition not in self.control_next:  # revoked meanwhile
                        break
                    if offset >= self.control_next[partition]:
                        await self._forward_control(record)
                        self.control_next[partition] = offset + 1
                else:
                    # forwarded and confirmed: commit, as faust would had it delivered them
                    # (a private API, like _add_gap in _in_order: faust has no public one).
                    await self.app.consumer._commit_offsets(  # type: ignore[attr-defined]
                        {TP(topic, partition): self.control_next[partition]})
                    # read to its end: forwarding, even if a transaction marker ends it
                    self.owned.control_forwarding(ends, [partition], read={partition: end})

    async def _forward_control(self, record: Record) -> None:
        """Forward a cancel or a result into its run's events partition; anything else goes
        to the DLQ; the latch's own result nowhere (:meth:`Driver.forward`)."""
        routed = self.driver.forward(record)
        if routed is None:
            return
        topic, key, value = routed
        sent = await (self.events if topic is None else self.outputs[topic]).send(
            key=key, value=value)
        await sent  # delivered before the control record is acked (a failure raises)

    async def _results_agent(self, stream: Any) -> None:
        """faust's agent of the results topic (the result latch on): each runner's result
        forwarded into its run's events partition like a control record, in offset order
        from the partition's committed offset, acked once delivered (a repeat after a crash
        is recognised by the core by its ``source``: core/pairing.py)."""
        await self._consume(stream, self._apply_result)

    async def _apply_result(self, message: Any) -> None:
        partition = message.partition
        async with self.results_locks[partition]:
            if partition not in self.results_next:
                self.results_next[partition] = await kafka_io.resume_offset(
                    self.reader_options, self.config.worker.app_id, message.topic, partition)
            async for record in self._in_order(message, self.results_next[partition]):
                await self._forward_control(record)
                self.results_next[partition] = record.source.offset + 1

    def _control_behind(self) -> bool:
        """Whether an owned control partition has records in the log not yet forwarded (its
        end as the repair last read it; unknown, as its next offset, until it has run)."""
        topic = self.control.get_topic_name()
        owned = [tp.partition for tp in self.app.assignor.assigned_actives()
                 if tp.topic == topic]
        return self.owned.control_behind(self.control_ends, owned)

    async def _repair_tick(self) -> None:
        """At each tick interval, read what faust left unread of the owned control
        partitions (:meth:`_repair_control`); a failure waits for the next interval."""
        try:
            await self._repair_control()
        except Exception as exc:  # nothing moved that was not confirmed: the next tick retries
            log.warning("reading unread control records failed (%s); retrying at the next "
                        "tick", type(exc).__name__)
