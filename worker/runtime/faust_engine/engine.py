"""The faust engine (:class:`FaustEngine`): the events agent, one record at a time through
the partition driver, its outputs sent and confirmed before its heads and its ack.

Its rooms, as the kafka engine's: the rebalance signals and the takeover of a partition
(rebalance.py), the control records forwarded into the events topic and the control repair
(forwarding.py), the sends and their confirms (sends.py); this module holds the app, the
events loop, the offset order and the ticks.

Four rules keep the promises of ``guarantees.md``; the reasons are in
``docs/decisions/0001-state-in-the-events-log.md`` and ``0002-exactly-once.md``.

* **One ordered history per run.** Everything that can change an outcome is a record in the
  run's partition of the events topic: the gateway's envelopes, the cancels that the control
  agent forwards there (forwarding.py), and the ticks that a timer writes into each events
  partition this worker owns. The core decides from that history and record times only.
* **State lives in the events log; the table holds only run heads.** Each events partition
  has an in-memory :class:`~worker.core.Assembler` holding the argument buffers. The table
  ``heads`` (changelog-backed, co-partitioned with the events topic) holds per run
  ``{"p", "start"}``, the offset of its ``run.start``, while it is open, and
  ``{"p", "done", "seq", "status"}`` once it has finished: two small records per run, whatever
  the size of the arguments. When a worker gets a partition, its first record rebuilds the
  assembler (rebalance.py): the open runs' records from the earliest ``start`` up to the
  group's committed offset are read from the log with a plain consumer and fed again, their
  outputs discarded.
* **Offset order, whatever faust delivers.** faust can skip or repeat records around a
  rebalance; the worker applies each partition's records strictly in offset order from the
  committed offset, reads a skipped range from the log itself, and drops a repeat.
* **Emit, confirm, then record.** The outputs of a record are sent in order (sends.py), and
  every one (progress records excepted) is delivered before the record is acked, before a
  run's ``done`` head is written, and before a control record that a cancel was forwarded
  for is acked. A crash in between finalizes the run again after recovery, with the same bytes.

Delivery is at least once. faust's commit only flushes its producer (a failed batch does not
raise), so the worker never relies on it: records are acked (by faust's stream, when the loop
body is done) after their outputs are confirmed; a send that fails stops the worker with its
record withheld from the ack, before the offset moves, so that the record is processed again
after a restart. Unconfirmed sends never outlive the record that made them.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import faust
from faust.types import TP

from worker.core import Topic
from worker.runtime import memory, step
from worker.runtime.config import Config
from worker.runtime.driver import Driver, Outgoing
from worker.runtime.faust_engine import app, kafka_io
from worker.runtime.faust_engine.forwarding import Forwarding
from worker.runtime.faust_engine.gaps import StallWatch
from worker.runtime.faust_engine.heads import (
    FaustHeadsMap,
    FaustHeadsTable,
    HeadWrite,
    StagedHeads,
)
from worker.runtime.faust_engine.rebalance import Rebalance
from worker.runtime.faust_engine.sends import Sends
from worker.runtime.faust_engine.settings import LeanMonitor, app_settings
from worker.runtime.governance.registry import POLICY_MARKER
from worker.runtime.governance.registry_io import RegistryError, RegistryReader
from worker.runtime.hooks import EngineHooks
from worker.runtime.observability import logs
from worker.runtime.observability.health import loop_heartbeat
from worker.runtime.observability.metrics import PartitionView
from worker.runtime.partition import Heads, PartitionState
from worker.runtime.step import Record

log = logging.getLogger("latch.worker")

#: How often a tick held back by the control backlog looks again (seconds).
_TICK_RECHECK_S = 0.05

_RAW: dict[str, Any] = {
    "key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}


class FaustEngine(Rebalance, Forwarding):
    """The faust app, its topics and table, and the state of the partitions it owns; its
    rebalances (:class:`~.rebalance.Rebalance`) and its control forwarding
    (:class:`~.forwarding.Forwarding`) mixed in."""

    def __init__(self, config: Config, faust_settings: Mapping[str, Any] | None = None) -> None:
        self.config = config
        names = config.topics
        settings = app_settings(config, faust_settings or {})
        # faust's web is the only reader of its Monitor's per-message statistics: without it,
        # a monitor that keeps only what faust's consumer reads (``LeanMonitor``).
        monitor = None if settings["web_enabled"] else LeanMonitor()
        # Table: the class app.Table makes (the heads table, the app's only one). The app
        # reads at read_committed and recovers the heads through the kafka engine's
        # transaction markers (faust_engine/app.py; decision 0009).
        self.app = app.App(
            config.worker.app_id, reader_options=kafka_io.aiokafka_options(config.kafka),
            monitor=monitor, Table=FaustHeadsTable, **settings)
        self.events = self.app.topic(names.events, partitions=names.partitions, **_RAW)
        self.control = self.app.topic(names.control, partitions=names.partitions, **_RAW)
        self.outputs = {t: self.app.topic(getattr(names, t.value), **_RAW) for t in Topic}
        # key_type bytes: raw run_id keys; values: JSON objects, kept packed (.heads).
        self.heads = self.app.Table("heads", partitions=names.partitions, key_type=bytes)
        self.heads_store = FaustHeadsMap(self.heads)
        #: The heads the driver writes, staged until the outputs before them are confirmed.
        self.staged = StagedHeads(self.heads_store)
        self.run_heads = Heads(self.staged, config.worker.finished_run_retention_s)
        self.hooks = EngineHooks(config)
        #: Everything around the core, engine-neutral (worker/runtime/driver.py).
        self.driver = Driver(config, self.hooks, self.run_heads)
        #: The registry, read whole before the faust worker starts (registry_io.py).
        self.registry = self.driver.registry = RegistryReader(config)
        self.metrics, self.health = self.hooks.metrics, self.hooks.health
        self.metrics.watch(self._partition_views)
        self.reader_options = kafka_io.aiokafka_options(config.kafka)
        #: The output topics' limits, read when the worker starts (:meth:`run`) and again
        #: after a refusal for size: the driver checks each output before it is sent.
        self.limits = self.driver.limits
        #: The owned events partitions' states and the next offset to forward of each owned
        #: control partition: the driver's (worker/runtime/assignment.py).
        self.owned = self.driver.owned
        self.partitions, self.control_next = self.owned.partitions, self.owned.control_next
        #: Each output topic's name, for the driver's outgoing records.
        self.names = {t: topic.get_topic_name() for t, topic in self.outputs.items()}
        #: The outputs sent for a record, their confirms, refusals and limits (sends.py).
        self.sends = Sends(config, self.driver, self.hooks, self.outputs, self.names,
                           self.app.conf)
        # The control forwarding's (forwarding.py): its locks, its stall watch, the ends.
        self.control_locks = defaultdict(asyncio.Lock)
        self.control_watch = StallWatch()
        self.control_ends = {}
        self.results_next = {}
        self.results_locks = defaultdict(asyncio.Lock)
        self.revocations = 0  # (rebalance.py)
        #: Records processed without outputs and not yet counted (telemetry in batches).
        #: A record could not be processed: the worker is stopping, nothing more is handled.
        self.failed = False
        app_id = config.worker.app_id
        self.app.agent(self.events, name=f"{app_id}.events", concurrency=1)(self._events_agent)
        self.app.agent(self.control, name=f"{app_id}.control", concurrency=1)(
            self._control_agent)
        #: The results topic, forwarded like the control topic (None: the result latch off).
        self.results: faust.TopicT | None = None
        if config.results.enabled:
            self.results = self.app.topic(names.results, partitions=names.partitions, **_RAW)
            self.app.agent(self.results, name=f"{app_id}.results", concurrency=1)(
                self._results_agent)
        self.app.timer(config.worker.tick_interval_s, name=f"{app_id}.tick")(self._tick)
        # Its own timer: a slow repair (a broker away) must not hold the ticks back.
        self.app.timer(config.worker.tick_interval_s, name=f"{app_id}.repair")(
            self._repair_tick)
        # mode's handler type (NamedArg/KwArg callables) rejects any bound async method:
        self.app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]
        self.app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]
        self.app.task(self._watch_loop)
        #: The heap's free memory goes back to the system when the events stop (memory.py).
        self.idle_trim = memory.IdleTrim(memory.malloc_trim())
        self.app.timer(memory.IDLE_S, name=f"{app_id}.trim")(self._trim_when_idle)

    # -- the events agent -------------------------------------------------------------

    async def _events_agent(self, stream: Any) -> None:
        await self._consume(stream, self._step_event)

    async def _trim_when_idle(self) -> None:
        """Every ``memory.IDLE_S``: the heap is trimmed once no record came for as long."""
        self.idle_trim.idle()

    async def _consume(self, stream: Any,
                       handle: Callable[[Any], Awaitable[None] | None]) -> None:
        """Handle each record; faust acks it when the loop asks for the next one. A record
        that failed (a send or a read) or was cancelled is withheld (:func:`_withhold`): never
        acked, so never committed, and processed again after a restart; a failure stops the
        worker. ``handle(message)``: None when the record is done, else an awaitable that
        does the rest (the common record of the events topic awaits nothing).

        The stream's automatic ack (faust's stream iterator acks the current event when the
        loop body is done, in C when faust's Cython iterator is built) is the ack that
        ``Stream.ack`` would do by hand, at the same point: after the body, so after the
        record's outputs were confirmed. Manual acks cost a coroutine, ``Event.ack``,
        ``Message.ack``, ``Consumer.ack`` (three lock acquisitions) and two sensor calls per
        record in Python."""
        idle_trim = self.idle_trim
        async for _ in stream:  # not stream.events(): one async generator less per record
            event = stream.current_event
            if event is None:  # a value that is not a Kafka record: none on a topic
                continue
            message = event.message
            idle_trim.active = True  # (IdleTrim.busy, inline)
            if self.failed:  # faust restarts a crashed agent while the app stops: do nothing
                _withhold(message)
                return
            try:
                rest = handle(message)
                if rest is not None:
                    await rest
            except BaseException as exc:
                _withhold(message)  # before anything else: the stream may close at any await
                if isinstance(exc, Exception):  # a cancellation (the app stopping) just ends
                    self.failed = True
                    log.error("cannot process %s[%d]@%d (%s: a send or a read failed); "
                              "stopping, so that it is processed again after a restart",
                              message.topic, message.partition, message.offset,
                              type(exc).__name__,
                              extra=logs.where(message.topic, message.partition,
                                               message.offset))
                    await self.app.crash(exc)
                raise

    def _step_event(self, message: Any) -> Awaitable[None] | None:
        """The events agent's ``handle``: the partition's next record is applied here;
        None if that was all (most records: nothing to send or wait for; its heads, if
        any, written), else the coroutine that sends, confirms and writes the heads
        (:meth:`_finish`). A takeover or a record out of order: :meth:`_apply_event`."""
        state = self.partitions.get(message.partition)
        if state is None or message.offset != state.next_offset or message.key == POLICY_MARKER:
            return self._apply_event(message)  # (a marker: perhaps settled first, _process)
        work = self.driver.apply_all({message.partition: state}, (_record(message),),
                                     (message.headers,))
        if not work.out and not state.unconfirmed:
            if work.heads:
                self.staged.write(work.heads)
            return None
        return self._finish(state, list(work.out), work.heads)

    async def _apply_event(self, message: Any) -> None:
        state = self.partitions.get(message.partition)
        if state is None:
            state = await self._take_over(message.topic, message.partition)
        if message.offset == state.next_offset:  # the common case, without a generator
            await self._process(state, _record(message), message.headers)
            return
        async for record in self._in_order(message, state.next_offset):
            live = record.source.offset == message.offset  # not read back from the log
            await self._process(state, record, message.headers if live else None)

    async def _in_order(self, message: Any, expected: int) -> AsyncIterator[Record]:
        """The records to apply for ``message`` when ``expected`` is the partition's next
        offset: faust can skip or repeat records around a rebalance, so a skipped range is
        read from the log first, and a repeat yields nothing."""
        if message.offset < expected:
            return
        if message.offset > expected:
            # (a range of transaction markers only, a transactional producer's on the results
            # or control topic, holds no record: read, it yields nothing, and is no warning)
            missed = 0
            async for record in self._read(message.topic, message.partition, expected,
                                           message.offset):
                if not missed:
                    log.warning("%s[%d]: records from %d to %d were not delivered; reading "
                                "them from the log", message.topic, message.partition,
                                record.source.offset, message.offset - 1,
                                extra=logs.where(message.topic, message.partition, expected))
                missed += 1
                yield record
            # faust never saw those offsets, and withholds every commit of the partition
            # while the first acked offset is past the committed one: tell it they are done,
            # as faust does for the gaps it sees itself (a private API: faust has no public
            # one; pinned by tests/runtime/unit/test_worker_commit_gap.py).
            tp = TP(message.topic, message.partition)
            await self.app.consumer._add_gap(tp, expected, message.offset - 1)  # type: ignore[attr-defined]  # private, see above
        yield _record(message)

    async def _process(self, state: PartitionState, record: Record,
                       headers: Any = None) -> None:
        """Apply one record (the driver: :meth:`Driver.apply_all`), then do what it says:
        send the outputs, confirm them, write the heads (:meth:`_finish`). A ``run.start``
        naming a toolset version whose answer is not final yet holds its run only
        (worker/runtime/hold.py): the driver parks the run's records and applies them, at a
        later record of the partition (a tick at the latest), in order, before that record:
        their outputs come first in its work (decision 0014). A policy marker naming a
        version the registry reader cannot answer for yet is settled first, off the event
        loop (:meth:`Driver.unsettled`), so that nothing waits inside the driver."""
        for version, at_ms in self.driver.unsettled((record,)):  # (a marker: decision 0014)
            await asyncio.to_thread(self.registry.policy_registered, version, at_ms)
        work = self.driver.apply_all({record.source.partition: state}, (record,), (headers,))
        await self._finish(state, list(work.out), work.heads)

    async def _finish(self, state: PartitionState, out: list[Outgoing], heads: list[HeadWrite]
                      ) -> None:
        """The rest of a record that the driver says needs more (it emitted or is a tick),
        or that finds outputs of the partition unconfirmed: send its outputs, confirm them,
        then write its heads (a run's ``done`` head only after its outputs are delivered; in
        stream context). Every output of the record (a DLQ record, an early commit, an error
        result) is delivered before the record is acked: faust's commit only flushes its
        producer, and a failed batch would not stop it. A failure raises here, unacked."""
        if out:
            await self.sends.publish(state, out)
        await state.confirm()
        if heads:
            self.staged.write(heads)

    async def _tick(self) -> None:
        """Write a tick into each events partition this worker owns (the only clock read),
        once the driver says it is due: not while a control record in the log (as the
        repair last read the ends) is still to forward (driver.TickRule)."""
        events = self.events.get_topic_name()
        if not any(tp.topic == events for tp in self.app.assignor.assigned_actives()):
            return
        while not self.driver.tick_due(time.monotonic(), self._control_behind()):
            await asyncio.sleep(_TICK_RECHECK_S)
        owned = [tp.partition for tp in self.app.assignor.assigned_actives()
                 if tp.topic == events]
        for partition, key, value in self.driver.ticks(owned, int(time.time() * 1000)):
            await self.events.send(key=key, value=value, partition=partition)

    # -- reads from the log (the takeover's, the control repair's, a skipped range's) ------

    async def _read(self, topic: str, partition: int, start: int,
                    end: int) -> AsyncGenerator[Record, None]:
        """The records ``start`` to ``end`` (excluded) of a partition, read from the log."""
        async for rec in kafka_io.read_range(self.reader_options, topic, partition, start, end):
            yield _reader_record(rec)

    # -- operations: lag, health -----------------------------------------------------

    def _lag(self, partition: int, state: PartitionState) -> int | None:
        try:
            tp = TP(self.events.get_topic_name(), partition)
            return max(0, int(self.app.consumer.highwater(tp)) - state.next_offset)
        except Exception:  # not started, not assigned, not fetched yet: unknown
            return None

    def _partition_views(self) -> list[PartitionView]:
        """The owned partitions for the metrics (called on the HTTP thread: reads only)."""
        return self.owned.views(self._lag)

    async def _watch_loop(self) -> None:
        """faust task at start: /healthz asks this event loop to answer."""
        self.health.heartbeat = loop_heartbeat(asyncio.get_running_loop())

    # -- running ----------------------------------------------------------------------

    def run(self) -> int:
        """Run until SIGTERM or SIGINT; return the exit status."""
        ignored = kafka_io.ignored_settings(self.config.kafka)
        if ignored:
            log.warning("the worker's Kafka clients ignore these kafka settings (only `latch "
                        "topics` passes them on): %s", ", ".join(ignored))
        try:
            server = self.hooks.serve_http()
        except OSError as exc:
            print(self.hooks.http_error(exc), file=sys.stderr)
            return 2
        self.sends.read_limits()
        try:
            self.registry.start()
        except RegistryError as exc:
            log.error("not starting: %s", exc)
            self.hooks.stop(server)
            return 2
        worker = faust.Worker(self.app, loglevel=self.config.worker.log_level, quiet=True,
                              logging_config=logs.faust_logging_config(self.config.worker))
        try:
            worker.execute_from_commandline()
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        finally:
            self.hooks.stop(server)
            self.registry.stop()
        return 0  # pragma: no cover  (execute_from_commandline always raises SystemExit)


def _withhold(message: Any) -> None:
    """Keep faust from acking ``message`` when its stream moves on or closes: faust's
    ``Message.ack`` and its Cython stream iterator both skip a message already marked
    ``acked``, and only their path (``Consumer.ack``) records an offset as safe to commit, so
    faust's commits stop below it (as for a message never acked). Pinned, against the
    installed faust, by ``tests/runtime/unit/test_worker_hot_path.py``."""
    message.acked = True


def _record(message: Any) -> Record:
    """A faust message as the core takes it (faust keeps record times in seconds)."""
    now_ms = None if message.timestamp is None else round(message.timestamp * 1000)
    return step.record(message.key, message.value or b"", now_ms, message.topic,
                       message.partition, message.offset)


def _reader_record(rec: Any) -> Record:
    """An aiokafka record as the core takes it (aiokafka keeps record times in ms)."""
    return step.record(rec.key, rec.value or b"", rec.timestamp, rec.topic, rec.partition,
                       rec.offset)
