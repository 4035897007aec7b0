"""Values that cross the core's boundary: states, reasons, and the records it emits.

The state machine of one tool call
==================================

A call is born ``OPEN`` when a provider event names it (a chat ``tool_calls`` entry, an
Anthropic ``tool_use`` block, a Responses ``function_call`` item). While it is open its
argument text is opaque: fragments are appended, never parsed (contract rule 1).

It becomes ``ARGS_COMPLETE`` when the provider says no more text will come for it: at the
end of the stream for every call, or at the end of its block for block-level signals
(Anthropic ``content_block_stop``, Responses ``response.output_item.done``). Only then is
the text parsed and checked by the completion latch, and the call ends in exactly one of
three terminal states:

* ``COMMITTED``: the latch held; the call goes to the runner topic.
* ``FAILED``: a rule broke (a :class:`Reason` other than ``cancelled``).
* ``CANCELLED``: a cancel marker reached the run first.

One state is not terminal and not streaming: ``PENDING_APPROVAL``, a call the latch held but
that needs a person's decision first (docs/policies.md, "Approvals"). It is published to the pending
topic; ``approve`` commits it, ``edit`` moves it back to ``ARGS_COMPLETE`` for the latch to
decide its new arguments (and never hold them again), and a denial, a timeout or the end of its
run fails (or cancels) it.

One more terminal state has no outcome of its own: ``UNWRAPPED``, a ``multi_tool_use.parallel``
wrapper whose text was read as ``tool_uses[]`` and replaced by one ``ARGS_COMPLETE`` call per
entry (docs/providers.md, "The parallel wrapper"); those calls get the outcomes, the wrapper none.

A call may also fail or be cancelled while still ``OPEN`` (oversize text, too many calls in
flight, a stream error, a cancel). Terminal states have no way out: whatever arrives for a
terminal call changes nothing, which is what makes a re-delivered or late event harmless. The
one exception is ``duplicate_call_id``: a failed or cancelled call whose id another call of
the run shares fails ``duplicate_call_id`` instead, so that one id gets one kind of outcome
(``ending.outcomes``); a committed call is never taken back.

``TRANSITIONS`` is the whole machine, in the manner of h11's ``EVENT_TRIGGERED_TRANSITIONS``
and h2's ``_transitions``: for every state and every :class:`CallEvent` (what happens to a
call) it gives the state the event moves the call to, or None when the event changes nothing
there. It is total (tests/core/property/test_model.py), and :meth:`Call.step
<worker.core.call.Call.step>` is the only way a call changes state: an event the table
refuses is a defined outcome (the call keeps its state), never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class CallState(StrEnum):
    OPEN = "open"
    ARGS_COMPLETE = "args_complete"
    COMMITTED = "committed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNWRAPPED = "unwrapped"
    #: The latch held, and the call waits for a person's decision (docs/policies.md, "Approvals"):
    #: it is on the pending topic, not the committed one, until approved, edited, denied or
    #: timed out.
    PENDING_APPROVAL = "pending_approval"


TERMINAL: frozenset[CallState] = frozenset(
    {CallState.COMMITTED, CallState.FAILED, CallState.CANCELLED, CallState.UNWRAPPED}
)


class CallEvent(StrEnum):
    """What happens to a call: the column of ``TRANSITIONS``."""

    #: The provider says no more text will come (its block ended, or the stream did).
    CLOSE = "close"
    #: The completion latch held.
    COMMIT = "commit"
    #: A rule broke (any :class:`Reason` but ``cancelled``).
    FAIL = "fail"
    #: A cancel reached the run first.
    CANCEL = "cancel"
    #: A parallel wrapper was read and replaced by its entries.
    UNWRAP = "unwrap"
    #: Another call of the run has the same id (``duplicate_call_id``, after the fact).
    DUPLICATE = "duplicate"
    #: The latch held, and the call needs approval before it commits.
    HOLD = "hold"
    #: A person approved a held call as it is.
    APPROVE = "approve"
    #: A person gave a held call new arguments: the latch decides it again.
    EDIT = "edit"


_OPEN, _COMPLETE = CallState.OPEN, CallState.ARGS_COMPLETE
_FAILED, _CANCELLED = CallState.FAILED, CallState.CANCELLED
_PENDING = CallState.PENDING_APPROVAL

#: (state, event) -> the state the event moves a call to; None: the event changes nothing.
#: Total: every pair is here (tests/core/property/test_model.py).
TRANSITIONS: dict[tuple[CallState, CallEvent], CallState | None] = {
    (_OPEN, CallEvent.CLOSE): _COMPLETE,
    (_OPEN, CallEvent.COMMIT): None,  # (only a call whose text is complete is decided)
    (_OPEN, CallEvent.FAIL): _FAILED,
    (_OPEN, CallEvent.CANCEL): _CANCELLED,
    (_OPEN, CallEvent.UNWRAP): None,
    (_OPEN, CallEvent.DUPLICATE): None,  # (an outcome is given to terminal calls only)
    (_COMPLETE, CallEvent.CLOSE): None,
    (_COMPLETE, CallEvent.COMMIT): CallState.COMMITTED,
    (_COMPLETE, CallEvent.FAIL): _FAILED,
    (_COMPLETE, CallEvent.CANCEL): _CANCELLED,
    (_COMPLETE, CallEvent.UNWRAP): CallState.UNWRAPPED,
    (_COMPLETE, CallEvent.DUPLICATE): None,
    (_OPEN, CallEvent.HOLD): None,
    (_OPEN, CallEvent.APPROVE): None,
    (_OPEN, CallEvent.EDIT): None,
    (_COMPLETE, CallEvent.HOLD): _PENDING,
    (_COMPLETE, CallEvent.APPROVE): None,  # (only a held call is approved)
    (_COMPLETE, CallEvent.EDIT): None,
    # Waiting for a decision: approved, it commits; edited, it is decided again; denied,
    # timed out, or its run ended first, it fails (or is cancelled).
    (_PENDING, CallEvent.CLOSE): None,
    (_PENDING, CallEvent.COMMIT): None,
    (_PENDING, CallEvent.FAIL): _FAILED,
    (_PENDING, CallEvent.CANCEL): _CANCELLED,
    (_PENDING, CallEvent.UNWRAP): None,
    (_PENDING, CallEvent.DUPLICATE): None,
    (_PENDING, CallEvent.HOLD): None,
    (_PENDING, CallEvent.APPROVE): CallState.COMMITTED,
    (_PENDING, CallEvent.EDIT): _COMPLETE,
    # Terminal states: nothing moves them, but for ``duplicate_call_id`` (below).
    **{(state, event): None
       for state in (CallState.COMMITTED, CallState.UNWRAPPED, _FAILED, _CANCELLED)
       for event in CallEvent},
    (_FAILED, CallEvent.DUPLICATE): _FAILED,
    (_CANCELLED, CallEvent.DUPLICATE): _FAILED,
}


class Reason(StrEnum):
    """Why a call did not commit (contract: "Reason codes")."""

    INVALID_JSON = "invalid_json"
    ARGUMENTS_NOT_OBJECT = "arguments_not_object"
    ARGUMENTS_EXCEED_MAX_BYTES = "arguments_exceed_max_bytes"
    TOO_MANY_TOOL_CALLS = "too_many_tool_calls"
    MISSING_ID_OR_NAME = "missing_id_or_name"
    UNKNOWN_TOOL = "unknown_tool"
    SCHEMA_INVALID = "schema_invalid"
    BUDGET_EXCEEDED = "budget_exceeded"
    TRUNCATED = "truncated"
    STREAM_ERROR = "stream_error"
    UPSTREAM_ERROR = "upstream_error"
    CANCELLED = "cancelled"
    ASSEMBLE_IDLE_TIMEOUT = "assemble_idle_timeout"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    #: The provider stopped the message (or a choice of it) for its content (Chat
    #: ``content_filter``, Anthropic ``refusal``, Responses ``incomplete_details.reason:
    #: content_filter``, Bedrock ``guardrail_intervened``, Gemini ``SAFETY``...; README,
    #: "Stop and incomplete reasons").
    CONTENT_FILTERED = "content_filtered"
    #: The provider said the model's output, or a tool call in it, was malformed (Bedrock
    #: ``malformed_tool_use``, ``malformed_model_output``; Gemini ``MALFORMED_FUNCTION_CALL``,
    #: ``UNEXPECTED_TOOL_CALL``, ``MALFORMED_RESPONSE``).
    MALFORMED_OUTPUT = "malformed_output"
    #: The provider stream broke its own protocol (a second message spliced in, a block
    #: started twice, a delta or stop for a block never started, a terminal event whose
    #: output contradicts the streamed calls): nothing of the run is trusted any more.
    PROTOCOL_ERROR = "protocol_error"
    #: A record Latch would emit for the call (its committed call) or for its run (the final
    #: message) is larger than the output topics' record size (``settings.MAX_RECORD_BYTES``).
    RECORD_TOO_LARGE = "record_too_large"
    #: The run's policy (``policy.mode: enforce``) did not permit the call: no policy permits
    #: it, a policy forbids it, or a policy could not be evaluated (issue 25).
    POLICY_DENIED = "policy_denied"
    #: The run named a toolset version (``{"toolset", "version"}``) that the registry did not
    #: hold within ``registry.wait_s`` of the run.start's record time
    #: (docs/decisions/0014-registry.md).
    UNKNOWN_TOOLSET = "unknown_toolset"
    #: A person denied the call that waited for approval (``deny`` on the control topic).
    APPROVAL_DENIED = "approval_denied"
    #: No decision came for the call within ``approvals.approval_timeout_s`` of record time.
    APPROVAL_TIMEOUT = "approval_timeout"
    #: Two of the run's tools would share the call's name (or key): which one it means is not
    #: guessed (``worker/core/identity.py``).
    AMBIGUOUS_TOOL = "ambiguous_tool"
    #: The run's tenant must name a registered toolset (``registry.require_toolsets_for``) and
    #: its run.start named none (its inline ``tools``, the tenant's own word, are not used).
    TOOLSET_REQUIRED = "toolset_required"
    #: The provider paused the turn (Anthropic ``stop_reason: "pause_turn"``) to be continued
    #: by sending the message back as it is: the message's client calls are not run now (the
    #: model makes them again when the turn goes on), and the final message leaves them out.
    TURN_PAUSED = "turn_paused"


class DlqReason(StrEnum):
    """Why an input record went to the dead-letter topic instead of a run."""

    UNDECODABLE = "undecodable"
    INVALID_ENVELOPE = "invalid_envelope"
    UNSUPPORTED_VERSION = "unsupported_version"
    KEY_MISMATCH = "key_mismatch"
    UNKNOWN_PROVIDER = "unknown_provider"
    UNKNOWN_RUN = "unknown_run"
    RUN_FINISHED = "run_finished"
    DUPLICATE_RUN_START = "duplicate_run_start"
    #: The worker failed on this record (a bug, not bad input); the partition moved on.
    INTERNAL_ERROR = "internal_error"
    #: Kafka refused an output record for its own sake (too large for its topic, invalid):
    #: written by the worker at the send (worker/runtime/refusals.py) in its place.
    OUTPUT_REFUSED = "output_refused"
    #: An approval decision names a call its (open or waiting) run does not have.
    UNKNOWN_CALL = "unknown_call"
    #: An approval decision names a call that is not waiting for one: still streaming or not
    #: yet decided by the latch.
    CALL_NOT_PENDING = "call_not_pending"
    #: An approval decision names a call that already has its outcome (decided, timed out).
    CALL_ALREADY_DECIDED = "call_already_decided"
    #: A decision carries no signature: it never counts (core/approvers.py).
    APPROVAL_UNSIGNED = "approval_unsigned"
    #: A decision signed with a key id the worker does not know, or one of another approver.
    APPROVER_UNKNOWN_KEY = "approver_unknown_key"
    #: A decision whose signature does not verify (altered, or signed for something else).
    APPROVAL_BAD_SIGNATURE = "approval_bad_signature"
    #: A signed decision whose approver the policy in force does not allow to make it.
    APPROVER_NOT_ALLOWED = "approver_not_allowed"
    #: A result for a call that already has its one result (the first valid one counts).
    RESULT_DUPLICATE = "result_duplicate"
    #: A result for a call the latch already answered ``tool_timeout``.
    RESULT_LATE = "result_late"


class ResultReason(StrEnum):
    """Why a committed call's result is an error the latch wrote or put in its place
    (core/pairing.py): the turn record's ``outcome`` and the result's ``reason``."""

    #: No result came within the call's deadline (``results.deadline_s``).
    TOOL_TIMEOUT = "tool_timeout"
    #: The result's content is larger than ``results.max_bytes``: its size, never its text.
    RESULT_TOO_LARGE = "result_too_large"
    #: The structured result does not match the MCP tool's ``outputSchema``.
    RESULT_SCHEMA_INVALID = "result_schema_invalid"


class RunStatus(StrEnum):
    """How a run ended, as written in its final message."""

    COMPLETED = "completed"
    TRUNCATED = "truncated"
    FAILED = "failed"
    CANCELLED = "cancelled"
    IDLE_TIMEOUT = "idle_timeout"


class Topic(StrEnum):
    """The logical output topics; the worker maps them to configured Kafka topic names."""

    COMMITTED = "committed"
    ERRORS = "errors"
    FINAL = "final"
    PROGRESS = "progress"
    DLQ = "dlq"
    #: Calls waiting for approval (``topics.pending``).
    PENDING = "pending"
    #: One record per call outcome: who called what, what was decided, and on which record
    #: (``Outputs.audit``); never argument text.
    AUDIT = "audit"
    #: ``run.ended`` records: a run Latch ended while its stream may still be running
    #: (:data:`ABORT_REASONS`; decision 0015), for the gateway to stop reading the provider.
    RUN_ENDED = "run_ended"
    #: A result the latch writes for a committed call no runner answered in time
    #: (``tool_timeout``): the results topic, beside the runners' own (core/pairing.py).
    RESULTS = "results"
    #: One turn record per run once every call of it has its one result
    #: (``schemas/turn.schema.json``, ``topics.turns``; core/pairing.py).
    TURNS = "turns"


#: The reasons for which Latch ends a run that the gateway cannot see in its own stream (a
#: budget, a flood of calls, a protocol break, idle, a cancel from the control topic): each
#: gives the run one ``run.ended`` record (schemas/run-ended.schema.json; decision 0015).
ABORT_REASONS: frozenset[Reason] = frozenset({
    Reason.BUDGET_EXCEEDED, Reason.TOO_MANY_TOOL_CALLS, Reason.PROTOCOL_ERROR,
    Reason.ASSEMBLE_IDLE_TIMEOUT, Reason.CANCELLED})


@dataclass(frozen=True, slots=True)
class Emit:
    """One record the caller must publish: ``value`` goes to ``topic`` under ``key``."""

    topic: Topic
    key: str | None
    value: dict[str, Any]

    def as_line(self) -> dict[str, Any]:
        """The ``latch assemble`` output line for this record."""
        return {"topic": self.topic.value, "key": self.key, "value": self.value}
