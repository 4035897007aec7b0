"""The result latch: every committed call answered exactly once, on time and checked, and each
run's turn record once every call of it has its one result (docs/contract.md, "The result
latch"; docs/decisions/0024-result-latch.md).

It sits beside the assembler and sees two things, both in the order of the events log:

* **the assembler's own emits** (:meth:`Pairing.observe`): a committed call starts its wait,
  with its deadline (``results.deadline_s``, or its tool's own) counted from the record time of
  the record that committed it (a call held for approval: from its approval); an error result
  is the answer of a call that never committed; the run's final message says which calls the
  turn has, in which order, and which were left out of the message (``dropped``);
* **the results** a runner wrote on the results topic, forwarded by the worker into the run's
  events partition as ``tool.result`` records (:meth:`Pairing.result`; the forwarder is
  ``worker.runtime.results``), and the **ticks** (:meth:`Pairing.expire`), whose record time
  ends the waits that are over.

So a take-over, which replays each open run from its ``run.start``, and ``latch replay`` decide
exactly as the live worker did. The first valid result for a call counts; a result for a call
the run does not have (or that does not match it: another name or idempotency key), for a call
already answered, or for one the latch answered ``tool_timeout``, is a DLQ record with its bytes
and a reason (``unknown_call``, ``result_duplicate``, ``result_late``); the same forwarded
record twice (an at-least-once forwarder) is a repeat, counted and dropped. A result over its
``max_bytes`` is answered ``result_too_large`` (its size, never its text), a structured result
that fails its tool's ``outputSchema`` ``result_schema_invalid``. Each answer has one audit
record (its size and keyed digest, never its text). When the final message has come and no
committed call waits any more, the run's turn record (``schemas/turn.schema.json``) is emitted:
the tool-result messages in the provider's own format (``core/turns.py``), one per call of the
message, in the message's order.

Memory: a waiting turn keeps its answers' content (each at most ``max_bytes``) until its record
is written; a closed turn keeps only its call ids and where each answer was read (the
``remember_finished_runs`` most recent), so that a late or repeated result is named as such and
the same answer forwarded again (an at-least-once forwarder after a crash) is a repeat.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from orjson import dumps

from worker.core.envelope import Rejected, ToolResult
from worker.core.model import DlqReason, Emit, ResultReason, Topic
from worker.core.outputs import keyed_digest
from worker.core.settings import AuditKey, ResultSettings
from worker.core.tools import ToolSchema, ValidatorCache
from worker.core.turns import Answer, TurnEntry, turn_record

__all__ = ["ANSWERED", "LATCH", "Pairing", "paired", "result_size"]

#: A turn record's outcome for a call answered by its runner (whatever ``is_error`` it said).
ANSWERED = "answered"
#: A call that never committed (its error result is its answer), and one left out of the
#: final message (no answer goes back to the model).
FAILED, DROPPED = "failed", "dropped"
#: No output schemas (never changed).
_NONE: dict[str, ToolSchema] = {}
#: The ``by`` of a result the latch itself wrote (``tool_timeout``): the forwarder never
#: forwards one, so it never pairs, whoever wrote it.
LATCH = "latch"
#: A closed turn's call: answered by a runner, or by the latch (``tool_timeout``).
_CLOSED_ANSWERED, _CLOSED_TIMED_OUT = "a", "x"
#: A closed turn's call: how it was answered, and the results record (partition, offset) its
#: answer was forwarded from ((-1, -1): none, the latch's own).
Closed = tuple[str, int, int]

#: ``(tenant) -> rewrite``: the operator's redaction of result text for a tenant (None: none);
#: the rewrite returns the text and how many rewrites each rule made.
Redactions = Callable[[str | None], Callable[[str], tuple[str, dict[str, int]]] | None]


class _Waiting(NamedTuple):
    """A committed call waiting for its result."""

    name: str
    kind: str | None
    key: str
    deadline_ms: int
    max_bytes: int


class _Done(NamedTuple):
    """A committed call's one answer."""

    outcome: str
    is_error: bool
    content: str
    structured: Any
    size: int
    #: The results record it was forwarded from (None: the latch's own).
    source: tuple[int, int] | None


class _Turn:
    """One run's calls, from its first committed call (or its final message) to its turn
    record."""

    __slots__ = ("done", "errors", "final", "provider", "run_id", "tenant", "waiting")

    def __init__(self, run_id: str, tenant: str | None, provider: str) -> None:
        self.run_id, self.tenant, self.provider = run_id, tenant, provider
        self.waiting: dict[str, _Waiting] = {}
        self.done: dict[str, _Done] = {}
        #: The error result of each call that never committed, by ``tool_call_id`` (the first).
        self.errors: dict[str, dict[str, Any]] = {}
        self.final: dict[str, Any] | None = None


class Pairing:
    """The result latch of one events partition (module docstring)."""

    def __init__(self, settings: ResultSettings, reject: Callable[..., Emit],
                 audit_key: AuditKey | None = None, remember: int = 100_000,
                 validators: ValidatorCache | None = None,
                 max_schema_bytes: int | None = None) -> None:
        self.settings = settings
        self._reject = reject
        self._audit_key = audit_key
        self._remember = remember
        self._validators = validators
        self._max_schema_bytes = max_schema_bytes
        #: The output schemas of the runs whose tools state one (most runs: none), by run id
        #: and tool name, compiled when a structured result is checked.
        self.schemas: dict[str, dict[str, ToolSchema]] = {}
        #: The open turns, by run id, oldest first.
        self.turns: dict[str, _Turn] = {}
        #: The closed turns' calls: run id -> {tool_call_id: :data:`Closed`}.
        self.closed: OrderedDict[str, dict[str, Closed]] = OrderedDict()
        self.stats: Counter[str] = Counter()
        #: Each redaction rule's rewrites, by rule name (a metric, never a log line).
        self.redactions: Counter[str] = Counter()
        #: The tenants' redaction rules (None: none).
        self.redact: Redactions | None = None

    def waiting(self, run_id: str) -> bool:
        """Whether ``run_id``'s turn record is still to be written."""
        return run_id in self.turns

    def started(self, run_id: str, schemas: dict[str, Any]) -> None:
        """A run started whose tools state these ``outputSchema``s (MCP tools: a registered
        toolset's, or its ``run.start``'s), by tool name."""
        if schemas and self._validators is not None:
            prepare = self._validators.prepare
            self.schemas[run_id] = {name: prepare(schema, self._max_schema_bytes)
                                    for name, schema in schemas.items()}

    # -- what the assembler emitted ------------------------------------------------------

    def observe(self, emits: list[Emit], now_ms: int) -> list[Emit]:
        """``emits``, and the turn records they complete: a committed call starts its wait, an
        error result answers its call, a final message closes the run's list of calls."""
        out = emits
        for emit in emits:
            topic = emit.topic
            if topic is Topic.COMMITTED:
                self._committed(emit.value, now_ms)
            elif topic is Topic.ERRORS:
                value = emit.value
                turn = self._turn(value)
                turn.errors.setdefault(value["tool_call_id"], value)
            elif topic is Topic.FINAL:
                turn = self._turn(emit.value)
                turn.final = emit.value
                if not turn.waiting:
                    if out is emits:
                        out = list(emits)
                    out.append(self._close(turn))
        return out

    def _turn(self, value: dict[str, Any]) -> _Turn:
        run_id = value["run_id"]
        turn = self.turns.get(run_id)
        if turn is None:
            turn = self.turns[run_id] = _Turn(run_id, value["tenant"], value["provider"])
        return turn

    def _committed(self, value: dict[str, Any], now_ms: int) -> None:
        name = value["name"]
        deadline_ms, max_bytes = self.settings.limits(name)
        self._turn(value).waiting[value["call_id"]] = _Waiting(
            name, value.get("kind"), value["idempotency_key"], now_ms + deadline_ms, max_bytes)

    # -- results and ticks ---------------------------------------------------------------

    def result(self, result: ToolResult, now_ms: int,
               raw: tuple[bytes | None, bytes, Any] | None) -> list[Emit]:
        """A forwarded result: its call's answer, or a DLQ record that says why not."""
        run_id, call_id = result.run_id, result.tool_call_id
        turn = self.turns.get(run_id)
        waiting = turn.waiting.get(call_id) if turn is not None else None
        if waiting is None or turn is None:
            return self._unpaired(result, turn, raw)
        if result.name != waiting.name or result.idempotency_key != waiting.key:
            return self._dlq(DlqReason.UNKNOWN_CALL, "the result's name or idempotency_key "
                             "differs from its committed call's", run_id, raw)
        del turn.waiting[call_id]
        done = self._checked(result, turn, waiting)
        turn.done[call_id] = done
        self.stats[f"results_{done.outcome}"] += 1
        emits = [self._audit(turn, call_id, waiting, done)]
        if not turn.waiting and turn.final is not None:
            emits.append(self._close(turn))
        return emits

    def _checked(self, result: ToolResult, turn: _Turn, waiting: _Waiting) -> _Done:
        """The answer ``result`` gives: itself (redacted), or the error in its place."""
        size, content = result.size, result.content
        if content is None or size > waiting.max_bytes:
            return _Done(ResultReason.RESULT_TOO_LARGE.value, True,
                         f"result_too_large: the tool's result is {size} bytes, more than "
                         f"{waiting.max_bytes}", None, size, result.source)
        structured = result.structured
        schema = self.schemas.get(turn.run_id, _NONE).get(waiting.name)
        if structured is not None and schema is not None:
            invalid = schema.check().errors(structured)
            if invalid is not None:
                return _Done(ResultReason.RESULT_SCHEMA_INVALID.value, True,
                             f"result_schema_invalid: {invalid}", None, size, result.source)
        rewrite = self.redact(turn.tenant) if self.redact is not None else None
        if rewrite is not None:
            content, counts = rewrite(content)
            if counts:
                self.redactions.update(counts)
                structured = None  # (its text may hold what was redacted: the text goes back)
        return _Done(ANSWERED, result.is_error, content, structured, size, result.source)

    def _unpaired(self, result: ToolResult, turn: _Turn | None,
                  raw: tuple[bytes | None, bytes, Any] | None) -> list[Emit]:
        """A result whose call waits for none: a repeat of the forward that counted, or a DLQ
        record (``result_duplicate``, ``result_late``, ``unknown_call``)."""
        run_id, call_id = result.run_id, result.tool_call_id
        done = turn.done.get(call_id) if turn is not None else None
        closed = self.closed.get(run_id) if turn is None else None
        was = closed.get(call_id) if closed is not None else None
        source = result.source
        if source is not None and ((done is not None and done.source == source) or (
                was is not None and (was[1], was[2]) == source)):
            self.stats["results_repeated"] += 1
            return []
        late = (done is not None and done.outcome == ResultReason.TOOL_TIMEOUT) or (
            was is not None and was[0] == _CLOSED_TIMED_OUT)
        if late:
            return self._dlq(DlqReason.RESULT_LATE, "the call was answered tool_timeout "
                             "before this result came", run_id, raw)
        if done is not None or was is not None:
            return self._dlq(DlqReason.RESULT_DUPLICATE, "the call already has its result",
                             run_id, raw)
        return self._dlq(DlqReason.UNKNOWN_CALL, "the run has no committed call with this "
                         "tool_call_id waiting for a result", run_id, raw)

    def _dlq(self, reason: DlqReason, detail: str, run_id: str,
             raw: tuple[bytes | None, bytes, Any] | None) -> list[Emit]:
        self.stats[f"results_{reason.value}"] += 1
        key, value, source = raw if raw is not None else (None, b"", None)
        return [self._reject(Rejected(reason, detail, run_id), key, value, source)]

    def expire(self, now_ms: int) -> list[Emit]:
        """At a tick: answer ``tool_timeout`` every call whose deadline is over (by record
        time), with a result the latch writes, so that the pairing holds with no runner left."""
        emits: list[Emit] = []
        for turn in [t for t in self.turns.values() if t.waiting]:
            over = [(c, w) for c, w in turn.waiting.items() if w.deadline_ms <= now_ms]
            for call_id, waiting in over:
                del turn.waiting[call_id]
                content = (f"tool_timeout: no result within the call's deadline "
                           f"({self.settings.limits(waiting.name)[0] / 1000:g} s)")
                done = _Done(ResultReason.TOOL_TIMEOUT.value, True, content, None, 0, None)
                turn.done[call_id] = done
                self.stats["results_tool_timeout"] += 1
                emits.append(Emit(Topic.RESULTS, turn.run_id, {
                    "v": 1, "run_id": turn.run_id, "tenant": turn.tenant,
                    "provider": turn.provider, "tool_call_id": call_id, "name": waiting.name,
                    "idempotency_key": waiting.key, "is_error": True, "content": content,
                    "reason": ResultReason.TOOL_TIMEOUT.value, "by": LATCH}))
                emits.append(self._audit(turn, call_id, waiting, done))
            if not turn.waiting and turn.final is not None:
                emits.append(self._close(turn))
        return emits

    # -- records -------------------------------------------------------------------------

    def _audit(self, turn: _Turn, call_id: str, waiting: _Waiting, done: _Done) -> Emit:
        """The audit record of one committed call's answer: never its text."""
        answered = done.outcome == ANSWERED
        digest: dict[str, Any] = {"bytes": done.size}
        key = self._audit_key
        if key is not None and answered:
            digest["hmac"] = keyed_digest(key.key, done.content.encode("utf-8", "surrogatepass"))
            digest["key_id"] = key.key_id
        return Emit(Topic.AUDIT, turn.run_id, {
            "v": 1, "run_id": turn.run_id, "tenant": turn.tenant, "provider": turn.provider,
            "tool_call_id": call_id, "name": waiting.name, "outcome": done.outcome,
            "reason": None if answered else done.outcome, "policy": {"mode": "off"},
            "arguments": None, "result": {**digest, "is_error": done.is_error},
            "trace_id": None, "source": None,
            # (its own: the committed call's audit record has the call's key)
            "idempotency_key": f"{waiting.key}:result"})

    def _close(self, turn: _Turn) -> Emit:
        """The run's turn record; the turn is closed (its call ids remembered)."""
        final = turn.final
        assert final is not None
        del self.turns[turn.run_id]
        self.schemas.pop(turn.run_id, None)
        outcomes: list[dict[str, Any]] = final.get("outcomes") or []
        top = min((o.get("choice", 0) for o in outcomes), default=0)
        order = sorted(outcomes, key=lambda o: (o.get("choice", 0), o.get("index", 0)))
        entries: list[TurnEntry] = []
        answered: set[str] = set()
        for outcome in order:
            entries.append(self._entry(turn, outcome, top, answered))
        self.closed[turn.run_id] = {c: _closed(d) for c, d in turn.done.items()}
        while len(self.closed) > self._remember:
            self.closed.popitem(last=False)
        self.stats["turns"] += 1
        return Emit(Topic.TURNS, turn.run_id, turn_record(
            turn.run_id, turn.tenant, turn.provider, final["idempotency_key"], entries))

    def _entry(self, turn: _Turn, outcome: dict[str, Any], top: int,
               answered: set[str]) -> TurnEntry:
        """One call's line of the turn record, with the answer that goes back to the model
        (none for a dropped call, a repeated id, or a call of another choice)."""
        call_id, name = outcome["tool_call_id"], outcome["name"]
        reason = outcome.get("reason")
        if outcome.get("dropped"):
            return TurnEntry(call_id, name, DROPPED, reason, None, None)
        sendable = outcome.get("choice", 0) == top and call_id not in answered
        answered.add(call_id)
        kind = outcome.get("kind") or "function"  # (the final's kinds: core/turns.py)
        message_id = call_id  # (a Gemini call without one: Latch's, as the final names it)
        done = turn.done.get(call_id) if outcome.get("state") == "committed" else None
        if done is not None:
            answer = Answer(message_id, name, kind, done.is_error, done.content, done.structured)
            timed_out = done.outcome == ResultReason.TOOL_TIMEOUT  # (no result: no size)
            return TurnEntry(call_id, name, done.outcome,
                             None if done.outcome == ANSWERED else done.outcome,
                             answer if sendable else None, None if timed_out else done.size)
        error = turn.errors.get(call_id)
        content = error["content"] if error is not None else f"{reason}"
        answer = Answer(message_id, name, kind, True, content)
        return TurnEntry(call_id, name, FAILED, reason, answer if sendable else None,
                         len(content.encode("utf-8", "surrogatepass")))

    # -- a take-over ---------------------------------------------------------------------

    def remember_closed(self, run_id: str, answered: list[tuple[str, int, int]],
                        timed_out: list[str]) -> None:
        """A closed turn read from the run's ``done`` head (a worker rebuilding a partition):
        its answered calls with where each answer was read, its timed-out calls."""
        calls: dict[str, Closed] = {c: (_CLOSED_ANSWERED, p, o) for c, p, o in answered}
        calls.update({c: (_CLOSED_TIMED_OUT, -1, -1) for c in timed_out})
        self.closed[run_id] = calls
        while len(self.closed) > self._remember:
            self.closed.popitem(last=False)

    def closed_calls(self, run_id: str) -> tuple[list[list[Any]], list[str]] | None:
        """A closed turn's answered calls (``[id, partition, offset]``) and timed-out call
        ids, for its ``done`` head."""
        calls = self.closed.get(run_id)
        if calls is None:
            return None
        return ([[c, p, o] for c, (s, p, o) in calls.items() if s == _CLOSED_ANSWERED],
                [c for c, (s, _, _) in calls.items() if s == _CLOSED_TIMED_OUT])


def _closed(done: _Done) -> Closed:
    """What a closed turn keeps of a call's answer."""
    if done.outcome == ResultReason.TOOL_TIMEOUT:
        return _CLOSED_TIMED_OUT, -1, -1
    partition, offset = done.source if done.source is not None else (-1, -1)
    return _CLOSED_ANSWERED, partition, offset


def paired(pairing: Pairing | None, result: ToolResult, now_ms: int,
           raw: tuple[bytes | None, bytes, Any] | None, reject: Callable[..., Emit]
           ) -> list[Emit]:
    """A forwarded result: the result latch's (:meth:`Pairing.result`), or a DLQ record when
    the latch is off (``results.enabled: false``)."""
    if pairing is not None:
        return pairing.result(result, now_ms, raw)
    key, value, source = raw if raw is not None else (None, b"", None)
    return [reject(Rejected(DlqReason.INVALID_ENVELOPE, "results are not paired by this "
                            "worker (results.enabled is false)", result.run_id),
                   key, value, source)]


def result_size(content: str, structured: Any) -> int:
    """The bytes a result counts against ``max_bytes``: its content's UTF-8 and its structured
    content's JSON text."""
    size = len(content.encode("utf-8", "surrogatepass"))
    if structured is not None:
        try:
            size += len(dumps(structured))
        except TypeError:
            size += len(str(structured))
    return size
