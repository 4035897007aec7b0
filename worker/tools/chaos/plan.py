"""The chaos driver's plan (``latch chaos``): runs, their envelopes, and their expected outcomes.

Pure: no Kafka, no clock. :func:`build_plan` draws M runs from a seeded RNG across the three
providers, in each provider's own streaming format: parallel calls (chat chunks of parallel
calls sometimes interleaved), large arguments (tens of KiB in small fragments, escapes and
multi-byte characters split anywhere), calls without arguments, invalid JSON, unknown tools,
schema violations, runs without calls, broken streams (``stream.error``), cancelled runs
(events without any end, then a cancel) and idle runs (no end, no cancel). Issue 9 added:
block-level early commits (``lookup`` is pipelined: see :data:`EARLY_SETTINGS`), early
commits then a cancel, calls that reuse an id (in one block and across an early-committed
one), tight per-run budgets (``limits.max_tool_calls: 1``), and cancels raced against their
run's ``run.start`` (sent with it: it may reach the log first) or against the rest of the
stream (sent once the ``run.start`` is acknowledged). It adds a few bad input
records that must reach the DLQ with their bytes. With a policy in ``enforce`` (``latch chaos
--policy``, issue 25), about one good call in six of the kinds in :data:`DENIABLE` names a path
under :data:`DENIED_PREFIX`, which the policy (``chaos.cedar``) denies: that call is meant to
get ``policy_denied``. With approvals (``latch chaos --approvals``, issue 26), calls of
:data:`GATED` need a person's decision (``approvals.require_approval``): runs of kind
``approval`` call it, each call with a planned decision (:data:`DECISIONS`): approve, deny,
edit with valid, schema-breaking or non-JSON arguments, or none (it times out). The driver's
approver sends each call's decision once it reads the call's pending record.

A raced cancel may reach the events log anywhere in its run, so such a run is *flexible*: the
verifier holds it to the promise (its final says ``cancelled``, every call it opened ends
``cancelled``, one outcome per call id) rather than to exact records.

Each run's expected records are what the offline core (:class:`~worker.core.Assembler`, the
code path of ``latch assemble``) emits for the very bytes the driver publishes, its cancel
appended for a cancelled run and one tick past the idle timeout for an idle run. The plan
also knows what each call is *meant* to get (commit with these arguments, or a reason);
:func:`check_intent` holds the core to it, so a plan is a conformance test of the core too.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import string
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from worker.core import Assembler, Emit, Topic, decode
from worker.core.approvers import Approvers
from worker.core.envelope import TICK_KEY, Rejected
from worker.core.settings import offline
from worker.runtime.config import Config
from worker.runtime.governance.approvers import approvers as approvers_for
from worker.runtime.governance.approvers import decision_signer
from worker.runtime.governance.policy_source import assembler_policy
from worker.runtime.governance.signing import with_audit_key

PROVIDERS = ("openai.chat", "anthropic.messages", "openai.responses")

_PATH = {"type": "string", "minLength": 1}
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "read_file": {"type": "object", "properties": {"path": _PATH}, "required": ["path"],
                  "additionalProperties": False},
    "write_file": {"type": "object", "properties": {"path": _PATH, "content": {"type": "string"}},
                   "required": ["path", "content"], "additionalProperties": False},
    "ping": {"type": "object", "properties": {}, "additionalProperties": False},
    "lookup": {"type": "object", "properties": {"path": _PATH}, "required": ["path"],
               "additionalProperties": False},
    "delete_file": {"type": "object", "properties": {"path": _PATH}, "required": ["path"],
                    "additionalProperties": False},
}
#: The assemble settings the chaos workers and the plan use: ``lookup`` calls commit at the
#: end of their block (block-level early commit), everything else at the stream's end.
EARLY_SETTINGS = {"execute_before_stream_end": "true", "allow_pipelined_execute": "lookup"}
#: Kinds of runs and how often each is drawn.
KINDS: dict[str, int] = {
    "ok": 24, "parallel": 12, "large": 6, "no_args": 6, "text_only": 3, "invalid_json": 7,
    "unknown_tool": 6, "schema_violation": 7, "mixed": 10, "broken": 6, "cancel": 8, "idle": 5,
    "early": 6, "early_cancel": 4, "reuse": 4, "early_reuse": 3, "tight": 4, "cancel_race": 3,
    "cancel_mid": 3,
}
#: Kinds whose calls may get any one outcome (the core decides which; one per call id).
ANY_OUTCOME = frozenset({"tight"})
#: Kinds whose cancel races the stream: how many of the run's envelopes are acknowledged
#: before it goes out (``cancel_race``: none, so it may reach the log before the run.start;
#: ``cancel_mid``: the run.start).
RACED = {"cancel_race": 0, "cancel_mid": 1}
#: Argument texts that are not strict JSON objects, and the reason each fails with.
BAD_TEXTS: list[tuple[str, str]] = [
    ('{"path": "/etc/a",}', "invalid_json"),
    ('{"path": "/etc/a"', "invalid_json"),
    ("{'path': '/etc/a'}", "invalid_json"),
    ('{"path": "/a", "path": "/b"}', "invalid_json"),
    ('{"path": NaN}', "invalid_json"),
    ('{"path": "/a"} // done', "invalid_json"),
    ('["/etc/a"]', "arguments_not_object"),
    ('"/etc/a"', "arguments_not_object"),
]
#: Argument objects that break ``read_file``'s schema.
SCHEMA_BREAKERS: list[dict[str, Any]] = [
    {"path": 42}, {}, {"path": ""}, {"path": "/a", "mode": "w"}, {"path": ["/a"]},
]
#: Kinds whose good calls may be meant for ``policy_denied`` when a policy is enforced.
DENIABLE = frozenset({"ok", "parallel", "large", "mixed", "early"})
#: The path prefix of a call the plan means the policy to deny (``chaos.cedar``).
DENIED_PREFIX = "/denied/"
#: The tool whose calls wait for approval with ``--approvals`` (``approvals.require_approval``).
GATED = "delete_file"
#: The chaos approver (``latch chaos --approvals``): it signs every decision with its key
#: (``approvers.key_id``), and ``chaos.cedar`` lets its group decide the chaos tenant's calls.
APPROVER, APPROVER_KEY_ID, APPROVER_GROUP = "chaos-approver", "chaos-approver-1", "oncall"
#: The variable holding the chaos approver's key (random per chaos run: Stack.approver_key).
APPROVER_KEY_VAR = "LATCH_CHAOS_APPROVER_KEY"
#: When the plan's decisions are signed (fixed, so that one seed gives one plan).
SIGNED_AT = 1
#: What the approver does with a held call, how often, and the outcome each is meant to get
#: (``commit``: with the call's own arguments, or the edit's).
DECISIONS: dict[str, tuple[int, str]] = {
    "approve": (30, "commit"), "deny": (20, "approval_denied"), "edit": (15, "commit"),
    "edit_schema": (10, "schema_invalid"), "edit_json": (10, "invalid_json"),
    "none": (15, "approval_timeout"),
}
#: The kind of run that calls :data:`GATED`, and how often it is drawn with ``--approvals``.
APPROVAL_KIND = ("approval", 12)
_ALPHABET = string.ascii_letters + string.digits + " /._-\"\\\n\t" + "éß中文🙂ø€"


@dataclass(slots=True)
class CallSpec:
    """One tool call the driver puts in a stream, and the outcome it means it to get."""

    call_id: str
    name: str
    text: str
    #: ``"commit"`` or a reason code.
    intent: str
    args: Any = None
    #: Fragment sizes (characters) for the argument text.
    fragment: tuple[int, int] = (1, 12)
    #: Approvals: the approver's planned decision (a key of :data:`DECISIONS`), else None.
    decision: str | None = None
    #: An edit's new argument text.
    edit: str | None = None


@dataclass(slots=True)
class RunPlan:
    run_id: str
    provider: str
    kind: str
    envelopes: list[bytes]
    #: A cancel goes to the control topic once ``cancel_after`` envelopes are acknowledged
    #: (all of them, or none for a raced cancel).
    cancel: bytes | None
    #: What the calls that the stream opened mean to get (call id -> CallSpec).
    opened: dict[str, CallSpec]
    expected: list[Emit] = field(default_factory=list)
    cancel_after: int = 0
    #: Approvals: call id -> the decision envelope the approver sends once it reads the call's
    #: pending record (a call of :data:`GATED` absent here is left to time out).
    decisions: dict[str, bytes] = field(default_factory=dict)

    @property
    def flexible(self) -> bool:
        """Where its cancel lands is up to the race: held to the promise, not to records."""
        return self.kind in RACED


@dataclass(frozen=True, slots=True)
class BadInput:
    """A record that must reach the DLQ unchanged."""

    key: bytes
    value: bytes
    control: bool
    reason: str


@dataclass(slots=True)
class Plan:
    seed: int
    runs: list[RunPlan]
    bad: list[BadInput]

    @property
    def calls(self) -> int:
        """Outcome records expected (calls that reuse an id get one each, but one that reuses
        an id whose outcome was out already: it gets none)."""
        return sum(1 for r in self.runs for e in r.expected
                   if e.topic in (Topic.COMMITTED, Topic.ERRORS))

    @property
    def events(self) -> int:
        return sum(len(r.envelopes) + (r.cancel is not None) for r in self.runs) + len(self.bad)


#: What a misbehaving runner does with a committed call (``--hang-rate``, ``--twice-rate``,
#: issue 36): never answer it, or answer it twice.
HANG, TWICE = "hang", "twice"


@dataclass(frozen=True, slots=True)
class Misbehaviour:
    """Which committed calls the chaos runners hang on or answer twice: a pure function of the
    call's ``idempotency_key`` and the seed, so that the runners (which act) and the verifier
    (which checks) agree without talking."""

    seed: int = 0
    hang_rate: float = 0.0
    twice_rate: float = 0.0

    def of(self, key: str) -> str | None:
        """:data:`HANG`, :data:`TWICE` or None (the runner answers the call once)."""
        if not (self.hang_rate or self.twice_rate):
            return None
        digest = hashlib.sha256(f"latch-chaos:{self.seed}:{key}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2 ** 64
        if draw < self.hang_rate:
            return HANG
        if draw < self.hang_rate + self.twice_rate:
            return TWICE
        return None


class PlanError(Exception):
    """The offline core decides a run otherwise than the driver meant: a bug in one of them."""


def build_plan(seed: int, runs: int, config: Config, tag: str = "",
               exclude: Collection[str] = (), env: Mapping[str, str] | None = None) -> Plan:
    """M runs and a few bad inputs, each with the outcome the offline core gives it;
    ``exclude`` leaves kinds out. With ``approvers`` configured, the approver signs each
    decision (``approvers.key_id``; its key read from ``env``, default the process's) and
    the offline core counts only signed ones, as the workers do."""
    rng = random.Random(seed)
    config = with_audit_key(config, env)  # (the workers' audit digests: the same bytes)
    gated = GATED in config.approvals.require_approval
    table = {**KINDS, **dict([APPROVAL_KIND])} if gated else KINDS
    kinds, weights = zip(*((k, w) for k, w in table.items() if k not in exclude), strict=True)
    prefix = f"chaos{tag}-{seed}"
    early = (config.assemble.execute_before_stream_end
             and "lookup" in config.assemble.allow_pipelined_execute)
    deny = config.policy.mode == "enforce"
    plans = [_run(rng, f"{prefix}-{n:05d}", PROVIDERS[n % 3], rng.choices(kinds, weights)[0],
                  early, deny, gated) for n in range(runs)]
    signer = decision_signer(config, env) if gated else None
    keys = approvers_for(config, env)
    for run in plans:
        if signer is not None:  # (signed at a fixed time: the plan stays one per seed)
            run.decisions = {cid: orjson.dumps(signer.sign(orjson.loads(value), SIGNED_AT))
                             for cid, value in run.decisions.items()}
        run.expected = expected_emits(run, config, keys)
        check_intent(run)
    return Plan(seed, plans, _bad_inputs(rng, prefix, max(BAD_VARIANTS, runs // 150), config))


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choices(_ALPHABET, k=size))


def _good_call(rng: random.Random, cid: str, large: bool = False) -> CallSpec:
    if large:
        args: dict[str, Any] = {"path": f"/out/{_text(rng, 12)}",
                                "content": _text(rng, rng.randint(10_000, 60_000))}
        return CallSpec(cid, "write_file", _dumps(rng, args), "commit", args, (16, 256))
    args = {"path": f"/data/{_text(rng, rng.randint(1, 40))}"}
    return CallSpec(cid, "read_file", _dumps(rng, args), "commit", args)


def _early_call(rng: random.Random, cid: str) -> CallSpec:
    """A call of the pipelined tool: committed at the end of its block."""
    args = {"path": f"/lookup/{_text(rng, rng.randint(1, 30))}"}
    return CallSpec(cid, "lookup", _dumps(rng, args), "commit", args)


def _dumps(rng: random.Random, args: dict[str, Any]) -> str:
    """JSON text of ``args``, compact or spaced (the latch must not care)."""
    text = orjson.dumps(args).decode()
    return text.replace('":', '": ').replace(',"', ', "') if rng.random() < 0.5 else text


def _bad_call(rng: random.Random, cid: str, kind: str) -> CallSpec:
    if kind == "invalid_json":
        text, reason = rng.choice(BAD_TEXTS)
        return CallSpec(cid, "read_file", text, reason)
    if kind == "unknown_tool":
        return CallSpec(cid, rng.choice(["delete_all", "exec", "parallel"]),
                        '{"path": "/x"}', "unknown_tool")
    if kind == "no_args":
        text = rng.choice(["", "", "{}", " {} "])
        return CallSpec(cid, "ping", text, "commit", {})
    return CallSpec(cid, "read_file", orjson.dumps(rng.choice(SCHEMA_BREAKERS)).decode(),
                    "schema_invalid")


def _denied(rng: random.Random, call: CallSpec) -> CallSpec:
    """``call``, about one time in six moved under :data:`DENIED_PREFIX`: meant to be denied."""
    if call.intent != "commit" or "path" not in call.args or rng.random() >= 1 / 6:
        return call
    args = {**call.args, "path": DENIED_PREFIX + call.args["path"].lstrip("/")}
    return CallSpec(call.call_id, call.name, _dumps(rng, args), "policy_denied", None,
                    call.fragment)


def _calls(rng: random.Random, kind: str, ids: Callable[[], str],
           deny: bool = False) -> list[CallSpec]:
    calls = _kind_calls(rng, kind, ids)
    if deny and kind in DENIABLE:
        calls = [_denied(rng, call) for call in calls]
    return calls


def _gated_call(rng: random.Random, cid: str) -> CallSpec:
    """A call of :data:`GATED` and the approver's planned decision (``CallSpec.decision``)."""
    args = {"path": f"/trash/{_text(rng, rng.randint(1, 30))}"}
    names = list(DECISIONS)
    decision = rng.choices(names, [DECISIONS[n][0] for n in names])[0]
    call = CallSpec(cid, GATED, _dumps(rng, args), DECISIONS[decision][1], args)
    call.decision = decision
    if decision == "edit":
        call.args = {"path": f"/edited/{_text(rng, rng.randint(1, 30))}"}
        call.edit = _dumps(rng, call.args)
    elif decision == "edit_schema":
        call.edit = orjson.dumps(rng.choice(SCHEMA_BREAKERS)).decode()
    elif decision == "edit_json":  # not a JSON object: invalid_json or arguments_not_object
        call.edit, call.intent = rng.choice(BAD_TEXTS)
    return call


def decision_envelope(run_id: str, call: CallSpec) -> bytes | None:
    """The control envelope of the call's planned decision; None: left to time out."""
    if call.decision in (None, "none"):
        return None
    kind = "edit" if call.decision.startswith("edit") else call.decision
    doc: dict[str, Any] = {"v": 1, "run_id": run_id, "type": kind, "tool_call_id": call.call_id,
                           "by": APPROVER, "reason": f"chaos plan: {call.decision}"}
    if call.edit is not None:
        doc["arguments"] = call.edit
    return orjson.dumps(doc)


def _kind_calls(rng: random.Random, kind: str, ids: Callable[[], str]) -> list[CallSpec]:
    if kind == "approval":
        return [_gated_call(rng, ids()) for _ in range(rng.randint(1, 3))]
    if kind == "text_only":
        return []
    if kind in ("ok", "broken", "cancel", "idle", "cancel_race", "cancel_mid"):
        return [_good_call(rng, ids()) for _ in range(rng.randint(1, 3))]
    if kind in ("early", "early_cancel"):
        return [_early_call(rng, ids()) if rng.random() < 0.7 else _good_call(rng, ids())
                for _ in range(rng.randint(1, 4))]
    if kind == "tight":
        return [_good_call(rng, ids()) for _ in range(rng.randint(2, 4))]
    if kind in ("reuse", "early_reuse"):
        first = _early_call(rng, ids()) if kind == "early_reuse" else _good_call(rng, ids())
        again = _good_call(rng, first.call_id)
        calls = [first, _good_call(rng, ids())] if rng.random() < 0.5 else [first]
        return [*calls, again]
    if kind == "parallel":
        return [_good_call(rng, ids()) for _ in range(rng.randint(3, 6))]
    if kind == "large":
        return [_good_call(rng, ids(), large=True) for _ in range(rng.randint(1, 2))]
    if kind == "mixed":
        pick = ["good", "invalid_json", "unknown_tool", "schema_violation", "no_args"]
        return [_good_call(rng, ids()) if k == "good" else _bad_call(rng, ids(), k)
                for k in rng.choices(pick, k=rng.randint(2, 5))]
    return [_bad_call(rng, ids(), kind) for _ in range(rng.randint(1, 2))]


def _run(rng: random.Random, run_id: str, provider: str, kind: str,
         early: bool = True, deny: bool = False, gated: bool = False) -> RunPlan:
    counter = itertools.count()
    stem = {"openai.chat": "call", "anthropic.messages": "toolu", "openai.responses": "call"}
    calls = _calls(rng, kind, lambda: f"{stem[provider]}_{rng.getrandbits(48):012x}"
                   f"{next(counter)}", deny)
    complete = kind not in ("broken", "cancel", "idle", "early_cancel", "cancel_race",
                            "cancel_mid")
    events = PROVIDER_EVENTS[provider](rng, calls, complete)
    if not complete:  # cut the stream somewhere after its first call opened
        first = next(i for i, (_, opens) in enumerate(events) if opens is not None)
        events = events[: rng.randint(first + 1, len(events))]
    opened_ids = [opens for _, opens in events if opens is not None]
    reason = {"broken": "stream_error", "cancel": "cancelled", "idle": "assemble_idle_timeout",
              "cancel_race": "cancelled", "cancel_mid": "cancelled",
              "reuse": "duplicate_call_id"}
    opened = {}
    reused = {c.call_id for c in calls if sum(o.call_id == c.call_id for o in calls) > 1}
    for call in calls:
        if call.call_id in opened_ids:
            opened[call.call_id] = call
            if kind == "reuse" and call.call_id not in reused:
                continue
            if kind in reason:
                call.intent = reason[kind]
            elif kind in ANY_OUTCOME:
                call.intent = "any"
    if kind == "early_reuse" and calls[0].call_id in opened:
        # The first call commits at its block's end when that block closes before the
        # stream ends; the later call reusing its id then gets no record (one kind of
        # outcome per id). Otherwise (chat: no block ends early) both fail duplicate_call_id.
        reused_id = calls[0].call_id
        if early and _block_closed(events, reused_id, provider):
            opened[reused_id] = calls[0]
        else:
            opened[reused_id].intent = "duplicate_call_id"
    tools = [_tool(provider, name) for name in TOOL_SCHEMAS if gated or name != GATED]
    docs: list[dict[str, Any]] = [{"v": 1, "run_id": run_id, "seq": 0, "type": "run.start",
                                   "provider": provider, "tenant": "chaos", "tools": tools}]
    if kind == "tight":
        docs[0]["limits"] = {"max_tool_calls": 1}
    docs += [{"v": 1, "run_id": run_id, "seq": n, "type": "provider.event", "event": event}
             for n, (event, _) in enumerate(events, start=1)]
    if complete:
        docs.append({"v": 1, "run_id": run_id, "seq": len(docs), "type": "stream.end"})
    elif kind == "broken":
        docs.append({"v": 1, "run_id": run_id, "seq": len(docs), "type": "stream.error",
                     "error": "connection reset by peer"})
    cancel = None
    if kind in ("cancel", "early_cancel", *RACED):
        cancel = orjson.dumps({"v": 1, "run_id": run_id, "type": "cancel", "reason": "user_stop"})
    if kind == "early_cancel":  # what the stream committed early stays committed
        for call in opened.values():
            if not (early and call.name == "lookup"
                    and _block_closed(events, call.call_id, provider)):
                call.intent = "cancelled"
    decisions = {cid: env for cid, call in opened.items()
                 if (env := decision_envelope(run_id, call)) is not None}
    return RunPlan(run_id, provider, kind, [orjson.dumps(d) for d in docs], cancel, opened,
                   cancel_after=RACED.get(kind, len(docs)), decisions=decisions)


def _block_closed(events: list[Event], call_id: str, provider: str) -> bool:
    """Whether the stream holds the end of the call's block (where early commit happens)."""
    if provider == "openai.chat":
        return False  # a chat call's block ends with the stream
    at = next(i for i, (_, opens) in enumerate(events) if opens == call_id)
    index_key = "index" if provider == "anthropic.messages" else "output_index"
    index = events[at][0].get(index_key)
    closing = "content_block_stop" if provider == "anthropic.messages" else \
        "response.output_item.done"
    return any(e.get("type") == closing and e.get(index_key) == index for e, _ in events[at:])


def _tool(provider: str, name: str) -> dict[str, Any]:
    schema = TOOL_SCHEMAS[name]
    if provider == "openai.chat":
        return {"type": "function", "function": {"name": name, "parameters": schema}}
    if provider == "anthropic.messages":
        return {"name": name, "input_schema": schema}
    return {"type": "function", "name": name, "parameters": schema}


def _pieces(rng: random.Random, call: CallSpec) -> list[str]:
    """The call's argument text in fragments of random sizes (escapes and characters split
    anywhere)."""
    text, low, high = call.text, *call.fragment
    pieces, at = [], 0
    while at < len(text):
        step = rng.randint(low, high)
        pieces.append(text[at:at + step])
        at += step
    return pieces


#: A provider event, and the id of the call it opens (None: it opens none).
Event = tuple[dict[str, Any], str | None]


def _chat_events(rng: random.Random, calls: Sequence[CallSpec], complete: bool) -> list[Event]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-chaos", "object": "chat.completion.chunk", "model": "gpt-chaos",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    streams: list[list[Event]] = []
    for i, call in enumerate(calls):
        opening = {"index": i, "id": call.call_id, "type": "function",
                   "function": {"name": call.name, "arguments": ""}}
        stream: list[Event] = [(chunk({"tool_calls": [opening]}), call.call_id)]
        stream += [(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}), None)
                   for piece in _pieces(rng, call)]
        streams.append(stream)
    head: list[Event] = [(chunk({"role": "assistant", "content": None}), None)]
    if not calls:
        head.append((chunk({"content": "Nothing to do."}), None))
    body = _interleave(rng, streams) if rng.random() < 0.3 else [e for s in streams for e in s]
    tail: list[Event] = [(chunk({}, "tool_calls" if calls else "stop"), None)] if complete else []
    return head + body + tail


def _interleave(rng: random.Random, streams: list[list[Event]]) -> list[Event]:
    """Parallel calls' chunks mixed (each call's own order kept): keys, not positions."""
    queues = [list(reversed(s)) for s in streams]
    out = []
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        out.append(queue.pop())
    return out


def _anthropic_events(rng: random.Random, calls: Sequence[CallSpec],
                      complete: bool) -> list[Event]:
    events: list[Event] = [({"type": "message_start", "message": {
        "id": "msg_chaos", "type": "message", "role": "assistant", "model": "claude-chaos",
        "content": [], "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 1}}},
        None)]
    offset = 0
    if not calls or rng.random() < 0.3:
        offset = 1
        events += [({"type": "content_block_start", "index": 0,
                     "content_block": {"type": "text", "text": ""}}, None),
                   ({"type": "content_block_delta", "index": 0,
                     "delta": {"type": "text_delta", "text": "Let me look."}}, None),
                   ({"type": "content_block_stop", "index": 0}, None)]
    for i, call in enumerate(calls, start=offset):
        events.append(({"type": "content_block_start", "index": i, "content_block": {
            "type": "tool_use", "id": call.call_id, "name": call.name, "input": {}}},
            call.call_id))
        events += [({"type": "content_block_delta", "index": i,
                     "delta": {"type": "input_json_delta", "partial_json": piece}}, None)
                   for piece in _pieces(rng, call)]
        events.append(({"type": "content_block_stop", "index": i}, None))
    if complete:
        stop = "tool_use" if calls else "end_turn"
        events += [({"type": "message_delta", "delta": {"stop_reason": stop},
                     "usage": {"output_tokens": 9}}, None), ({"type": "message_stop"}, None)]
    return events


def _responses_events(rng: random.Random, calls: Sequence[CallSpec],
                      complete: bool) -> list[Event]:
    response = {"id": "resp_chaos", "object": "response", "status": "in_progress", "output": []}
    events: list[Event] = [({"type": "response.created", "response": response}, None)]
    items = []
    for i, call in enumerate(calls):
        item = {"type": "function_call", "id": f"fc_{call.call_id}", "call_id": call.call_id,
                "name": call.name, "arguments": "", "status": "in_progress"}
        events.append(({"type": "response.output_item.added", "output_index": i,
                        "item": item}, call.call_id))
        events += [({"type": "response.function_call_arguments.delta", "output_index": i,
                     "item_id": item["id"], "delta": piece}, None) for piece in _pieces(rng, call)]
        events.append(({"type": "response.function_call_arguments.done", "output_index": i,
                        "item_id": item["id"], "arguments": call.text}, None))
        done = {**item, "arguments": call.text, "status": "completed"}
        events.append(({"type": "response.output_item.done", "output_index": i, "item": done},
                       None))
        items.append(done)
    if complete:
        events.append(({"type": "response.completed",
                        "response": {**response, "status": "completed", "output": items}}, None))
    return events


PROVIDER_EVENTS: dict[str, Callable[[random.Random, Sequence[CallSpec], bool], list[Event]]] = {
    "openai.chat": _chat_events,
    "anthropic.messages": _anthropic_events,
    "openai.responses": _responses_events,
}


def expected_emits(run: RunPlan, config: Config, keys: Approvers | None = None) -> list[Emit]:
    """What the offline core emits for the run's bytes (progress aside): its envelopes, then
    its cancel, its approval decisions (each where the approver sends it: after the call's
    pending record); an idle run gets one tick past the idle timeout, a run with a call left
    undecided one tick past the approval timeout."""
    assembler = Assembler(offline(config.assemble))
    assembler.policy = assembler_policy(config)
    assembler.approvals.approvers = keys
    emits = [e for value in run.envelopes for e in assembler.feed_record(None, value)]
    if run.cancel is not None:
        emits += assembler.feed_record(None, run.cancel)
    for value in run.decisions.values():
        emits += assembler.feed_record(None, value)
    if any(c.decision == "none" for c in run.opened.values()):
        ts = int(config.assemble.approvals.approval_timeout_s * 1000) + 1
        emits += assembler.feed_record(TICK_KEY.encode(),
                                       orjson.dumps({"v": 1, "type": "tick", "ts": ts}))
    if run.kind == "idle":
        ts = int(config.assemble.assemble_idle_timeout_s * 1000) + 1
        emits += assembler.feed_record(TICK_KEY.encode(),
                                       orjson.dumps({"v": 1, "type": "tick", "ts": ts}))
    return [e for e in emits if e.topic is not Topic.PROGRESS]


def check_intent(run: RunPlan) -> None:
    """Raise :class:`PlanError` unless the core gives every opened call the outcome the driver
    meant, each call id one kind of outcome, and the run exactly one final message that lists
    every record's outcome."""
    problems = []
    outcomes = {}
    every: dict[str, set[str]] = {}  # call id -> every kind of outcome the core gives it
    records: dict[str, int] = {}  # call id -> its records
    listed: dict[str, list[tuple[str, str | None]]] = {}  # call id -> its final's outcomes
    for emit in run.expected:
        if emit.topic is Topic.COMMITTED:
            call_id, kind = emit.value["call_id"], "committed"
            outcomes[call_id] = ("commit", emit.value["arguments"])
        elif emit.topic is Topic.ERRORS:
            call_id, kind = emit.value["tool_call_id"], str(emit.value["reason"])
            outcomes[call_id] = (emit.value["reason"], None)
        elif emit.topic is Topic.FINAL:
            for entry in emit.value["outcomes"]:
                listed.setdefault(entry["tool_call_id"], []).append(
                    (entry["state"], entry.get("reason")))
            continue
        else:
            continue
        every.setdefault(call_id, set()).add(kind)
        records[call_id] = records.get(call_id, 0) + 1
    problems += _one_kind_per_id(every, records, listed)
    keys = [e.value["idempotency_key"] for e in run.expected
            if e.topic in (Topic.COMMITTED, Topic.ERRORS)]
    problems += [f"{key}: {keys.count(key)} outcomes under one idempotency key"
                 for key in sorted(set(keys)) if keys.count(key) > 1]
    for call in run.opened.values():
        want = ("commit", call.args) if call.intent == "commit" else (call.intent, None)
        if call.intent == "any" and call.call_id in outcomes:
            continue
        if outcomes.get(call.call_id) != want:
            problems.append(f"{call.call_id}: meant {want[0]}, core gives "
                            f"{outcomes.get(call.call_id, ('nothing',))[0]}")
    if set(outcomes) != set(run.opened):
        problems.append(f"outcomes for {sorted(set(outcomes) ^ set(run.opened))}")
    finals = [e for e in run.expected if e.topic is Topic.FINAL]
    if len(finals) != 1 or any(e.topic is Topic.DLQ for e in run.expected):
        problems.append(f"{len(finals)} final messages and DLQ records")
    if problems:
        raise PlanError(f"run {run.run_id} ({run.provider}, {run.kind}): {'; '.join(problems)}")


#: A call's entry in its final message when it has no record of its own: it reused an id
#: whose outcome was out already (docs/contract.md, "Choices the contract leaves open").
UNRECORDED = ("failed", "duplicate_call_id")


def _one_kind_per_id(every: dict[str, set[str]], records: dict[str, int],
                     listed: dict[str, list[tuple[str, str | None]]]) -> list[str]:
    """One kind of outcome per call id (a runner pairs results by id): a committed id has one
    record, never also an error result; and the final lists every call, a call without a
    record only as failed ``duplicate_call_id``, reusing an id that has one."""
    problems = [f"{cid}: {len(kinds)} kinds of outcome ({', '.join(sorted(kinds))}) for one id"
                for cid, kinds in every.items() if len(kinds) > 1]
    problems += [f"{cid}: committed, and {n - 1} more records for the id"
                 for cid, n in records.items() if "committed" in every[cid] and n > 1]
    for cid, entries in listed.items():
        extra = len(entries) - records.get(cid, 0)
        if extra < 0 or (extra and (not records.get(cid) or entries.count(UNRECORDED) < extra)):
            problems.append(f"{cid}: the final lists {entries} for {records.get(cid, 0)} "
                            "records")
    problems += [f"{cid}: records but no entry in the final" for cid in records
                 if cid not in listed]
    return problems


def _bad_inputs(rng: random.Random, prefix: str, count: int, config: Config) -> list[BadInput]:
    """Records that must reach the DLQ with their bytes: garbage, a key that is not the
    run_id, a non-object, an event of a run that never started, a tick far in the future
    under a run's key (it must expire nothing), garbage on the control topic."""
    out = []
    for n in range(count):
        key = f"{prefix}-bad-{n}".encode()
        variant = n % BAD_VARIANTS
        control = variant == BAD_VARIANTS - 1
        value = _bad_value(rng, variant, key, f"{prefix}-other-{n}")
        out.append(BadInput(key, value, control, _dlq_reason(key, value, control, config)))
    return out


#: The kinds of bad input records, the last one on the control topic.
BAD_VARIANTS = 6


def _bad_value(rng: random.Random, variant: int, key: bytes, other_run: str) -> bytes:
    if variant == 0:
        return b"\xff\xfe" + rng.randbytes(rng.randint(1, 64))
    if variant == 1:
        return orjson.dumps({"v": 1, "run_id": other_run, "seq": 0, "type": "run.start",
                             "provider": "openai.chat", "tools": []})
    if variant == 2:
        return b'["not", "an", "envelope"]'
    if variant == 3:
        return orjson.dumps({"v": 1, "run_id": key.decode(), "seq": 3,
                             "type": "provider.event", "event": {"type": "message_stop"}})
    if variant == 4:
        return orjson.dumps({"v": 1, "type": "tick", "ts": 99_999_999_999_999})
    return b"cancel " + rng.randbytes(8).hex().encode()


def _dlq_reason(key: bytes, value: bytes, control: bool, config: Config) -> str:
    if control:
        envelope = decode(key, value)
        return str(envelope.reason) if isinstance(envelope, Rejected) else "invalid_envelope"
    emits = Assembler(offline(config.assemble)).feed_record(key, value)
    if len(emits) != 1 or emits[0].topic is not Topic.DLQ:
        raise PlanError(f"bad input {key!r} does not go to the DLQ offline")
    return str(emits[0].value["reason"])


