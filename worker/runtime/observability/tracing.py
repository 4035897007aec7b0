"""Traces that follow a run from the gateway through the worker to the runner (W3C context).

* The gateway's :class:`~worker.client.publisher.Publisher` puts the ``traceparent`` (and
  ``tracestate``) of the caller's current context into each envelope's Kafka headers
  (:func:`inject`).
* The worker continues that trace with one span per run (:class:`RunTracer`): it starts when
  the run opens (parent: the context in its ``run.start`` record's headers), gets an event at
  each call's end (committed, failed, cancelled) and ends with the final message. Every output
  record of the run carries the run span's context in its headers (:meth:`RunTracer.headers`),
  so the runner's span (:func:`extract`) joins the same trace.
* Attributes come from closed vocabularies (provider, state, reason, status) plus the run id
  and call ids, which are identifiers. Never argument text, a tool's description or a secret.

Spans cost about 100 µs per run (start, context, events, end), so they are made only when
they go somewhere (``worker.otel_exporter`` is not ``none``, or a provider is given). Without
them the worker still carries the trace on: each output of a run gets the ``traceparent`` and
``tracestate`` headers of the run's ``run.start`` record as they came, so the runner's span
still joins the gateway's trace (as a child of the gateway's span instead of the run's).

A run taken over by another worker in the middle of its stream has no span there (its
``run.start`` record was read back by the rebuild, not seen live): its later outputs carry no
trace headers. Engine-independent: an engine calls :meth:`RunTracer.on_record` after the core
applied a record, and :meth:`RunTracer.forget_partition` when a partition is revoked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from worker.core.model import Emit, Topic

__all__ = ["TRACE_HEADERS", "Headers", "RunTracer", "extract", "inject", "span_exporter",
           "trace_id_of"]

#: Kafka headers as the clients take them.
Headers = list[tuple[str, bytes]]
#: The W3C trace-context headers Latch reads and writes.
TRACE_HEADERS = ("traceparent", "tracestate")

_PROPAGATOR = TraceContextTextMapPropagator()
_HEX = "0123456789abcdef"


def span_exporter(exporter: str) -> SpanExporter | None:
    """The span exporter of ``worker.otel_exporter`` (None: spans are made, not exported)."""
    if exporter == "console":
        return ConsoleSpanExporter()
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter_: SpanExporter = OTLPSpanExporter()
        return exporter_
    return None


def inject(context: otel_context.Context | None = None) -> Headers:
    """The trace headers of ``context`` (default: the current one); empty without a span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return [(name, value.encode()) for name, value in carrier.items()]


def _trace_headers(headers: Any) -> Headers:
    """The W3C trace headers among Kafka ``headers``, as they came (bounded in size)."""
    if not headers:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(name, bytes(value)) for name, value in items
            if isinstance(name, str) and name.lower() in TRACE_HEADERS
            and isinstance(value, bytes | bytearray) and len(value) <= 512]


def extract(headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes] | None
            ) -> otel_context.Context:
    """The context carried by Kafka ``headers`` (an empty one when they carry none)."""
    if not headers:
        return otel_context.Context()
    items = headers.items() if isinstance(headers, Mapping) else headers
    carrier = {}
    for name, value in items:
        key = name.lower() if isinstance(name, str) else str(name)
        if key in TRACE_HEADERS and isinstance(value, bytes | bytearray) and len(value) <= 512:
            carrier[key] = bytes(value).decode("ascii", "replace")
    return _PROPAGATOR.extract(carrier) if carrier else otel_context.Context()


def trace_id_of(traceparent: bytes) -> str | None:
    """The trace id of a W3C ``traceparent`` value (``version-traceid-parentid-flags``);
    None when it is not one (a malformed header came in), or the trace id is all zeros."""
    parts = traceparent.split(b"-")
    if len(parts) < 4 or len(parts[1]) != 32:
        return None
    text = parts[1].decode("ascii", "replace").lower()
    if text.strip(_HEX) or not text.strip("0"):
        return None
    return text


class RunTracer:
    """One span per run of the partitions a worker owns."""

    def __init__(self, exporter: str = "none",
                 provider: TracerProvider | None = None) -> None:
        #: Make spans (they are exported), or only pass the incoming context on.
        self.spans = provider is not None or exporter != "none"
        if provider is None:
            provider = TracerProvider(resource=Resource.create({"service.name": "latch"}))
            span_out = span_exporter(exporter)
            if span_out is not None:
                provider.add_span_processor(BatchSpanProcessor(span_out))
        self.provider = provider
        self.tracer = provider.get_tracer("latch.worker")
        #: run id -> (partition, its span (None: no spans made), the headers of its outputs)
        self._runs: dict[str, tuple[int, trace.Span | None, Headers]] = {}
        #: Runs whose final message was seen, to forget at the next record (empty: idle).
        self.ended: list[str] = []

    @property
    def idle(self) -> bool:
        """Whether :meth:`on_record` of a record that opened no run and emitted nothing would
        do nothing (no ended run left to forget)."""
        return not self.ended

    def on_record(self, partition: int, run_id: str | None, opened: bool,
                  headers: Any, emits: Sequence[Emit]) -> None:
        """After the core applied a record of ``run_id`` (``opened``: it started the run)."""
        if self.ended:
            for ended in self.ended:
                self._runs.pop(ended, None)
            self.ended.clear()
        if opened and run_id:
            self._start(partition, run_id, headers, emits)
        runs = self._runs
        for emit in emits:
            topic = emit.topic
            if topic is Topic.PROGRESS or topic is Topic.DLQ or topic is Topic.AUDIT \
                    or emit.key not in runs:
                continue
            span = runs[emit.key][1]
            if span is None:
                if topic is Topic.FINAL:
                    self.ended.append(emit.key)
                continue
            value = emit.value
            if topic is Topic.RUN_ENDED:  # Latch ended the run: an event, not its end (0015)
                span.add_event("latch.run.ended", {"latch.reason": value["reason"]})
            elif topic is Topic.COMMITTED:
                span.add_event("latch.call.committed", {"latch.tool_call_id": value["call_id"]})
            elif topic is Topic.ERRORS:
                span.add_event("latch.call.error", {
                    "latch.tool_call_id": value["tool_call_id"], "latch.state": value["state"],
                    "latch.reason": value["reason"]})
            elif topic is Topic.PENDING:
                span.add_event("latch.call.pending", {"latch.tool_call_id": value["call_id"]})
            elif topic is Topic.FINAL:  # (a turn record comes after: the span has ended)
                span.set_attribute("latch.status", value["status"])
                span.set_attribute("latch.calls", len(value["outcomes"]))
                span.end()
                self.ended.append(emit.key)

    def _start(self, partition: int, run_id: str, headers: Any,
               emits: Sequence[Emit]) -> None:
        if not self.spans:
            incoming = _trace_headers(headers)
            if incoming:
                self._runs[run_id] = (partition, None, incoming)
            return
        span = self.tracer.start_span("latch.run", context=extract(headers),
                                      kind=trace.SpanKind.CONSUMER,
                                      attributes={"latch.run_id": run_id,
                                                  "latch.partition": partition})
        out = inject(trace.set_span_in_context(span))
        self._runs[run_id] = (partition, span, out)

    def trace_id(self, run_id: str | None) -> str | None:
        """The trace id of ``run_id``'s trace (32 lowercase hex digits), as its outputs'
        ``traceparent`` header carries it; None: the run has no trace here."""
        for name, value in self.headers(run_id) or ():
            if name == "traceparent":
                return trace_id_of(value)
        return None

    def headers(self, run_id: str | None) -> Headers | None:
        """The trace headers for an output record of ``run_id`` (None: the run has no span)."""
        found = self._runs.get(run_id) if run_id is not None else None
        return None if found is None else found[2]

    def forget_partition(self, partition: int) -> None:
        """The partition was revoked: end its runs' spans here (the next owner has none)."""
        for run_id, (owner, span, _) in list(self._runs.items()):
            if owner == partition:
                if span is not None:
                    span.set_attribute("latch.handed_over", True)
                    span.end()
                del self._runs[run_id]

    @property
    def open_spans(self) -> int:
        return len(self._runs)

    def shutdown(self) -> None:
        for _, span, _ in self._runs.values():
            if span is not None:
                span.end()
        self._runs.clear()
        self.provider.shutdown()
