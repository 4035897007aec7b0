"""The assembler's settings: the ``agent_stream_assemble`` section of ``latch.yaml``.

Frozen and plain so that the core never reads a file or the environment; ``worker.runtime.config``
loads, validates and overrides them, then hands one instance to :class:`~worker.core.Assembler`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

#: ``max.message.bytes`` of the output topics (``worker.runtime.admin`` creates them with it;
#: the worker's producers take the same limit): no record the worker sends may be larger.
OUTPUT_RECORD_BYTES = 64 * 1024 * 1024
#: The largest record value the core emits: the output record size less 1 MiB for the key (a
#: run id, at most 256 characters), the headers and Kafka's framing. The core measures any
#: record that might be larger (``Assembler``, "Memory budgets") and never emits one that is.
MAX_RECORD_BYTES = OUTPUT_RECORD_BYTES - 1024 * 1024
#: Bytes of one record besides its arguments and text, at most: the run's head (run id and
#: tenant, 256 characters each), a call's id and name (``MAX_ID_CHARACTERS``,
#: ``MAX_NAME_CHARACTERS``), an error's detail, the field names.
RECORD_OVERHEAD = 64 * 1024
#: Bytes of one call's entries in a final message besides its argument text, at most (its
#: id and name twice, in the message and in ``outcomes``, and their field names).
CALL_OUTCOME_BYTES = 8 * 1024
#: Bytes of one choice's (candidate's) entry in a final message besides its text, at most.
CHOICE_BYTES = 128
#: Provider call ids and names longer than these (characters) are no id or name: the call
#: fails ``missing_id_or_name``, and no record repeats the text.
MAX_ID_CHARACTERS = 512
MAX_NAME_CHARACTERS = 256
#: A run may hold at most this many times ``max_tool_calls_in_flight_assemble`` calls,
#: placeholders included (``assembler``, "Memory budgets").
CALLS_PER_RUN_FACTOR = 4
#: The ``on_invalid_json`` policy that leaves a call failing ``invalid_json`` out of the final
#: message (docs/contract.md, "Repair and feedback to the model";
#: docs/decisions/0017-protocol-repair.md).
DROP_WITH_PROTOCOL_REPAIR = "drop_with_protocol_repair"


@dataclass(frozen=True, slots=True)
class ApprovalSettings:
    """Which calls wait for a person's decision before they commit (the ``approvals``
    section of ``latch.yaml``; docs/policies.md, "Approvals")."""

    #: Tools (by the name the run registered) whose every call needs approval.
    require_approval: tuple[str, ...] = ()
    #: Whether a call of a tool whose MCP annotations say ``destructiveHint: true`` needs it.
    destructive: bool = False
    #: Record time a call may wait for its decision; then it fails ``approval_timeout``
    #: (checked at ticks, like the idle timeout).
    approval_timeout_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class ToolResultLimits:
    """One tool's own result limits (``results.tools.<name>``): None keeps the section's."""

    deadline_s: float | None = None
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ResultSettings:
    """The result latch (the ``results`` section of ``latch.yaml``; docs/contract.md, "The
    result latch"): every committed call answered once, on time and checked, and each run's
    turn record once every call of it has its one result."""

    #: Whether the worker pairs results with their calls and writes turn records. The core's
    #: default is off (``latch assemble`` and the core's tests see no turn records); the
    #: worker's configuration turns it on.
    enabled: bool = False
    #: Record time a committed call may wait for its result (from the record that committed
    #: it); then the latch answers it ``tool_timeout`` (checked at ticks, like the idle timeout).
    deadline_s: float = 300.0
    #: UTF-8 bytes of a result's content (and of its structured content's JSON text) above
    #: which it is replaced by an error result ``result_too_large`` (its size, never its text).
    max_bytes: int = 262_144
    #: Per tool (the name the run registered): its own ``deadline_s`` and ``max_bytes``.
    tools: tuple[tuple[str, ToolResultLimits], ...] = ()

    def limits(self, name: str) -> tuple[int, int]:
        """``(deadline_ms, max_bytes)`` for a call of tool ``name``."""
        deadline_s, max_bytes = self.deadline_s, self.max_bytes
        for tool, own in self.tools:
            if tool == name:
                if own.deadline_s is not None:
                    deadline_s = own.deadline_s
                if own.max_bytes is not None:
                    max_bytes = own.max_bytes
                break
        return int(deadline_s * 1000), max_bytes


@dataclass(frozen=True, slots=True)
class AuditKey:
    """The key that makes an audit record's argument digest (``arguments.hmac``): its id, as
    the record names it (``audit.key_id``), and its bytes, read by the worker from the file or
    variable ``audit.keys`` names (``worker.runtime.governance.signing.audit_key``). The bytes
    never print (no ``repr``); a record without a key has no digest at all, only the size: an
    unkeyed hash of a short secret (a PIN, a door code) is undone by trying every value."""

    key_id: str
    key: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class AssembleSettings:
    """Limits and switches of the completion latch (contract: "Configuration")."""

    #: A call whose argument text grows past this many UTF-8 bytes fails
    #: ``arguments_exceed_max_bytes``; its text is dropped as soon as the limit is crossed.
    max_tool_argument_bytes: int = 262_144
    #: Calls being assembled at once in one run; the surplus gets a failed placeholder. A run
    #: holding 4 times this many calls, placeholders included, is ended by the next call start
    #: (``too_many_tool_calls``; :data:`CALLS_PER_RUN_FACTOR`).
    max_tool_calls_in_flight_assemble: int = 32
    #: Calls committed per run (a run's ``limits.max_tool_calls`` may only lower it).
    max_tool_calls_per_run: int = 16
    #: A run that receives no event for this long (by record time) fails its open calls.
    assemble_idle_timeout_s: float = 60.0
    #: Master switch for block-level early commit (rule 4), together with the allow list.
    execute_before_stream_end: bool = False
    #: Tools that may be committed at their block's end instead of the stream's end.
    allow_pipelined_execute: tuple[str, ...] = ()
    #: Put partial argument text on the progress topic (byte counts only when false): each
    #: record carries its fragment and the byte offset it starts at, never the whole buffer.
    ui_forward_partial_args: bool = False
    #: Emit progress records at all.
    emit_progress: bool = False
    #: Arguments must decode to a JSON object (``arguments_not_object`` otherwise).
    arguments_must_be_object: bool = True
    #: What an invalid argument text becomes: ``error_result`` (the call stays in the final
    #: message, its error result answers it), or ``drop_with_protocol_repair`` (the call is
    #: left out of the final message, so the transcript holds no call without a result; its
    #: error result says ``dropped``: docs/contract.md, "Repair and feedback to the model").
    on_invalid_json: str = "error_result"
    #: Tenants whose ``invalid_json`` error results echo the text the model sent (cut at
    #: ``outputs.ECHO_MAX_BYTES``), as ``{"INVALID_JSON": "<text>"}``, so the model can correct
    #: itself. Empty by default: argument text may hold secrets, so a tenant must ask for it.
    echo_invalid_input_tenants: tuple[str, ...] = ()
    #: What an oversize argument text becomes; ``error_result`` is the only policy in v1.
    on_args_overflow: str = "error_result"
    #: Order of a run's outcomes; ``provider_index`` is the only order in v1.
    finalize_order: str = "provider_index"
    #: Open runs one assembler (one events partition) holds. A ``run.start`` beyond it is
    #: accepted, and the least recently active open run (streaming or parked on approval) is
    #: ended first: its uncommitted calls fail ``budget_exceeded``, its final message
    #: ``failed``.
    max_open_runs: int = 100_000
    #: Bytes that all open runs of one assembler may hold together: argument text (UTF-8),
    #: tool schema text, and the text kept for final messages. A fragment or event that would
    #: cross it ends least recently active runs holding bytes (as ``max_open_runs`` does)
    #: until it fits; when the receiving run alone would cross it, the receiving call fails
    #: ``budget_exceeded`` and its buffer is dropped (argument text), or the run ends (text).
    max_buffered_bytes: int = 64 * 1024 * 1024
    #: Finished run ids remembered to recognise re-deliveries and late events.
    remember_finished_runs: int = 100_000
    #: Cancels remembered for runs not started yet (a cancel that reached the log before its
    #: run's ``run.start``); the oldest is forgotten beyond this count.
    remember_early_cancels: int = 10_000
    #: How long (record time) such a cancel waits for its ``run.start``; a run that starts
    #: within it is cancelled at once, one that starts later runs as if it had never come.
    early_cancel_ttl_s: float = 300.0
    #: A tool whose parameter schema is longer than this (JSON text, UTF-8 bytes) is unusable:
    #: its calls fail ``schema_invalid``. The schemas a run keeps count in
    #: ``max_buffered_bytes`` until the run ends.
    max_tool_schema_bytes: int = 131_072
    #: JSON values one tool schema may hold, and subschemas that may apply to one value
    #: (``$ref`` and ``allOf``/``anyOf``/``oneOf`` fan-out); beyond, the tool is unusable.
    max_schema_nodes: int = 2_000
    #: Keyword applications that validating one call's arguments may take; beyond, the call
    #: fails ``schema_invalid``.
    max_schema_validation_steps: int = 20_000
    #: Bytes of provider events carrying no argument text (what the final message's text,
    #: thinking, blocks and items come from) one run may receive; the event that crosses it
    #: ends the run (status ``failed``, uncommitted calls ``budget_exceeded``). Bounds the
    #: final message below the output topics' record size.
    max_run_text_bytes: int = 16 * 1024 * 1024
    #: Choices (chat ``n``) or candidates (Gemini ``candidateCount``) one run may open; the
    #: event that opens one more ends the run (status ``failed``, uncommitted calls
    #: ``budget_exceeded``). Each is counted in ``max_buffered_bytes`` while its run is open.
    max_choices_per_run: int = 128
    #: Which calls wait for approval (the ``approvals`` section, merged in by the config).
    approvals: ApprovalSettings = ApprovalSettings()
    #: The key of the audit records' argument digests (None: no digest, only the size). Not a
    #: key of this section: the worker reads it where ``audit.keys`` says (``AuditKey``).
    audit_key: AuditKey | None = None
    #: Tenants (``run.start`` ``tenant``, written by the gateway) whose runs must name a
    #: registered toolset: inline ``tools`` are the tenant's own word, so every call of such a
    #: run fails ``toolset_required``; ``"*"``: every tenant, a run without one too. From
    #: ``registry.require_toolsets_for``, merged in by the config.
    require_toolsets_for: tuple[str, ...] = ()
    #: The result latch (the ``results`` section, merged in by the config).
    results: ResultSettings = ResultSettings()


def offline(settings: AssembleSettings) -> AssembleSettings:
    """``settings`` with the result latch off: for a core that reads captured streams or
    plans them (``latch assemble``, ``latch chaos``'s expectations), where no runner answers
    and no turn record is due."""
    return replace(settings, results=ResultSettings())


def largest_records(settings: AssembleSettings) -> list[tuple[str, int, tuple[str, ...]]]:
    """The largest committed call and final message ``settings`` let a run make, counted in the
    units the limits count (UTF-8 bytes of argument text, bytes of provider events), each as
    (what, bytes, the settings that bound it). ``worker.runtime.config`` refuses settings for
    which one is above :data:`MAX_RECORD_BYTES`. JSON escapes can make a record larger than
    its count (a quote written ``\\"``); the core measures such a record and never emits it
    (``record_too_large``)."""
    s = settings
    calls = CALLS_PER_RUN_FACTOR * s.max_tool_calls_in_flight_assemble + 1
    committed = s.max_tool_argument_bytes + RECORD_OVERHEAD
    final = (s.max_run_text_bytes + min(s.max_buffered_bytes, calls * s.max_tool_argument_bytes)
             + calls * CALL_OUTCOME_BYTES + s.max_choices_per_run * CHOICE_BYTES
             + RECORD_OVERHEAD)
    return [("a committed call", committed, ("max_tool_argument_bytes",)),
            ("a final message", final, (
                "max_run_text_bytes", "max_buffered_bytes", "max_tool_argument_bytes",
                "max_tool_calls_in_flight_assemble", "max_choices_per_run"))]
