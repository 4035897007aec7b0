"""The partition driver: what happens around the core for each record, for both engines.

Engine-neutral (no I/O, no faust, no Kafka client: an import-linter contract in
pyproject.toml). An engine (faust's :mod:`worker.runtime.faust_engine.engine`, the confluent-kafka
:mod:`worker.runtime.kafka_engine.engine`) reads records and writes what the driver says; the
driver decides everything between:

1. :meth:`Driver.apply_all` feeds events records to their partitions in order (the kafka
   engine hands it one ``consume`` call's, the faust engine one): the partition's clock, then
   the core's step (:func:`worker.runtime.step.step`); it counts each record and carries its
   run's trace on (:mod:`worker.runtime.hooks`), writes the heads (a run's ``start``, a
   cancel that waits for its run, a finished run's ``done``, at a tick the tombstones of
   heads whose time is over: :class:`Heads`) into the engine's table, which stages them,
   and prepares each output (:meth:`Driver.outgoing`, one chain: key, value, trace headers
   and signature, the topic's size limit, an ``output_refused`` replacement). It returns
   the whole of what the engine must do (:class:`Work`): the outputs in order, the heads to
   write, each partition's next offset.
2. The engine sends :attr:`Work.out`, writes :attr:`Work.heads` once the outputs before
   them are delivered (faust confirms its sends first; the kafka engine's transaction holds
   both) and moves each partition's committed offset to :attr:`Work.offsets` (faust: the
   ack after the confirm; kafka: the transaction's offsets). The driver never calls the
   engine, and the engine never calls back into a record half applied: a refusal at the
   send is told to the driver afterwards (:meth:`Driver.refused`; the audit record after a
   refused outcome is prepared again, :meth:`Driver.reaudit`).
3. :meth:`Driver.route` decides where a control record goes (a cancel into its run's events
   partition, anything else to the DLQ, counted); the engine sends it.
4. :meth:`Driver.tick_due` holds a tick back while the control backlog is unread
   (:class:`TickRule`); the engine says how far its control partitions are read.
5. :meth:`Driver.takeover` and :meth:`Driver.rebuilt` rebuild a partition taken over from its
   heads and the records of its open runs, which the engine reads from the log.
6. The registry (:mod:`worker.runtime.governance.registry`): a run naming a toolset gets it from
   :attr:`Driver.registry`; a policy marker sets the policy set in force
   (:meth:`Driver.policy_marker`; a version that cannot be built changes nothing:
   governance/policy_source.py), and :meth:`Driver.markers` says which markers the engine
   writes beside its ticks (and takes up a version whose text was read late). The driver
   adds the registry's and the policy's parts of ``/readyz`` and their metrics. A run whose
   toolset answer is not final yet is held (:mod:`worker.runtime.hold`):
   :meth:`Driver.apply_all` parks its records and applies the other runs' as they come; once
   the answer is final it applies the parked records, in order, before the partition's next
   (their offsets are behind the partition's: they move no offset), their outputs in the
   same :class:`Work`. The core's lookup never waits, and nothing commits, inside the core.

It also keeps what both engines know of their assignment (:mod:`worker.runtime.assignment`:
the owned partitions' states, the control partitions' forwarded offsets, the partition
gauges) and prepares what they send (:meth:`Driver.outgoing`: each output's key, value,
headers, or its ``output_refused`` replacement, in :attr:`Work.out`; :meth:`Driver.forward`,
a control record's destination; :func:`tick_value`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import orjson

from worker.core import Emit, Topic
from worker.core.outputs import refused_audit
from worker.core.redaction import redactor_for
from worker.runtime import control, hold, refusals, results
from worker.runtime import takeover as takeover_module
from worker.runtime.assignment import Assignment, control_behind
from worker.runtime.config import Config
from worker.runtime.governance.approvers import approvers as approvers_for
from worker.runtime.governance.policy_source import PolicySource
from worker.runtime.governance.registry import (
    POLICY_HISTORY,
    POLICY_MARKER,
    marker_refusal,
    marker_value,
    marker_version,
    policy_head_key,
)
from worker.runtime.governance.signing import SignCommitted, signer, with_audit_key
from worker.runtime.hooks import EngineHooks
from worker.runtime.observability import logs
from worker.runtime.observability.metrics import GovernanceView
from worker.runtime.observability.tracing import Headers
from worker.runtime.partition import TICK, Heads, PartitionState, finished_runs
from worker.runtime.step import Record, Source, out_key, out_value
from worker.runtime.takeover import Takeover

__all__ = ["TICK_DEFER_MAX_S", "Driver", "Outgoing", "RegistryView", "Takeover",
           "TickRule", "Work", "control_behind", "tick_value"]

log = logging.getLogger("latch.worker")
#: What the worker says when it lists no approver key (its start warning, ``/readyz``).
NO_APPROVER_KEYS = "no approver keys: no decision can count; held calls time out"

#: The topics of the outcomes that an audit record follows (``Outputs.outcomes``).
_AUDITED = (Topic.COMMITTED, Topic.ERRORS)
#: Refused outcomes whose audit records a driver waits for, at most (each audit record is
#: sent right after its outcome, or once the record's outcomes are confirmed: faust).
_REFUSED_KEPT = 1024

#: Seconds a tick may wait for the control backlog (a control partition whose end is never
#: reached, e.g. held by someone's open transaction, must not stop the clock).
TICK_DEFER_MAX_S = 10.0


class Outgoing(NamedTuple):
    """One output as the engine sends it (:meth:`Driver.outgoing`)."""

    emit: Emit
    #: Where it goes: the emit's topic, or :attr:`Topic.DLQ` for a replacement.
    topic: Topic
    #: The topic's name (the emit's topic's, also for a replacement: what it replaces).
    name: str
    key: bytes | None
    value: bytes
    headers: Headers | None
    #: The emit was over its topic's limit: this is its ``output_refused`` DLQ record
    #: (counted, logged), keyed by the input record's key.
    refused: bool = False
    #: The input record's key, where it was read and its time (what a refusal at the send
    #: names; a committed call's latency counts from ``record_ms``).
    in_key: bytes | None = None
    source: Source | None = None
    record_ms: int | None = None


class Work:
    """What one :meth:`Driver.apply_all` leaves its engine to do, whole: send :attr:`out`,
    in order; write :attr:`heads`; once both are delivered, move each partition's committed
    offset to :attr:`offsets`. One object per driver, reused: the engine reads it before it
    applies the next records."""

    __slots__ = ("heads", "offsets", "out")

    def __init__(self) -> None:
        #: The records to send, in order: signed, traced, checked against their topic's
        #: limit (:meth:`Driver.outgoing`, one chain).
        self.out: list[Outgoing] = []
        #: The heads the records wrote, as the engine's table stages them
        #: (:meth:`Heads.take`; empty for a table that writes at once).
        self.heads: list[Any] = []
        #: The next offset of each partition whose records were applied.
        self.offsets: dict[int, int] = {}


def tick_value(now_ms: int) -> bytes:
    """The value of the ticks an engine writes into its events partitions at ``now_ms`` (its
    clock's one read: wall time in ms)."""
    return orjson.dumps({"v": 1, "type": "tick", "ts": now_ms})


class TickRule:
    """When a tick is due: at once, unless a control record already in the log is still to
    forward; then at the first turn it is not, or ``defer_max_s`` after it first fell due.

    Why: after a takeover the partition's first tick would otherwise reach the events log
    before the cancels that arrived on the control topic while the partition stood still,
    and expire the runs they stop. Both engines obey this rule."""

    def __init__(self, defer_max_s: float = TICK_DEFER_MAX_S) -> None:
        self.defer_max_s = defer_max_s
        #: When the tick waiting for the control backlog first fell due (None: none waits).
        self.deferred: float | None = None

    def due(self, now: float, behind: bool) -> bool:
        """Whether the tick that fell due (at or before ``now``, a monotonic time) is written
        now; ``behind``: a control record in the log is not yet forwarded."""
        if behind:
            if self.deferred is None:
                self.deferred = now
            if now - self.deferred < self.defer_max_s:
                return False
            log.warning("ticking with control records not yet forwarded (waited %.1fs)",
                        now - self.deferred)
        self.deferred = None
        return True


class RegistryView(Protocol):
    """The registry as a worker follows it (``registry_io.RegistryReader``)."""

    def toolsets(self, name: str, version: int, at_ms: int) -> Any: ...

    def unsettled(self, value: bytes, at_ms: int | None) -> tuple[str, int, int] | None: ...

    def ready(self, name: str, version: int, at_ms: int) -> bool: ...

    def policy_text(self, version: int) -> str | None: ...

    def policy_read(self, version: int) -> str | None: ...

    def policy_registered(self, version: int, at_ms: int) -> bool | None: ...

    def latest_policy(self) -> int | None: ...


class Driver:
    """What a worker does around the core for each record of the partitions it owns, with
    the telemetry hooks and the heads table (over the engine's store) it was given."""

    def __init__(self, config: Config, hooks: EngineHooks, heads: Heads) -> None:
        self.config, self.hooks, self.heads = config, hooks, heads
        #: The core's settings, with the audit digests' key (``signing.with_audit_key``).
        self.assemble = with_audit_key(config).assemble
        self.tick_rule = TickRule()
        #: The registry the worker follows (None: none, e.g. in unit tests).
        self.registry: RegistryView | None = None
        #: The policy in force for a version a marker names (:mod:`policy_source`).
        self.policies = PolicySource(config)
        #: Whose signed decisions count (governance/approvers.py): every assembler gets it;
        #: with no keys listed, no decision counts.
        self.approvers = approvers_for(config)
        if not self.approvers.key_ids and (config.approvals.require_approval
                                           or config.approvals.destructive
                                           or config.policy.mode == "enforce"):
            log.warning("%s (approvers.keys is empty; docs/policies.md, Approvals)",
                        NO_APPROVER_KEYS)
        #: The partitions this worker owns, their states and gauges (assignment.py).
        self.owned = Assignment(hooks)
        #: The outgoing chain's signing step: a committed call's signature (None key id: off).
        self.sign = SignCommitted(signer(config))
        #: Each written topic's limit, checked before each output is sent (refusals.py):
        #: the engine reads them at start, and again after a refusal for size.
        self.limits = refusals.Limits()
        hooks.health.reports["policy"] = self._policy_report
        hooks.health.reports["registry"] = self._registry_report
        hooks.health.reports["approvers"] = self._approvers_report
        hooks.metrics.watch_governance(self._governance)
        #: The tenants' redaction rules (``results.redact``; checked when the config loads).
        self._redactors = config.results.redactors()
        #: The most result bytes a forwarded result carries (runtime/results.py).
        self.result_limit = results.forward_limit(self.assemble.results)
        #: Each output topic's name (the engine sends by name).
        self.names = {t: str(getattr(config.topics, t.value)) for t in Topic}
        #: What the last :meth:`apply_all` left the engine to do (reused).
        self.work = Work()
        #: Outcomes (committed calls, error results) refused by Kafka whose audit records are
        #: not sent yet: (run key, idempotency key) -> Kafka's error (:meth:`refused`).
        self._refused: dict[tuple[str | None, str], str] = {}

    def redact(self, tenant: str | None) -> Callable[[str], tuple[str, dict[str, int]]] | None:
        """The result latch's rewrite of a tenant's result text (None: no rule applies)."""
        redactor = redactor_for(self._redactors, tenant) if self._redactors else None
        return None if redactor is None else redactor.apply

    # -- per record ---------------------------------------------------------------------

    def apply_all(self, partitions: Mapping[int, PartitionState], records: Sequence[Record],
                  headers: Sequence[Any] | None = None) -> Work:
        """Apply ``records`` in order, each its partition's next (``partitions``: the owned
        states by number), and return what the engine must do, whole (:class:`Work`): the
        one hot path of both engines (the kafka engine hands over one ``consume`` call's
        events records, the faust engine one record). The driver never calls the engine:
        the engine sends, writes and commits once this returns.

        Most records (a text delta) need nothing more: they are counted, and their
        partition's ``next_offset`` moves past them. A record that emitted, opened its run,
        ended a call (its argument sizes to count), ended a traced run, found a cancel
        waiting for its run, or is a tick is counted and traced, its heads written to the
        table (which stages them: :meth:`Heads.take`) and its outputs prepared
        (:meth:`outgoing`); a run's ``done`` head is staged with its outputs, so the engine
        writes it once they are delivered (faust) or in their transaction (kafka). A policy
        marker sets the policy in force; a record of a held run is parked, and a held run's
        records are applied once its answer is final, before the record that ended the hold
        (:func:`hold.held`: their offsets are behind the partition's, which they do not
        move). ``headers``: each record's Kafka headers (or a function returning them), read
        only for a record that opens a run."""
        work = self.work
        work.out.clear()
        before = {p: state.next_offset for p, state in partitions.items()}
        self._apply(partitions, records, headers, True)
        work.heads = self.heads.take()
        offsets = work.offsets
        offsets.clear()
        for partition, state in partitions.items():
            if state.next_offset != before[partition]:
                offsets[partition] = state.next_offset
        return work

    def _apply(self, partitions: Mapping[int, PartitionState], records: Sequence[Record],
               headers: Sequence[Any] | None, advance: bool) -> None:
        """:meth:`apply_all`'s loop, into :attr:`work` (``advance``: move the offsets past
        the records; not for a held run's records, :func:`hold.held`)."""
        tracing, metrics = self.hooks.tracing, self.hooks.metrics
        quiet = 0
        try:
            for i, record in enumerate(records):
                key, value, _, source = record
                state = partitions[source.partition]
                if key == POLICY_MARKER:
                    self.policy_marker(state, record)
                elif (state.holds.runs or b'"toolset"' in value) and hold.held(
                        self, state, record, None if headers is None else headers[i]):
                    pass  # parked: its run is held (hold.py)
                else:
                    assembler = state.assembler
                    opened_before = assembler.runs_opened
                    emits = state.apply(record)
                    if (emits or assembler.runs_opened != opened_before or assembler.sizes
                            or tracing.ended or assembler.early_cancels_waiting
                            or key == TICK):
                        # A record opens at most its own run: the counter moved; is it open?
                        opened = assembler.runs_opened != opened_before and assembler.is_open(
                            key.decode("utf-8", "replace") if key else "")
                        self._emitted(state, record, emits, opened,
                                      None if headers is None else headers[i])
                    else:
                        quiet += 1
                if advance:
                    state.next_offset = source.offset + 1
        finally:
            metrics.records += quiet

    def _emitted(self, state: PartitionState, record: Record, emits: list[Emit],
                 opened: bool, headers: Any) -> None:
        """A record that emitted, opened its run, ended a call or is a tick: counted,
        traced, its heads written, its outputs prepared; at a tick, what is over forgotten."""
        key, _, time_ms, source = record
        hooks = self.hooks
        hooks.metrics.record(emits, state.assembler.sizes)
        if opened and callable(headers):
            headers = headers()
        run_id = key.decode("utf-8", "replace") if key else ""
        hooks.tracing.on_record(source.partition, run_id, opened, headers, emits)
        heads = self.heads
        if emits:
            hooks.traced(emits)
        if opened or (not emits and state.assembler.early_cancels_waiting):
            # (Heads.applied writes a head only then: a run's start, a waiting cancel's)
            heads.applied(state, key, source.partition, source.offset, opened, emits)
        if emits:
            self.work.out.extend(self.outgoing(key, emits, self.names, source, time_ms))
            finished = finished_runs(emits, state.assembler.pairing is not None)
            if finished:  # (a held run's record is behind the partition's next offset)
                heads.finished(state, source.partition, finished,
                               max(source.offset + 1, state.next_offset))
        if key == TICK:  # by record time, so the same on every worker
            heads.forget_finished(state)

    def unsettled(self, records: Sequence[Record]) -> list[tuple[int, int]]:
        """What ``records`` need settled before they are applied (both engines ask first,
        so that nothing waits inside :meth:`apply_all`): the ``(version, record time)`` of
        each policy marker whose registration the registry reader cannot answer for yet
        (registry.py ``marker_refusal``: a fence round trip when the reader follows the
        registry); only where the registry's policy sets decide. The engine settles each
        (``registry.policy_registered``, the reader's bounded hold) with no transaction
        open (the kafka engine commits first; decision 0014). A ``run.start`` naming a
        toolset needs nothing: its run is held instead (:mod:`worker.runtime.hold`)."""
        registry = self.registry
        if registry is None or not self.policies.registry:  # (markers change nothing)
            return []
        state = getattr(registry, "state", registry)  # (the reader's answer, never waiting)
        wanted = []
        for record in records:
            if record.key != POLICY_MARKER:
                continue
            version, at_ms = marker_version(record.value), record.time_ms
            if version is not None and at_ms is not None and state.policy_registered(
                    version, at_ms) is None:
                wanted.append((version, at_ms))
        return wanted

    def route(self, record: Record) -> control.Forward | Emit:
        """Where a control record goes (:func:`control.route`); a DLQ record is counted."""
        routed = control.route(record)
        if isinstance(routed, Emit):
            self.hooks.routed(routed)
        return routed

    def forward(self, record: Record) -> tuple[Topic | None, bytes | None, bytes] | None:
        """What the engine sends for a control record (:meth:`route`) or a results record
        (:func:`results.route`): ``(topic, key, value)``; topic None: the events topic (a
        cancel or a result, keyed by its run, into its run's partition by the key's hash),
        else the DLQ (keyed by the record's key); None: nothing (the latch's own result)."""
        routed: control.Forward | Emit | None
        if record.source.topic == self.config.topics.results:
            routed = results.route(record, self.result_limit)
            if routed is None:
                return None
            if isinstance(routed, Emit):
                self.hooks.routed(routed)
        else:
            routed = self.route(record)
        if isinstance(routed, Emit):
            return Topic.DLQ, record.key, out_value(routed)
        key, value = routed
        return None, key, value

    def outgoing(self, key: bytes | None, emits: Sequence[Emit],
                 names: Mapping[Topic, str], source: Source | None = None,
                 record_ms: int | None = None) -> Iterator[Outgoing]:
        """The records to send for ``emits``, in order, each through the chain: its run's
        trace headers (:meth:`EngineHooks.headers`), a committed call's signature
        (:class:`~worker.runtime.governance.signing.SignCommitted`), its size; a DLQ record
        keeps the input record's ``key``. ``names``: each topic's name; ``source``: where the
        input record was read. An emit over its topic's limit (:class:`refusals.Limits`) is
        not sent: its ``output_refused`` DLQ record comes in its place (:meth:`refused`), and
        the audit record of a refused outcome says so (``outputs.refused_audit``): an
        outcome comes before its audit record, and the engine refuses it before it asks for
        the next."""
        trace, sign, over = self.hooks.headers, self.sign, self.limits.over
        for emit in emits:
            topic = emit.topic
            if self._refused and (topic is Topic.AUDIT or topic in _AUDITED):
                noted = (emit.key, str(emit.value["idempotency_key"]))
                if topic is Topic.AUDIT:
                    error = self._refused.pop(noted, None)
                    if error is not None:
                        emit = refused_audit(emit, error)
                else:  # the outcome sent again (a transaction's retry): refused anew, or not
                    self._refused.pop(noted, None)
            name = names[topic]
            emit_key, value = out_key(emit, key), out_value(emit)
            headers = sign(emit, value, trace(emit))
            size = over(name, emit_key, value, headers)
            if size is None:
                yield Outgoing(emit, topic, name, emit_key, value, headers, False, key, source,
                               record_ms)
            else:
                yield Outgoing(emit, Topic.DLQ, name, key, self.refused(
                    emit, name, emit_key, size, "MSG_SIZE_TOO_LARGE", key, source), None, True,
                    key, source, record_ms)

    def reaudit(self, out: Outgoing) -> Outgoing:
        """``out`` again if it is the audit record of an outcome refused since it was
        prepared (by the broker or the client, at the send: :meth:`refused`), so that it
        says ``refused``; else ``out``. The engine asks before it sends an audit record
        while :attr:`refusals` is non-empty (it comes after its outcome)."""
        if out.topic is not Topic.AUDIT or (
                out.emit.key, str(out.emit.value.get("idempotency_key"))) not in self._refused:
            return out
        return next(self.outgoing(out.in_key, (out.emit,), self.names, out.source,
                                  out.record_ms))

    @property
    def refusals(self) -> bool:
        """Whether an outcome's refusal waits for its audit record (:meth:`reaudit`)."""
        return bool(self._refused)

    def refused(self, emit: Emit, name: str, emit_key: bytes | None, size: int, error: str,
                key: bytes | None, source: Source | None) -> bytes:
        """The value of the ``output_refused`` DLQ record that replaces ``emit`` (for topic
        ``name``, ``size`` bytes, refused with ``error``: over the limit, or by the broker),
        counted and logged (:meth:`refusals.Limits.replacement`); the engine sends it to the
        DLQ keyed by the input record's ``key``. A refused outcome's audit record, sent
        after, says ``refused`` (:meth:`outgoing`)."""
        if emit.topic in _AUDITED:
            if len(self._refused) >= _REFUSED_KEPT:  # audits never sent (a filtered list)
                self._refused.clear()
            self._refused[(emit.key, emit.value["idempotency_key"])] = error
        dlq = self.limits.replacement(emit, name, emit_key, size, error, key, source)
        self.hooks.metrics.dlq[str(dlq.value["reason"])] += 1
        return out_value(dlq)

    def tick_due(self, now: float, behind: bool) -> bool:
        """Whether to write the tick that fell due now (:class:`TickRule`)."""
        return self.tick_rule.due(now, behind)

    def ticks(self, partitions: Iterable[int], ts_ms: int) -> list[tuple[int, bytes, bytes]]:
        """What the engine writes into its events ``partitions`` once a tick is due (at
        ``ts_ms``, its clock's one read: wall time in ms): ``(partition, key, value)``, in
        order: each partition's tick, and after it the policy marker it needs
        (:meth:`markers`: a partition not taken over yet needs none). Both engines write
        exactly these."""
        value, owned = tick_value(ts_ms), self.owned.partitions
        out: list[tuple[int, bytes, bytes]] = []
        for partition in sorted(partitions):
            out.append((partition, TICK, value))
            state = owned.get(partition)
            marker = None if state is None else self.markers(state, ts_ms)
            if marker is not None:  # a new policy set version (module doc, step 6)
                out.append((partition, POLICY_MARKER, marker))
        return out

    # -- takeover -----------------------------------------------------------------------

    def takeover(self, partition: int, resume: int) -> Takeover:
        """A fresh state for ``partition`` at offset ``resume`` (:func:`takeover.begin`)."""
        return takeover_module.begin(self, partition, resume)

    def rebuild(self, topic: str, partition: int, resume: int) -> takeover_module.Rebuild:
        """The takeover of ``partition`` at ``resume``, as one generator both engines drive
        (:func:`takeover.rebuild`): it yields what to read, is sent the records, returns
        the state and what to send."""
        return takeover_module.rebuild(self, topic, partition, resume)

    def rebuilt(self, takeover: Takeover, topic: str) -> list[Emit]:
        """The rebuild is read (:func:`takeover.rebuilt`): the outputs to publish again."""
        return takeover_module.rebuilt(takeover, topic)

    def refinished(self, state: PartitionState, partition: int, outputs: Sequence[Emit]
                   ) -> None:
        """The outputs of :meth:`rebuilt` are delivered: record their runs as finished."""
        self.heads.finished(state, partition, finished_runs(
            outputs, state.assembler.pairing is not None), state.next_offset)

    # -- the registry's policy set in force (module doc, step 6) --------------------------

    def policy_marker(self, state: PartitionState, record: Record) -> None:
        """A policy marker, live: the version in force from here on, recorded in the
        partition's policy head (its last ``POLICY_HISTORY`` markers: the version at the
        committed offset for a rebuild with nothing to read, and at a start whose run's head
        names none; the heads of the runs opened from here on name it themselves)."""
        source = record.source
        if not self.set_policy(state, record) or state.policy_version is None:
            return
        state.policy_history = [*state.policy_history,
                                [source.offset, state.policy_version]][-POLICY_HISTORY:]
        self.heads.table[policy_head_key(source.partition)] = {
            "p": source.partition, "policy": state.policy_history}

    def set_policy(self, state: PartitionState, record: Record) -> bool:
        """Apply a policy marker (live or in a rebuild); False if it changes nothing (a
        repeat of the version in force) or is not one."""
        version = marker_version(record.value)
        if version is None:
            log.warning("ignoring a policy marker that names no version",
                        extra=logs.where(record.source.topic, record.source.partition,
                                         record.source.offset))
            return False
        if version == state.policy_version:
            return False
        registry, at_ms = self.registry, record.time_ms
        registered = (None if registry is None or at_ms is None or not self.policies.registry
                      else registry.policy_registered(version, at_ms))
        refused = marker_refusal(version, state.policy_version, registered)
        if refused is not None:  # (never one this worker wrote: registry.py, who writes what)
            log.warning("ignoring a policy marker: %s", refused,
                        extra=logs.where(record.source.topic, record.source.partition,
                                         record.source.offset))
            return False
        return self.put_in_force(state, version)

    def put_in_force(self, state: PartitionState, version: int) -> bool:
        """Put policy set ``version`` in force in ``state``; False when it cannot be built:
        then the version in force stays (policy_source.py)."""
        registry = self.registry
        policy = self.policies.at(version, None if registry is None else registry.policy_text,
                                  state.assembler.policy)
        if version in self.policies.refused:
            return False
        state.policy_version = version
        state.assembler.policy = policy
        return True

    def _reread(self, state: PartitionState) -> None:
        """A version whose text was not read in time when its marker was applied: put it in
        force once the reader has read it (asked without waiting)."""
        policy, registry = state.assembler.policy, self.registry
        if not getattr(policy, "unread", False) or registry is None \
                or state.policy_version is None:
            return
        version = state.policy_version
        if registry.policy_read(version) is not None:
            log.info("policy set version %d read late: in force from now on", version)
            self.put_in_force(state, version)

    def _policy_report(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``'s ``policy``: the registry versions this worker could not build, and
        why (ready all the same: the version in force decides)."""
        refused = dict(self.policies.refused)
        return True, {"refused": {str(v): why for v, why in sorted(refused.items())}}

    def _registry_report(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``'s ``registry``: not ready while a Kafka error keeps the reader from
        following it (registry_io.py)."""
        failure = getattr(self.registry, "failure", None)
        return failure is None, {"following": failure is None, "error": failure}

    def _approvers_report(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``'s ``approvers``: how many approver keys this worker lists, and whether
        a decision can count (ready all the same: a held call fails closed, at its timeout)."""
        keys = len(self.approvers.key_ids)
        detail: dict[str, Any] = {"keys": keys, "counts": keys > 0}
        if not keys:
            detail["detail"] = NO_APPROVER_KEYS
        return True, detail

    def _governance(self) -> GovernanceView | None:
        if self.registry is None:
            return None
        return GovernanceView(len(self.policies.refused),
                              getattr(self.registry, "failure", None) is None)

    def markers(self, state: PartitionState, ts_ms: int) -> bytes | None:
        """The policy marker to write into ``state``'s partition beside its tick (None: the
        registry's latest policy version is in force, or a newer one is, or it is already
        marked since the takeover). First, a version in force whose text was not read in time is
        taken up if it is read now."""
        self._reread(state)
        latest = None if self.registry is None else self.registry.latest_policy()
        if latest is None or latest == state.policy_marked:
            return None
        if state.policy_version is not None and latest <= state.policy_version:
            # in force already, or newer than what this worker's reader has read (a successor
            # whose reader lags): never mark an older version (versions only go forward)
            return None
        state.policy_marked = latest
        return marker_value(latest, ts_ms)

