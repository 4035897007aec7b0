"""The worker's telemetry in one object: metrics (:mod:`.metrics`), run spans
(:mod:`.tracing`), and the exporters ``worker.otel_exporter`` names.

The Prometheus endpoint (``/metrics`` on ``worker.http_port``, :mod:`.health`)
is always fed; ``otel_exporter`` adds a push exporter for metrics and spans: ``none``,
``console`` (periodic dump on stdout, for development) or ``otlp`` (OTLP over HTTP with
protobuf, a dependency; configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables).
Labels and attributes come from closed vocabularies (contract rule 8): see the two modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)

from worker.core.model import Emit
from worker.runtime.observability.metrics import Metrics, MetricsError, otlp_reader
from worker.runtime.observability.tracing import RunTracer

__all__ = ["Telemetry", "TelemetryError"]

TelemetryError = MetricsError


def _readers(exporter: str) -> list[MetricReader]:
    if exporter == "none":
        return []
    if exporter == "console":
        return [PeriodicExportingMetricReader(ConsoleMetricExporter(),
                                              export_interval_millis=60_000)]
    if exporter == "otlp":
        return [otlp_reader()]
    raise TelemetryError(f"worker.otel_exporter: unknown exporter {exporter!r}")


class Telemetry:
    """The worker's metrics and run tracer; :meth:`record` counts one applied record."""

    def __init__(self, exporter: str = "none", readers: Sequence[MetricReader] = (), *,
                 prometheus: bool = True, labels: Iterable[str] = (),
                 label_cap: int = 100,
                 label_values: Mapping[str, Iterable[str]] | None = None) -> None:
        self.metrics = Metrics(prometheus=prometheus, readers=[*_readers(exporter), *readers],
                               labels=tuple(labels), label_cap=label_cap,
                               label_values=label_values)
        self.tracing = RunTracer(exporter)

    def record(self, emits: Sequence[Emit], sizes: list[int] | None = None) -> None:
        """Count one input record, what it produced, and the argument sizes it ended."""
        self.metrics.record(emits, sizes)

    def shutdown(self) -> None:
        self.metrics.shutdown()
        self.tracing.shutdown()
