"""What a partition remembers of runs that are not open.

Two bounded memories, kept by record time only, and what an envelope of a run that is not
open comes to (:meth:`Remembered.orphan`):

* **Finished runs** (``remember_finished_runs``, oldest forgotten first): a run's last applied
  ``seq`` and its status, so that a re-delivered envelope of a finished run is recognised and
  ignored, and a late one goes to the DLQ.
* **A cancel before its run.start.** The gateway's envelopes and the forwarded cancels reach
  a run's partition by different paths, so a user's cancel may be written before the run's
  ``run.start``. It is remembered (``remember_early_cancels``, oldest forgotten first) for
  ``early_cancel_ttl_s`` of record time, and a run that starts within it is cancelled at
  once (:meth:`Remembered.early_cancel`): the same outcome as a cancel right after its
  ``run.start``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from worker.core.envelope import (
    Cancel,
    Decision,
    ProviderEvent,
    RecordSource,
    Rejected,
    StreamEnd,
    StreamError,
)
from worker.core.ledger import Ledger
from worker.core.model import DlqReason, Emit, RunStatus
from worker.core.settings import AssembleSettings

__all__ = ["Remembered", "raw_or_empty"]


class Remembered:
    """The finished runs and the early cancels of one partition (the module docstring);
    ``ledger``: the partition's counters and DLQ records."""

    __slots__ = ("early_cancels", "finished", "ledger", "settings")

    def __init__(self, settings: AssembleSettings, ledger: Ledger) -> None:
        self.settings, self.ledger = settings, ledger
        #: Finished runs: run id -> (last applied seq, status), oldest first.
        self.finished: OrderedDict[str, tuple[int, RunStatus]] = OrderedDict()
        #: Cancels of runs not started yet: run id -> (record time, reason), oldest first.
        self.early_cancels: OrderedDict[str, tuple[int, str]] = OrderedDict()

    def remember_finished(self, run_id: str, last_seq: int, status: RunStatus) -> None:
        """Remember a finished run (the oldest beyond ``remember_finished_runs`` goes)."""
        self.finished[run_id] = (last_seq, status)
        if len(self.finished) > self.settings.remember_finished_runs:
            self.finished.popitem(last=False)

    def remember_cancel(self, cancel: Cancel, now_ms: int) -> None:
        """Remember a cancel of a run not started (yet) at record time ``now_ms``."""
        self.early_cancels.pop(cancel.run_id, None)
        self.early_cancels[cancel.run_id] = (now_ms, cancel.reason)
        self.forget_early_cancels(now_ms)
        while len(self.early_cancels) > self.settings.remember_early_cancels:
            self.early_cancels.popitem(last=False)
            self.ledger.stats["early_cancels_forgotten"] += 1
        self.ledger.stats["early_cancels_remembered"] += 1

    def forget_early_cancels(self, now_ms: int) -> None:
        """Drop the remembered cancels older than ``early_cancel_ttl_s`` at ``now_ms``."""
        ttl_ms = self.settings.early_cancel_ttl_s * 1000
        while self.early_cancels:
            at = next(iter(self.early_cancels.values()))[0]
            if now_ms - at <= ttl_ms:
                break
            self.early_cancels.popitem(last=False)
            self.ledger.stats["early_cancels_expired"] += 1

    def early_cancel(self, run_id: str, now_ms: int) -> str | None:
        """The reason of a remembered, unexpired cancel of ``run_id`` (forgotten once used)."""
        if not self.early_cancels:
            return None
        self.forget_early_cancels(now_ms)
        found = self.early_cancels.pop(run_id, None)
        return None if found is None else found[1]

    def orphan(self, envelope: Cancel | Decision | ProviderEvent | StreamEnd | StreamError,
               raw: Any, now_ms: int) -> list[Emit]:
        """An envelope (not a ``run.start``) of a run that is not open: a cancel of a run
        never seen is remembered; a re-delivered envelope, a cancel or a ``stream.end`` of a
        finished run changes nothing; anything else goes to the DLQ (``raw``: the input
        record, if any)."""
        finished = self.finished.get(envelope.run_id)
        if finished is None and isinstance(envelope, Cancel):
            self.remember_cancel(envelope, now_ms)
            return []
        reject = self.ledger.reject
        if finished is None:
            rejected = Rejected(DlqReason.UNKNOWN_RUN, "no run.start for this run",
                                envelope.run_id)
            return [reject(rejected, *raw_or_empty(raw))]
        last_seq, status = finished
        if isinstance(envelope, Decision):  # every call of a finished run has its outcome
            rejected = Rejected(DlqReason.CALL_ALREADY_DECIDED, f"the run ended as {status}",
                                envelope.run_id)
            return [reject(rejected, *raw_or_empty(raw))]
        if isinstance(envelope, Cancel) or status is RunStatus.CANCELLED:
            self.ledger.stats["ignored_after_end"] += 1
            return []
        if envelope.seq <= last_seq or isinstance(envelope, StreamEnd):
            self.ledger.stats["duplicates" if envelope.seq <= last_seq
                              else "ignored_after_end"] += 1
            return []
        rejected = Rejected(DlqReason.RUN_FINISHED, f"the run ended as {status}",
                            envelope.run_id)
        return [reject(rejected, *raw_or_empty(raw))]


def raw_or_empty(raw: tuple[bytes | None, bytes, RecordSource | None] | None
                 ) -> tuple[bytes | None, bytes, RecordSource | None]:
    """The input record an envelope came from; none (``feed`` of a decoded envelope): empty."""
    return raw if raw is not None else (None, b"", None)
