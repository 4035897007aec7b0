"""OpenTelemetry metrics and spans for the worker.

Counters are labelled only by closed vocabularies (provider, reason, state, status, DLQ
reason); a label never holds a run id, a tool call id, a tool name or argument text, so
cardinality stays bounded and secrets stay out (contract rule 8). Spans mark the end of a
run with the same closed attributes plus the run id, which is an identifier, not content.

``exporter`` is ``none`` (instruments are no-ops), ``console`` (periodic dump on stdout,
for development), or ``otlp`` (needs ``opentelemetry-exporter-otlp``, not a default
dependency: ``pip install opentelemetry-exporter-otlp``; configured by the standard
``OTEL_EXPORTER_OTLP_*`` variables).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from worker.core.model import Emit, Topic


class TelemetryError(RuntimeError):
    """The configured exporter cannot be set up."""


def _readers(exporter: str) -> tuple[list[MetricReader], Any]:
    if exporter == "none":
        return [], None
    if exporter == "console":
        return [PeriodicExportingMetricReader(ConsoleMetricExporter(),
                                              export_interval_millis=60_000)], ConsoleSpanExporter()
    if exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise TelemetryError("otel_exporter: otlp needs `pip install "
                                 "opentelemetry-exporter-otlp`") from exc
        return [PeriodicExportingMetricReader(OTLPMetricExporter())], OTLPSpanExporter()
    raise TelemetryError(f"worker.otel_exporter: unknown exporter {exporter!r}")


class Telemetry:
    """The worker's instruments; :meth:`record` turns emitted records into counts."""

    def __init__(self, exporter: str = "none", readers: Sequence[MetricReader] = ()) -> None:
        own, span_exporter = _readers(exporter)
        resource = Resource.create({"service.name": "latch"})
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[*own, *readers])
        self.tracer_provider = TracerProvider(resource=resource)
        if span_exporter is not None:
            self.tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        meter = self.meter_provider.get_meter("latch")
        self.tracer = self.tracer_provider.get_tracer("latch")
        self._committed = meter.create_counter("latch.calls.committed", "{call}")
        self._errors = meter.create_counter("latch.calls.errors", "{call}")
        self._runs = meter.create_counter("latch.runs.finished", "{run}")
        self._dlq = meter.create_counter("latch.dlq.records", "{record}")
        self._records = meter.create_counter("latch.records.processed", "{record}")

    def install_globally(self) -> None:
        """Make these providers the process-wide ones (faust's OTel sensor uses them)."""
        metrics.set_meter_provider(self.meter_provider)
        trace.set_tracer_provider(self.tracer_provider)

    def record(self, emits: Sequence[Emit], records: int = 1) -> None:
        """Count ``records`` input records and what they produced (the worker counts the
        records that produce nothing with the next one that does)."""
        if records:
            self._records.add(records)
        for emit in emits:
            value = emit.value
            if emit.topic is Topic.COMMITTED:
                self._committed.add(1, {"provider": value["provider"]})
            elif emit.topic is Topic.ERRORS:
                self._errors.add(1, {"provider": value["provider"], "reason": value["reason"],
                                     "state": value["state"]})
            elif emit.topic is Topic.FINAL:
                self._finished(value)
            elif emit.topic is Topic.DLQ:
                self._dlq.add(1, {"reason": value["reason"]})

    def _finished(self, value: dict[str, Any]) -> None:
        attrs = {"provider": value["provider"], "status": value["status"]}
        self._runs.add(1, attrs)
        with self.tracer.start_as_current_span("latch.run.finished") as span:
            span.set_attributes({**attrs, "latch.run_id": value["run_id"],
                                 "latch.calls": len(value["outcomes"])})

    def shutdown(self) -> None:
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()
