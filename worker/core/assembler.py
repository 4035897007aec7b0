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
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from worker.core import ops as op
from worker.core.envelope import (
    Cancel,
    Envelope,
    ProviderEvent,
    Rejected,
    RunStart,
    StreamEnd,
    StreamError,
    Tick,
    decode,
)
from worker.core.model import CallState, DlqReason, Emit, Reason, RunStatus
from worker.core.outputs import Outputs, dlq_record
from worker.core.providers import adapter_for
from worker.core.run import Call, Latch, utf8_len
from worker.core.settings import AssembleSettings
from worker.core.tools import ValidatorCache, client_tools


@dataclass(slots=True)
class Run:
    """The state of one open run."""

    start: RunStart
    adapter: op.Adapter
    latch: Latch
    out: Outputs
    last_seq: int
    last_ms: int
    calls: dict[str, Call] = field(default_factory=dict)
    truncated: set[int | None] = field(default_factory=set)

    def in_flight(self) -> int:
        return sum(1 for c in self.calls.values() if c.state is CallState.OPEN)


class Assembler:
    """Assemble tool calls for many runs; see the module docstring."""

    def __init__(self, settings: AssembleSettings | None = None) -> None:
        self.settings = settings or AssembleSettings()
        self.stats: Counter[str] = Counter()
        self._runs: dict[str, Run] = {}
        self._finished: OrderedDict[str, tuple[int, RunStatus]] = OrderedDict()
        self._validators = ValidatorCache()
        self._pipelined = frozenset(self.settings.allow_pipelined_execute)
        self._clock = 0

    # -- entry points -----------------------------------------------------------------

    def feed_record(
        self, key: bytes | None, value: bytes, now_ms: int | None = None,
        source: dict[str, Any] | None = None,
    ) -> list[Emit]:
        """Decode one input record and apply it; a bad record becomes one DLQ record.

        ``now_ms`` is the record time; offline (None) it is the envelope's ``ts``, else the
        latest time seen, so that a capture without times never expires anything.
        """
        envelope = decode(key, value)
        if isinstance(envelope, Rejected):
            return [self._reject(envelope, key, value, source)]
        if now_ms is None:
            now_ms = max(self._clock, envelope.ts or 0)
        self._clock = max(self._clock, now_ms)
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
        if isinstance(envelope, ProviderEvent):
            return self._provider_event(run, envelope, raw)
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
        return list(self._runs)

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
        if len(self._runs) >= self.settings.max_open_runs:
            detail = f"{len(self._runs)} runs open, the limit is {self.settings.max_open_runs}"
            return [self._reject(Rejected(DlqReason.RUN_LIMIT, detail, start.run_id),
                                 *self._raw(raw))]
        tools = {name: self._validators.get(schema)
                 for name, schema in client_tools(start.provider, start.tools).items()}
        budget = self.settings.max_tool_calls_per_run
        if start.max_tool_calls is not None:
            budget = min(budget, start.max_tool_calls)
        self._runs[start.run_id] = Run(start, adapter_for(start.provider), Latch(
            self.settings, tools, budget), Outputs(start), start.seq, now_ms)
        self.stats["runs_started"] += 1
        return []

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

    def _provider_event(self, run: Run, env: ProviderEvent, raw: Any) -> list[Emit]:
        try:
            ops = run.adapter.feed(env.event)
        except Exception as exc:  # a malformed provider event: contained, never raised
            detail = f"provider event could not be read ({type(exc).__name__})"
            reject = Rejected(DlqReason.INVALID_ENVELOPE, detail, run.start.run_id)
            return [self._reject(reject, *self._raw(raw))]
        emits: list[Emit] = []
        for item in ops:
            emits += self._apply(run, item)
            if run.start.run_id not in self._runs:
                break
        return emits

    def _stream_end(self, run: Run) -> list[Emit]:
        if run.adapter.completes_on_stream_end:
            status = RunStatus.TRUNCATED if run.truncated else RunStatus.COMPLETED
            return self._finish(run, status, None, "")
        detail = "the stream ended before the provider's end-of-message event"
        return self._finish(run, RunStatus.FAILED, Reason.STREAM_ERROR, detail)

    # -- ops --------------------------------------------------------------------------

    def _apply(self, run: Run, item: op.Op) -> list[Emit]:
        match item:
            case op.OpenCall():
                return self._open(run, item)
            case op.Identify(key, call_id, name):
                call = run.calls.get(key)
                if call is not None:
                    call.call_id = call.call_id or call_id
                    call.name = call.name or name
                return []
            case op.AppendArgs(key, text) | op.SetArgs(key, text):
                return self._args(run, key, text, replace=isinstance(item, op.SetArgs))
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
        if run.in_flight() >= limit:
            call.fail(Reason.TOO_MANY_TOOL_CALLS, f"at most {limit} calls may be assembled at once")
        run.calls[item.key] = call
        return []

    def _args(self, run: Run, key: str, text: str, replace: bool) -> list[Emit]:
        call = run.calls.get(key)
        if call is None or call.state is not CallState.OPEN:
            return []
        if replace:
            call.parts, call.nbytes = [], 0
        call.nbytes += utf8_len(text)
        if call.nbytes > self.settings.max_tool_argument_bytes:
            limit = self.settings.max_tool_argument_bytes
            call.fail(Reason.ARGUMENTS_EXCEED_MAX_BYTES, f"more than {limit} bytes of arguments")
            return []
        call.parts.append(text)
        if not self.settings.emit_progress:
            return []
        partial = "".join(call.parts) if self.settings.ui_forward_partial_args else None
        return [run.out.progress(call, partial)]

    def _close(self, run: Run, key: str) -> list[Emit]:
        call = run.calls.get(key)
        if call is None or call.state is not CallState.OPEN:
            return []
        call.move(CallState.ARGS_COMPLETE)
        if not (self.settings.execute_before_stream_end and call.name in self._pipelined):
            return []
        self._decide(run, call)
        return run.out.outcomes([call])

    # -- the end of a run -------------------------------------------------------------

    def _decide(self, run: Run, call: Call) -> None:
        truncated = None in run.truncated or call.choice in run.truncated
        same_id = [c for c in run.calls.values() if c.call_id and c.call_id == call.call_id]
        run.latch.decide(call, truncated, len(same_id) > 1)

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
        del self._runs[run.start.run_id]
        self._finished[run.start.run_id] = (run.last_seq, status)
        if len(self._finished) > self.settings.remember_finished_runs:
            self._finished.popitem(last=False)
        self.stats[f"runs_{status}"] += 1
        return emits

    # -- the dead-letter topic --------------------------------------------------------

    @staticmethod
    def _raw(raw: tuple[bytes | None, bytes, dict[str, Any] | None] | None
             ) -> tuple[bytes | None, bytes, dict[str, Any] | None]:
        return raw if raw is not None else (None, b"", None)

    def _reject(self, rejected: Rejected, key: bytes | None, value: bytes,
                source: dict[str, Any] | None) -> Emit:
        self.stats[f"dlq_{rejected.reason}"] += 1
        return dlq_record(rejected, key, value, source)
