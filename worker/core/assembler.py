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
* **Buffered argument bytes** (``max_buffered_bytes``): the UTF-8 argument text held by all open
  runs, kept as a running total (added on append, released when a buffer is dropped or
  replaced and when its run ends). A fragment that would cross the budget ends the least
  recently active runs that hold bytes, other than the receiving run, the same way, until it
  fits. When the receiving run alone would cross it, nobody else is ended: the receiving call
  fails ``budget_exceeded`` and its buffer is dropped; the run goes on.
* **Calls per run**: ``max_tool_calls_in_flight_assemble`` bounds the calls assembled at once,
  and each call beyond it still gets a failed placeholder (``too_many_tool_calls``) so that it
  has its one outcome. Placeholders cost memory too, so a run may hold at most
  :data:`CALLS_PER_RUN_FACTOR` times that many calls; the call start beyond that ends the whole
  run (status ``failed``): that call and every uncommitted call fail ``too_many_tool_calls``.
  A stream that opens that many calls is broken or hostile, and nothing of it is worth running.

Every end of a run above is the same ``_finish`` as a stream error's, so each call still gets
exactly one outcome and the run one final message. Text that is not argument text (assistant
text, thinking) is kept by the adapters for the final message and is not counted.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from orjson import JSONDecodeError
from orjson import loads as _loads

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
from worker.core.outputs import Outputs, dlq_record
from worker.core.providers import adapter_for
from worker.core.run import Call, Latch, utf8_len
from worker.core.settings import AssembleSettings
from worker.core.tools import SHARED_VALIDATORS, ValidatorCache, client_tools

_OPEN = CallState.OPEN
#: What ``feed_record`` reads a record that is not a JSON object as (never changed).
_NOT_AN_OBJECT: dict[str, Any] = {}

#: A run may hold at most this many times ``max_tool_calls_in_flight_assemble`` calls,
#: placeholders included (see "Memory budgets" in the module docstring).
CALLS_PER_RUN_FACTOR = 4
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


class Run:
    """The state of one open run."""

    __slots__ = ("adapter", "calls", "key", "last_ms", "last_seq", "latch", "nbytes", "out",
                 "run_id", "start", "truncated")

    def __init__(self, start: RunStart, adapter: op.Adapter, latch: Latch, now_ms: int) -> None:
        self.start = start
        self.run_id = start.run_id
        #: The record key of the run's envelopes (its run id, UTF-8).
        self.key = start.run_id.encode()
        self.adapter = adapter
        self.latch = latch
        self.out = Outputs(start)
        self.last_seq = start.seq
        self.last_ms = now_ms
        self.calls: dict[str, Call] = {}
        self.truncated: set[int | None] = set()
        #: Argument bytes this run's calls hold (its share of ``Assembler.buffered_bytes``).
        self.nbytes = 0

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
        self._buffered = 0
        self._finished: OrderedDict[str, tuple[int, RunStatus]] = OrderedDict()
        self._validators = SHARED_VALIDATORS if validators is None else validators
        self._pipelined = frozenset(self.settings.allow_pipelined_execute)
        # Read for every argument fragment: copied out of the settings once.
        self._max_argument_bytes = self.settings.max_tool_argument_bytes
        self._max_buffered_bytes = self.settings.max_buffered_bytes
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
        try:
            parsed: Any = _loads(value)
        except JSONDecodeError as exc:
            return [self._reject(undecodable(exc), key, value, source)]
        # The common case, a provider event of an open run in order, is applied here without
        # building its envelope (bench/bench_core.py). Each test below is one that
        # ``envelope.decode`` and ``feed`` make of such a record; whatever fails one of them
        # takes the general path, which decodes the record again and says what is wrong.
        # (``doc`` is declared a dict so that the compiled core reads it with dict operations.)
        doc: dict[str, Any] = parsed if isinstance(parsed, dict) else _NOT_AN_OBJECT
        kind = doc.get("type")
        if isinstance(kind, str) and kind == "provider.event":
            run_id, version = doc.get("run_id"), doc.get("v")
            run = self._runs.get(run_id) if isinstance(run_id, str) else None
            seq, ts, event = doc.get("seq"), doc.get("ts"), doc.get("event")
            if (run is not None and type(seq) is int and seq > run.last_seq
                    and type(version) is int and version == 1
                    and (ts is None or (type(ts) is int and ts >= 0))
                    and (key is None or key == run.key) and isinstance(event, dict)):
                if now_ms is None:
                    now_ms = max(self._clock, ts or 0)
                if now_ms > self._clock:
                    self._clock = now_ms
                run.last_seq, run.last_ms = seq, now_ms
                self._runs.move_to_end(run.run_id)  # _touch(run), inline
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
            return self.expire(envelope.ts)
        run = self._runs.get(envelope.run_id)
        if isinstance(envelope, RunStart):
            return self._start(envelope, run, now_ms, raw)
        if run is None:
            return self._orphan(envelope, raw)
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
        """Fail every run that has seen no event for ``assemble_idle_timeout_s``."""
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
        """Argument bytes held by all open runs (what ``max_buffered_bytes`` bounds)."""
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
        tools = {name: self._validators.get(schema)
                 for name, schema in client_tools(start.provider, start.tools).items()}
        budget = self.settings.max_tool_calls_per_run
        if start.max_tool_calls is not None:
            budget = min(budget, start.max_tool_calls)
        latch = Latch(self.settings, tools, budget)
        self._runs[start.run_id] = Run(start, adapter_for(start.provider), latch, now_ms)
        self.stats["runs_started"] += 1
        return emits

    def _orphan(self, envelope: Cancel | ProviderEvent | StreamEnd | StreamError,
                raw: Any) -> list[Emit]:
        finished = self._finished.get(envelope.run_id)
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
        try:
            ops = run.adapter.feed(event)
            if ops and (len(ops) > 1 or not isinstance(ops[0], op.AppendArgs)):  # a fragment
                _check_order_keys(ops)  # alone opens no call: nothing to check
        except Exception as exc:  # a malformed provider event: contained, never raised
            return [self._unreadable(run, exc, key, value, source)]
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
        if run.adapter.completes_on_stream_end:
            status = RunStatus.TRUNCATED if run.truncated else RunStatus.COMPLETED
            return self._finish(run, status, None, "")
        detail = "the stream ended before the provider's end-of-message event"
        return self._finish(run, RunStatus.FAILED, Reason.STREAM_ERROR, detail)

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
                if call is not None:
                    call.call_id = call.call_id or call_id
                    call.name = call.name or name
                return []
            case op.CloseCall(key):
                return self._close(run, key)
            case op.Truncated(choice):
                run.truncated.add(choice)
                return []
            case op.Complete():
                status = RunStatus.TRUNCATED if run.truncated else RunStatus.COMPLETED
                return self._finish(run, status, None, "")
            case op.UpstreamError(detail):
                return self._finish(run, RunStatus.FAILED, Reason.UPSTREAM_ERROR, detail)
        raise AssertionError(f"unhandled op {item!r}")  # pragma: no cover

    def _open(self, run: Run, item: op.OpenCall) -> list[Emit]:
        if item.key in run.calls:
            return self._apply(run, op.Identify(item.key, item.call_id, item.name))
        call = Call(item.key, item.index, item.choice, len(run.calls), item.call_id, item.name)
        limit = self.settings.max_tool_calls_in_flight_assemble
        cap = CALLS_PER_RUN_FACTOR * limit
        if len(run.calls) >= cap:  # a flood of call starts: end the run (module docstring)
            run.calls[item.key] = call
            self.stats["runs_ended_too_many_calls"] += 1
            detail = f"the run started more than {cap} calls; the whole run was ended"
            return self._finish(run, RunStatus.FAILED, Reason.TOO_MANY_TOOL_CALLS, detail)
        if run.in_flight() >= limit:
            call.fail(Reason.TOO_MANY_TOOL_CALLS, f"at most {limit} calls may be assembled at once")
        run.calls[item.key] = call
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
        if replace:
            call.parts.clear()
        call.parts.append(text)
        call.nbytes = total
        run.nbytes += growth
        self._buffered += growth
        if not self._emit_progress:
            return emits
        partial = "".join(call.parts) if self.settings.ui_forward_partial_args else None
        return [*emits, run.out.progress(call, partial)]

    def _close(self, run: Run, key: str) -> list[Emit]:
        call = run.calls.get(key)
        if call is None or call.state is not CallState.OPEN:
            return []
        call.move(CallState.ARGS_COMPLETE)
        if not (self.settings.execute_before_stream_end and call.name in self._pipelined):
            return []
        self._decide(run, call)
        return run.out.outcomes([call], run.calls.values())

    # -- the end of a run -------------------------------------------------------------

    def _decide(self, run: Run, call: Call) -> None:
        truncated = None in run.truncated or call.choice in run.truncated
        same_id = [c for c in run.calls.values() if c.call_id and c.call_id == call.call_id]
        run.latch.decide(call, truncated, len(same_id) > 1)
        if self.sizes is not None:
            self.sizes.append(call.nbytes)

    def _finish(self, run: Run, status: RunStatus, reason: Reason | None,
                detail: str) -> list[Emit]:
        """End the run: every call gets its outcome, then the final message."""
        calls = sorted(run.calls.values(), key=Call.sort_key)
        for call in calls:
            if call.state is CallState.OPEN and reason is None:
                call.move(CallState.ARGS_COMPLETE)
            if call.state is CallState.ARGS_COMPLETE and reason is None:
                self._decide(run, call)
            elif call.state in (CallState.OPEN, CallState.ARGS_COMPLETE):
                call.fail(reason or Reason.STREAM_ERROR, detail)
        emits = run.out.outcomes(calls)
        emits.append(run.out.final(run.adapter, calls, status))
        del self._runs[run.run_id]
        self._buffered -= run.nbytes
        self._finished[run.run_id] = (run.last_seq, status)
        if len(self._finished) > self.settings.remember_finished_runs:
            self._finished.popitem(last=False)
        self.stats[f"runs_{status}"] += 1
        return emits

    # -- memory budgets (module docstring) ---------------------------------------------

    def _touch(self, run: Run) -> None:
        """``run`` had an envelope applied: it becomes the most recently active run."""
        self._runs.move_to_end(run.run_id)

    def _drop(self, run: Run, call: Call) -> None:
        """Drop ``call``'s argument text and release its bytes."""
        run.nbytes -= call.nbytes
        self._buffered -= call.nbytes
        call.parts.clear()
        call.nbytes = 0

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
