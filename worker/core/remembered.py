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
* **Events after a run's end** (decision 0015). A gateway that did not stop reading when its
  run ended keeps sending the provider's events. Each is counted, not dead-lettered on its
  own: a run gets one DLQ record (``run_finished``, with ``late``: the count, the first and
  last seq and offsets), at the first tick at which its late events have been quiet for
  ``assemble_idle_timeout_s`` of record time (the rule that ends an idle run:
  :meth:`Remembered.summarise_quiet`), or when more than ``remember_finished_runs`` runs are
  being counted (the oldest is summed up at once). Once a run's summary is out (the last
  ``remember_finished_runs`` such runs are remembered), its later events are only counted
  (``late_after_summary``). A re-delivered late event (a seq already counted) counts nothing.
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
from worker.core.outputs import late_summary
from worker.core.settings import AssembleSettings

__all__ = ["LateEvents", "Remembered", "raw_or_empty"]


class Remembered:
    """The finished runs and the early cancels of one partition (the module docstring);
    ``ledger``: the partition's counters and DLQ records."""

    __slots__ = ("decided", "early_cancels", "finished", "late", "late_done", "ledger",
                 "read_to", "settings")

    def __init__(self, settings: AssembleSettings, ledger: Ledger) -> None:
        self.settings, self.ledger = settings, ledger
        #: Finished runs: run id -> (last applied seq, status), oldest first.
        self.finished: OrderedDict[str, tuple[int, RunStatus]] = OrderedDict()
        #: Cancels of runs not started yet: run id -> (record time, reason), oldest first.
        self.early_cancels: OrderedDict[str, tuple[int, str]] = OrderedDict()
        #: Events of finished runs, counted for their one summary (decision 0015): run id ->
        #: its count, least recently counted first; ``done`` once the summary is out.
        self.late: OrderedDict[str, LateEvents] = OrderedDict()
        #: The control records (partition, offset) whose decisions each run applied, open or
        #: finished (a finished run's go with it): a decision forwarded twice is a repeat.
        self.decided: dict[str, set[tuple[int, int]]] = {}
        #: Finished runs known from a ``done`` head: run id -> the offset before which every
        #: record of the run was applied (a decision has no seq: its offset tells a repeat).
        self.read_to: dict[str, int] = {}
        #: The runs whose summary is out: run id -> the last seq seen (oldest first).
        self.late_done: OrderedDict[str, int] = OrderedDict()

    def remember_finished(self, run_id: str, last_seq: int, status: RunStatus,
                          read_to: int | None = None,
                          decided: list[tuple[int, int]] | None = None) -> None:
        """Remember a finished run (the oldest beyond ``remember_finished_runs`` goes);
        ``read_to``: the events offset before which every record of the run was applied (a
        take-over's ``done`` head): a decision read again from below it is a repeat."""
        self.finished[run_id] = (last_seq, status)
        if decided:
            self.decided[run_id] = set(decided)
        if read_to is not None:
            self.read_to[run_id] = read_to
        elif run_id in self.read_to:
            del self.read_to[run_id]
        if len(self.finished) > self.settings.remember_finished_runs:
            gone, _ = self.finished.popitem(last=False)
            self.read_to.pop(gone, None)
            self.decided.pop(gone, None)

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
        finished run changes nothing; a decision, or any envelope of a run never seen, goes
        to the DLQ (``raw``: the input record, if any); a later event of a finished run is
        counted (:meth:`count_late`)."""
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
            read_to = self.read_to.get(envelope.run_id)
            offset = _offset(raw_or_empty(raw)[2])
            control = envelope.control
            if (read_to is not None and offset is not None and offset < read_to) or (
                    control is not None and control in self.decided.get(envelope.run_id, ())):
                self.ledger.stats["duplicates"] += 1  # read again after a take-over
                return []
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
        return self.count_late(envelope.run_id, envelope.seq, status, now_ms,
                               raw_or_empty(raw)[2])

    # -- events after a run's end (decision 0015; the module docstring) ------------------

    def count_late(self, run_id: str, seq: int, status: RunStatus, now_ms: int,
                   source: RecordSource | None) -> list[Emit]:
        """Count event ``seq`` of the finished run ``run_id``; the summaries it pushes out."""
        stats = self.ledger.stats
        summed = self.late_done.get(run_id)
        if summed is not None:  # its summary is out: counted, nothing sent
            if seq > summed:
                self.late_done[run_id] = seq
                stats["late_after_summary"] += 1
            else:
                stats["duplicates"] += 1
            return []
        late = self.late.get(run_id)
        if late is None:
            late = self.late[run_id] = LateEvents(status, seq, source)
        elif seq <= late.last_seq:
            stats["duplicates"] += 1
            return []
        else:
            self.late.move_to_end(run_id)
        late.last_seq, late.last, late.last_ms = seq, source, now_ms
        late.count += 1
        stats["late_events"] += 1
        emits: list[Emit] = []
        while len(self.late) > self.settings.remember_finished_runs:
            old_id, old = self.late.popitem(last=False)
            emits.append(self._summary(old_id, old))
        return emits

    def summarise_all(self) -> list[Emit]:
        """The summaries of every run whose late events are still being counted, now (the end
        of ``latch assemble``'s input, where no tick will come)."""
        late, self.late = self.late, OrderedDict()
        return [self._summary(run_id, each) for run_id, each in late.items()]

    def summarise_quiet(self, horizon_ms: int) -> list[Emit]:
        """The summaries of the runs whose last late event came at or before ``horizon_ms``."""
        emits: list[Emit] = []
        late = self.late
        while late:
            run_id, first = next(iter(late.items()))
            if first.last_ms > horizon_ms:
                break  # (least recently counted first)
            del late[run_id]
            emits.append(self._summary(run_id, first))
        return emits

    def _summary(self, run_id: str, late: LateEvents) -> Emit:
        """The summary of ``late`` (no longer counted); the run is remembered as summed up."""
        done = self.late_done
        done[run_id] = late.last_seq
        while len(done) > self.settings.remember_finished_runs:
            done.popitem(last=False)
        self.ledger.stats["late_summaries"] += 1
        return late_summary(run_id, late.status, late.count, late.first_seq, late.last_seq,
                            late.first, late.last)


class LateEvents:
    """The events that reached one finished run (:meth:`Remembered.count_late`)."""

    __slots__ = ("count", "first", "first_seq", "last", "last_ms", "last_seq", "status")

    def __init__(self, status: RunStatus, seq: int, source: RecordSource | None) -> None:
        self.status = status
        self.count = 0
        self.first_seq = self.last_seq = seq
        self.first: RecordSource | None = source
        self.last: RecordSource | None = source
        self.last_ms = 0


def _offset(source: RecordSource | None) -> int | None:
    """The events offset of an input record's source, if known."""
    if source is None:
        return None
    offset = source.get("offset") if isinstance(source, dict) else getattr(source, "offset", None)
    return offset if type(offset) is int else None


def raw_or_empty(raw: tuple[bytes | None, bytes, RecordSource | None] | None
                 ) -> tuple[bytes | None, bytes, RecordSource | None]:
    """The input record an envelope came from; none (``feed`` of a decoded envelope): empty."""
    return raw if raw is not None else (None, b"", None)
