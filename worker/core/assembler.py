"""The assembler: envelopes in, records out, for any number of runs.

:class:`Assembler` is the whole core as the worker and ``latch assemble`` see it. The
caller decodes nothing and keeps no clock: it passes the record (or an envelope) and the
record time ``now_ms``, and publishes the :class:`~worker.core.model.Emit` records it gets
back, in order. Same envelopes and times in, same records out, byte for byte; nothing here
reads a clock, a socket or a random number.

A run lives from ``run.start`` until its end: the provider's own end (``message_stop``,
``response.completed``), ``stream.end`` (for chat, or as a failure when the provider's end
never came), ``stream.error``, a provider error event, a cancel, or an idle timeout carried by
a tick. At its end every call gets exactly one outcome and the run one final message.
A finished run is remembered (``remember_finished_runs``) so that a re-delivered envelope is
recognised and ignored, and a late one goes to the DLQ.

Memory budgets
==============

One assembler (one events partition in the worker) holds a bounded amount of state, and what
happens at each bound is an outcome, never a silent drop or a refused run:

* **Open runs** (``max_open_runs``). Open runs are kept in least-recently-active order: a run
  moves to the back each time one of its envelopes is applied (re-deliveries do not count), so
  the order depends only on the input order. A ``run.start`` that finds the limit reached is
  accepted, and the least recently active run is ended first: its uncommitted calls fail
  ``budget_exceeded``, its final message has status ``failed``.
* **Buffered bytes** (``max_buffered_bytes``): the UTF-8 argument text held by all open runs,
  their tools' schema text, and the text their adapters keep for the final messages
  (assistant text, thinking, content blocks, output items: the bytes each adapter reports in
  ``Adapter.kept``, UTF-8 for text and the JSON text of a kept value), kept as a running total
  (added on append, released when a buffer is dropped or replaced and when its run ends). A
  fragment, or an event whose kept text, would cross the budget ends the least recently
  active runs that hold bytes, other than the receiving run, the same way, until it fits.
  When the receiving run alone would cross it, nobody else is ended: for an argument
  fragment the receiving call fails ``budget_exceeded`` and its buffer is dropped, and the
  run goes on; for kept text (which a final message in the making cannot drop) the receiving
  run ends (status ``failed``, its uncommitted calls fail ``budget_exceeded``).
* **Calls per run**: ``max_tool_calls_in_flight_assemble`` bounds the calls assembled at once,
  and each call beyond it still gets a failed placeholder (``too_many_tool_calls``) so that it
  has its one outcome. Placeholders cost memory too, so a run may hold at most
  :data:`CALLS_PER_RUN_FACTOR` times that many calls; the call start beyond that ends the whole
  run (status ``failed``): that call and every uncommitted call fail ``too_many_tool_calls``.
  A stream that opens that many calls is broken or hostile, and nothing of it is worth running.

* **Text per run** (``max_run_text_bytes``): text that is not argument text (assistant text,
  thinking, content blocks, output items) is kept by the adapters for the final message. It
  is bounded by the bytes of the provider events it comes from, less their argument text
  (less the whole record for a lone fragment within :data:`FRAGMENT_ENVELOPE` bytes of its
  text): the event that crosses the bound ends the run (status ``failed``, its
  uncommitted calls fail ``budget_exceeded``), so no final message grows past what the output
  topics accept. This per-run bound counts event bytes, an overcount of the text kept (the
  envelopes of small deltas) that is never below the text's JSON size in the final message;
  the partition's ``max_buffered_bytes`` counts the text actually kept. An event that keeps
  nothing but argument text counts no envelope; one that keeps anything, or names a call, does.
* **State per run**: each choice but a run's first, each Gemini candidate but its first, each
  content block, output item and item text an adapter keeps counts ``ops.STATE_BYTES`` in
  ``max_buffered_bytes`` (with the same eviction as text) besides its text; and a run may open
  at most ``max_choices_per_run`` choices (candidates): the event that opens one more ends the
  run (status ``failed``, uncommitted calls ``budget_exceeded``).
* **Output records** (``settings.MAX_RECORD_BYTES``): a call id longer than
  ``MAX_ID_CHARACTERS``, or a name longer than ``MAX_NAME_CHARACTERS``, is none (the call fails
  ``missing_id_or_name``), so that every record's head, ids and names are small. A committed
  call record that could be larger is measured, and fails ``record_too_large`` if it is
  (``run.Latch``). At a run's end, a final message that could be larger (:meth:`_final_bound`)
  is measured: a run ending normally whose final message would not fit ends ``failed``
  instead, its undecided calls ``record_too_large``; whatever the end, a final message that
  does not fit drops content and says so (``Outputs.bounded``).

Every end of a run above is the same ``_finish`` as a stream error's, so each call still gets
exactly one outcome and the run one final message.
"""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from orjson import JSONDecodeError, dumps
from orjson import loads as _loads

from worker.core import keys, strictjson
from worker.core import ops as op
from worker.core._mypyc import mypyc_attr
from worker.core.envelope import (
    Cancel,
    Envelope,
    ProviderEvent,
    Rejected,
    RunStart,
    StreamEnd,
    StreamError,
    Tick,
    checked,
    decode,
    undecodable,
)
from worker.core.model import CallState, DlqReason, Emit, Reason, RunStatus
from worker.core.outputs import Outputs, dlq_record, id_counts
from worker.core.providers import adapter_for
from worker.core.run import FOLD_PIECES, Call, Latch, utf8_len
from worker.core.schemacheck import SchemaLimits
from worker.core.settings import (
    CALLS_PER_RUN_FACTOR,
    CHOICE_BYTES,
    MAX_ID_CHARACTERS,
    MAX_NAME_CHARACTERS,
    MAX_RECORD_BYTES,
    RECORD_OVERHEAD,
    AssembleSettings,
)
from worker.core.tools import (
    SchemaCheck,
    ToolSchema,
    ValidatorCache,
    client_tools,
    shared_validators,
)

#: ``worker.core._peek.peek`` (worker/core/csrc/peek.c), built with the compiled core; None in
#: a pure-Python install, which then parses every record with orjson.
Peeked = tuple[int, str, int, int | None, int, str]
_PEEK: Callable[[bytes], Peeked | None] | None
try:
    from worker.core._peek import peek as _PEEK
except ImportError:  # pure Python (setup.py): no C extension
    _PEEK = None

#: How many distinct tool maps an assembler keeps for its runs to share (``_shared_tools``),
#: and how much schema text they may hold at most.
SHARED_TOOL_MAPS = 1024
SHARED_TOOL_MAP_BYTES = 16 * 1024 * 1024
#: The tool map of a run that registers no client tool (never changed).
_NO_TOOLS: dict[str, ToolSchema] = {}

_OPEN = CallState.OPEN
_COMPLETE = CallState.ARGS_COMPLETE
_UNWRAPPED = CallState.UNWRAPPED
#: Between a parallel wrapper's call id and an entry's position in the ids of the calls it is
#: unwrapped into (``call_abc`` -> ``call_abc#0``, ``call_abc#1``; README, "The parallel
#: wrapper"). OpenAI's call ids are ``call_`` and letters and digits, never ``#``; an id that
#: equals a derived one anyway is shared by two calls, and both fail ``duplicate_call_id``.
WRAPPED_ID_SEPARATOR = "#"
#: What ``feed_record`` reads a record that is not a JSON object as (never changed).
_NOT_AN_OBJECT: dict[str, Any] = {}

#: Bytes of a call's entries in a final message besides its text, id and name, at most.
_CALL_FIELDS_BYTES = 512
#: The bytes of a record carrying one argument fragment that are taken for its envelope (the
#: ids, model and names a provider repeats on every chunk), not counted as the run's text.
FRAGMENT_ENVELOPE = 512
#: The largest order key (tool, content block or output index; choice) a call may carry. Every
#: outcome repeats it, JSON readers lose precision beyond 2**53, and orjson writes nothing
#: beyond 2**64 - 1 (which a chat call without an index after one at 2**64 - 1 would get).
MAX_ORDER_KEY = 2**53 - 1


def _check_order_keys(ops: Sequence[op.Op]) -> None:
    """Refuse (ValueError: the event goes to the DLQ) a call whose order key is not an integer
    (``true`` is not one), is negative, or is beyond :data:`MAX_ORDER_KEY`."""
    for item in ops:
        if isinstance(item, op.OpenCall) and not (
                _order_key(item.index) and (item.choice is None or _order_key(item.choice))):
            raise ValueError("a call index out of range")


def _order_key(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_ORDER_KEY


_NONE_TRUNCATED: frozenset[int | None] = frozenset()


class Run:
    """The state of one open run."""

    __slots__ = ("adapter", "broken", "calls", "key", "last_ms", "last_seq", "latch", "nbytes",
                 "out", "run_id", "text_bytes", "truncated")

    def __init__(self, start: RunStart, adapter: op.Adapter, latch: Latch, now_ms: int,
                 key: bytes | None = None) -> None:
        # (the run.start itself is not kept: its tools are the latch's, the rest the outputs')
        self.run_id = start.run_id
        #: The record key of the run's envelopes (its run id, UTF-8): the ``run.start``
        #: record's own key object, which the engine's heads table holds too.
        encoded = start.run_id.encode()
        self.key = key if key is not None and key == encoded else encoded
        self.adapter = adapter
        self.latch = latch
        self.out = Outputs(start)
        self.last_seq = start.seq
        self.last_ms = now_ms
        self.calls: dict[str, Call] = {}
        #: The choices cut short (None: the whole message); a shared empty set until one is.
        self.truncated: frozenset[int | None] = _NONE_TRUNCATED
        #: Argument, schema and text bytes this run holds (its share of
        #: ``Assembler.buffered_bytes``).
        self.nbytes = 0
        #: How the stream broke its protocol, once it did (see ``Assembler._break``).
        self.broken: str | None = None
        #: Bytes of the provider events its final message is built from (``max_run_text_bytes``).
        self.text_bytes = 0

    def in_flight(self) -> int:
        return sum(1 for c in self.calls.values() if c.state is CallState.OPEN)


@mypyc_attr(allow_interpreted_subclasses=True)  # mypyc: tests subclass it (SpyAssembler)
class Assembler:
    """Assemble tool calls for many runs; see the module docstring."""

    def __init__(self, settings: AssembleSettings | None = None,
                 validators: ValidatorCache | None = None) -> None:
        self.settings = settings or AssembleSettings()
        self.stats: Counter[str] = Counter()
        #: Open runs, least recently active first.
        self._runs: OrderedDict[str, Run] = OrderedDict()
        #: ``self._runs.move_to_end``, bound once: called for nearly every record, and
        #: compiled a method call by name looks the method up each time (bench/bench_core.py).
        self._move_to_end: Callable[[str], None] = self._runs.move_to_end
        #: ``orjson.loads``, held by the instance: compiled, a module global is a dict lookup.
        self._loads: Callable[[bytes], Any] = _loads
        #: The common provider event read without building its whole object (``_PEEK``);
        #: None: every record is parsed with orjson.
        self._peek: Callable[[bytes], Peeked | None] | None = _PEEK
        #: Tool maps shared by the runs that register the same tools (``_shared_tools``).
        self._tool_maps: OrderedDict[tuple[tuple[str, ToolSchema], ...],
                                     tuple[dict[str, ToolSchema], int]] = OrderedDict()
        self._tool_map_bytes = 0
        #: The keys of the open runs whose adapter reads no peeked event (``Adapter.fast``):
        #: their records go to orjson at once, not through a parse that can only decline.
        self._unpeeked: set[bytes] = set()
        self._buffered = 0
        self._finished: OrderedDict[str, tuple[int, RunStatus]] = OrderedDict()
        #: Cancels of runs not started yet: run id -> (record time, reason), oldest first.
        self._early_cancels: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._validators = validators or shared_validators(SchemaLimits(
            self.settings.max_schema_nodes, self.settings.max_schema_validation_steps))
        self._pipelined = frozenset(self.settings.allow_pipelined_execute)
        # Read for every argument fragment: copied out of the settings once.
        self._max_argument_bytes = self.settings.max_tool_argument_bytes
        self._max_buffered_bytes = self.settings.max_buffered_bytes
        self._max_run_text_bytes = self.settings.max_run_text_bytes
        self._emit_progress = self.settings.emit_progress
        self._clock = 0
        #: When a list (the worker's metrics set one), the argument bytes of each call the
        #: latch checks are appended; the caller drains it. None (the default): not kept.
        self.sizes: list[int] | None = None

    # -- entry points -----------------------------------------------------------------

    def feed_record(
        self, key: bytes | None, value: bytes, now_ms: int | None = None,
        source: dict[str, Any] | None = None,
    ) -> list[Emit]:
        """Decode one input record and apply it; a bad record becomes one DLQ record.

        ``now_ms`` is the record time; offline (None) it is the envelope's ``ts``, else the
        latest time seen, so that a capture without times never expires anything.
        """
        peek = self._peek
        unpeeked = self._unpeeked
        if peek is not None and not (unpeeked and key in unpeeked):
            # Nearly every record: a text delta or an argument fragment of an open run, in
            # order, read by worker/core/csrc/peek.c without building the event. Each test here
            # is one the orjson path below makes; anything else, or an event the adapter's
            # ``fast`` leaves to ``feed``, takes that path (test_fast_paths.py).
            peeked = peek(value)
            if peeked is not None:
                known = self._runs.get(peeked[1])
                next_seq = peeked[2]
                if (known is not None and next_seq > known.last_seq
                        and (key is None or key == known.key)):
                    fast = known.adapter.fast(peeked[0], peeked[4], peeked[5])
                    if fast is not None:
                        if now_ms is None:
                            now_ms = max(self._clock, peeked[3] or 0)
                        if now_ms > self._clock:
                            self._clock = now_ms
                        known.last_seq, known.last_ms = next_seq, now_ms
                        self._move_to_end(known.run_id)  # _touch(run), inline
                        return self._applied(known, fast, len(value))
        try:
            parsed: Any = self._loads(value)
        except JSONDecodeError as exc:
            return [self._reject(undecodable(exc), key, value, source)]
        # The common case, a provider event of an open run in order, is applied here without
        # building its envelope (bench/bench_core.py). Each test below is one that
        # ``envelope.decode`` and ``feed`` make of such a record; whatever fails one of them
        # takes the general path, which decodes the record again and says what is wrong.
        # (``doc`` is declared a dict so that the compiled core reads it with dict operations.)
        doc: dict[str, Any] = parsed if isinstance(parsed, dict) else _NOT_AN_OBJECT
        # (the member names are orjson's own key objects: worker/core/keys.py)
        kind = doc.get(keys.TYPE)
        if isinstance(kind, str) and kind == "provider.event":
            run_id, version = doc.get(keys.RUN_ID), doc.get(keys.V)
            run = self._runs.get(run_id) if isinstance(run_id, str) else None
            seq, event = doc.get(keys.SEQ), doc.get(keys.EVENT)
            # Five members, and the five read are not null: they are all there is, so no ts.
            ts = doc.get(keys.TS) if len(doc) != 5 else None
            if (run is not None and type(seq) is int and seq > run.last_seq
                    and type(version) is int and version == 1
                    and (ts is None or (type(ts) is int and ts >= 0))
                    and (key is None or key == run.key) and isinstance(event, dict)):
                if now_ms is None:
                    now_ms = max(self._clock, ts or 0)
                if now_ms > self._clock:
                    self._clock = now_ms
                run.last_seq, run.last_ms = seq, now_ms
                self._move_to_end(run.run_id)  # _touch(run), inline
                return self._provider_event(run, event, key, value, source)
        return self._feed_envelope(checked(parsed, key, value), key, value, now_ms, source)

    def _feed_general(self, key: bytes | None, value: bytes, now_ms: int | None,
                      source: dict[str, Any] | None) -> list[Emit]:
        """``feed_record`` without its fast path: decode the envelope, then ``feed`` it."""
        return self._feed_envelope(decode(key, value), key, value, now_ms, source)

    def _feed_envelope(self, envelope: Envelope | Rejected, key: bytes | None, value: bytes,
                       now_ms: int | None, source: dict[str, Any] | None) -> list[Emit]:
        if isinstance(envelope, Rejected):
            return [self._reject(envelope, key, value, source)]
        if now_ms is None:
            now_ms = max(self._clock, envelope.ts or 0)
        if now_ms > self._clock:  # not max(): this runs for every record
            self._clock = now_ms
        return self.feed(envelope, now_ms, raw=(key, value, source))

    def feed(
        self,
        envelope: Envelope,
        now_ms: int,
        raw: tuple[bytes | None, bytes, dict[str, Any] | None] | None = None,
    ) -> list[Emit]:
        """Apply one decoded envelope at record time ``now_ms``."""
        if isinstance(envelope, Tick):
            return self.expire(now_ms)  # the record time, never the payload's ts
        run = self._runs.get(envelope.run_id)
        if isinstance(envelope, RunStart):
            return self._start(envelope, run, now_ms, raw)
        if run is None:
            return self._orphan(envelope, raw, now_ms)
        if isinstance(envelope, Cancel):
            run.last_ms = now_ms
            return self._finish(run, RunStatus.CANCELLED, Reason.CANCELLED, envelope.reason)
        if envelope.seq <= run.last_seq:
            self.stats["duplicates"] += 1
            return []
        run.last_seq, run.last_ms = envelope.seq, now_ms
        self._touch(run)
        if isinstance(envelope, ProviderEvent):
            return self._provider_event(run, envelope.event, *self._raw(raw))
        if isinstance(envelope, StreamError):
            return self._finish(run, RunStatus.FAILED, Reason.STREAM_ERROR, "transport failed")
        return self._stream_end(run)

    def expire(self, now_ms: int) -> list[Emit]:
        """Fail every run that has seen no event for ``assemble_idle_timeout_s``, and forget
        the cancels that waited ``early_cancel_ttl_s`` for their ``run.start`` in vain."""
        if self._early_cancels:  # by record time too: what the worker's heads mirror
            self._forget_early_cancels(now_ms)
        limit = self.settings.assemble_idle_timeout_s * 1000
        idle = [r for r in self._runs.values() if now_ms - r.last_ms >= limit]
        emits: list[Emit] = []
        for run in idle:
            detail = f"no event for {self.settings.assemble_idle_timeout_s:g} s"
            emits += self._finish(run, RunStatus.IDLE_TIMEOUT, Reason.ASSEMBLE_IDLE_TIMEOUT, detail)
        return emits

    @property
    def open_runs(self) -> int:
        return len(self._runs)

    def open_run_ids(self) -> list[str]:
        """The open runs, least recently active first."""
        return list(self._runs)

    @property
    def buffered_bytes(self) -> int:
        """Argument, schema and kept text bytes held by all open runs (what
        ``max_buffered_bytes`` bounds)."""
        return self._buffered

    def is_open(self, run_id: str) -> bool:
        """Whether ``run_id`` has started and not yet finished."""
        return run_id in self._runs

    def finished(self, run_id: str) -> tuple[int, RunStatus] | None:
        """The last applied ``seq`` and the status of a remembered finished run, else None."""
        return self._finished.get(run_id)

    def remember_finished(self, run_id: str, last_seq: int, status: RunStatus) -> None:
        """Remember a run that finished before this assembler existed (a worker rebuilding a
        partition), so that its re-delivered events are ignored and late ones rejected."""
        self._finished[run_id] = (last_seq, status)
        if len(self._finished) > self.settings.remember_finished_runs:
            self._finished.popitem(last=False)

    # -- run lifecycle ----------------------------------------------------------------

    def _start(self, start: RunStart, run: Run | None, now_ms: int, raw: Any) -> list[Emit]:
        seen = run.last_seq if run is not None else self._finished.get(start.run_id, (None,))[0]
        if seen is not None:
            if start.seq <= seen:
                self.stats["duplicates"] += 1
                return []
            return [self._reject(Rejected(DlqReason.DUPLICATE_RUN_START, "run already started",
                                          start.run_id), *self._raw(raw))]
        emits: list[Emit] = []
        limit = self.settings.max_open_runs
        while self._runs and len(self._runs) >= limit:
            detail = (f"the worker's open-run budget ({limit} runs) was exhausted; the least "
                      "recently active run was ended")
            emits += self._evict(next(iter(self._runs.values())), detail, "evicted_open_runs")
        tools, cost, emits_ = self._tools(start)
        emits += emits_
        budget = self.settings.max_tool_calls_per_run
        if start.max_tool_calls is not None:
            budget = min(budget, start.max_tool_calls)
        adapter = adapter_for(start.provider, start.run_id)
        adapter.max_choices = self.settings.max_choices_per_run
        latch = Latch(self.settings, tools, budget, adapter.parse_arguments
                      if adapter.parses_own_arguments else strictjson.parse)
        run = Run(start, adapter, latch, now_ms, raw[0] if raw is not None else None)
        if not adapter.peeked:
            self._unpeeked.add(run.key)
        run.nbytes = cost
        self._buffered += cost
        self._runs[start.run_id] = run
        self.stats["runs_started"] += 1
        early = self._early_cancel(start.run_id, now_ms)
        if early is not None:  # cancelled before it started: it ends as a cancel right after
            self.stats["early_cancels_applied"] += 1  # its run.start would have ended it
            emits += self._finish(run, RunStatus.CANCELLED, Reason.CANCELLED, early)
        return emits

    def _tools(self, start: RunStart) -> tuple[dict[str, ToolSchema], int, list[Emit]]:
        """The run's client tools, not compiled; the bytes of schema text they hold (counted in
        ``max_buffered_bytes`` like argument text, making room the same way); and the runs
        ended to make that room. Tools that alone would exceed the budget are all unusable."""
        limit, budget = self.settings.max_tool_schema_bytes, self._max_buffered_bytes
        tools = {name: self._validators.prepare(schema, limit)
                 for name, schema in client_tools(start.provider, start.tools).items()}
        cost = sum(len(t.text) for t in tools.values() if t.text is not None)
        if cost > budget:
            self.stats["runs_over_buffered_bytes_tools"] += 1
            broken = SchemaCheck(None, f"the run's tool schemas exceed the worker's byte budget "
                                 f"({budget} bytes)")
            return {name: ToolSchema(self._validators, None, broken) for name in tools}, 0, []
        if cost and self._buffered + cost > budget:
            detail = (f"the worker's argument byte budget ({budget} bytes) was exhausted; the "
                      "least recently active run was ended")
            emits: list[Emit] = []
            for victim in [r for r in self._runs.values() if r.nbytes]:
                if self._buffered + cost <= budget:
                    break
                emits += self._evict(victim, detail, "evicted_buffered_bytes")
            return self._shared_tools(tools, cost), cost, emits
        return self._shared_tools(tools, cost), cost, []

    def _shared_tools(self, tools: dict[str, ToolSchema], cost: int) -> dict[str, ToolSchema]:
        """One tool map for the runs that register the same tools (names and shared schemas:
        ``ValidatorCache.prepare``), as most runs of one agent do: the map is only read, and
        each run would otherwise hold a copy (bench/bench_memory.py).

        The maps kept are the most recently used, at most :data:`SHARED_TOOL_MAPS` of them
        holding at most :data:`SHARED_TOOL_MAP_BYTES` of schema text: a map keeps its schemas
        alive after its runs ended, and run starts with ever new tools must not make that
        memory grow past a bound (it is counted in no run's ``max_buffered_bytes``). ``cost``:
        the map's schema text bytes."""
        if not tools:
            return _NO_TOOLS
        maps = self._tool_maps
        key = tuple(tools.items())  # (a ToolSchema hashes and compares by identity)
        found = maps.get(key)
        if found is not None:
            maps.move_to_end(key)
            return found[0]
        if cost > SHARED_TOOL_MAP_BYTES:
            return tools  # its own, never kept
        maps[key] = (tools, cost)
        self._tool_map_bytes += cost
        while len(maps) > SHARED_TOOL_MAPS or self._tool_map_bytes > SHARED_TOOL_MAP_BYTES:
            _, (_, dropped) = maps.popitem(last=False)
            self._tool_map_bytes -= dropped
        return tools

    # -- a cancel before its run.start ---------------------------------------------------
    #
    # The gateway's envelopes and the forwarded cancels reach a run's partition by different
    # paths, so a user's cancel may be written before the run's ``run.start``. It is
    # remembered (``remember_early_cancels``, oldest forgotten first) for
    # ``early_cancel_ttl_s`` of record time, and a run that starts within it is cancelled at
    # once: the same outcome as a cancel right after its ``run.start``.

    def _remember_cancel(self, cancel: Cancel, now_ms: int) -> None:
        self._early_cancels.pop(cancel.run_id, None)
        self._early_cancels[cancel.run_id] = (now_ms, cancel.reason)
        self._forget_early_cancels(now_ms)
        while len(self._early_cancels) > self.settings.remember_early_cancels:
            self._early_cancels.popitem(last=False)
            self.stats["early_cancels_forgotten"] += 1
        self.stats["early_cancels_remembered"] += 1

    def _forget_early_cancels(self, now_ms: int) -> None:
        """Drop the remembered cancels older than ``early_cancel_ttl_s`` at ``now_ms``."""
        ttl_ms = self.settings.early_cancel_ttl_s * 1000
        while self._early_cancels:
            at = next(iter(self._early_cancels.values()))[0]
            if now_ms - at <= ttl_ms:
                break
            self._early_cancels.popitem(last=False)
            self.stats["early_cancels_expired"] += 1

    def _early_cancel(self, run_id: str, now_ms: int) -> str | None:
        """The reason of a remembered, unexpired cancel of ``run_id`` (forgotten once used)."""
        if not self._early_cancels:
            return None
        self._forget_early_cancels(now_ms)
        found = self._early_cancels.pop(run_id, None)
        return None if found is None else found[1]

    @property
    def early_cancels_waiting(self) -> int:
        """How many cancels are remembered, waiting for their ``run.start``."""
        return len(self._early_cancels)

    def early_cancel_pending(self, run_id: str) -> bool:
        """Whether a cancel of ``run_id`` is remembered, waiting for its ``run.start``."""
        return run_id in self._early_cancels

    def _orphan(self, envelope: Cancel | ProviderEvent | StreamEnd | StreamError,
                raw: Any, now_ms: int) -> list[Emit]:
        finished = self._finished.get(envelope.run_id)
        if finished is None and isinstance(envelope, Cancel):
            self._remember_cancel(envelope, now_ms)
            return []
        if finished is None:
            reject = Rejected(DlqReason.UNKNOWN_RUN, "no run.start for this run", envelope.run_id)
            return [self._reject(reject, *self._raw(raw))]
        last_seq, status = finished
        if isinstance(envelope, Cancel) or status is RunStatus.CANCELLED:
            self.stats["ignored_after_end"] += 1
            return []
        if envelope.seq <= last_seq or isinstance(envelope, StreamEnd):
            self.stats["duplicates" if envelope.seq <= last_seq else "ignored_after_end"] += 1
            return []
        reject = Rejected(DlqReason.RUN_FINISHED, f"the run ended as {status}", envelope.run_id)
        return [self._reject(reject, *self._raw(raw))]

    def _provider_event(self, run: Run, event: dict[str, Any], key: bytes | None,
                        value: bytes, source: dict[str, Any] | None) -> list[Emit]:
        adapter = run.adapter
        adapter.record = value  # (Adapter.arguments_text), never kept past the event
        try:
            ops = adapter.feed(event)
            n = len(ops)
            if n and (n > 1 or not isinstance(ops[0], op.AppendArgs)):  # a fragment alone
                _check_order_keys(ops)  # opens no call: nothing to check
        except Exception as exc:  # a malformed provider event: contained, never raised
            adapter.record = b""
            if adapter.kept:  # what it kept before refusing is the final message's: counted
                run.text_bytes += len(value) if value else len(dumps(event))
            return [self._unreadable(run, exc, key, value, source)]
        adapter.record = b""
        return self._applied(run, ops, len(value) if value else len(dumps(event)))

    def _applied(self, run: Run, ops: list[op.Op], size: int) -> list[Emit]:
        """Apply the ops of one provider event of ``size`` bytes that the run's adapter read."""
        # What an adapter keeps for the final message (text, thinking, blocks, items) comes
        # from the event's bytes that are not argument text: they bound the run's text. A lone
        # argument fragment's own envelope (at most FRAGMENT_ENVELOPE bytes) is not counted.
        adapter = run.adapter
        n = len(ops)
        if not n:  # nearly every event, a text delta: its text kept, no op (_ops, inline)
            text_bytes = run.text_bytes + size
            run.text_bytes = text_bytes
            kept = adapter.kept
            if text_bytes <= self._max_run_text_bytes and kept >= 0 and (
                    self._buffered + kept <= self._max_buffered_bytes):
                adapter.kept = 0
                run.nbytes += kept  # it fits: _hold_text, inline
                self._buffered += kept
                return []
            run.text_bytes -= size  # anything else: the general steps below
        if n == 1:
            first = ops[0]
            if isinstance(first, (op.AppendArgs, op.SetArgs)):
                size -= len(first.text)
            # (an event that keeps something, or names a call, is the final message's source)
            if (size <= FRAGMENT_ENVELOPE and not adapter.kept
                    and not isinstance(first, (op.OpenCall, op.Identify))):
                size = 0
        elif n:
            for item in ops:
                if isinstance(item, (op.AppendArgs, op.SetArgs)):
                    size -= len(item.text)
        text_bytes = run.text_bytes + size
        run.text_bytes = text_bytes
        if text_bytes > self._max_run_text_bytes:
            self.stats["runs_over_text_bytes"] += 1
            return self._finish(run, RunStatus.FAILED, Reason.BUDGET_EXCEEDED, "the run's text "
                                f"and thinking exceeded {self._max_run_text_bytes} bytes")
        kept = run.adapter.kept
        if kept:  # text kept for the final message: held in max_buffered_bytes
            run.adapter.kept = 0
            if kept < 0 or self._buffered + kept <= self._max_buffered_bytes:
                run.nbytes += kept  # it fits: _hold_text, inline
                self._buffered += kept
            else:
                ended = self._hold_text(run, kept)
                if ended:  # runs ended to make room, perhaps this one
                    return ended + self._ops(run, ops) if run.run_id in self._runs else ended
        if n == 1:
            item = ops[0]
            if isinstance(item, op.AppendArgs):  # _apply(run, item), inline: nearly every op
                return self._args(run, item.key, item.text, replace=False)
        return self._ops(run, ops)

    def _ops(self, run: Run, ops: list[op.Op]) -> list[Emit]:
        """Apply one provider event's ops, until one ends the run."""
        if not ops:  # most events (text deltas) have none
            return []
        if len(ops) == 1:
            item = ops[0]
            if isinstance(item, op.AppendArgs):  # _apply(run, item), inline: nearly every op
                return self._args(run, item.key, item.text, replace=False)
            return self._apply(run, item)
        emits: list[Emit] = []
        for item in ops:
            emits += self._apply(run, item)
            if run.run_id not in self._runs:
                break
        return emits

    def _unreadable(self, run: Run, exc: Exception, key: bytes | None, value: bytes,
                    source: dict[str, Any] | None) -> Emit:
        """The DLQ record of a provider event its adapter could not read or refused."""
        detail = (str(exc) if isinstance(exc, op.EventRefused)
                  else f"provider event could not be read ({type(exc).__name__})")
        reject = Rejected(DlqReason.INVALID_ENVELOPE, detail, run.run_id)
        return self._reject(reject, key, value, source)

    def _stream_end(self, run: Run) -> list[Emit]:
        if run.broken is not None:
            return self._finish(run, RunStatus.FAILED, Reason.PROTOCOL_ERROR, run.broken)
        emits: list[Emit] = []
        for item in run.adapter.end():  # a stop reason decided at the stream's end
            emits += self._apply(run, item)
            if run.run_id not in self._runs:
                return emits
        if run.adapter.completes_on_stream_end:
            status = RunStatus.TRUNCATED if run.truncated else RunStatus.COMPLETED
            return emits + self._finish(run, status, None, "")
        detail = "the stream ended before the provider's end-of-message event"
        return emits + self._finish(run, RunStatus.FAILED, Reason.STREAM_ERROR, detail)

    # -- ops --------------------------------------------------------------------------

    def _apply(self, run: Run, item: op.Op) -> list[Emit]:
        if isinstance(item, op.AppendArgs):  # the most frequent op by far: before the match
            return self._args(run, item.key, item.text, replace=False)
        match item:
            case op.SetArgs():
                return self._args(run, item.key, item.text, replace=True)
            case op.OpenCall():
                return self._open(run, item)
            case op.Identify(key, call_id, name):
                call = run.calls.get(key)
                if call is not None:  # (a too long id or name is none: _open)
                    call.call_id = call.call_id or _usable(call_id, MAX_ID_CHARACTERS)
                    call.name = call.name or _usable(name, MAX_NAME_CHARACTERS)
                return []
            case op.RefuseArgs(key, detail):
                call = run.calls.get(key)
                if call is not None and call.state is _OPEN:  # its text no longer counts
                    self._drop(run, call)
                    call.refused = detail
                return []
            case op.CloseCall(key):
                return self._close(run, key)
            case op.Truncated(choice):
                run.truncated = run.truncated | {choice}
                return []
            case op.Complete():
                if run.broken is not None:
                    return self._finish(run, RunStatus.FAILED, Reason.PROTOCOL_ERROR, run.broken)
                status = RunStatus.TRUNCATED if run.truncated else RunStatus.COMPLETED
                return self._finish(run, status, None, "")
            case op.UpstreamError(detail, reason):
                return self._finish(run, RunStatus.FAILED, reason, detail)
            case op.ProtocolError(detail):
                return self._break(run, detail)
            case op.Restated(key, text):
                return self._restated(run, key, text)
        raise AssertionError(f"unhandled op {item!r}")  # pragma: no cover

    def _open(self, run: Run, item: op.OpenCall) -> list[Emit]:
        if item.key in run.calls:
            return self._apply(run, op.Identify(item.key, item.call_id, item.name))
        if run.broken is not None and item.call_id is not None and any(
                c.call_id == item.call_id for c in run.calls.values()):
            return []  # after a break, an id the run holds already has its one outcome
        name, call_id = item.name, item.call_id
        # An id or name too long to repeat in every record is none (``missing_id_or_name``).
        long = _too_long(call_id, name)
        if long:
            call_id, name = _usable(call_id, MAX_ID_CHARACTERS), _usable(name, MAX_NAME_CHARACTERS)
        if name is not None and name in run.latch.tools:
            name = sys.intern(name)  # the tool map's key (tools.client_tools): one string
        call = Call(item.key, item.index, item.choice, len(run.calls), call_id, name,
                    item.kind, item.tool)
        limit = self.settings.max_tool_calls_in_flight_assemble
        cap = CALLS_PER_RUN_FACTOR * limit
        if len(run.calls) >= cap:  # a flood of call starts: end the run (module docstring)
            run.calls[item.key] = call
            self.stats["runs_ended_too_many_calls"] += 1
            detail = f"the run started more than {cap} calls; the whole run was ended"
            return self._finish(run, RunStatus.FAILED, Reason.TOO_MANY_TOOL_CALLS, detail)
        run.calls[item.key] = call
        if run.broken is not None:  # nothing of the stream is trusted (outcome at the end)
            call.fail(Reason.PROTOCOL_ERROR, f"started after the stream broke: {run.broken}")
            return []
        if long:
            call.fail(Reason.MISSING_ID_OR_NAME, long)
            return []
        if run.in_flight() > limit:
            call.fail(Reason.TOO_MANY_TOOL_CALLS, f"at most {limit} calls may be assembled at once")
        return []

    def _args(self, run: Run, key: str, text: str, replace: bool) -> list[Emit]:
        call = run.calls.get(key)
        if call is None or call.state is not _OPEN:
            return []
        held = call.nbytes
        total = (len(text) if text.isascii() else utf8_len(text)) + (0 if replace else held)
        if total > self._max_argument_bytes:
            limit = self.settings.max_tool_argument_bytes
            self._drop(run, call)
            call.fail(Reason.ARGUMENTS_EXCEED_MAX_BYTES, f"more than {limit} bytes of arguments")
            return []
        growth, budget = total - held, self._max_buffered_bytes
        emits: list[Emit] = []
        if growth > 0 and self._buffered + growth > budget:
            if run.nbytes + growth > budget:  # this run alone: fail the call, end nobody
                self._drop(run, call)
                self.stats["calls_over_buffered_bytes"] += 1
                call.fail(Reason.BUDGET_EXCEEDED, f"the worker's argument byte budget ({budget} "
                          "bytes) cannot hold this run's calls; this call's text was dropped")
                return []
            emits = self._make_room(run, growth, budget)
        parts = call.parts
        if replace:
            parts.clear()
            call.folded = 0
        parts.append(text)
        if len(parts) - call.folded >= FOLD_PIECES:
            call.fold()
        call.nbytes = total
        run.nbytes += growth
        self._buffered += growth
        if not self._emit_progress:
            return emits
        if not self.settings.ui_forward_partial_args:
            return [*emits, run.out.progress(call)]
        # Only this fragment's text, and where it goes: progress is linear in argument bytes.
        return [*emits, run.out.progress(call, text, 0 if replace else held)]

    def _close(self, run: Run, key: str) -> list[Emit]:
        call = run.calls.get(key)
        if call is None or call.state is not CallState.OPEN:
            return []
        call.move(CallState.ARGS_COMPLETE)
        ready = self._unwrap(run, call) or [call]
        if not self.settings.execute_before_stream_end:
            return []
        ready = [c for c in ready if c.name in self._pipelined and c.state is _COMPLETE]
        for each in ready:
            self._decide(run, each)
        return self._outcomes(run, ready) if ready else []

    # -- the parallel wrapper (README, "The parallel wrapper") --------------------------

    def _unwrap(self, run: Run, call: Call) -> list[Call] | None:
        """Replace an ``ARGS_COMPLETE`` ``multi_tool_use.parallel`` wrapper by one
        ``ARGS_COMPLETE`` call per ``tool_uses[]`` entry and return those; None (and nothing
        changed) when ``call`` is not such a wrapper: another kind or name, a name the run
        registered, no id, or a text that is not a strict JSON object whose ``tool_uses`` is a
        non-empty array. A wrapper with more entries than the run may still hold calls fails
        ``too_many_tool_calls`` instead (and returns [])."""
        if (call.kind != op.FUNCTION or call.name not in run.adapter.wrapper_names
                or call.name in run.latch.tools or not call.call_id):
            return None
        text = "".join(call.parts)
        value = strictjson.parse(text)
        uses = value.get("tool_uses") if isinstance(value, dict) else None
        if not isinstance(uses, list) or not uses:
            return None
        room = CALLS_PER_RUN_FACTOR * self.settings.max_tool_calls_in_flight_assemble
        if len(run.calls) + len(uses) > room:
            call.fail(Reason.TOO_MANY_TOOL_CALLS, f"the parallel wrapper holds {len(uses)} "
                      f"calls; the run may hold at most {room}")
            return []
        call.text, call.parts = text, []
        call.move(CallState.UNWRAPPED)
        children = []
        for n, use in enumerate(uses):
            name, arguments = _tool_use(use)
            name = _usable(name, MAX_NAME_CHARACTERS)  # (too long: missing_id_or_name)
            child = Call(f"{call.key}/{n}", call.index, call.choice, len(run.calls),
                         f"{call.call_id}{WRAPPED_ID_SEPARATOR}{n}", name)
            child.parent = call.key
            child.parts.append(arguments)
            child.move(CallState.ARGS_COMPLETE)
            run.calls[child.key] = child
            children.append(child)
        self.stats["parallel_wrappers_unwrapped"] += 1
        return children

    # -- protocol breaks (README, "Protocol breaks") ---------------------------------------

    def _break(self, run: Run, detail: str) -> list[Emit]:
        """The stream broke its protocol: every call not yet decided fails
        ``protocol_error`` now (its text stays for the final message, as after any failed
        check), later call starts fail at once (``_open``), and the run ends ``failed``
        (``_finish``), which emits the outcomes, in provider order like every run's. A second
        break changes nothing."""
        if run.broken is not None:
            return []
        run.broken = detail
        self.stats["protocol_errors"] += 1
        for call in run.calls.values():
            if call.state is _OPEN or call.state is _COMPLETE:
                call.fail(Reason.PROTOCOL_ERROR, detail)
        return []

    def _restated(self, run: Run, key: str, text: str) -> list[Emit]:
        """The provider restated a call's whole text at its end: a different text than the
        one streamed (and decided on) is a protocol break."""
        call = run.calls.get(key)
        if call is None:
            return []
        if call.text is not None:  # decided (or unwrapped): the text it was decided on
            held = call.text
        elif call.state is _OPEN or call.state is _COMPLETE:
            held = "".join(call.parts)
        else:  # failed before it was decided (oversize, too many...): no text was kept
            return []
        if held == text:
            return []
        return self._break(run, "the terminal event restates a call with another text than "
                                "the one streamed")

    # -- the end of a run -------------------------------------------------------------

    def _decide(self, run: Run, call: Call) -> None:
        truncated = None in run.truncated or call.choice in run.truncated
        tool_call_id = call.tool_call_id
        shared = sum(1 for c in run.calls.values() if c.tool_call_id == tool_call_id) > 1
        run.latch.decide(call, truncated, shared, run.out.committed_size)
        if self.sizes is not None:
            self.sizes.append(call.nbytes)

    def _finish(self, run: Run, status: RunStatus, reason: Reason | None,
                detail: str) -> list[Emit]:
        """End the run: every call gets its outcome, then the final message."""
        if reason is None:
            for call in list(run.calls.values()):
                if call.state is CallState.OPEN:
                    call.move(CallState.ARGS_COMPLETE)
                    self._unwrap(run, call)
        calls = sorted(run.calls.values(), key=Call.sort_key)
        large = self._final_bound(run, calls) > MAX_RECORD_BYTES  # (nearly never)
        if large and reason is None and self._final_over(run, calls, status):
            # Nothing commits whose final message cannot be sent: the run fails instead.
            self.stats["runs_over_record_bytes"] += 1
            status, reason = RunStatus.FAILED, Reason.RECORD_TOO_LARGE
            detail = (f"the run's final message would be larger than an output record may be "
                      f"({MAX_RECORD_BYTES} bytes); the run was ended")
        for call in calls:
            if call.state is CallState.ARGS_COMPLETE and reason is None:
                self._decide(run, call)
            elif call.state in (CallState.OPEN, CallState.ARGS_COMPLETE):
                call.fail(reason or Reason.STREAM_ERROR, detail)
        emits = self._outcomes(run, calls)
        final = run.out.final(run.adapter, calls, status)
        if large:  # measured, and made smaller if it must be (Outputs.bounded)
            bounded = run.out.bounded(final)
            if bounded is not final:
                self.stats["finals_dropped_content"] += 1
            final = bounded
        emits.append(final)
        del self._runs[run.run_id]
        self._unpeeked.discard(run.key)
        self._buffered -= run.nbytes
        self._finished[run.run_id] = (run.last_seq, status)
        if len(self._finished) > self.settings.remember_finished_runs:
            self._finished.popitem(last=False)
        self.stats[f"runs_{status}"] += 1
        return emits

    def _final_bound(self, run: Run, calls: list[Call]) -> int:
        """At most the bytes of ``run``'s final message: 6 bytes (the longest JSON escape) a
        byte of the events its text came from (``text_bytes``; a kept value written back is
        never longer than 4.5 bytes a byte of its event) and a character of each call's text,
        id and name (twice: in the message and in ``outcomes``), each choice's own fields, and
        the rest of a record."""
        bound = (6 * run.text_bytes + self.settings.max_choices_per_run * CHOICE_BYTES
                 + RECORD_OVERHEAD)
        for call in calls:
            text = call.text
            chars = len(text) if text is not None else sum(len(p) for p in call.parts)
            named = len(call.call_id or call.key) + len(call.name or "unknown")
            bound += 6 * (chars + 2 * named) + _CALL_FIELDS_BYTES
        return bound

    def _final_over(self, run: Run, calls: list[Call], status: RunStatus) -> bool:
        """Whether ``run``'s final message, written now with its calls not yet decided, is
        larger than an output record may be, less what deciding them may add to it (a
        ``reason`` per outcome)."""
        final = run.out.final(run.adapter, calls, status)
        return len(dumps(final.value)) + _CALL_FIELDS_BYTES * len(calls) > MAX_RECORD_BYTES

    def _outcomes(self, run: Run, batch: list[Call]) -> list[Emit]:
        """The records of ``batch``'s decided calls not yet emitted, one kind of outcome per
        ``tool_call_id`` (README, "Choices the contract leaves open"). Among calls that share
        an id: once one of them has its record out (block-level early commit, or an early
        error), the others get none (the final message lists them ``failed``,
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
                    self.stats["reused_ids_suppressed"] += 1
                elif call.reason is not Reason.DUPLICATE_CALL_ID:
                    call.duplicate("another call of this run has the same id")
        return run.out.outcomes(batch, calls.values())

    # -- memory budgets (module docstring) ---------------------------------------------

    def _touch(self, run: Run) -> None:
        """``run`` had an envelope applied: it becomes the most recently active run."""
        self._move_to_end(run.run_id)

    def _drop(self, run: Run, call: Call) -> None:
        """Drop ``call``'s argument text and release its bytes."""
        run.nbytes -= call.nbytes
        self._buffered -= call.nbytes
        call.parts.clear()
        call.folded = 0
        call.nbytes = 0

    def _hold_text(self, run: Run, growth: int) -> list[Emit]:
        """Count ``growth`` more bytes of text that ``run``'s adapter kept (fewer when
        negative) in ``max_buffered_bytes``, making room as for argument text: the runs ended
        to make it (``_make_room``), or ``run`` itself when it alone would cross the budget
        (its text cannot be dropped from a final message in the making, so the run ends)."""
        budget = self._max_buffered_bytes
        emits: list[Emit] = []
        if growth > 0 and self._buffered + growth > budget:
            if run.nbytes + growth > budget:
                self.stats["runs_over_buffered_bytes_text"] += 1
                return self._finish(run, RunStatus.FAILED, Reason.BUDGET_EXCEEDED, (
                    f"the worker's byte budget ({budget} bytes) cannot hold this run's text "
                    "and arguments; the run was ended"))
            emits = self._make_room(run, growth, budget)
        run.nbytes += growth
        self._buffered += growth
        return emits

    def _make_room(self, run: Run, growth: int, budget: int) -> list[Emit]:
        """End the least recently active runs holding bytes, other than ``run``, until
        ``growth`` more bytes fit; ``run`` alone fits (the caller checked)."""
        detail = (f"the worker's argument byte budget ({budget} bytes) was exhausted; the least "
                  "recently active run was ended")
        emits: list[Emit] = []
        holders = [r for r in self._runs.values() if r.nbytes and r is not run]
        for victim in holders:  # least recently active first
            if self._buffered + growth <= budget:
                break
            emits += self._evict(victim, detail, "evicted_buffered_bytes")
        return emits

    def _evict(self, run: Run, detail: str, counter: str) -> list[Emit]:
        """End ``run`` to keep a budget: uncommitted calls fail ``budget_exceeded``."""
        self.stats[counter] += 1
        return self._finish(run, RunStatus.FAILED, Reason.BUDGET_EXCEEDED, detail)

    # -- the dead-letter topic --------------------------------------------------------

    @staticmethod
    def _raw(raw: tuple[bytes | None, bytes, dict[str, Any] | None] | None
             ) -> tuple[bytes | None, bytes, dict[str, Any] | None]:
        return raw if raw is not None else (None, b"", None)

    def _reject(self, rejected: Rejected, key: bytes | None, value: bytes,
                source: dict[str, Any] | None) -> Emit:
        self.stats[f"dlq_{rejected.reason}"] += 1
        return dlq_record(rejected, key, value, source)


def _usable(text: str | None, limit: int) -> str | None:
    """A provider id or name, or None when it is longer than ``limit`` characters."""
    return text if text is None or len(text) <= limit else None


def _too_long(call_id: str | None, name: str | None) -> str:
    """Why a call's id or name is too long to be used, or "" when neither is."""
    if call_id is not None and len(call_id) > MAX_ID_CHARACTERS:
        return f"the provider's call id has more than {MAX_ID_CHARACTERS} characters"
    if name is not None and len(name) > MAX_NAME_CHARACTERS:
        return f"the provider's tool name has more than {MAX_NAME_CHARACTERS} characters"
    return ""


def _tool_use(use: Any) -> tuple[str | None, str]:
    """The name and argument text of one ``tool_uses[]`` entry: ``recipient_name`` without
    its ``functions.`` namespace (None when it is not a non-empty string, so the call fails
    ``missing_id_or_name``), and ``parameters`` written back as JSON (empty when absent, which
    the latch reads as ``{}``)."""
    if not isinstance(use, dict):
        return None, ""
    recipient = use.get("recipient_name")
    name = None
    if isinstance(recipient, str):
        name = recipient.removeprefix("functions.") or None
    parameters = use.get("parameters")
    arguments = "" if "parameters" not in use else dumps(parameters).decode()
    return name, arguments
