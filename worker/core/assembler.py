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
  moves to the back each time its ``run.start`` or one of its stream's envelopes is applied
  (re-deliveries do not count; decisions and cancels are not its stream), so the order
  depends only on the input order. A run parked on approval (``core/waiting.py``) keeps its
  place: its last activity is the envelope that ended its stream. A ``run.start`` that finds
  the limit reached is accepted, and the least recently active run, streaming or parked, is
  ended first: its uncommitted calls, held ones included, fail ``budget_exceeded``, its final
  message has status ``failed``.
* **Buffered bytes** (``max_buffered_bytes``): the UTF-8 argument text held by all open runs,
  their tools' schema text, and the text their adapters keep for the final messages
  (assistant text, thinking, content blocks, output items: the bytes each adapter reports in
  ``Adapter.kept``, UTF-8 for text and the JSON text of a kept value), kept as a running total
  (added on append, released when a buffer is dropped or replaced and when its run ends). A
  fragment, an event whose kept text, or a ``run.start`` whose tool schemas would cross the
  budget ends the least recently active runs that hold bytes (parked ones in their place),
  other than the receiving run, the same way, until it fits.
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
  (``latch.Latch``). At a run's end, a final message that could be larger
  (``ending.final_bound``) is measured: a run ending normally whose final message would not
  fit ends ``failed`` instead, its undecided calls ``record_too_large``; whatever the end, a
  final message that does not fit drops content and says so (``ending.bounded``).

Every end of a run above is the same ``Run.finish`` as a stream error's
(``core/ending.py``), so each call still gets exactly one outcome and the run one final
message.

What is the partition's lives here: the open runs and their order, the shared tool maps
(``tools.ToolMaps``), the clock; the finished runs, the early cancels and the late events
remembered in ``core/remembered.py``, the runs waiting for approvals and the decisions on
their held calls in ``core/waiting.py``. What is a run's lives in its
:class:`~worker.core.run.Run` (``core/run.py``) while it streams and in ``core/ending.py`` at
its end; a run reaches the partition-wide byte budget through the
:class:`~worker.core.ledger.Ledger` this assembler passes it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from orjson import JSONDecodeError
from orjson import loads as _loads

from worker.core import keys, strictjson
from worker.core import ops as op
from worker.core._mypyc import mypyc_attr
from worker.core.envelope import (
    Cancel,
    Decision,
    Envelope,
    ProviderEvent,
    RecordSource,
    Rejected,
    RunStart,
    StreamError,
    Tick,
    ToolResult,
    checked,
    undecodable,
)
from worker.core.identity import identities
from worker.core.latch import (
    TOOLSET_REQUIRED,
    UNKNOWN_TOOLSET,
    Latch,
    toolset_required,
    unknown_toolset,
)
from worker.core.ledger import Ledger, Rules
from worker.core.model import DlqReason, Emit, Reason, RunStatus
from worker.core.pairing import Pairing, paired
from worker.core.policy import Policy
from worker.core.providers import adapter_for
from worker.core.remembered import Remembered
from worker.core.remembered import raw_or_empty as _raw
from worker.core.run import Run
from worker.core.schemacheck import SchemaLimits
from worker.core.settings import AssembleSettings
from worker.core.tools import (
    SchemaCheck,
    ToolMaps,
    ToolSchema,
    ValidatorCache,
    client_tools,
    output_schemas,
    shared_validators,
    tool_attributes,
)
from worker.core.waiting import Waiting

#: ``worker.core._peek.peek`` (worker/core/csrc/peek.c), built with the compiled core; None in
#: a pure-Python install, which then parses every record with orjson. Its answer, a tuple
#: built in C: (kind, run_id, seq, ts or None, index, text), unpacked by these names.
Peeked = tuple[int, str, int, int | None, int, str]
_PEEK: Callable[[bytes], Peeked | None] | None
try:
    from worker.core._peek import peek as _PEEK
except ImportError:  # pure Python (setup.py): no C extension
    _PEEK = None

#: The registry's tools of a toolset version for a run.start at a record time:
#: ``toolsets(name, version, now_ms)``, None when that version does not count for the run
#: (never registered, or registered later than ``registry.wait_s`` after ``now_ms``:
#: runtime/governance/registry.py). Pure for the core: the worker's lookup has read far enough.
ToolsetLookup = Callable[[str, int, int], Any]
#: What ``feed_record`` reads a record that is not a JSON object as (never changed).
_NOT_AN_OBJECT: dict[str, Any] = {}


@mypyc_attr(allow_interpreted_subclasses=True)  # mypyc: tests subclass it (SpyAssembler)
class Assembler:
    """Assemble tool calls for many runs; see the module docstring."""

    def __init__(self, settings: AssembleSettings | None = None,
                 validators: ValidatorCache | None = None) -> None:
        self.settings = settings or AssembleSettings()
        #: The partition-wide byte budget and counters its runs share (``ledger.Ledger``).
        self._ledger = Ledger(self.settings.max_buffered_bytes, self._make_room, self._forget)
        self.stats: Counter[str] = self._ledger.stats
        self._rules = Rules(self.settings)
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
        #: Tool maps shared by the runs that register the same tools (``tools.ToolMaps``).
        self._tool_maps = ToolMaps()
        #: The keys of the open runs whose adapter reads no peeked event (``Adapter.fast``):
        #: their records go to orjson at once, not through a parse that can only decline.
        self._unpeeked: set[bytes] = set()
        #: The finished runs and the early cancels remembered (core/remembered.py).
        self._remembered = Remembered(self.settings, self._ledger)
        self._finished = self._remembered.finished
        self._early_cancels = self._remembered.early_cancels
        #: Runs whose stream ended with calls waiting for approval, oldest first: their final
        #: message waits for the last decision (docs/policies.md, "Approvals"; core/waiting.py). No
        #: provider event reaches them any more.
        #: The control records (partition, offset) whose decisions each run applied (read
        #: only: a run's ``done`` head keeps them, so that a decision forwarded twice is a
        #: repeat after a take-over too).
        self.decided = self._remembered.decided
        self._approvals = Waiting(self._runs, self._unpeeked, self._ledger, self.decided)
        self._waiting = self._approvals.runs
        #: The partition's approvals (core/waiting.py): set ``approvals.approvers`` to the
        #: approvers' keys (core/approvers.py) and a decision counts only when an approver
        #: signed it and the policy in force allows that approver (None, the core's "no
        #: check" for its unit tests: unsigned ones count; the runtime never leaves it so).
        self.approvals = self._approvals
        self._ledger.park = self._approvals.park
        self._validators = validators or shared_validators(SchemaLimits(
            self.settings.max_schema_nodes, self.settings.max_schema_validation_steps))
        self._clock = 0
        #: The ``run.start`` and stream envelopes applied so far: each gives its run's
        #: ``Run.active`` the next number, so that streaming and parked runs are put in one
        #: "least recently active" order (the records' order only, never their times).
        self._entered = 0
        #: Runs opened so far: a record that leaves it as it was opened no run (the worker's
        #: per-record check, an attribute read, not two ``is_open`` lookups).
        self.runs_opened = 0
        #: Where a run that names a registry toolset gets its tools (None: no registry, such
        #: a run fails every call ``unknown_toolset``).
        self.toolsets: ToolsetLookup | None = None
        #: The policy set in force (None: no policy decides; set by the worker's driver).
        self.policy: Policy | None = None
        results = self.settings.results
        #: The result latch (core/pairing.py; None: ``results.enabled`` is off).
        self.pairing: Pairing | None = Pairing(
            results, self._ledger.reject, self.settings.audit_key,
            self.settings.remember_finished_runs, self._validators,
            self.settings.max_tool_schema_bytes) if results.enabled else None
        #: Tenants whose runs must name a registered toolset (:func:`_toolset_required`).
        self._require_toolsets: frozenset[str | None] = frozenset(
            self.settings.require_toolsets_for)

    @property
    def policy(self) -> Policy | None:
        """The policy in force for this partition's calls (``worker.core.policy``; issue 25),
        read when a call is decided, not per record: set it before the records it must decide
        (the registry sets the version the events log names). None (the default): no policy,
        today's behaviour (``policy.mode: off``)."""
        return self._ledger.policy

    @policy.setter
    def policy(self, policy: Policy | None) -> None:
        self._ledger.policy = policy

    @property
    def sizes(self) -> list[int] | None:
        """When a list (the worker's metrics set one), the argument bytes of each call the
        latch checks are appended; the caller drains it. None (the default): not kept."""
        return self._ledger.sizes

    @sizes.setter
    def sizes(self, sizes: list[int] | None) -> None:
        self._ledger.sizes = sizes

    # -- entry points -----------------------------------------------------------------

    def feed_record(self, key: bytes | None, value: bytes, now_ms: int | None = None,
                    source: RecordSource | None = None) -> list[Emit]:
        """:meth:`_feed_record`; the result latch sees what it emits (core/pairing.py)."""
        emits = self._feed_record(key, value, now_ms, source)
        pairing = self.pairing
        if emits and pairing is not None:
            return pairing.observe(emits, self._clock)
        return emits

    def _feed_record(self, key: bytes | None, value: bytes, now_ms: int | None,
                     source: RecordSource | None) -> list[Emit]:
        """Decode one input record and apply it; a bad record becomes one DLQ record.

        ``now_ms`` is the record time; offline (None) it is the envelope's ``ts``, else the
        latest time seen, so that a capture without times never expires anything.

        Nearly every record is a provider event of an open run, in order. Two fast paths
        apply it without building its envelope (bench/bench_core.py), each entering the run
        the one way (:meth:`_enter`); whatever either declines takes the general path, which
        decodes the record again and says what is wrong (test_fast_paths.py).
        """
        self._ledger.at = source
        peek = self._peek
        unpeeked = self._unpeeked
        if peek is not None and not (unpeeked and key in unpeeked):
            # 1. A text delta or an argument fragment, read by worker/core/csrc/peek.c without
            # building the event, that the run's adapter applies at once (``Adapter.fast``).
            peeked = peek(value)
            if peeked is not None:
                # (named at a tuple's cost; names of their own: the compiled core types a
                # local by its first assignment)
                peek_kind, peek_run, peek_seq, peek_ts, peek_index, peek_text = peeked
                known = self._runs.get(peek_run)
                if (known is not None and peek_seq > known.last_seq
                        and (key is None or key == known.key)):
                    fast = known.adapter.fast(peek_kind, peek_index, peek_text)
                    if fast is not None:
                        self._enter(known, peek_seq, self._now(now_ms, peek_ts))
                        return known.applied(fast, len(value))
        try:
            parsed: Any = self._loads(value)
        except JSONDecodeError as exc:
            return [self._ledger.reject(undecodable(exc), key, value, source)]
        # 2. Any provider event, parsed by orjson. Each test below is one that
        # ``envelope.decode`` and ``feed`` make of such a record.
        # (``doc`` is declared a dict so that the compiled core reads it with dict operations.)
        doc: dict[str, Any] = parsed if isinstance(parsed, dict) else _NOT_AN_OBJECT
        # (the member names are orjson's own key objects: worker/core/keys.py)
        kind = doc.get(keys.TYPE)
        if isinstance(kind, str) and kind == "provider.event":
            run_id, version = doc.get(keys.RUN_ID), doc.get(keys.V)
            run = self._runs.get(run_id) if isinstance(run_id, str) else None
            seq_, event = doc.get(keys.SEQ), doc.get(keys.EVENT)
            # Five members, and the five read are not null: they are all there is, so no ts.
            ts = doc.get(keys.TS) if len(doc) != 5 else None
            if (run is not None and type(seq_) is int and seq_ > run.last_seq
                    and type(version) is int and version == 1
                    and (ts is None or (type(ts) is int and ts >= 0))
                    and (key is None or key == run.key) and isinstance(event, dict)):
                self._enter(run, seq_, self._now(now_ms, ts))
                return run.provider_event(event, key, value, source)
        return self._feed_envelope(checked(parsed, key, value), key, value, now_ms, source)

    def _now(self, now_ms: int | None, ts: int | None) -> int:
        """The record time (``now_ms``; offline, the envelope's ``ts`` or else the latest time
        seen), which the clock moves on to."""
        clock = self._clock
        if now_ms is None:
            now_ms = max(clock, ts or 0)
        if now_ms > clock:  # not max(): this runs for every record
            self._clock = now_ms
        return now_ms

    def _enter(self, run: Run, seq: int, now_ms: int) -> None:
        """An envelope ``seq`` of ``run``, in order, is applied at ``now_ms``: the run's last
        one, and the run becomes the most recently active."""
        run.last_seq, run.last_ms = seq, now_ms
        self._entered = run.active = self._entered + 1
        self._move_to_end(run.run_id)

    def _feed_envelope(self, envelope: Envelope | Rejected, key: bytes | None, value: bytes,
                       now_ms: int | None, source: RecordSource | None) -> list[Emit]:
        if isinstance(envelope, Rejected):
            return [self._ledger.reject(envelope, key, value, source)]
        return self._feed(envelope, self._now(now_ms, envelope.ts), raw=(key, value, source))

    def feed(self, envelope: Envelope, now_ms: int,
             raw: tuple[bytes | None, bytes, RecordSource | None] | None = None) -> list[Emit]:
        """Apply one decoded envelope at record time ``now_ms``; the result latch sees what
        it emits (core/pairing.py)."""
        emits = self._feed(envelope, now_ms, raw)
        pairing = self.pairing
        if emits and pairing is not None:
            return pairing.observe(emits, max(self._clock, now_ms))
        return emits

    def _feed(self, envelope: Envelope, now_ms: int,
              raw: tuple[bytes | None, bytes, RecordSource | None] | None = None) -> list[Emit]:
        self._ledger.at = raw[2] if raw is not None else None
        if isinstance(envelope, Tick):
            return self._expire(now_ms)  # the record time, never the payload's ts
        if isinstance(envelope, ToolResult):  # (core/pairing.py; a DLQ record when off)
            return paired(self.pairing, envelope, now_ms, raw, self._ledger.reject)
        run = self._runs.get(envelope.run_id)
        if run is None and self._waiting:
            waiting = self._waiting.get(envelope.run_id)
            if waiting is not None:
                return self._approvals.envelope(waiting, envelope, now_ms, raw)
        if isinstance(envelope, RunStart):
            return self._start(envelope, run, now_ms, raw)
        if run is None:
            return self._remembered.orphan(envelope, raw, now_ms)
        if isinstance(envelope, Decision):
            return self._approvals.decision(run, envelope, raw)
        if isinstance(envelope, Cancel):
            run.last_ms = now_ms
            return run.finish(RunStatus.CANCELLED, Reason.CANCELLED, envelope.reason)
        if envelope.seq <= run.last_seq:
            self.stats["duplicates"] += 1
            return []
        self._enter(run, envelope.seq, now_ms)
        if isinstance(envelope, ProviderEvent):
            return run.provider_event(envelope.event, *_raw(raw))
        if isinstance(envelope, StreamError):
            return run.finish(RunStatus.FAILED, Reason.STREAM_ERROR, "transport failed")
        return run.stream_end()

    def expire(self, now_ms: int) -> list[Emit]:
        """:meth:`_expire`; the result latch sees what it emits (core/pairing.py)."""
        emits = self._expire(now_ms)
        pairing = self.pairing
        if emits and pairing is not None:
            return pairing.observe(emits, now_ms)
        return emits

    def _expire(self, now_ms: int) -> list[Emit]:
        """Fail every run that has seen no event for ``assemble_idle_timeout_s``, forget
        the cancels that waited ``early_cancel_ttl_s`` for their ``run.start`` in vain, and
        answer ``tool_timeout`` the committed calls whose results are late."""
        if self._early_cancels:  # by record time too: what the worker's heads mirror
            self._remembered.forget_early_cancels(now_ms)
        limit = self.settings.assemble_idle_timeout_s * 1000
        remembered = self._remembered
        emits: list[Emit] = (remembered.summarise_quiet(now_ms - int(limit)) if remembered.late
                             else [])
        idle = [r for r in self._runs.values() if now_ms - r.last_ms >= limit]
        for run in idle:
            detail = f"no event for {self.settings.assemble_idle_timeout_s:g} s"
            emits += run.finish(RunStatus.IDLE_TIMEOUT, Reason.ASSEMBLE_IDLE_TIMEOUT, detail)
        held = [r for r in self._runs.values() if r.held]
        if held or self._waiting:  # calls waiting for approval too long fail (by record time)
            wait_ms = self.settings.approvals.approval_timeout_s * 1000
            for run in [*self._waiting.values(), *held]:
                emits += self._approvals.expire(run, now_ms, wait_ms)
        pairing = self.pairing
        if pairing is not None and pairing.turns:
            emits += pairing.expire(now_ms)
        return emits

    @property
    def open_runs(self) -> int:
        """Runs started and not finished: those streaming, and those waiting for approvals."""
        return len(self._runs) + len(self._waiting)

    def open_run_ids(self) -> list[str]:
        """The open runs: those waiting for approvals (oldest first), then those streaming,
        least recently active first."""
        return [*self._waiting, *self._runs]

    @property
    def buffered_bytes(self) -> int:
        """Argument, schema and kept text bytes held by all open runs (what
        ``max_buffered_bytes`` bounds)."""
        return self._ledger.held

    def is_open(self, run_id: str) -> bool:
        """Whether ``run_id`` has started and not yet finished (its final message not yet
        emitted: it may wait for approvals; or, with the result latch, its turn record)."""
        pairing = self.pairing
        return run_id in self._runs or run_id in self._waiting or (
            pairing is not None and run_id in pairing.turns)

    def finished(self, run_id: str) -> tuple[int, RunStatus] | None:
        """The last applied ``seq`` and the status of a remembered finished run, else None."""
        return self._finished.get(run_id)

    def remember_finished(self, run_id: str, last_seq: int, status: RunStatus,
                          read_to: int | None = None,
                          decided: list[tuple[int, int]] | None = None) -> None:
        """Remember a run that finished before this assembler existed (a worker rebuilding a
        partition), so that its re-delivered events are ignored and late ones rejected;
        ``read_to``: its ``done`` head's offset (a decision from below it is a repeat)."""
        self._remembered.remember_finished(run_id, last_seq, status, read_to, decided)

    @property
    def early_cancels_waiting(self) -> int:
        """How many cancels are remembered, waiting for their ``run.start``
        (core/remembered.py)."""
        return len(self._early_cancels)

    def early_cancel_pending(self, run_id: str) -> bool:
        """Whether a cancel of ``run_id`` is remembered, waiting for its ``run.start``."""
        return run_id in self._early_cancels

    def summarise_late(self) -> list[Emit]:
        """The summaries of every run whose late events are still being counted, now (the end
        of ``latch assemble``'s input, where no tick will come; decision 0015)."""
        return self._remembered.summarise_all()

    @property
    def waiting_runs(self) -> int:
        """Runs whose final message waits for approval decisions."""
        return len(self._waiting)

    # -- run lifecycle ----------------------------------------------------------------

    def _start(self, start: RunStart, run: Run | None, now_ms: int, raw: Any) -> list[Emit]:
        seen = run.last_seq if run is not None else self._finished.get(start.run_id, (None,))[0]
        if seen is not None:
            if start.seq <= seen:
                self.stats["duplicates"] += 1
                return []
            return [self._ledger.reject(Rejected(DlqReason.DUPLICATE_RUN_START,
                                                 "run already started", start.run_id),
                                        *_raw(raw))]
        emits: list[Emit] = []
        limit = self.settings.max_open_runs
        while self.open_runs and self.open_runs >= limit:
            detail = (f"the worker's open-run budget ({limit} runs) was exhausted; the least "
                      "recently active run was ended")
            emits += self._evict(self._approvals.least_active(), detail, "evicted_open_runs")
        required = start.toolset is None and toolset_required(self._require_toolsets,
                                                               start.tenant)
        # The run's tool definitions: its ``tools``, or, for a run naming a registry toolset,
        # that version's, read at its run.start's record time (None: an unknown version).
        given = None if required else start.tools if start.toolset is None else (
            None if self.toolsets is None else self.toolsets(*start.toolset, now_ms))
        tools, cost, emits_ = (UNKNOWN_TOOLSET, 0, []) if required else self._tools(start, given)
        emits += emits_
        budget = self.settings.max_tool_calls_per_run
        if start.max_tool_calls is not None:
            budget = min(budget, start.max_tool_calls)
        adapter = adapter_for(start.provider, start.run_id)
        adapter.max_choices = self.settings.max_choices_per_run
        latch = Latch(self.settings, tools, budget, adapter.parse_arguments
                      if adapter.parses_own_arguments else strictjson.parse,
                      (start.tenant, start.provider, start.run_id),
                      tool_attributes(given, tools, start.toolset),
                      identities(start.provider, given))
        if required:
            latch.unknown = TOOLSET_REQUIRED
        elif start.toolset is not None and not tools:
            latch.unknown = unknown_toolset(start.toolset, tools is UNKNOWN_TOOLSET,
                                             self.toolsets is not None)
        run = self._new_run(start, adapter, latch, now_ms, raw[0] if raw is not None else None)
        if not adapter.peeked:
            self._unpeeked.add(run.key)
        run.nbytes = cost
        self._ledger.held += cost
        self._runs[start.run_id] = run
        self._entered = run.active = self._entered + 1
        self.runs_opened += 1
        self.stats["runs_started"] += 1
        if self.pairing is not None and given:  # its MCP tools' outputSchema (core/pairing.py)
            self.pairing.started(start.run_id, output_schemas(start.provider, given))
        early = self._remembered.early_cancel(start.run_id, now_ms)
        if early is not None:  # cancelled before it started: it ends as a cancel right after
            self.stats["early_cancels_applied"] += 1  # its run.start would have ended it
            emits += run.finish(RunStatus.CANCELLED, Reason.CANCELLED, early)
        return emits

    def _new_run(self, start: RunStart, adapter: op.Adapter, latch: Latch, now_ms: int,
                 key: bytes | None) -> Run:
        """The run ``start`` opens (tests make a spy of it: tests/mutation_fuzz.py)."""
        return Run(start, adapter, latch, now_ms, key, self._ledger, self._rules)

    def _tools(self, start: RunStart, given: Any
               ) -> tuple[dict[str, ToolSchema], int, list[Emit]]:
        """The run's client tools, not compiled; the bytes of schema text they hold (counted in
        ``max_buffered_bytes`` like argument text, making room the same way); and the runs
        ended to make that room. Tools that alone would exceed the budget are all unusable.
        ``given``: :meth:`_given_tools` (None for a registry toolset not known: no tools)."""
        limit, budget = self.settings.max_tool_schema_bytes, self._ledger.limit
        if start.toolset is not None and given is None:
            return UNKNOWN_TOOLSET, 0, []
        tools = {name: self._validators.prepare(schema, limit)
                 for name, schema in client_tools(start.provider, given).items()}
        cost = sum(len(t.text) for t in tools.values() if t.text is not None)
        if cost > budget:
            self.stats["runs_over_buffered_bytes_tools"] += 1
            broken = SchemaCheck(None, f"the run's tool schemas exceed the worker's byte budget "
                                 f"({budget} bytes)")
            return {name: ToolSchema(self._validators, None, broken) for name in tools}, 0, []
        if cost and self._ledger.held + cost > budget:
            detail = (f"the worker's argument byte budget ({budget} bytes) was exhausted; the "
                      "least recently active run was ended")
            emits: list[Emit] = []
            for victim in [r for r in self._approvals.by_activity() if r.nbytes]:
                if self._ledger.held + cost <= budget:
                    break
                emits += self._evict(victim, detail, "evicted_buffered_bytes")
            return self._tool_maps.shared(tools, cost), cost, emits
        return self._tool_maps.shared(tools, cost), cost, []

    # -- memory budgets (module docstring) ---------------------------------------------

    def _make_room(self, run: Run, growth: int) -> list[Emit]:
        """End the least recently active runs holding bytes, other than ``run``, until
        ``growth`` more bytes fit; ``run`` alone fits (the caller checked)."""
        ledger = self._ledger
        budget = ledger.limit
        detail = (f"the worker's argument byte budget ({budget} bytes) was exhausted; the least "
                  "recently active run was ended")
        emits: list[Emit] = []
        holders = [r for r in self._approvals.by_activity() if r.nbytes and r is not run]
        for victim in holders:  # least recently active first
            if ledger.held + growth <= budget:
                break
            emits += self._evict(victim, detail, "evicted_buffered_bytes")
        return emits

    def _evict(self, run: Run, detail: str, counter: str) -> list[Emit]:
        """End ``run`` to keep a budget: uncommitted calls fail ``budget_exceeded``."""
        self.stats[counter] += 1
        return run.finish(RunStatus.FAILED, Reason.BUDGET_EXCEEDED, detail)

    def _forget(self, run: Run) -> None:
        """``run`` has ended (``Run.finish``): it is no longer open, and is remembered finished."""
        if self._runs.pop(run.run_id, None) is None:
            del self._waiting[run.run_id]
        self._unpeeked.discard(run.key)
        status = run.status
        assert status is not None
        self.remember_finished(run.run_id, run.last_seq, status)
