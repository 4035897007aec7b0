"""What a worker owns of its topics, the same for both engines (the partition driver's,
:mod:`worker.runtime.driver`).

Engine-neutral (no I/O, no faust, no Kafka client). The engine says what the group gave and
took (:meth:`Assignment.assigned`, :meth:`Assignment.revoked`), installs the states it
rebuilt (:attr:`Assignment.partitions`) and moves the control partitions' forwarded offsets
(:attr:`Assignment.control_next`); the assignment keeps the rest: readiness and spans
(through :class:`~worker.runtime.hooks.EngineHooks`), what a revoked partition drops, the
log line of an assignment, the partition gauges, and whether the control backlog is read
(the tick rule's input, :func:`worker.runtime.driver.control_behind`; and readiness,
:meth:`Assignment.control_forwarding`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from worker.runtime.hooks import EngineHooks
from worker.runtime.observability.metrics import PartitionView
from worker.runtime.partition import PartitionState

__all__ = ["Assignment", "control_behind"]

log = logging.getLogger("latch.worker")


def control_behind(forwarded: Mapping[int, int], ends: Mapping[int, int | None]) -> bool:
    """Whether a control partition has records in the log not yet forwarded:
    ``forwarded``, the next offset to forward of each owned partition; ``ends``, its end
    offset as the engine last learnt it (None or missing: unknown, so behind)."""
    for partition, next_offset in forwarded.items():
        end = ends.get(partition)
        if end is None or end < 0 or next_offset < end:
            return True
    return False


class Assignment:
    """The events partitions this worker owns (their states) and its control partitions
    (the next offset to forward of each)."""

    __slots__ = ("control_next", "hooks", "partitions")

    def __init__(self, hooks: EngineHooks) -> None:
        self.hooks = hooks
        #: Each owned events partition's state, once the engine has rebuilt it.
        self.partitions: dict[int, PartitionState] = {}
        #: The next offset to forward of each control partition this worker owns (once the
        #: engine has read where to resume).
        self.control_next: dict[int, int] = {}

    def assigned(self, events: Collection[int], control: Collection[int] = ()) -> None:
        """The group gave this worker these events and control partitions (the whole
        assignment): readiness waits for the events partitions' rebuilds and for the control
        partitions to be forwarded up to their ends (:meth:`control_behind`)."""
        self.hooks.assigned(events, control)

    @staticmethod
    def log_assigned(events: Collection[int], dropped: int = 0) -> None:
        """Log the events partitions owned (the line tests and tools read); ``dropped``: the
        heads of partitions owned elsewhere that the engine let go."""
        log.info("events partitions assigned: %s%s", sorted(events),
                 f" (dropped {dropped} heads of partitions owned elsewhere)" if dropped else "")

    def revoked(self, events: Collection[int], control: Collection[int]) -> None:
        """These partitions were taken away: not ready until the next assignment, their runs'
        spans end, their states and forwarded offsets go (the next owner rebuilds them)."""
        self.hooks.revoked(events, control)
        for partition in events:
            self.partitions.pop(partition, None)
        for partition in control:
            self.control_next.pop(partition, None)

    def control_behind(self, ends: Mapping[int, int | None],
                       owned: Collection[int] | None = None) -> bool:
        """Whether an owned control partition has records in the log not yet forwarded:
        ``ends``, their end offsets as the engine last learnt them; ``owned``, the control
        partitions owned (default: those with a forwarded offset; one without is behind)."""
        return control_behind(self._forwarded(owned), ends)

    def control_forwarding(self, ends: Mapping[int, int | None],
                           owned: Collection[int] | None = None,
                           read: Mapping[int, int] | None = None) -> None:
        """Report (readiness) as forwarding each owned control partition forwarded up to its
        end, ``ends`` and ``owned`` as for :meth:`control_behind`; ``read``: where the engine
        has read a partition to, past what it forwarded (a transaction's commit marker takes
        an offset and is never a record). The engine calls this when every record it
        forwarded is in the events log."""
        read = read or {}
        self.hooks.health.forwarding([
            p for p, next_offset in self._forwarded(owned).items()
            if not control_behind({p: max(next_offset, read.get(p, -1))}, ends)])

    def _forwarded(self, owned: Collection[int] | None) -> Mapping[int, int]:
        return self.control_next if owned is None else {
            p: self.control_next.get(p, -1) for p in owned}

    def views(self, lag_of: Callable[[int, PartitionState], int | None]
              ) -> list[PartitionView]:
        """The owned partitions for the gauges (:meth:`EngineHooks.views`; any thread)."""
        return self.hooks.views(self.partitions, lag_of)
