"""The partition driver: what happens around the core for each record, for both engines.

Engine-neutral (no I/O, no faust, no Kafka client: an import-linter contract in
pyproject.toml). An engine (faust's :mod:`worker.runtime.faust_engine.engine`, the confluent-kafka
:mod:`worker.runtime.kafka_engine.loop`) reads records and writes what the driver says; the
driver decides everything between:

1. :meth:`Driver.apply` feeds one events record to its partition (the partition's clock,
   then the core's step, :func:`worker.runtime.step.step`), counts it and carries its run's trace on
   (:mod:`worker.runtime.hooks`), writes the heads that need no delivery first (a run's
   ``start``; the head of a cancel that waits for its run: :meth:`Heads.applied`), and returns
   what the engine must still do: None for most records (nothing to send, confirm or record),
   else an :class:`Applied` with the outputs to publish, in order, the runs they finish and
   whether the record is a tick.
2. The engine publishes ``Applied.emits``. A run's ``done`` head is written only once its
   outputs are delivered: faust confirms its sends first (``Applied.confirm``), the kafka
   engine's transaction holds both. Then :meth:`Driver.recorded` writes the ``done`` heads
   and, at a tick, tombstones the heads whose time is over (:meth:`Heads.forget_finished`).
   The engine acks (faust) or adds the offset to its transaction (kafka).
3. :meth:`Driver.route` decides where a control record goes (a cancel into its run's events
   partition, anything else to the DLQ, counted); the engine sends it.
4. :meth:`Driver.tick_due` holds a tick back while the control backlog is unread
   (:class:`TickRule`); the engine says how far its control partitions are read.
5. :meth:`Driver.takeover` and :meth:`Driver.rebuilt` rebuild a partition taken over from its
   heads and the records of its open runs, which the engine reads from the log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from worker.core import Assembler, Emit
from worker.runtime import control
from worker.runtime import partition as partition_module
from worker.runtime.config import Config
from worker.runtime.hooks import EngineHooks
from worker.runtime.observability import logs
from worker.runtime.partition import TICK, Heads, PartitionState, finished_runs
from worker.runtime.step import Record, step

__all__ = ["TICK_DEFER_MAX_S", "Applied", "Driver", "Takeover", "TickRule", "control_behind"]

log = logging.getLogger("latch.worker")

#: Seconds a tick may wait for the control backlog (a control partition whose end is never
#: reached, e.g. held by someone's open transaction, must not stop the clock).
TICK_DEFER_MAX_S = 10.0


class Applied(NamedTuple):
    """What an applied events record still needs from its engine."""

    #: The records to publish, in order (a DLQ record keeps the input record's key).
    emits: list[Emit]
    #: The runs these outputs finish: their ``done`` heads go once the outputs are delivered.
    finished: list[str]
    #: The record is a tick: heads whose time is over go at :meth:`Driver.recorded`.
    tick: bool

    @property
    def confirm(self) -> bool:
        """Whether the record's outputs must be delivered before its run's heads are
        written (a run finished); every output is confirmed before the record is acked."""
        return bool(self.finished)


#: What a tick that emitted nothing still needs.
_TICK = Applied([], [], True)


class TickRule:
    """When a tick is due: at once, unless a control record already in the log is still to
    forward; then at the first turn it is not, or ``defer_max_s`` after it first fell due.

    Why: after a takeover the partition's first tick would otherwise reach the events log
    before the cancels that arrived on the control topic while the partition stood still,
    and expire the runs they stop. Both engines obey this rule."""

    def __init__(self, defer_max_s: float = TICK_DEFER_MAX_S) -> None:
        self.defer_max_s = defer_max_s
        #: When the tick waiting for the control backlog first fell due (None: none waits).
        self.deferred: float | None = None

    def due(self, now: float, behind: bool) -> bool:
        """Whether the tick that fell due (at or before ``now``, a monotonic time) is written
        now; ``behind``: a control record in the log is not yet forwarded."""
        if behind:
            if self.deferred is None:
                self.deferred = now
            if now - self.deferred < self.defer_max_s:
                return False
            log.warning("ticking with control records not yet forwarded (waited %.1fs)",
                        now - self.deferred)
        self.deferred = None
        return True


def control_behind(forwarded: Mapping[int, int], ends: Mapping[int, int | None]) -> bool:
    """Whether a control partition has records in the log not yet forwarded:
    ``forwarded``, the next offset to forward of each owned partition; ``ends``, its end
    offset as the engine last learnt it (None or missing: unknown, so behind)."""
    for partition, next_offset in forwarded.items():
        end = ends.get(partition)
        if end is None or end < 0 or next_offset < end:
            return True
    return False


class Takeover:
    """One partition being rebuilt: a fresh state at offset ``resume``, its heads loaded; the
    engine reads the log from :attr:`start` (None: nothing to read) up to ``resume`` and feeds
    each record to :meth:`feed`."""

    __slots__ = ("count", "open_runs", "partition", "replayed", "resume", "start", "state")

    def __init__(self, state: PartitionState, partition: int, resume: int,
                 open_runs: dict[bytes, int]) -> None:
        self.state, self.partition, self.resume, self.open_runs = \
            state, partition, resume, open_runs
        starts = [start for start in open_runs.values() if start < resume]
        self.start: int | None = min(starts) if starts else None
        self.count = 0
        self.replayed: list[Emit] = []

    def feed(self, record: Record) -> None:
        """One record of the rebuild (:func:`partition.replay`: its outputs are kept only to
        find the runs that finished during it)."""
        self.count += 1
        self.replayed += partition_module.replay(self.state, self.open_runs, record)


class Driver:
    """What a worker does around the core for each record of the partitions it owns, with
    the telemetry hooks and the heads table (over the engine's store) it was given."""

    def __init__(self, config: Config, hooks: EngineHooks, heads: Heads) -> None:
        self.config, self.hooks, self.heads = config, hooks, heads
        self.ticks = TickRule()

    # -- per record ---------------------------------------------------------------------

    def apply(self, state: PartitionState, record: Record, headers: Any = None
              ) -> Applied | None:
        """Apply ``record``, the partition's next; None if it needs nothing more (no output,
        not a tick), else what the engine must do (module doc, step 1). ``headers``: the
        record's Kafka headers, or a function returning them (called only when the record
        opens a run)."""
        key = record.key
        run_id = key.decode("utf-8", "replace") if key else ""
        assembler = state.assembler
        was_open = assembler.is_open(run_id)
        # PartitionState.apply inlined (one call less per record; test_engine_hooks.py holds
        # them equal): the partition's clock, then the core's one step
        now = record.time_ms
        if now is not None and now > state.clock_ms:
            state.clock_ms = now
        emits = step(assembler, record)
        opened = not was_open and assembler.is_open(run_id)
        hooks = self.hooks
        tracing = hooks.tracing
        if not emits and not opened and not assembler.sizes and not tracing.ended:
            # most records (a text delta): only counted, nothing to trace (the same as the
            # two calls below would do, without their cost; RunTracer.idle, read inline)
            hooks.metrics.records += 1
        else:
            hooks.metrics.record(emits, assembler.sizes)
            if opened and callable(headers):
                headers = headers()
            tracing.on_record(record.source.partition, run_id, opened, headers, emits)
            if emits:
                hooks.traced(emits)
        if opened or (not emits and assembler.early_cancels_waiting):
            # (Heads.applied writes a head only then: a run's start, a waiting cancel's)
            source = record.source
            self.heads.applied(state, key, source.partition, source.offset, opened, emits)
        if emits:
            return Applied(emits, finished_runs(emits), key == TICK)
        return _TICK if key == TICK else None

    def recorded(self, state: PartitionState, partition: int, applied: Applied) -> None:
        """After the record's outputs are delivered (or held by the same transaction): the
        ``done`` heads of the runs it finished; at a tick, forget what is over."""
        if applied.finished:
            self.heads.finished(state, partition, applied.finished)
        if applied.tick:  # by record time, so the same on every worker
            self.heads.forget_finished(state)

    def route(self, record: Record) -> control.Forward | Emit:
        """Where a control record goes (:func:`control.route`); a DLQ record is counted."""
        routed = control.route(record)
        if isinstance(routed, Emit):
            self.hooks.routed(routed)
        return routed

    def tick_due(self, now: float, behind: bool) -> bool:
        """Whether to write the tick that fell due now (:class:`TickRule`)."""
        return self.ticks.due(now, behind)

    # -- takeover -----------------------------------------------------------------------

    def takeover(self, partition: int, resume: int) -> Takeover:
        """A fresh state for ``partition`` at offset ``resume``: its finished runs registered
        from the heads, its open runs' records to read from :attr:`Takeover.start`."""
        state = PartitionState(Assembler(self.config.assemble), next_offset=resume)
        return Takeover(state, partition, resume, self.heads.load(state, partition))

    def rebuilt(self, takeover: Takeover, topic: str) -> list[Emit]:
        """The rebuild is read: log it; return the outputs of runs that finished during it
        (they lost their ``done`` head: published again, then :meth:`refinished`)."""
        partition, resume = takeover.partition, takeover.resume
        log.info("partition %d: rebuilt before offset %d from %d records; %d runs open",
                 partition, resume, takeover.count, takeover.state.assembler.open_runs,
                 extra=logs.where(topic, partition, resume))
        return partition_module.refinished(partition, takeover.replayed)

    def refinished(self, state: PartitionState, partition: int, outputs: Sequence[Emit]
                   ) -> None:
        """The outputs of :meth:`rebuilt` are delivered: record their runs as finished."""
        self.heads.finished(state, partition, finished_runs(outputs))
