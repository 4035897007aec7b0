"""A run's end: every call its one outcome, then the run its one final message, within the
bounds of an output record; and the ``run.ended`` record that tells the gateway Latch ended a
run whose stream may still be running (decision 0015).

Every way a run ends (the provider's own end, ``stream.end``, a stream error or a provider
error, a protocol break, a cancel, an idle timeout, a budget: ``assembler``'s module
docstring) comes to :func:`finish` through ``Run.finish``, so each call gets exactly one
outcome and the run one final message. A run whose calls still wait for approval when its
stream ends parks instead (``Ledger.park``): its final message comes with the last decision
(``core/waiting.py`` calls :func:`conclude`).

This module alone builds a final message (``Topic.FINAL``; it alone asks an adapter for its
``Adapter.final``) and a ``run.ended`` record; ``tests/test_architecture.py`` holds it so.
``core/outputs.py`` shapes the records of single calls (committed calls, error results, audit
records, pending records); the run's whole message is made here.

Outcomes
========

One kind of outcome per ``tool_call_id`` (docs/contract.md, "Choices the contract leaves
open"; :func:`outcomes`): among calls that share an id, once one of them has its record out
(block-level early commit, or an early error) the others get none; until then, each fails
``duplicate_call_id``.

Bounds
======

No final message is larger than ``settings.MAX_RECORD_BYTES``. At a run's end, one that could
be larger (:func:`final_bound`) is measured: a run ending normally whose final message would
not fit ends ``failed`` instead, its undecided calls ``record_too_large`` (:func:`final_over`);
whatever the end, a final message that does not fit drops its message's content and its
``choices``, then its ``outcomes``, and lists what it dropped in ``dropped`` (:func:`bounded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orjson import dumps

from worker.core.call import Call
from worker.core.model import ABORT_REASONS, CallState, Emit, Reason, RunStatus, Topic
from worker.core.ops import CallView
from worker.core.outputs import Outputs, events_span, id_counts, idempotency_key
from worker.core.settings import CHOICE_BYTES, MAX_RECORD_BYTES, RECORD_OVERHEAD

if TYPE_CHECKING:
    from worker.core.run import Run

__all__ = ["bounded", "conclude", "final_bound", "finish", "outcomes", "run_ended"]

_COMPLETE = CallState.ARGS_COMPLETE
_PENDING = CallState.PENDING_APPROVAL
_UNWRAPPED = CallState.UNWRAPPED
#: Bytes of a call's entries in a final message besides its text, id and name, at most.
_CALL_FIELDS_BYTES = 512
#: The fields a final message that must drop its message keeps of it (short strings only),
#: and the fields it empties (an array becomes [], anything else null).
_MESSAGE_LABELS = ("role", "id", "model", "status", "stop_reason")
_MESSAGE_CONTENT = ("content", "parts", "output")


def finish(run: Run, status: RunStatus, reason: Reason | None, detail: str) -> list[Emit]:
    """End ``run`` (``Run.finish``, which closed its open calls): every call gets its outcome,
    then the final message (:func:`conclude`), unless calls of it wait for approval: then the
    run parks, and its final message waits for their decisions. ``reason`` None: the run
    ended normally, and its complete calls are decided; else every call not yet decided fails
    ``reason``."""
    ledger = run.ledger
    calls = sorted(run.calls.values(), key=Call.sort_key)
    large = final_bound(run, calls) > MAX_RECORD_BYTES  # (nearly never)
    if large and reason is None and final_over(run, calls, status):
        # Nothing commits whose final message cannot be sent: the run fails instead.
        ledger.stats["runs_over_record_bytes"] += 1
        status, reason = RunStatus.FAILED, Reason.RECORD_TOO_LARGE
        detail = (f"the run's final message would be larger than an output record may be "
                  f"({MAX_RECORD_BYTES} bytes); the run was ended")
    for call in calls:
        if call.state is _COMPLETE and reason is None:
            run.decide(call)
        elif call.state is _PENDING and reason is None:
            continue  # (it waits for its decision, and the final message with it)
        else:  # (a decided call keeps its outcome: TRANSITIONS)
            if call.fail(reason or Reason.STREAM_ERROR, detail) and call.held:
                run.latch.release()
    # Ended by Latch while its stream may still run: the gateway is told first.
    emits = (run_ended(run, status, reason) if reason in ABORT_REASONS and reason is not None
             else [])
    emits += outcomes(run, calls)
    run.held = sum(1 for c in calls if c.state is _PENDING) if run.held else 0
    if run.held:  # the final waits for the last decision (docs/policies.md, "Approvals")
        if run.waiting is None:
            run.waiting = status
            ledger.stats["runs_waiting_for_approval"] += 1
            if ledger.park is not None:
                ledger.park(run)
        return emits
    return emits + conclude(run, status, calls, large)


def conclude(run: Run, status: RunStatus, calls: list[Call], large: bool) -> list[Emit]:
    """The run's final message, once every call has its outcome (``calls``, in provider
    order; ``large``: it may be too large, :func:`final_bound`); the run is over: its bytes
    are released and the partition told (``Ledger.forget``)."""
    ledger = run.ledger
    final = final_message(run, calls, status)
    if large:  # measured, and made smaller if it must be (bounded)
        smaller = bounded(final)
        if smaller is not final:
            ledger.stats["finals_dropped_content"] += 1
        final = smaller
    run.status, run.waiting = status, None
    ledger.held -= run.nbytes
    ledger.stats[f"runs_{status}"] += 1
    ledger.forget(run)
    return [final]


def run_ended(run: Run, status: RunStatus, reason: Reason) -> list[Emit]:
    """The run's one ``run.ended`` record (schemas/run-ended.schema.json), unless it is out
    already: Latch ended it for ``reason`` while its stream may still be running. Its events
    span from where its ``run.start`` was read to the record at which it ended (its own,
    another run's that made room, or a tick); either end null when unknown (``latch
    assemble``)."""
    if run.ended:
        return []
    run.ended = True
    ledger = run.ledger
    ledger.stats["runs_ended_records"] += 1
    value = {**run.out.head(), "type": "run.ended", "status": str(status),
             "reason": str(reason), "last_seq": run.last_seq,
             "events": events_span(run.first, ledger.at),
             "idempotency_key": idempotency_key(run.run_id, "ended")}
    return [Emit(Topic.RUN_ENDED, run.run_id, value)]


def outcomes(run: Run, batch: list[Call]) -> list[Emit]:
    """The records of ``batch``'s decided calls not yet emitted, one kind of outcome per
    ``tool_call_id`` (module docstring). Among calls that share an id: once one of them has
    its record out, the others get none (the final message lists them ``failed``,
    ``duplicate_call_id``; counted in ``reused_ids_suppressed``); until then, each fails
    ``duplicate_call_id``, whatever else ended it, under a key of its own."""
    calls = run.calls
    if len(calls) > 1:
        ids = id_counts(calls.values())
        answered = {c.tool_call_id for c in calls.values() if c.emitted}
        for call in batch:
            if call.emitted or call.state is _UNWRAPPED or ids.get(call.tool_call_id, 0) < 2:
                continue
            if call.tool_call_id in answered:
                call.duplicate("another call of this run with the same id already has its "
                               "outcome; this one gets no record")
                call.emitted = True
                run.ledger.stats["reused_ids_suppressed"] += 1
            elif call.reason is not Reason.DUPLICATE_CALL_ID:
                call.duplicate("another call of this run has the same id")
    return run.out.outcomes(batch, calls.values())


# -- the final message ------------------------------------------------------------------------


def final_message(run: Run, calls: Sequence[Call], status: RunStatus) -> Emit:
    """The run's canonical assistant message (its adapter's ``final``) and each call's
    outcome."""
    out = run.out
    calls = [c for c in calls if c.state is not _UNWRAPPED]
    views = [CallView(c.key, c.tool_call_id, c.name or "unknown",
                      c.text if c.text is not None else "".join(c.parts),
                      c.arguments, c.parsed, c.parent, out.dropped(c), c.kind) for c in calls]
    message, choices = run.adapter.final(views)
    value: dict[str, Any] = {**out.head(), "status": str(status), "message": message}
    if choices is not None:
        value["choices"] = choices
    value["outcomes"] = [_outcome(out, c) for c in calls]
    value["idempotency_key"] = idempotency_key(run.run_id, "final")
    return Emit(Topic.FINAL, run.run_id, value)


def _outcome(out: Outputs, call: Call) -> dict[str, Any]:
    """``call``'s entry in the final message's ``outcomes``."""
    outcome = {"tool_call_id": call.tool_call_id, "name": call.name or "unknown",
               **out.where(call), "state": str(call.state)}
    if call.reason is not None:
        outcome["reason"] = str(call.reason)
    if out.dropped(call):
        outcome["dropped"] = True
    return outcome


# -- bounds (module docstring) ------------------------------------------------------------------


def final_bound(run: Run, calls: list[Call]) -> int:
    """At most the bytes of the run's final message: 6 bytes (the longest JSON escape) a
    byte of the events its text came from (``text_bytes``; a kept value written back is
    never longer than 4.5 bytes a byte of its event) and a character of each call's text,
    id and name (twice: in the message and in ``outcomes``), each choice's own fields, and
    the rest of a record."""
    bound = 6 * run.text_bytes + run.rules.choices * CHOICE_BYTES + RECORD_OVERHEAD
    for call in calls:
        text = call.text
        chars = len(text) if text is not None else sum(len(p) for p in call.parts)
        named = len(call.call_id or call.key) + len(call.name or "unknown")
        bound += 6 * (chars + 2 * named) + _CALL_FIELDS_BYTES
    return bound


def final_over(run: Run, calls: list[Call], status: RunStatus) -> bool:
    """Whether the run's final message, written now with its calls not yet decided, is
    larger than an output record may be, less what deciding them may add to it (a
    ``reason`` per outcome)."""
    final = final_message(run, calls, status)
    return len(dumps(final.value)) + _CALL_FIELDS_BYTES * len(calls) > MAX_RECORD_BYTES


def bounded(final: Emit) -> Emit:
    """``final`` when it is at most ``MAX_RECORD_BYTES`` long. Else the same final with
    its message's content and its ``choices`` dropped (the message keeps its role, ids,
    model and status; its content, parts or output are emptied), then, if that is still too
    long, its ``outcomes`` too (each call has its own record), with ``dropped`` listing
    what was left out. The head of a record is bounded, so what is left always fits."""
    value = final.value
    if len(dumps(value)) <= MAX_RECORD_BYTES:
        return final
    message = value["message"]
    kept = {k: message[k] for k in _MESSAGE_LABELS
            if isinstance(message.get(k), str) and len(message[k]) <= 256}
    for k in _MESSAGE_CONTENT:
        if k in message:
            kept[k] = [] if isinstance(message[k], list) else None
    dropped = ["message"]
    smaller = {k: v for k, v in value.items() if k != "choices"}
    if len(smaller) < len(value):
        dropped.append("choices")
    smaller["message"] = kept
    smaller["dropped"] = dropped
    if len(dumps(smaller)) > MAX_RECORD_BYTES:
        smaller["outcomes"] = []
        dropped.append("outcomes")
    return Emit(Topic.FINAL, final.key, smaller)
