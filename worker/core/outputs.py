"""The records the core emits, shaped as ``schemas/*.schema.json`` describe them.

Every output carries the run's identity (``run_id``, ``tenant``, ``provider``) and an
``idempotency_key`` that is the same each time the same outcome is emitted again (after a
crash, or on replay), so a runner deduplicates on it. A key is its parts (run id, call id,
buffer key, or ``final``) joined with ``:``, each part with ``%`` written ``%25`` and ``:``
written ``%3A`` first (:func:`idempotency_key`): a ``:`` in a key always separates parts, so two
different lists of parts never give one key (run ``a:7`` with call ``c`` is ``a%3A7:c``, run
``a`` with call ``7:c`` is ``a:7%3Ac``). The error ``content`` holds the reason
and a detail made by the core from positions, lengths, counts and schema paths: never
argument text, but for one opt-in: the ``invalid_json`` error results of a tenant listed in
``echo_invalid_input_tenants`` add the text the model sent, cut at :data:`ECHO_MAX_BYTES`
(:func:`echoed`), so that the model can correct itself. The audit record never carries it.

With ``on_invalid_json: drop_with_protocol_repair`` a call failing ``invalid_json`` is left
out of the final message (each adapter skips a ``CallView`` whose ``dropped`` is set), and its
error result and its entry in ``outcomes`` say ``dropped: true``: an agent loop sends no tool
result for it, so the next request holds no result without its call and no call without its
result (docs/decisions/0017-protocol-repair.md). A call failing ``turn_paused`` is left out so,
whatever the policy: its message is sent back as it is to continue the paused turn.

No record is larger than ``settings.MAX_RECORD_BYTES``: an error result is small (its id and
name are bounded, its detail cut at :data:`MAX_DETAIL_CHARACTERS`); a committed call that would
be larger fails ``record_too_large`` instead (``run.Latch``); and a final message that would be
larger drops its message's content and its ``choices``, then its ``outcomes``, and lists what
it dropped in ``dropped`` (``core/ending.py``, which alone builds the final message and the
``run.ended`` record: this module shapes the records of single calls).

Each outcome (a committed call or an error result) is followed by its audit record
(:meth:`Outputs.audit`, ``schemas/audit.schema.json``): the run, tenant, call id, tool name and
provider, the outcome and reason, the policy's decision, and the size of the argument bytes
with, when the operator gave an audit key (``AssembleSettings.audit_key``), their HMAC-SHA256
under it and the key's id; never the bytes themselves, and never an unkeyed hash of them (a
short secret, a PIN or a door code, is found again from its SHA-256 by trying every value:
:func:`argument_digest`). It has the outcome's ``idempotency_key``. Where the
record was read (``source``) and the run's ``trace_id`` are not the core's to know: it writes
them null, and the worker fills them in (``worker.runtime.step.located``,
``worker.runtime.hooks.EngineHooks.traced``). When Kafka refuses the outcome's record for its
own sake (``worker/runtime/refusals.py``: an ``output_refused`` DLQ record goes in its place),
the worker sends the audit record as :func:`refused_audit` makes it: outcome ``refused``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Any

from orjson import dumps

from worker.core.call import Call
from worker.core.envelope import RecordSource, Rejected, RunStart, Source
from worker.core.model import CallState, Emit, Reason, RunStatus, Topic
from worker.core.ops import CUSTOM, FUNCTION
from worker.core.policy import OFF
from worker.core.providers.gemini_args import is_records
from worker.core.settings import AuditKey

#: Characters of an error's detail written in its ``content``; a longer one (a schema path
#: through long property names) is cut, and ends with "...".
MAX_DETAIL_CHARACTERS = 1024
#: UTF-8 bytes of argument text an echoing error result shows at most (:func:`echoed`).
ECHO_MAX_BYTES = 4096


def idempotency_key(*parts: str) -> str:
    """``parts`` joined with ``:``, each with ``%`` and ``:`` percent-encoded (module docstring)."""
    return ":".join(p.replace("%", "%25").replace(":", "%3A") if ("%" in p or ":" in p) else p
                    for p in parts)


def id_counts(calls: Iterable[Call]) -> dict[str, int]:
    """How many of ``calls`` carry each ``tool_call_id`` (a ``Counter``, compiled: the
    interpreter builds a ``Counter``, at every run's end)."""
    counts: dict[str, int] = {}
    for call in calls:
        tool_call_id = call.tool_call_id
        counts[tool_call_id] = counts.get(tool_call_id, 0) + 1
    return counts


class Outputs:
    """Builds the output records of one run."""

    __slots__ = ("_audit_key", "_drop", "_echo", "_provider", "_run_id", "_tenant")

    def __init__(self, start: RunStart, drop: bool = False, echo: bool = False,
                 audit_key: AuditKey | None = None) -> None:
        # (the head of every record is made when one is: an open run holds no dict for it)
        self._run_id = start.run_id
        self._tenant = start.tenant
        self._provider = start.provider
        #: ``on_invalid_json: drop_with_protocol_repair`` (module docstring).
        self._drop = drop
        #: The run's tenant is listed in ``echo_invalid_input_tenants``.
        self._echo = echo
        #: The key of the audit records' argument digests (None: size only).
        self._audit_key = audit_key

    def dropped(self, call: Call) -> bool:
        """Whether ``call`` is left out of the final message: it failed ``turn_paused`` (the
        message is sent back as it is to continue the turn, with no result for it), or it
        failed ``invalid_json`` and the policy is ``drop_with_protocol_repair``."""
        return call.state is CallState.FAILED and (
            call.reason is Reason.TURN_PAUSED
            or (self._drop and call.reason is Reason.INVALID_JSON))

    def head(self) -> dict[str, Any]:
        """What every output of the run starts with."""
        return {"v": 1, "run_id": self._run_id, "tenant": self._tenant,
                "provider": self._provider}

    def outcomes(self, calls: Sequence[Call], every: Iterable[Call] | None = None) -> list[Emit]:
        """The committed call or error result of each terminal call of ``calls`` not yet
        emitted. ``every`` is all the run's calls (default: ``calls``), among which an error's
        ``tool_call_id`` may be shared (see ``_error``)."""
        emits = []
        seen = id_counts(calls if every is None else every)
        for call in calls:
            if call.state is CallState.PENDING_APPROVAL and not call.announced:
                call.announced = True
                emits.append(self.pending(call))
                continue
            if call.emitted or call.state not in (
                CallState.COMMITTED, CallState.FAILED, CallState.CANCELLED
            ):
                continue
            call.emitted = True
            outcome = (self._committed(call) if call.state is CallState.COMMITTED
                       else self._error(call, shared=seen.get(call.tool_call_id, 0) > 1))
            emits.append(outcome)
            emits.append(self.audit(call, outcome))
        return emits

    def audit(self, call: Call, outcome: Emit) -> Emit:
        """The audit record of ``call``'s ``outcome`` (its committed call or error result):
        the same identity, name and key, the outcome and reason, the policy's decision
        (``{"mode": "off"}`` when no policy decided), and the size and keyed digest of its
        argument bytes (:func:`argument_digest`). ``source`` and ``trace_id`` are null here
        (module doc)."""
        value = outcome.value
        committed = outcome.topic is Topic.COMMITTED
        decision = call.decision
        policy: dict[str, Any] = {"mode": OFF} if decision is None else {
            "mode": decision.mode, "allow": decision.allow, "policies": list(decision.policies),
            "errors": list(decision.errors), "version": decision.version}
        record = {**self.head(), "tool_call_id": call.tool_call_id, "name": value["name"],
                  "outcome": "committed" if committed else "error",
                  "reason": None if committed else value["reason"], "policy": policy,
                  "arguments": argument_digest(call, value if committed else None,
                                               self._audit_key),
                  "trace_id": None, "source": None,
                  "idempotency_key": value["idempotency_key"]}
        if call.approval is not None:  # (a person's decision decided it: who, and which)
            kind, by, key = call.approval
            record["approval"] = {"decision": kind, "by": by, "key": key}
        return Emit(Topic.AUDIT, self._run_id, record)

    def where(self, call: Call) -> dict[str, Any]:
        """``index`` and ``choice``, then ``kind`` for a call that is not a function call
        (absent for those, so that their records stay as they were before kinds existed)."""
        where: dict[str, Any] = {"index": call.index}
        if call.choice is not None:
            where["choice"] = call.choice
        if call.kind != FUNCTION:
            where["kind"] = call.kind
        return where

    def _committed(self, call: Call) -> Emit:
        value = {**self.head(), "call_id": call.call_id, "name": call.name, **self.where(call)}
        if call.kind == CUSTOM:  # free-form input, as the provider sent it
            value["input"] = call.text
        else:
            value["arguments"] = call.arguments
        value["idempotency_key"] = idempotency_key(self._run_id, call.call_id or "")
        return Emit(Topic.COMMITTED, self._run_id, value)

    def pending(self, call: Call) -> Emit:
        """The pending record of a held call (``schemas/pending-call.schema.json``): its
        committed call record as it would be, and why it waits (``approval``)."""
        value = self._committed(call).value
        value["idempotency_key"] = idempotency_key(self._run_id, call.call_id or "", "pending")
        value["approval"] = {"required_by": list(call.held), "held_ms": call.held_ms}
        if call.decision is not None and call.decision.policies:
            value["approval"]["policies"] = list(call.decision.policies)
        return Emit(Topic.PENDING, self._run_id, value)

    def _error(self, call: Call, shared: bool) -> Emit:
        """``shared``: another call of the run has the same ``tool_call_id`` (a repeated
        provider id, or a provider id equal to a fallback buffer key). Each of them is a
        different outcome, so the key adds the buffer key, or a runner would drop one."""
        reason = call.reason or Reason.STREAM_ERROR
        detail = call.detail
        if len(detail) > MAX_DETAIL_CHARACTERS:
            detail = detail[:MAX_DETAIL_CHARACTERS - 3] + "..."
        key = (idempotency_key(self._run_id, call.tool_call_id, call.key)
               if shared or reason is Reason.DUPLICATE_CALL_ID
               else idempotency_key(self._run_id, call.tool_call_id))
        content = f"{reason}: {detail}"
        if self._echo and reason is Reason.INVALID_JSON:
            text = call.text if call.text is not None else "".join(call.parts)
            if not is_records(text):  # Gemini's partialArgs are values, not text: no echo
                content += echoed(text)
        value = {**self.head(), "tool_call_id": call.tool_call_id, "name": call.name or "unknown",
                 **self.where(call), "is_error": True, "state": str(call.state),
                 "reason": str(reason), "content": content, "idempotency_key": key}
        if self.dropped(call):
            value["dropped"] = True
        return Emit(Topic.ERRORS, self._run_id, value)

    def committed_size(self, call: Call) -> int:
        """The bytes of ``call``'s committed call record (a committed or decided call)."""
        return len(dumps(self._committed(call).value))

    def progress(self, call: Call, delta: str | None = None, offset: int = 0) -> Emit:
        """A UI progress record: byte counts, and, only when configured, the text ``delta``
        that replaces the call's text from UTF-8 byte ``offset`` on (the fragment just
        appended, or the whole text restated): never the whole buffer again, so progress grows
        linearly with the argument bytes."""
        value = {**self.head(), "call_key": call.key, "tool_call_id": call.call_id,
                 "name": call.name, "index": call.index, "bytes": call.nbytes}
        if delta is not None:
            value["arguments_offset"] = offset
            value["arguments_delta"] = delta
        return Emit(Topic.PROGRESS, self._run_id, value)


def echoed(text: str) -> str:
    """What an echoing ``invalid_json`` error result adds to its content: the rest of its first
    line, then ``{"INVALID_JSON": "<text>"}`` on a line of its own (the form Anthropic documents
    for passing invalid JSON from fine-grained tool streaming back to the model). The text is
    cut at :data:`ECHO_MAX_BYTES` UTF-8 bytes, on a character boundary, and the first line then
    says how many bytes of how many it shows; a lone surrogate (not UTF-8) is shown as U+FFFD.
    Empty when no text came."""
    data = text.encode("utf-8", "surrogatepass")
    if not data:
        return ""
    cut = len(data)
    if cut > ECHO_MAX_BYTES:
        cut = ECHO_MAX_BYTES
        while cut > 0 and data[cut] & 0xC0 == 0x80:  # not inside a character
            cut -= 1
        note = f"; the text sent follows, its first {cut} of {len(data)} bytes"
    else:
        note = "; the text sent follows"
    shown = data[:cut].decode("utf-8", "replace")
    return note + "\n" + dumps({"INVALID_JSON": shown}).decode()


def argument_digest(call: Call, committed: dict[str, Any] | None,
                    key: AuditKey | None = None) -> dict[str, Any] | None:
    """``{"bytes"}`` of a call's argument bytes, with ``"hmac"`` and ``"key_id"`` when an audit
    ``key`` is given: for a committed call (its record's value ``committed``), the bytes its
    record carries: the JSON text of ``arguments`` as written in it (compact, UTF-8:
    ``orjson.dumps``, which also writes the record), or the UTF-8 of a custom call's ``input``;
    for a call that did not commit, the UTF-8 of the text received. None when there is none:
    no text came, or it was dropped at a bound (``arguments_exceed_max_bytes``,
    ``budget_exceeded``).

    Who reads it: anyone who may read the audit topic, a wider circle than the runners that
    read the arguments. So no unkeyed hash (whoever guesses the text confirms it, and a short
    secret is guessed by trying every value); the HMAC can be checked only by whoever holds the
    key: the operator, against a record of the call (:func:`keyed_digest`)."""
    if committed is not None:
        data = (committed["input"].encode("utf-8", "surrogatepass") if "input" in committed
                else dumps(committed["arguments"]))
    else:
        text = call.text if call.text is not None else "".join(call.parts)
        if not text:
            return None
        data = text.encode("utf-8", "surrogatepass")
    if key is None:
        return {"bytes": len(data)}
    return {"bytes": len(data), "hmac": keyed_digest(key.key, data), "key_id": key.key_id}


def keyed_digest(key: bytes, data: bytes) -> str:
    """Lowercase hex of HMAC-SHA256(``key``, ``data``): an audit record's ``arguments.hmac``."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


#: An audit record's outcome and reason when Kafka refused its outcome's record.
REFUSED, OUTPUT_REFUSED = "refused", "output_refused"


def refused_audit(audit: Emit, error: str) -> Emit:
    """``audit``, the audit record of an outcome that Kafka refused for its own sake (too
    large for its topic, invalid: ``worker/runtime/refusals.py``; Kafka's ``error`` name), as
    the worker sends it instead: outcome ``refused``, reason ``output_refused``, and
    ``refused`` saying what the outcome was (``outcome``, ``reason``) and the ``error``. The
    same key and ``idempotency_key``: the record audits the same outcome, which never reached
    its topic (its ``output_refused`` DLQ record did)."""
    value = audit.value
    refused = {"outcome": value["outcome"], "reason": value["reason"], "error": error}
    return Emit(audit.topic, audit.key, {**value, "outcome": REFUSED, "reason": OUTPUT_REFUSED,
                                         "refused": refused})


def _where_read(source: RecordSource | None) -> tuple[str | None, int | None, int | None]:
    if source is None:
        return None, None, None
    if isinstance(source, Source):
        return source.topic, source.partition, source.offset
    return source.get("topic"), source.get("partition"), source.get("offset")


def events_span(first: RecordSource | None, last: RecordSource | None) -> dict[str, Any]:
    """``{"topic", "partition", "first_offset", "last_offset"}`` of the events partition a run
    was read from (each null when unknown)."""
    topic, partition, first_offset = _where_read(first)
    last_topic, last_partition, last_offset = _where_read(last)
    return {"topic": topic if topic is not None else last_topic,
            "partition": partition if partition is not None else last_partition,
            "first_offset": first_offset, "last_offset": last_offset}


def late_summary(run_id: str, status: RunStatus, count: int, first_seq: int, last_seq: int,
                 first: RecordSource | None, last: RecordSource | None) -> Emit:
    """The one DLQ record that sums up the ``count`` events that reached ``run_id`` after it
    had ended (decision 0015): reason ``run_finished``, no original bytes, and ``late`` with
    the count, the first and last seq and the first and last offsets."""
    span = events_span(first, last)
    src: dict[str, Any] = {k: span[k] for k in ("topic", "partition") if span[k] is not None}
    if span["first_offset"] is not None:
        src["offset"] = span["first_offset"]
    src["key_b64"] = base64.b64encode(run_id.encode()).decode()
    record = {"v": 1, "reason": "run_finished",
              "detail": f"{count} events reached the run after it ended as {status}; "
                        "summed up in this one record, their bytes are not kept",
              "source": src, "original_b64": "", "run_id": run_id,
              "late": {"count": count, "first_seq": first_seq, "last_seq": last_seq,
                       "first_offset": span["first_offset"], "last_offset": span["last_offset"]}}
    return Emit(Topic.DLQ, run_id, record)


def dlq_record(rejected: Rejected, key: bytes | None, value: bytes,
               source: RecordSource | None) -> Emit:
    """A dead-letter record that keeps the original bytes and says why."""
    if isinstance(source, Source):
        src: dict[str, Any] = {"topic": source.topic, "partition": source.partition,
                               "offset": source.offset}
    else:
        src = dict(source or {})
    src["key_b64"] = None if key is None else base64.b64encode(key).decode()
    record = {"v": 1, "reason": str(rejected.reason), "detail": rejected.detail, "source": src,
              "original_b64": base64.b64encode(value).decode(), "run_id": rejected.run_id}
    text_key = None if key is None else key.decode("utf-8", "replace")
    return Emit(Topic.DLQ, text_key, record)
