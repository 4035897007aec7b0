"""The assembler's settings: the ``agent_stream_assemble`` section of ``latch.yaml``.

Frozen and plain so that the core never reads a file or the environment; ``worker.runtime.config``
loads, validates and overrides them, then hands one instance to :class:`~worker.core.Assembler`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AssembleSettings:
    """Limits and switches of the completion latch (contract: "Configuration")."""

    #: A call whose argument text grows past this many UTF-8 bytes fails
    #: ``arguments_exceed_max_bytes``; its text is dropped as soon as the limit is crossed.
    max_tool_argument_bytes: int = 262_144
    #: Calls being assembled at once in one run; the surplus gets a failed placeholder. A run
    #: holding 4 times this many calls, placeholders included, is ended by the next call start
    #: (``too_many_tool_calls``; ``assembler.CALLS_PER_RUN_FACTOR``).
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
    #: What an invalid argument text becomes; ``error_result`` is the only policy in v1.
    on_invalid_json: str = "error_result"
    #: What an oversize argument text becomes; ``error_result`` is the only policy in v1.
    on_args_overflow: str = "error_result"
    #: Order of a run's outcomes; ``provider_index`` is the only order in v1.
    finalize_order: str = "provider_index"
    #: Open runs one assembler (one events partition) holds. A ``run.start`` beyond it is
    #: accepted, and the least recently active open run is ended first: its uncommitted calls
    #: fail ``budget_exceeded``, its final message has status ``failed``.
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
