"""The worker's metrics, through the OpenTelemetry SDK, exported to Prometheus (and OTLP).

Engine-independent: an engine (faust's :mod:`worker.runtime.faust_engine.engine`, or any other
loop around the core) calls

* :meth:`Metrics.record` with the emits of each input record (and the argument sizes of the
  calls the record ended, :meth:`Metrics.sizes_of`),
* :meth:`Metrics.commit_delivered` when a committed call's record is delivered,
* :meth:`Metrics.send_failed`, :meth:`Metrics.rebuilt`, :meth:`Metrics.rejected_not_committed`,
* :meth:`Metrics.watch` once, with a function that describes the partitions it owns (runs
  open, buffered bytes, lag), read at each collection.

Cost per record: one integer increment and, per emitted outcome, one dict increment keyed by
a tuple of strings; no attribute dict is built and no OpenTelemetry call is made on that path.
The counters are OpenTelemetry *observable* instruments whose callbacks turn those plain
totals into data points at collection time (a scrape, an OTLP export). Histograms take one
call per ended call (not per record) and carry no attributes.

Labels come from closed vocabularies only: provider, state, reason, status, DLQ reason,
logical topic, events partition. ``tenant`` and ``tool`` labels (on the outcome counter) are
added only when the operator turns them on (``worker.metrics_labels``), and their values are
bounded (:class:`_Label`): at most :data:`LABEL_MAX_CHARS` characters; the operator's own list
when one is given (``worker.metrics_label_tools``, ``worker.metrics_label_tenants``), else
the first ``worker.metrics_label_cap`` registered values: a tool name the run registered
(never a name the model made up: :data:`~worker.core.latch.NAME_CHECKED_REASONS`), a tenant
from ``run.start``. Anything else counts under ``_other`` and takes no slot. No label ever
holds a run id, a call id or argument text.

Prometheus names (the exporter appends ``_total`` to counters)::

    tool_assemble_args_bytes                   histogram  argument bytes of each checked call
    tool_assemble_invalid_json_total           counter    {provider}
    tool_assemble_overflow_total               counter    {provider}  arguments_exceed_max_bytes
    tool_assemble_to_commit_seconds            histogram  completing record's time -> delivery
    tool_execute_rejected_not_committed_total  counter    {reason}    the runner's (runner.py)
    latch_call_outcomes_total                  counter    {provider, state, reason[, tenant, tool]}
    latch_runs_finished_total                  counter    {provider, status}
    latch_records_processed_total              counter
    latch_dlq_records_total                    counter    {reason}
    latch_send_failures_total                  counter    {topic}
    latch_runs_open                            gauge      {partition}
    latch_buffered_bytes                       gauge      {partition}
    latch_buffered_bytes_budget                gauge      {partition}
    latch_consumer_lag_records                 gauge      {partition}
    latch_consumer_lag_seconds                 gauge      {partition}
    latch_rebuild_seconds                      histogram  one per takeover
    latch_rebuild_records_total                counter    records re-read by takeovers
    latch_policy_decisions_total               counter    {mode, result}  policy decisions
    latch_policy_versions_refused_total        counter    registry policy set versions not built
    latch_registry_following                   gauge      1 while the registry reader follows
    latch_results_total                        counter    {outcome}  committed calls' answers
    latch_turns_total                          counter    {provider}  turn records
    latch_result_redactions_total              counter    {rule}  result text rewrites

``latch_policy_decisions_total`` counts the decisions of the policy in force (issue 25):
``mode`` log_only or enforce, ``result`` allow, deny or error (an evaluation error, which
denies); in log_only, ``deny`` and ``error`` are the would-deny counts to watch before enforcing
(docs/operations.md). Decisions a takeover's rebuild makes again are counted again.
``latch_policy_versions_refused_total`` counts the registry policy set versions this worker
could not build (kept out of force: the version in force stays; governance/policy_source.py);
``latch_registry_following`` is 0 while a Kafka error keeps the registry reader from following
(both from :meth:`Metrics.watch_governance`; no point without a registry reader).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from worker.core.envelope import PROVIDERS
from worker.core.latch import NAME_CHECKED_REASONS
from worker.core.model import DlqReason, Emit, Reason, Topic

__all__ = ["LABEL_MAX_CHARS", "METRIC_NAMES", "GovernanceView", "Metrics", "MetricsError",
           "PartitionView"]

#: Every metric family the worker exports, as Prometheus names it (dashboards and alerts may
#: query these and nothing else: tests/runtime/unit/test_deploy.py holds them to it).
METRIC_NAMES: frozenset[str] = frozenset({
    "tool_assemble_args_bytes", "tool_assemble_invalid_json_total",
    "tool_assemble_overflow_total", "tool_assemble_to_commit_seconds",
    "tool_execute_rejected_not_committed_total", "latch_call_outcomes_total",
    "latch_runs_finished_total", "latch_records_processed_total", "latch_dlq_records_total",
    "latch_send_failures_total", "latch_runs_open", "latch_buffered_bytes",
    "latch_buffered_bytes_budget", "latch_consumer_lag_records", "latch_consumer_lag_seconds",
    "latch_rebuild_seconds", "latch_rebuild_records_total",
    "latch_policy_versions_refused_total", "latch_registry_following",
    "latch_results_total", "latch_turns_total", "latch_result_redactions_total",
})
#: A committed call's answer (the result latch, core/pairing.py): ``latch_results_total``.
RESULT_OUTCOMES = ("answered", "tool_timeout", "result_too_large", "result_schema_invalid")

#: Why a runner refuses a record (``tool_execute_rejected_not_committed_total{reason}``):
#: not JSON, not a committed call (the committed-call schema fails), or the wrong topic; with
#: signing keys (signing.py): no signature, a key id it does not hold, a wrong signature.
REJECT_REASONS = ("undecodable", "not_a_committed_call", "wrong_topic", "unsigned",
                  "unknown_key", "bad_signature")

#: Labels an operator may turn on (``worker.metrics_labels``).
OPTIONAL_LABELS = frozenset({"tenant", "tool"})
OTHER = "_other"
#: The longest value an optional label takes (the providers' own bound on a tool name: 64
#: characters for OpenAI, Anthropic, Bedrock and Gemini); a longer one counts under ``_other``.
LABEL_MAX_CHARS = 64

_BYTES_BUCKETS = (0, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_REBUILD_BUCKETS = (0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


@dataclass(frozen=True, slots=True)
class GovernanceView:
    """What the partition driver says about the registry, at collection time."""

    #: Registry policy set versions this worker could not build.
    policy_versions_refused: int
    #: Whether the registry reader follows the registry now.
    registry_following: bool


class MetricsError(RuntimeError):
    """The configured exporter cannot be set up."""


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What an engine says about one events partition it owns, at collection time."""

    partition: int
    runs_open: int
    buffered_bytes: int
    budget_bytes: int
    #: Records between the next offset to apply and the high watermark (None: unknown).
    lag_records: int | None = None
    #: Seconds since the last applied record's time while there is lag (0 without lag).
    lag_seconds: float | None = None


def otlp_reader() -> MetricReader:
    """A periodic OTLP/HTTP reader (``OTEL_EXPORTER_OTLP_*`` variables configure it)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as exc:
        raise MetricsError("otel_exporter: otlp needs opentelemetry-exporter-otlp-proto-http "
                           "(a dependency of latch: reinstall it)") from exc
    return PeriodicExportingMetricReader(OTLPMetricExporter())


class _Label:
    """The values one optional label takes: ``allowed`` (the operator's list) when given, and
    then only those; else the first ``cap`` values offered as ``registered``. A value longer
    than :data:`LABEL_MAX_CHARS`, not a string, unlisted, unregistered or past the cap is
    ``_other`` and takes no slot; None (a run without a tenant) is the empty value, free."""

    def __init__(self, cap: int, allowed: Iterable[str] = ()) -> None:
        self.cap = cap
        self.allowed = frozenset(allowed)
        self.seen: set[str] = set()

    def __call__(self, value: Any, registered: bool = True) -> str:
        if value is None:
            return ""
        if not isinstance(value, str) or not value or len(value) > LABEL_MAX_CHARS:
            return OTHER
        if self.allowed:
            return value if value in self.allowed else OTHER
        if value in self.seen:
            return value
        if not registered or len(self.seen) >= self.cap:
            return OTHER
        self.seen.add(value)
        return value


class Metrics:
    """The worker's instruments and the plain totals behind the observable ones.

    ``prometheus``: serve a Prometheus registry (:meth:`exposition`); ``readers``: further
    OpenTelemetry readers (an OTLP reader, a test's in-memory reader); ``labels``: the
    optional labels turned on, ``label_cap`` and ``label_values`` (label -> the operator's
    list of its values) bound their values (:class:`_Label`).
    """

    def __init__(self, *, prometheus: bool = True, readers: Sequence[MetricReader] = (),
                 labels: Iterable[str] = (), label_cap: int = 100,
                 label_values: Mapping[str, Iterable[str]] | None = None) -> None:
        self.registry: Any = None
        all_readers = list(readers)
        if prometheus:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            self.registry = CollectorRegistry(auto_describe=False)
            all_readers.append(PrometheusMetricReader(
                disable_target_info=True, scope_info_enabled=False, registry=self.registry))
        labels = tuple(labels)
        values = dict(label_values or {})
        unknown = (set(labels) | set(values)) - OPTIONAL_LABELS
        if unknown:
            raise MetricsError(f"worker.metrics_labels: unknown labels {sorted(unknown)}")
        self._tenant = _Label(label_cap, values.get("tenant", ())) if "tenant" in labels \
            else None
        self._tool = _Label(label_cap, values.get("tool", ())) if "tool" in labels else None
        self._lock = threading.Lock()  # collections may run on another thread than records
        self.records = 0
        #: (provider, state, reason, tenant, tool) -> calls; reason "" for committed.
        self.outcomes: Counter[tuple[str, str, str, str, str]] = Counter()
        self.runs: Counter[tuple[str, str]] = Counter()
        # Counters of closed vocabularies start at 0, so that rate() and alerts see a series
        # before the first event.
        self.dlq: Counter[str] = Counter(dict.fromkeys(map(str, DlqReason), 0))
        self.send_failures: Counter[str] = Counter(
            {t.value: 0 for t in Topic if t is not Topic.PROGRESS})
        self.rejected: Counter[str] = Counter(dict.fromkeys(REJECT_REASONS, 0))
        self.rebuild_records = 0
        #: The result latch's answers by outcome, turn records by provider, and each
        #: redaction rule's rewrites by rule name (the operator's names, never text).
        self.results: Counter[str] = Counter(dict.fromkeys(RESULT_OUTCOMES, 0))
        self.turns: Counter[str] = Counter(dict.fromkeys(PROVIDERS, 0))
        self.redactions: Counter[str] = Counter()
        self._partitions: Callable[[], Iterable[PartitionView]] = tuple
        self._governance: Callable[[], GovernanceView | None] = lambda: None

        views = [
            View(instrument_name="tool_assemble_args_bytes",
                 aggregation=ExplicitBucketHistogramAggregation(_BYTES_BUCKETS)),
            View(instrument_name="tool_assemble_to_commit_seconds",
                 aggregation=ExplicitBucketHistogramAggregation(_SECONDS_BUCKETS)),
            View(instrument_name="latch_rebuild_seconds",
                 aggregation=ExplicitBucketHistogramAggregation(_REBUILD_BUCKETS)),
        ]
        self.provider = MeterProvider(resource=Resource.create({"service.name": "latch"}),
                                      metric_readers=all_readers, views=views)
        meter = self.provider.get_meter("latch")
        # No units: the Prometheus exporter would append them to the names.
        self._args_bytes = meter.create_histogram(
            "tool_assemble_args_bytes", description="Bytes of each call's argument text at "
            "its end (committed or not)")
        self._to_commit = meter.create_histogram(
            "tool_assemble_to_commit_seconds", description="From the time of the record "
            "that completed a call to the delivery of its committed record")
        self._rebuild = meter.create_histogram(
            "latch_rebuild_seconds", description="Time to rebuild a partition at a takeover")
        counter, gauge = meter.create_observable_counter, meter.create_observable_gauge
        counter("tool_assemble_invalid_json", [self._invalid_json],
                description="Calls whose argument text was not strict JSON")
        counter("tool_assemble_overflow", [self._overflow],
                description="Calls whose argument text exceeded max_tool_argument_bytes")
        counter("tool_execute_rejected_not_committed", [self._rejected],
                description="Records a runner refused to execute: not a committed call")
        counter("latch_call_outcomes", [self._outcomes],
                description="Call outcomes by provider, state and reason")
        counter("latch_runs_finished", [self._runs], description="Final messages, by status")
        counter("latch_records_processed", [self._records],
                description="Input records applied (events and control)")
        counter("latch_dlq_records", [self._dlq], description="Records sent to the DLQ")
        counter("latch_results", [lambda _: self._by(self.results, "outcome")],
                description="Committed calls' answers by outcome (the result latch)")
        counter("latch_turns", [lambda _: self._by(self.turns, "provider")],
                description="Turn records written, by provider")
        counter("latch_result_redactions", [lambda _: self._by(self.redactions, "rule")],
                description="Rewrites of result text by redaction rule (never the text)")
        counter("latch_send_failures", [self._send_failures],
                description="Output records whose delivery failed")
        counter("latch_rebuild_records", [self._rebuild_records],
                description="Records re-read from the log by takeovers")
        counter("latch_policy_decisions", [self._policy_decisions],
                description="Policy decisions by mode and result (allow, deny, error)")
        counter("latch_policy_versions_refused", [self._refused],
                description="Registry policy set versions this worker could not build")
        gauge("latch_registry_following", [self._following],
              description="1 while the registry reader follows the registry, 0 after a "
              "Kafka error until a new consumer resumes")
        gauge("latch_runs_open", [self._gauge("runs_open")], description="Open runs")
        gauge("latch_buffered_bytes", [self._gauge("buffered_bytes")],
              description="Argument bytes held by open runs")
        gauge("latch_buffered_bytes_budget", [self._gauge("budget_bytes")],
              description="max_buffered_bytes of the partition's assembler")
        gauge("latch_consumer_lag_records", [self._gauge("lag_records")],
              description="Records behind the high watermark")
        gauge("latch_consumer_lag_seconds", [self._gauge("lag_seconds")],
              description="Seconds since the last applied record's time, while lagging")

    # -- what engines call --------------------------------------------------------------

    def record(self, emits: Sequence[Emit], sizes: list[int] | None = None) -> None:
        """Count one applied input record, what it emitted, and the argument sizes of the
        calls it ended (drained: the list is cleared)."""
        self.records += 1
        for emit in emits:
            topic = emit.topic
            if topic is Topic.PROGRESS:
                continue
            value = emit.value
            if topic is Topic.AUDIT:  # (one per outcome: counted there; an answer's here)
                if "result" in value:
                    self.results[value["outcome"]] += 1
                continue
            if topic is Topic.TURNS:
                self.turns[value["provider"]] += 1
                continue
            if topic is Topic.COMMITTED:
                self._outcome(value, "committed", "", value.get("name"), True)
            elif topic is Topic.ERRORS:
                reason = value["reason"]
                self._outcome(value, value["state"], reason, value.get("name"),
                              reason in NAME_CHECKED_REASONS)
            elif topic is Topic.FINAL:
                self.runs[(value["provider"], value["status"])] += 1
            elif topic is Topic.DLQ:  # (a pending call has its outcome later: not counted)
                self.dlq[value["reason"]] += 1
        if sizes:
            for size in sizes:
                self._args_bytes.record(size)
            sizes.clear()

    def _outcome(self, value: dict[str, Any], state: str, reason: str, tool: Any,
                 registered: bool) -> None:
        """Count one call's outcome; ``registered``: its name passed the run's tool check."""
        tenant = "" if self._tenant is None else self._tenant(value.get("tenant"))
        name = "" if self._tool is None else self._tool(tool, registered)
        self.outcomes[(value["provider"], state, reason, tenant, name)] += 1

    def allowed(self, label: str) -> frozenset[str]:
        """The operator's list of values for an optional label (empty: none given, or off)."""
        found = {"tenant": self._tenant, "tool": self._tool}.get(label)
        return frozenset() if found is None else found.allowed

    def label_values(self, label: str) -> set[str]:
        """The values an optional label has taken from the registered ones (the slots used)."""
        found = {"tenant": self._tenant, "tool": self._tool}.get(label)
        return set() if found is None else set(found.seen)

    def commit_delivered(self, record_ms: int | None, now_s: float) -> None:
        """A committed call's record was delivered at ``now_s`` (wall time, seconds); the
        record that completed the call has time ``record_ms``."""
        if record_ms is not None:
            self._to_commit.record(max(0.0, now_s - record_ms / 1000))

    def send_failed(self, topic: Topic) -> None:
        self.send_failures[topic.value] += 1

    def rebuilt(self, seconds: float, records: int) -> None:
        """A takeover rebuilt a partition in ``seconds`` from ``records`` re-read."""
        self._rebuild.record(seconds)
        self.rebuild_records += records

    def rejected_not_committed(self, reason: str) -> None:
        """A runner refused a record that is not a committed call (closed ``reason``)."""
        self.rejected[reason] += 1

    def watch(self, partitions: Callable[[], Iterable[PartitionView]]) -> None:
        """Describe the owned partitions at each collection (called from any thread)."""
        self._partitions = partitions

    def watch_governance(self, view: Callable[[], GovernanceView | None]) -> None:
        """Describe the policy versions refused and the registry reader at each collection
        (called from any thread; None: no registry reader)."""
        self._governance = view

    def exposition(self) -> bytes:
        """The Prometheus text of every metric (empty without a Prometheus registry)."""
        if self.registry is None:
            return b""
        from prometheus_client import generate_latest

        with self._lock:
            text: bytes = generate_latest(self.registry)
        return text

    def shutdown(self) -> None:
        self.provider.shutdown()

    # -- collection callbacks (outside the hot path) ------------------------------------

    @staticmethod
    def _by(counts: Counter[str], label: str) -> list[Observation]:
        return [Observation(n, {label: key}) for key, n in list(counts.items())]

    def _outcomes(self, options: CallbackOptions) -> list[Observation]:
        points = []
        for (provider, state, reason, tenant, tool), n in list(self.outcomes.items()):
            attrs = {"provider": provider, "state": state, "reason": reason}
            if self._tenant is not None:
                attrs["tenant"] = tenant
            if self._tool is not None:
                attrs["tool"] = tool
            points.append(Observation(n, attrs))
        return points

    def _reason_total(self, reason: str) -> list[Observation]:
        totals: Counter[str] = Counter(dict.fromkeys(PROVIDERS, 0))
        for (provider, _, why, _, _), n in list(self.outcomes.items()):
            if why == reason:
                totals[provider] += n
        return self._by(totals, "provider")

    def _invalid_json(self, options: CallbackOptions) -> list[Observation]:
        return self._reason_total(Reason.INVALID_JSON.value)

    def _overflow(self, options: CallbackOptions) -> list[Observation]:
        return self._reason_total(Reason.ARGUMENTS_EXCEED_MAX_BYTES.value)

    @staticmethod
    def _policy_decisions(options: CallbackOptions) -> list[Observation]:
        from worker.runtime.governance.policy import DECISIONS  # (cedarpy: read at collection only)

        return [Observation(n, {"mode": mode, "result": result})
                for (mode, result), n in list(DECISIONS.items())]

    def _refused(self, options: CallbackOptions) -> list[Observation]:
        view = self._governance()
        return [] if view is None else [Observation(view.policy_versions_refused)]

    def _following(self, options: CallbackOptions) -> list[Observation]:
        view = self._governance()
        return [] if view is None else [Observation(int(view.registry_following))]

    def _rejected(self, options: CallbackOptions) -> list[Observation]:
        return self._by(self.rejected, "reason")

    def _runs(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {"provider": p, "status": s})
                for (p, s), n in list(self.runs.items())]

    def _records(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self.records)]

    def _dlq(self, options: CallbackOptions) -> list[Observation]:
        return self._by(self.dlq, "reason")

    def _send_failures(self, options: CallbackOptions) -> list[Observation]:
        return self._by(self.send_failures, "topic")

    def _rebuild_records(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(self.rebuild_records)]

    def _gauge(self, field: str) -> Callable[[CallbackOptions], list[Observation]]:
        def observe(options: CallbackOptions) -> list[Observation]:
            points = []
            for view in self._partitions():
                value = getattr(view, field)
                if value is not None:
                    points.append(Observation(value, {"partition": str(view.partition)}))
            return points
        return observe
