"""Approvals in a partition (docs/policies.md, "Approvals"): the decisions on held calls, and the
runs whose final message waits for them.

A call that passes the latch and needs approval is held by its run (``Run.decide``), and is
decided here: by a person's decision (:meth:`Waiting.decision`: approve, edit or deny), or by
the approval timeout (:meth:`Waiting.expire`). A run whose stream ended while calls of it are
held leaves the streaming runs and waits
(:meth:`Waiting.park`, the ledger's ``park``): no provider event reaches it any more, and its
final message waits for the last decision. :meth:`Waiting.envelope` says what an envelope of
such a run comes to. A parked run keeps its place in the partition's "least recently active"
order, which the budgets end runs by (:meth:`Waiting.by_activity`): parking holds no slot.
"""

from __future__ import annotations

from collections import OrderedDict
from heapq import merge
from operator import attrgetter
from typing import Any

from worker.core import ending
from worker.core.approvers import ApproverRequest, Approvers, approver_refusal
from worker.core.call import Call, utf8_len
from worker.core.envelope import (
    Cancel,
    Decision,
    Envelope,
    Rejected,
    RunStart,
    StreamEnd,
    Tick,
    ToolResult,
)
from worker.core.ledger import Ledger
from worker.core.model import CallState, DlqReason, Emit, Reason, RunStatus
from worker.core.remembered import raw_or_empty
from worker.core.run import Run
from worker.core.settings import MAX_RECORD_BYTES

__all__ = ["Waiting"]

#: A run's number in the partition's "least recently active" order (``Run.active``).
_ACTIVE = attrgetter("active")
_OPEN = CallState.OPEN
_COMPLETE = CallState.ARGS_COMPLETE
_PENDING = CallState.PENDING_APPROVAL


class Waiting:
    """The runs of one partition that wait for approval decisions, oldest first (:attr:`runs`);
    ``streaming``: the partition's open streaming runs, which a parked run leaves;
    ``unpeeked``: the keys of those whose records skip the peek; ``ledger``: the partition's
    counters and DLQ records."""

    __slots__ = ("approvers", "decided", "ledger", "runs", "streaming", "unpeeked")

    def __init__(self, streaming: OrderedDict[str, Run], unpeeked: set[bytes],
                 ledger: Ledger, decided: dict[str, set[tuple[int, int]]]) -> None:
        self.streaming, self.unpeeked, self.ledger = streaming, unpeeked, ledger
        self.runs: OrderedDict[str, Run] = OrderedDict()
        #: The control records whose decisions each run applied (``Remembered.decided``).
        self.decided = decided
        #: The approvers' keys: a decision counts only signed by one (none listed: no
        #: decision counts). None is the pure core's "no check", for its unit tests only:
        #: the runtime always sets an :class:`Approvers` (governance/approvers.py).
        self.approvers: Approvers | None = None

    def decision(self, run: Run, decision: Decision, raw: Any) -> list[Emit]:
        """A person's decision on one of ``run``'s held calls: its outcome, or a DLQ record
        naming why not. A decision whose control record the run already applied or refused
        (forwarded twice: the faust engine forwards at least once) is a repeat: counted,
        nothing emitted (a forgery, refused for its signature, is not remembered: its
        ``control`` is the writer's to choose). With :attr:`approvers` set, a decision counts
        only when it is signed by an approver's key and the policy in force allows that
        approver to make it (core/approvers.py: who may send it, and what is trusted);
        otherwise it goes to the DLQ and the call stays held."""
        control = decision.control
        if control is not None and control in self.decided.get(run.run_id, ()):
            self.ledger.stats["duplicates"] += 1
            return []
        approvers = self.approvers
        refused = None if approvers is None else approvers.refusal(decision)
        if refused is None:  # (an approver's decision: applied or refused below, once)
            if control is not None:
                self.decided.setdefault(run.run_id, set()).add(control)
            refused = self._not_allowed(run, decision)
        if refused is None:
            done = _decide(run, decision.decision, decision.tool_call_id, decision.by,
                           decision.reason, decision.arguments)
            if not isinstance(done, tuple):
                return done
            refused = done
        reason, detail = refused
        return [self.ledger.reject(Rejected(reason, detail, run.run_id), *raw_or_empty(raw))]

    def _not_allowed(self, run: Run, decision: Decision) -> tuple[DlqReason, str] | None:
        """Why the policy in force does not let a (verified) approver make ``decision``, or
        None; the decision is then recorded on the held call it decides (its audit record
        names the approver). A call not held is left to :func:`_decide` to say why."""
        call = next((c for c in run.calls.values() if c.state is CallState.PENDING_APPROVAL
                     and c.tool_call_id == decision.tool_call_id), None)
        if call is None:
            return None
        approvers = self.approvers
        if approvers is not None:
            latch = run.latch
            key = (call.name if call.tool is None else call.tool) or ""
            # the tool as the call's own request has it: its one name, its kind (identity.py)
            attributes = latch.identities.attributes(key, latch.attributes.get(key, {}))
            refused = approver_refusal(self.ledger.policy, ApproverRequest(
                decision.by, approvers.groups.get(decision.by, ()), decision.decision,
                latch.tenant, call.name or key, attributes,
                call.arguments if call.parsed else call.text, latch.provider, run.run_id))
            if refused is not None:
                return refused
        signature = decision.signature
        call.approval = (decision.decision, decision.by,
                         None if signature is None or approvers is None else signature.key)
        return None

    def envelope(self, run: Run, envelope: Envelope, now_ms: int, raw: Any) -> list[Emit]:
        """An envelope of a run whose stream ended and whose calls wait for approval: a
        decision applies; a cancel ends it (its held calls are cancelled); a re-delivered
        envelope or a ``stream.end`` changes nothing; any later envelope goes to the DLQ."""
        if isinstance(envelope, Decision):
            return self.decision(run, envelope, raw)
        if isinstance(envelope, Cancel):
            run.last_ms = now_ms
            return run.finish(RunStatus.CANCELLED, Reason.CANCELLED, envelope.reason)
        if isinstance(envelope, (Tick, ToolResult)):  # (never: the assembler takes them)
            return []
        if envelope.seq <= run.last_seq or isinstance(envelope, StreamEnd):
            self.ledger.stats["duplicates" if envelope.seq <= run.last_seq
                              else "ignored_after_end"] += 1
            return []
        if isinstance(envelope, RunStart):
            reject = Rejected(DlqReason.DUPLICATE_RUN_START, "run already started", run.run_id)
        else:
            reject = Rejected(DlqReason.RUN_FINISHED, "the run's stream ended; its calls wait "
                              "for approval", run.run_id)
        return [self.ledger.reject(reject, *raw_or_empty(raw))]

    def expire(self, run: Run, now_ms: int, limit_ms: float) -> list[Emit]:
        """Fail ``run``'s held calls that waited ``limit_ms`` of record time
        (``approval_timeout``): their outcomes, and the final message after the last one."""
        late = [c for c in run.calls.values()
                if c.state is _PENDING and now_ms - c.held_ms >= limit_ms]
        for call in late:
            call.fail(Reason.APPROVAL_TIMEOUT, f"no approval decision within {limit_ms / 1000:g} s")
            run.latch.release()
        self.ledger.stats["approvals_timed_out"] += len(late)
        return _decided(run, late) if late else []

    def park(self, run: Run) -> None:
        """``run``'s stream ended with calls waiting for approval: it leaves the streaming
        runs, and waits (``Ledger.park``)."""
        del self.streaming[run.run_id]
        self.unpeeked.discard(run.key)
        self.runs[run.run_id] = run

    # -- the budgets' order (assembler's module docstring, "Memory budgets") ----------------

    def least_active(self) -> Run:
        """The least recently active open run (there must be one, streaming or parked): the
        first streaming run or the first parked one, whichever's last stream envelope came
        first (``Run.active``). A parked run keeps its place: parking spares it nothing."""
        streaming = next(iter(self.streaming.values()), None)
        if not self.runs:  # nearly always
            assert streaming is not None
            return streaming
        parked = next(iter(self.runs.values()))
        if streaming is not None and streaming.active < parked.active:
            return streaming
        return parked

    def by_activity(self) -> list[Run]:
        """The open runs, least recently active first. The streaming runs are in that order,
        and so are the parked ones: a run parks at the envelope that ends its stream (its
        last), and nothing makes it active again (a decision or a cancel is not its stream),
        so the two are merged by ``Run.active``."""
        if not self.runs:
            return list(self.streaming.values())
        return list(merge(self.runs.values(), self.streaming.values(), key=_ACTIVE))


def _decide(run: Run, kind: str, tool_call_id: str, by: str, why: str,
            arguments: str | None) -> list[Emit] | tuple[DlqReason, str]:
    """Apply a person's decision on ``run``'s held call ``tool_call_id``: its outcome (and the
    final message, after the last one), or why the decision goes to the DLQ instead (no such
    call; not waiting; already decided)."""
    found = [c for c in run.calls.values() if c.tool_call_id == tool_call_id]
    call = next((c for c in found if c.state is _PENDING), None)
    if call is None:
        if not found:
            return DlqReason.UNKNOWN_CALL, "the run has no call with this id"
        if all(c.state is _OPEN or c.state is _COMPLETE for c in found):
            return DlqReason.CALL_NOT_PENDING, "the call is not waiting for approval"
        state = next(c.state for c in found if c.state is not _OPEN)
        return DlqReason.CALL_ALREADY_DECIDED, f"the call is already {state}"
    ledger = run.ledger
    if kind == "approve":  # (decided against the policy in force now: Latch.approve)
        run.latch.approve(call, ledger.policy)
    elif kind == "edit":
        before = call.nbytes
        run.latch.edit(call, arguments or "", run.out.committed_size, ledger.policy)
        text = call.text
        call.nbytes = 0 if text is None else utf8_len(text)
        run.nbytes += call.nbytes - before
        ledger.held += call.nbytes - before
    else:
        call.fail(Reason.APPROVAL_DENIED, f"denied by {by}: {why}")
        run.latch.release()
    ledger.stats[f"approvals_{kind}"] += 1
    return _decided(run, [call])


def _decided(run: Run, calls: list[Call]) -> list[Emit]:
    """The outcomes of ``run``'s held calls just decided; the final message after the last
    one, if the run's stream has ended (it waits: ``Run.waiting``)."""
    run.held -= len(calls)
    emits = ending.outcomes(run, calls)
    waiting = run.waiting
    if waiting is None or run.held:
        return emits
    ordered = sorted(run.calls.values(), key=Call.sort_key)
    large = ending.final_bound(run, ordered) > MAX_RECORD_BYTES
    return emits + ending.conclude(run, waiting, ordered, large)
