"""Decoding input records into envelopes, and the envelopes themselves.

Every record on the events topic decodes to exactly one of:

* an :data:`Envelope` (``RunStart``, ``ProviderEvent``, ``StreamEnd``, ``StreamError``,
  ``Cancel``, ``Tick``), or
* a :class:`Rejected` that says why the record goes to the dead-letter topic.

:func:`decode` never raises. It checks the contract by hand rather than with a JSON Schema
validator: it runs once per provider event, and the benchmark holds the whole core to twice
the cost of a bare ``orjson.loads`` (``schemas/stream-envelope.schema.json`` states the same
rules, and a contract test runs both over the same corpus).

A ``run.start`` that nests arrays and objects deeper than ``strictjson.MAX_DEPTH`` (64) levels
is ``invalid_envelope``: its tools are kept for the whole run and their schemas compiled, and
neither must depend on how much stack the caller has left. Other envelopes are not bounded
here: a provider event is read where it stands and dropped, and what an adapter keeps of it for
the final message (a content block, an output item) is bounded the same way when it is kept
(``ops.kept``). Counting the brackets of the raw record bounds the depth from above at C speed,
so the walk over the decoded value runs only for the rare record with more than 64 of them.

A member that repeats in an envelope or in its provider event is read as orjson reads it, the
last, in both builds (the peek gives such a record up); a record that carries arguments as a
parsed value is read whole with one meaning (``strictjson.one_meaning``), and an index has one
reading everywhere: ``docs/decisions/0010-one-meaning.md`` says why.

``Cancel`` and ``Decision`` (``approve``, ``deny``, ``edit`` of a call waiting for approval)
arrive on the control topic; the worker forwards it into the run's partition of
the events topic so that it takes its place in the run's ordered history. ``Tick`` is the
worker's own marker (key :data:`TICK_KEY`) that carries the record time used for idle expiry.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from worker.core.approvers import Signature
from worker.core.model import DlqReason
from worker.core.settings import MAX_ID_CHARACTERS as _MAX_CALL_ID
from worker.core.strictjson import MAX_DEPTH, nested_deeper

PROVIDERS: frozenset[str] = frozenset({"openai.chat", "openai.responses", "anthropic.messages",
                                       "bedrock.converse", "google.gemini"})
#: Each provider name to itself: what a run keeps is this constant, not the record's copy.
_PROVIDER_NAMES: dict[str, str] = {p: p for p in PROVIDERS}
TICK_KEY = "__latch_tick__"
_TICK_KEY_BYTES = TICK_KEY.encode()
#: The longest run id accepted, in characters (``maxLength`` in the envelope schemas). Every
#: output repeats the run id (record key, ``run_id``, ``idempotency_key``), and the assembler
#: keeps it for each open and remembered run, so it is bounded; a longer one is
#: ``invalid_envelope`` and the DLQ record names no run.
MAX_RUN_ID_LENGTH = 256
#: The longest tenant accepted, in characters (``maxLength`` in the envelope schema): every
#: output of the run repeats it, and no record may outgrow the output record size.
MAX_TENANT_LENGTH = 256


# The envelopes are NamedTuples rather than frozen slotted dataclasses: as immutable and as
# light, and built in less than half the time (a frozen dataclass sets each field through
# object.__setattr__), which counts for a value built for every record (bench/bench_core.py).
# Unlike a dataclass, an envelope equals a plain tuple of the same fields.


class RunStart(NamedTuple):
    run_id: str
    seq: int
    ts: int | None
    provider: str
    tenant: str | None
    tools: Any
    max_tool_calls: int | None
    #: The registry toolset the run names instead of ``tools`` (name, version), else None.
    toolset: tuple[str, int] | None = None


class ProviderEvent(NamedTuple):
    run_id: str
    seq: int
    ts: int | None
    event: dict[str, Any]


class StreamEnd(NamedTuple):
    run_id: str
    seq: int
    ts: int | None


class StreamError(NamedTuple):
    run_id: str
    seq: int
    ts: int | None
    error: str


class Cancel(NamedTuple):
    run_id: str
    ts: int | None
    reason: str


class Tick(NamedTuple):
    ts: int


#: What a person may decide of a call waiting for approval (docs/policies.md, "Approvals").
APPROVE, DENY, EDIT = "approve", "deny", "edit"
DECISIONS = (APPROVE, DENY, EDIT)
#: The longest ``by`` and ``reason`` of a decision accepted, in characters: both are repeated
#: in the call's error result (a denial), which stays small.
MAX_DECIDER_LENGTH = 256
MAX_DECISION_REASON_LENGTH = 1024


class Decision(NamedTuple):
    """A person's decision on one held call (``approve``, ``deny``, ``edit``): it arrives on
    the control topic and is forwarded into its run's events partition, like a cancel."""

    run_id: str
    ts: int | None
    decision: str
    tool_call_id: str
    by: str
    reason: str
    #: ``edit``: the new argument text (checked by the whole latch); else None.
    arguments: str | None
    #: The control record it was forwarded from, (partition, offset) (None: not forwarded by a
    #: worker): a decision whose control record its run already applied is a repeat.
    control: tuple[int, int] | None = None
    #: The approver's signature (``core/approvers.py``; None: unsigned).
    signature: Signature | None = None


#: The type of a forwarded result (``worker.runtime.results`` writes it into the events log).
RESULT = "tool.result"
#: The longest idempotency key accepted on a result (Latch's own are 64 hex characters).
MAX_IDEMPOTENCY_KEY_LENGTH = 256


class ToolResult(NamedTuple):
    """A runner's result for one committed call, forwarded from the results topic into its
    run's events partition (``worker.runtime.results``), so that pairing it with its call
    takes its place in the run's one ordered history (core/pairing.py)."""

    run_id: str
    ts: int | None
    tool_call_id: str
    name: str
    idempotency_key: str
    is_error: bool
    #: UTF-8 bytes of the result's content plus its structured content's JSON text.
    size: int
    #: The content (None: over the forwarder's ``results.max_bytes``, left in the results
    #: topic; the latch answers the call ``result_too_large``).
    content: str | None
    #: An MCP tool's ``structuredContent`` (None: none, or left out with the content).
    structured: Any = None
    #: The results record it was forwarded from, (partition, offset) (None: not forwarded by
    #: a worker): a result forwarded twice is recognised by it.
    source: tuple[int, int] | None = None


class Source(NamedTuple):
    """Where an input record was read: what a DLQ record's ``source`` says of it."""

    topic: str
    partition: int
    offset: int


#: Where a record came from, as the core takes it: a :class:`Source`, or the same members as
#: a mapping (offline callers; a DLQ record copies it).
RecordSource = Source | dict[str, Any]

Envelope = (RunStart | ProviderEvent | StreamEnd | StreamError | Cancel | Decision | Tick
            | ToolResult)
RunEnvelope = RunStart | ProviderEvent | StreamEnd | StreamError | Cancel | Decision


@dataclass(frozen=True, slots=True)
class Rejected:
    """An input record that is not a valid envelope: what the DLQ record says about it."""

    reason: DlqReason
    detail: str
    run_id: str | None = None


def decode(key: bytes | None, value: bytes | str) -> Envelope | Rejected:
    """Decode one record value (and check it against its key, when there is one)."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return undecodable(exc)
    return checked(doc, key, value)


def undecodable(exc: orjson.JSONDecodeError) -> Rejected:
    """What a record that is not JSON at all is (``exc`` quotes no input, only a position)."""
    return Rejected(DlqReason.UNDECODABLE, f"not JSON: {exc.msg} (char {exc.pos})")


def checked(doc: Any, key: bytes | None, value: bytes | str) -> Envelope | Rejected:
    """``decode`` of a record already parsed into ``doc``: the envelope it is, or why not."""
    if not isinstance(doc, dict):
        return Rejected(DlqReason.INVALID_ENVELOPE, f"envelope is a {type(doc).__name__}")
    envelope = from_dict(doc, key)
    if type(envelope) is RunStart and _brackets(value) > MAX_DEPTH and nested_deeper(doc):
        return Rejected(DlqReason.INVALID_ENVELOPE,
                        f"arrays and objects nested deeper than {MAX_DEPTH} levels",
                        envelope.run_id)
    return envelope


def _brackets(value: bytes | str) -> int:
    """The number of ``{`` and ``[`` in the raw record: an upper bound of its depth."""
    if isinstance(value, str):
        return value.count("{") + value.count("[")
    return value.count(b"{") + value.count(b"[")


def from_dict(doc: dict[str, Any], key: bytes | None = None) -> Envelope | Rejected:
    """Check an already decoded envelope object."""
    if type(doc.get("v")) is not int or doc["v"] != 1:
        return Rejected(DlqReason.UNSUPPORTED_VERSION, f"v is {_short(doc.get('v'))}, not 1")
    kind = doc.get("type")
    ts = doc.get("ts")
    if ts is not None and not _is_count(ts):
        return Rejected(DlqReason.INVALID_ENVELOPE, "ts is not a non-negative integer")
    if kind == "tick":
        # A tick ends every idle run of its partition: only the worker's own key may carry
        # one (offline, without keys, the input is trusted as a whole).
        if key is not None and key != _TICK_KEY_BYTES:
            return Rejected(DlqReason.INVALID_ENVELOPE, "a tick under a key other than "
                            f"{TICK_KEY}")
        if ts is None:
            return Rejected(DlqReason.INVALID_ENVELOPE, "tick has no ts")
        return Tick(ts)
    run_id = doc.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return Rejected(DlqReason.INVALID_ENVELOPE, "run_id is missing or empty")
    if len(run_id) > MAX_RUN_ID_LENGTH:
        return Rejected(DlqReason.INVALID_ENVELOPE, f"run_id has {len(run_id)} characters, more "
                        f"than {MAX_RUN_ID_LENGTH}")
    if key is not None and key != run_id.encode():
        return Rejected(DlqReason.KEY_MISMATCH, "the record key differs from run_id", run_id)
    if kind == "cancel":
        reason = doc.get("reason", "cancelled")
        return Cancel(run_id, ts, reason[:64] if isinstance(reason, str) else "cancelled")
    if kind in DECISIONS:
        return _decision(doc, kind, run_id, ts)
    if kind == RESULT:
        return _result(doc, run_id, ts)
    seq = doc.get("seq")
    if type(seq) is not int or seq < 0:  # _is_count inlined: this runs for every record
        return Rejected(DlqReason.INVALID_ENVELOPE, "seq is not a non-negative integer", run_id)
    return _typed(doc, kind, run_id, seq, ts)


def _typed(
    doc: dict[str, Any], kind: Any, run_id: str, seq: int, ts: int | None
) -> Envelope | Rejected:
    if kind == "provider.event":
        event = doc.get("event")
        if not isinstance(event, dict):
            return Rejected(DlqReason.INVALID_ENVELOPE, "event is not an object", run_id)
        return ProviderEvent(run_id, seq, ts, event)
    if kind == "stream.end":
        return StreamEnd(run_id, seq, ts)
    if kind == "stream.error":
        error = doc.get("error")
        return StreamError(run_id, seq, ts, error if isinstance(error, str) else "stream error")
    if kind == "run.start":
        return _run_start(doc, run_id, seq, ts)
    return Rejected(DlqReason.INVALID_ENVELOPE, f"unknown type {_short(kind)}", run_id)


def _run_start(doc: dict[str, Any], run_id: str, seq: int, ts: int | None) -> Envelope | Rejected:
    provider = doc.get("provider")
    if not isinstance(provider, str) or provider not in PROVIDERS:  # a list is unhashable
        return Rejected(DlqReason.UNKNOWN_PROVIDER, f"provider {_short(provider)}", run_id)
    tenant = doc.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        return Rejected(DlqReason.INVALID_ENVELOPE, "tenant is not a string", run_id)
    if tenant is not None and len(tenant) > MAX_TENANT_LENGTH:
        return Rejected(DlqReason.INVALID_ENVELOPE, f"tenant has {len(tenant)} characters, more "
                        f"than {MAX_TENANT_LENGTH}", run_id)
    tools = doc.get("tools", [])
    toolset = None
    if isinstance(tools, dict):  # a registry toolset by reference: {"toolset", "version"}
        toolset = toolset_ref(tools)
        if toolset is None:
            return Rejected(DlqReason.INVALID_ENVELOPE, "tools names no toolset: an object "
                            "must be {\"toolset\": NAME, \"version\": N}", run_id)
        tools = []
    if not isinstance(tools, list):
        return Rejected(DlqReason.INVALID_ENVELOPE, "tools is not an array", run_id)
    limits = doc.get("limits")
    limits = {} if limits is None else limits
    cap = limits.get("max_tool_calls") if isinstance(limits, dict) else None
    if not isinstance(limits, dict) or (cap is not None and not _is_count(cap)):
        return Rejected(DlqReason.INVALID_ENVELOPE, "limits.max_tool_calls is invalid", run_id)
    # Kept by each open run: the provider's own constant, and one string per distinct tenant.
    return RunStart(run_id, seq, ts, _PROVIDER_NAMES[provider],
                    None if tenant is None else sys.intern(tenant), tools, cap, toolset)


#: The longest toolset name accepted, in characters (``maxLength`` in the schemas).
MAX_TOOLSET_NAME_LENGTH = 128


def toolset_ref(value: dict[str, Any]) -> tuple[str, int] | None:
    """A ``run.start``'s ``tools`` object read as a registry reference ``(name, version)``:
    exactly the members ``toolset`` (1 to 128 characters) and ``version`` (a positive
    integer); None if it is not one."""
    name, version = value.get("toolset"), value.get("version")
    if (len(value) != 2 or not isinstance(name, str) or not name
            or len(name) > MAX_TOOLSET_NAME_LENGTH or type(version) is not int or version < 1):
        return None
    return name, version


def _decision(doc: dict[str, Any], kind: str, run_id: str, ts: int | None
              ) -> Decision | Rejected:
    """An ``approve``, ``deny`` or ``edit`` envelope: the call it names (``tool_call_id``),
    who decided (``by``) and why (``reason``), each a bounded string; an edit's new argument
    text (``arguments``, a string)."""
    call_id, by, reason = doc.get("tool_call_id"), doc.get("by"), doc.get("reason")
    if not isinstance(call_id, str) or not call_id or len(call_id) > _MAX_CALL_ID:
        return Rejected(DlqReason.INVALID_ENVELOPE, "tool_call_id is missing, empty or longer "
                        f"than {_MAX_CALL_ID} characters", run_id)
    if not isinstance(by, str) or not by or len(by) > MAX_DECIDER_LENGTH:
        return Rejected(DlqReason.INVALID_ENVELOPE, "by is missing, empty or longer than "
                        f"{MAX_DECIDER_LENGTH} characters", run_id)
    if not isinstance(reason, str) or len(reason) > MAX_DECISION_REASON_LENGTH:
        return Rejected(DlqReason.INVALID_ENVELOPE, "reason is missing or longer than "
                        f"{MAX_DECISION_REASON_LENGTH} characters", run_id)
    arguments = doc.get("arguments")
    if kind == EDIT and not isinstance(arguments, str):
        return Rejected(DlqReason.INVALID_ENVELOPE, "an edit's arguments are not a string "
                        "(the new argument text)", run_id)
    control = doc.get("control")
    if control is not None:
        if (not isinstance(control, list) or len(control) != 2
                or not all(type(n) is int and n >= 0 for n in control)):
            return Rejected(DlqReason.INVALID_ENVELOPE, "control is not [partition, offset] of "
                            "non-negative integers", run_id)
        control = (control[0], control[1])
    signature = _signature(doc.get("signature"))
    if isinstance(signature, str):
        return Rejected(DlqReason.INVALID_ENVELOPE, signature, run_id)
    return Decision(run_id, ts, kind, call_id, by, reason,
                    arguments if kind == EDIT else None, control, signature)


def _result(doc: dict[str, Any], run_id: str, ts: int | None) -> ToolResult | Rejected:
    """A forwarded ``tool.result``: the call it answers (``tool_call_id``, ``name``,
    ``idempotency_key``, each bounded), ``is_error``, ``size``, the ``content`` (a string, or
    absent when over the limit), ``structured`` (any JSON) and ``source``."""
    for field, most in (("tool_call_id", _MAX_CALL_ID), ("name", _MAX_CALL_ID),
                        ("idempotency_key", MAX_IDEMPOTENCY_KEY_LENGTH)):
        value = doc.get(field)
        if not isinstance(value, str) or not value or len(value) > most:
            return Rejected(DlqReason.INVALID_ENVELOPE, f"{field} is missing, empty or longer "
                            f"than {most} characters", run_id)
    call_id, name, key = doc["tool_call_id"], doc["name"], doc["idempotency_key"]
    is_error, size, content = doc.get("is_error"), doc.get("size"), doc.get("content")
    if type(is_error) is not bool:
        return Rejected(DlqReason.INVALID_ENVELOPE, "is_error is not a boolean", run_id)
    if not _is_count(size):
        return Rejected(DlqReason.INVALID_ENVELOPE, "size is not a non-negative integer", run_id)
    if content is not None and not isinstance(content, str):
        return Rejected(DlqReason.INVALID_ENVELOPE, "content is not a string", run_id)
    source = doc.get("source")
    if source is not None:
        if (not isinstance(source, list) or len(source) != 2
                or not all(type(n) is int and n >= 0 for n in source)):
            return Rejected(DlqReason.INVALID_ENVELOPE, "source is not [partition, offset] of "
                            "non-negative integers", run_id)
        source = (source[0], source[1])
    counted = size if type(size) is int else 0
    return ToolResult(run_id, ts, call_id, name, key, is_error, counted, content,
                      doc.get("structured"), source)


def _signature(value: Any) -> Signature | str | None:
    """A decision's ``signature`` object (None: absent), or what is wrong with it."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return "signature is not an object"
    key, ts, mac = value.get("key"), value.get("ts"), value.get("mac")
    if not isinstance(key, str) or not 0 < len(key) <= _MAX_KEY_ID:
        return f"signature.key is not a string of 1 to {_MAX_KEY_ID} characters"
    if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
        return "signature.ts is not a non-negative integer"
    if not isinstance(mac, str) or len(mac) != 64 or not _HEX.issuperset(mac):
        return "signature.mac is not 64 hex characters"
    return Signature(key, ts, mac)


_HEX = frozenset("0123456789abcdef")
#: The longest approver key id accepted (``approvers.keys``: 64 characters).
_MAX_KEY_ID = 64


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(value: Any) -> str:
    """A bounded rendering of an envelope field for a DLQ detail (never provider text)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
