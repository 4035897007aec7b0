"""The partition driver one record at a time, for the runtime's unit tests.

:meth:`Driver.apply_all` returns what the engine must do for a batch (:class:`Work`); a
test that feeds records one by one and reads what they emitted uses :func:`apply`, whose
:class:`Applied` is the work of one record as emits (the outputs' emits, in order; an
output over its topic's limit shows as the emit it replaces).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from worker.core import Emit
from worker.runtime.driver import Driver
from worker.runtime.partition import TICK, PartitionState, finished_runs
from worker.runtime.step import Record


class Applied(NamedTuple):
    """What one applied record emitted (with a held run's records it let go, before it)."""

    emits: list[Emit]
    #: The runs these outputs finish (their ``done`` heads are in the work's heads).
    finished: list[str]
    #: The record is a tick.
    tick: bool

    @property
    def confirm(self) -> bool:
        """Whether a run finished: its ``done`` head waits for the outputs' delivery."""
        return bool(self.finished)


def apply(driver: Driver, state: PartitionState, record: Record, headers: Any = None
          ) -> Applied | None:
    """Apply ``record``, the partition's next: None if it emitted nothing and is no tick."""
    work = driver.apply_all({record.source.partition: state}, (record,), (headers,))
    emits = [out.emit for out in work.out]
    tick = record.key == TICK
    if not emits and not tick:
        return None
    return Applied(emits, finished_runs(emits), tick)
