"""One run while it streams: its calls, their buffers, and its bounds.

A :class:`Run` lives from its ``run.start`` to its end. It applies the ops its adapter reads
from each provider event to its calls (:mod:`worker.core.call`), keeps its own bounds
(argument bytes per call, text per run, calls per run: ``assembler``'s module docstring), and
asks the completion latch (:mod:`worker.core.latch`) to decide each complete call
(:meth:`Run.decide`). How it ends is ``core/ending.py``'s (:meth:`Run.finish`): every call
its one outcome, the run its one final message. A person's decision on a call the latch held
is ``core/waiting.py``'s.

What a run shares with the other runs of its partition it reaches through two small objects
passed in (``core/ledger.py``): the :class:`~worker.core.ledger.Ledger` (the bytes all open
runs hold against ``max_buffered_bytes``, the counters, and the partition's hooks to make room
and to forget an ended run) and the :class:`~worker.core.ledger.Rules` (the settings a run
reads, copied once per partition). A parallel wrapper call is unwrapped by
``core/wrapper.py``.
"""

from __future__ import annotations

import sys
from typing import Any

from orjson import dumps

from worker.core import ending, wrapper
from worker.core import ops as op
from worker.core._mypyc import mypyc_attr
from worker.core.call import Call, check_order_keys, too_long, usable, utf8_len
from worker.core.envelope import RecordSource, Rejected, RunStart
from worker.core.latch import Latch
from worker.core.ledger import Ledger, Rules
from worker.core.model import CallEvent, CallState, DlqReason, Emit, Reason, RunStatus
from worker.core.settings import CALLS_PER_RUN_FACTOR, MAX_ID_CHARACTERS, MAX_NAME_CHARACTERS

__all__ = ["FRAGMENT_ENVELOPE", "Run"]

_OPEN = CallState.OPEN
_COMPLETE = CallState.ARGS_COMPLETE
_PENDING = CallState.PENDING_APPROVAL
#: The bytes of a record carrying one argument fragment that are taken for its envelope (the
#: ids, model and names a provider repeats on every chunk), not counted as the run's text.
FRAGMENT_ENVELOPE = 512

@mypyc_attr(allow_interpreted_subclasses=True)  # mypyc: tests subclass it (mutation_fuzz.py)
class Run:
    """The state of one open run, and what it does with each provider event."""

    __slots__ = ("active", "adapter", "broken", "calls", "ended", "first", "held", "key",
                 "last_ms", "last_seq", "latch", "ledger", "nbytes", "out", "rules", "run_id",
                 "status", "stops", "text_bytes", "waiting")

    def __init__(self, start: RunStart, adapter: op.Adapter, latch: Latch, now_ms: int,
                 key: bytes | None, ledger: Ledger, rules: Rules) -> None:
        # (the run.start itself is not kept: its tools are the latch's, the rest the outputs')
        self.run_id = start.run_id
        #: The record key of the run's envelopes (its run id, UTF-8): the ``run.start``
        #: record's own key object, which the engine's heads table holds too.
        encoded = start.run_id.encode()
        self.key = key if key is not None and key == encoded else encoded
        self.adapter = adapter
        self.latch = latch
        self.ledger = ledger
        self.rules = rules
        self.out = rules.outputs(start)
        #: Its last stream envelope: seq, record time, number among the partition's records.
        self.last_seq, self.last_ms, self.active = start.seq, now_ms, 0
        self.calls: dict[str, Call] = {}
        #: How the provider stopped its choices (``ops.Stopped``; choice None: the message).
        self.stops: tuple[op.Stopped, ...] = ()
        #: Argument, schema and text bytes this run holds (its share of ``ledger.held``).
        self.nbytes = 0
        #: How the stream broke its protocol, once it did (see :meth:`_break`).
        self.broken: str | None = None
        #: Bytes of the provider events its final message is built from (``max_run_text_bytes``).
        self.text_bytes = 0
        #: How it ended, once it has (:meth:`finish`).
        self.status: RunStatus | None = None
        #: Where its ``run.start`` was read (None: unknown), and whether its ``run.ended``
        #: record is out (at most one per run: decision 0015).
        self.first: RecordSource | None = ledger.at
        self.ended = False
        #: Its calls waiting for approval (``PENDING_APPROVAL``).
        self.held = 0
        #: How its stream ended, while its final message waits for approvals (else None).
        self.waiting: RunStatus | None = None

    def in_flight(self) -> int:
        return sum(1 for c in self.calls.values() if c.state is CallState.OPEN)

    # -- provider events --------------------------------------------------------------

    def provider_event(self, event: dict[str, Any], key: bytes | None, value: bytes,
                       source: RecordSource | None) -> list[Emit]:
        """Apply one provider event (``value``: its record); one its adapter cannot read or
        refuses becomes a DLQ record."""
        adapter = self.adapter
        adapter.record = value  # (Adapter.arguments_text), never kept past the event
        try:
            ops = adapter.feed(event)
            n = len(ops)
            if n and (n > 1 or not isinstance(ops[0], op.AppendArgs)):  # a fragment alone
                check_order_keys(ops)  # opens no call: nothing to check
        except Exception as exc:  # a malformed provider event: contained, never raised
            adapter.record = b""
            if adapter.kept:  # what it kept before refusing is the final message's: counted
                self.text_bytes += len(value) if value else len(dumps(event))
            detail = (str(exc) if isinstance(exc, op.EventRefused)
                      else f"provider event could not be read ({type(exc).__name__})")
            reject = Rejected(DlqReason.INVALID_ENVELOPE, detail, self.run_id)
            return [self.ledger.reject(reject, key, value, source)]
        adapter.record = b""
        return self.applied(ops, len(value) if value else len(dumps(event)))

    def applied(self, ops: list[op.Op], size: int) -> list[Emit]:
        """Apply the ops of one provider event of ``size`` bytes that the run's adapter read."""
        # What an adapter keeps for the final message (text, thinking, blocks, items) comes
        # from the event's bytes that are not argument text: they bound the run's text. A lone
        # argument fragment's own envelope (at most FRAGMENT_ENVELOPE bytes) is not counted.
        adapter, ledger, text_limit = self.adapter, self.ledger, self.rules.text_bytes
        n = len(ops)
        if not n:  # nearly every event, a text delta: its text kept, no op (_ops, inline)
            text_bytes = self.text_bytes + size
            self.text_bytes = text_bytes
            kept = adapter.kept
            if text_bytes <= text_limit and kept >= 0 and (
                    ledger.held + kept <= ledger.limit):
                adapter.kept = 0
                self.nbytes += kept  # it fits: _hold_text, inline
                ledger.held += kept
                return []
            self.text_bytes -= size  # anything else: the general steps below
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
        text_bytes = self.text_bytes + size
        self.text_bytes = text_bytes
        if text_bytes > text_limit:
            ledger.stats["runs_over_text_bytes"] += 1
            return self.finish(RunStatus.FAILED, Reason.BUDGET_EXCEEDED, "the run's text "
                               f"and thinking exceeded {text_limit} bytes")
        kept = adapter.kept
        if kept:  # text kept for the final message: held in max_buffered_bytes
            adapter.kept = 0
            if kept < 0 or ledger.held + kept <= ledger.limit:
                self.nbytes += kept  # it fits: _hold_text, inline
                ledger.held += kept
            else:
                ended = self._hold_text(kept)
                if ended:  # runs ended to make room, perhaps this one
                    return ended + self._ops(ops) if self.status is None else ended
        if n == 1:
            item = ops[0]
            if isinstance(item, op.AppendArgs):  # _apply(item), inline: nearly every op
                return self._args(item.key, item.text, replace=False)
        return self._ops(ops)

    def _ops(self, ops: list[op.Op]) -> list[Emit]:
        """Apply one provider event's ops, until one ends the run."""
        if not ops:  # most events (text deltas) have none
            return []
        if len(ops) == 1:
            item = ops[0]
            if isinstance(item, op.AppendArgs):  # _apply(item), inline: nearly every op
                return self._args(item.key, item.text, replace=False)
            return self._apply(item)
        emits: list[Emit] = []
        for item in ops:
            emits += self._apply(item)
            if self.status is not None or self.waiting is not None:  # ended, or it waits
                break
        return emits

    def stream_end(self) -> list[Emit]:
        """The gateway's ``stream.end``: the provider's own end, or a failure without it."""
        if self.broken is not None:
            return self.finish(RunStatus.FAILED, Reason.PROTOCOL_ERROR, self.broken)
        emits: list[Emit] = []
        for item in self.adapter.end():  # a stop reason decided at the stream's end
            emits += self._apply(item)
            if self.status is not None or self.waiting is not None:  # ended, or it waits
                return emits
        if self.adapter.completes_on_stream_end:
            return emits + self.finish(op.stopped_status(self.stops), None, "")
        detail = "the stream ended before the provider's end-of-message event"
        return emits + self.finish(RunStatus.FAILED, Reason.STREAM_ERROR, detail)

    # -- ops --------------------------------------------------------------------------

    def _apply(self, item: op.Op) -> list[Emit]:
        if isinstance(item, op.AppendArgs):  # the most frequent op by far: before the match
            return self._args(item.key, item.text, replace=False)
        match item:
            case op.SetArgs():
                return self._args(item.key, item.text, replace=True)
            case op.OpenCall():
                return self._open(item)
            case op.Identify(key, call_id, name):
                call = self.calls.get(key)
                if call is not None:  # (a too long id or name is none: _open)
                    call.call_id = call.call_id or usable(call_id, MAX_ID_CHARACTERS)
                    call.name = call.name or usable(name, MAX_NAME_CHARACTERS)
                return []
            case op.RefuseArgs(key, detail):
                call = self.calls.get(key)
                if call is not None and call.state is _OPEN:  # its text no longer counts
                    self._drop(call)
                    call.refused = detail
                return []
            case op.CloseCall(key):
                return self._close(key)
            case op.Stopped():
                self.stops = op.add_stop(self.stops, item)
                return []
            case op.Complete():
                if self.broken is not None:
                    return self.finish(RunStatus.FAILED, Reason.PROTOCOL_ERROR, self.broken)
                return self.finish(op.stopped_status(self.stops), None, "")
            case op.UpstreamError(detail, reason):
                return self.finish(RunStatus.FAILED, reason, detail)
            case op.ProtocolError(detail):
                return self._break(detail)
            case op.Restated(key, text):
                return self._restated(key, text)
        raise AssertionError(f"unhandled op {item!r}")  # pragma: no cover

    def _open(self, item: op.OpenCall) -> list[Emit]:
        if item.key in self.calls:
            return self._apply(op.Identify(item.key, item.call_id, item.name))
        if self.broken is not None and item.call_id is not None and any(
                c.call_id == item.call_id for c in self.calls.values()):
            return []  # after a break, an id the run holds already has its one outcome
        name, call_id = item.name, item.call_id
        # An id or name too long to repeat in every record is none (``missing_id_or_name``).
        long = too_long(call_id, name)
        if long:
            call_id, name = usable(call_id, MAX_ID_CHARACTERS), usable(name, MAX_NAME_CHARACTERS)
        if name is not None and name in self.latch.tools:
            name = sys.intern(name)  # the tool map's key (tools.client_tools): one string
        call = Call(item.key, item.index, item.choice, len(self.calls), call_id, name,
                    item.kind, item.tool)
        limit = self.rules.in_flight
        cap = CALLS_PER_RUN_FACTOR * limit
        if len(self.calls) >= cap:  # a flood of call starts: end the run (module docstring)
            self.calls[item.key] = call
            self.ledger.stats["runs_ended_too_many_calls"] += 1
            detail = f"the run started more than {cap} calls; the whole run was ended"
            return self.finish(RunStatus.FAILED, Reason.TOO_MANY_TOOL_CALLS, detail)
        self.calls[item.key] = call
        if self.broken is not None:  # nothing of the stream is trusted (outcome at the end)
            call.fail(Reason.PROTOCOL_ERROR, f"started after the stream broke: {self.broken}")
            return []
        if long:
            call.fail(Reason.MISSING_ID_OR_NAME, long)
            return []
        if self.in_flight() > limit:
            call.fail(Reason.TOO_MANY_TOOL_CALLS, f"at most {limit} calls may be assembled at once")
        return []

    def _args(self, key: str, text: str, replace: bool) -> list[Emit]:
        call = self.calls.get(key)
        if call is None or call.state is not _OPEN:
            return []
        ledger, limit = self.ledger, self.rules.argument_bytes
        held = call.nbytes
        total = (len(text) if text.isascii() else utf8_len(text)) + (0 if replace else held)
        if total > limit:
            self._drop(call)
            call.fail(Reason.ARGUMENTS_EXCEED_MAX_BYTES, f"more than {limit} bytes of arguments")
            return []
        growth, budget = total - held, ledger.limit
        emits: list[Emit] = []
        if growth > 0 and ledger.held + growth > budget:
            if self.nbytes + growth > budget:  # this run alone: fail the call, end nobody
                self._drop(call)
                ledger.stats["calls_over_buffered_bytes"] += 1
                call.fail(Reason.BUDGET_EXCEEDED, f"the worker's argument byte budget ({budget} "
                          "bytes) cannot hold this run's calls; this call's text was dropped")
                return []
            emits = ledger.make_room(self, growth)
        call.add(text, replace)
        call.nbytes = total
        self.nbytes += growth
        ledger.held += growth
        if not self.rules.progress:
            return emits
        if not self.rules.partial_args:
            return [*emits, self.out.progress(call)]
        # Only this fragment's text, and where it goes: progress is linear in argument bytes.
        return [*emits, self.out.progress(call, text, 0 if replace else held)]

    def _close(self, key: str) -> list[Emit]:
        call = self.calls.get(key)
        if call is None or not call.step(CallEvent.CLOSE):
            return []
        ready = self._unwrap(call) or [call]
        if not self.rules.early:
            return []
        pipelined = self.rules.pipelined
        ready = [c for c in ready if c.name in pipelined and c.state is _COMPLETE]
        for each in ready:
            self.decide(each)
        return ending.outcomes(self, ready) if ready else []

    # -- the parallel wrapper (docs/providers.md, "The parallel wrapper") --------------------------

    def _unwrap(self, call: Call) -> list[Call] | None:
        """Replace an ``ARGS_COMPLETE`` ``multi_tool_use.parallel`` wrapper by one
        ``ARGS_COMPLETE`` call per ``tool_uses[]`` entry and return those; None (and nothing
        changed) when ``call`` is not such a wrapper: another kind or name, a name the run
        registered, no id, or a text that is not a strict JSON object whose ``tool_uses`` is a
        non-empty array. A wrapper with more entries than the run may still hold calls fails
        ``too_many_tool_calls`` instead (and returns []): :func:`.wrapper.unwrap`."""
        if (call.kind != op.FUNCTION or call.name not in self.adapter.wrapper_names
                or call.name in self.latch.tools or not call.call_id):
            return None
        return wrapper.unwrap(call, self.calls, CALLS_PER_RUN_FACTOR * self.rules.in_flight,
                              self.ledger.stats)

    # -- protocol breaks (docs/providers.md, "Protocol breaks") ------------------------------------

    def _break(self, detail: str) -> list[Emit]:
        """The stream broke its protocol: every call not yet decided fails
        ``protocol_error`` now (its text stays for the final message, as after any failed
        check), later call starts fail at once (``_open``), and the run ends ``failed``
        (``finish``), which emits the outcomes, in provider order like every run's. A second
        break changes nothing."""
        if self.broken is not None:
            return []
        self.broken = detail
        self.ledger.stats["protocol_errors"] += 1
        for call in self.calls.values():
            call.fail(Reason.PROTOCOL_ERROR, detail)  # (a decided call keeps its outcome)
        # The run's end is decided now: the gateway may stop reading (decision 0015).
        return ending.run_ended(self, RunStatus.FAILED, Reason.PROTOCOL_ERROR)

    def _restated(self, key: str, text: str) -> list[Emit]:
        """The provider restated a call's whole text at its end: a different text than the
        one streamed (and decided on) is a protocol break."""
        call = self.calls.get(key)
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
        return self._break("the terminal event restates a call with another text than the "
                           "one streamed")

    # -- the latch and the end ---------------------------------------------------------

    def decide(self, call: Call) -> None:
        """Ask the latch to decide the complete ``call`` (at its block's end, or at the run's);
        a call it holds for approval waits (``core/waiting.py``)."""
        stop = op.stop_of(self.stops, call.choice) if self.stops else None
        tool_call_id = call.tool_call_id
        shared = sum(1 for c in self.calls.values() if c.tool_call_id == tool_call_id) > 1
        self.latch.decide(call, stop, shared, self.out.committed_size, self.ledger.policy)
        if call.state is _PENDING:
            call.held_ms = self.last_ms
            self.held += 1
        sizes = self.ledger.sizes
        if sizes is not None:
            sizes.append(call.nbytes)

    def finish(self, status: RunStatus, reason: Reason | None, detail: str) -> list[Emit]:
        """End the run (``core/ending.py``): every call gets its outcome, then the final
        message. ``reason`` None: the run ended normally, and its open calls close first (a
        parallel wrapper is unwrapped); else every call not yet decided fails ``reason``."""
        if reason is None:
            for call in list(self.calls.values()):
                if call.step(CallEvent.CLOSE):
                    self._unwrap(call)
        return ending.finish(self, status, reason, detail)

    # -- memory budgets (assembler's module docstring) ----------------------------------

    def _drop(self, call: Call) -> None:
        """Drop ``call``'s argument text and release its bytes."""
        self.nbytes -= call.nbytes
        self.ledger.held -= call.nbytes
        call.parts.clear()
        call.folded = 0
        call.nbytes = 0

    def _hold_text(self, growth: int) -> list[Emit]:
        """Count ``growth`` more bytes of text that the run's adapter kept (fewer when
        negative) in ``max_buffered_bytes``, making room as for argument text: the runs ended
        to make it (``Ledger.make_room``), or this run itself when it alone would cross the
        budget (its text cannot be dropped from a final message in the making, so it ends)."""
        ledger = self.ledger
        budget = ledger.limit
        emits: list[Emit] = []
        if growth > 0 and ledger.held + growth > budget:
            if self.nbytes + growth > budget:
                ledger.stats["runs_over_buffered_bytes_text"] += 1
                return self.finish(RunStatus.FAILED, Reason.BUDGET_EXCEEDED, (
                    f"the worker's byte budget ({budget} bytes) cannot hold this run's text "
                    "and arguments; the run was ended"))
            emits = ledger.make_room(self, growth)
        self.nbytes += growth
        ledger.held += growth
        return emits

