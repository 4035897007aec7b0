"""W3C trace context: the publisher's headers, the worker's run span, the outputs' headers."""

from __future__ import annotations

import orjson
from builders import chat_calls, chat_run, chat_tool
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from worker.core import Assembler, Topic
from worker.runtime.observability.tracing import RunTracer, extract, inject

SECRET = "hunter2-SECRET-token"


def _envelopes() -> list[bytes]:
    """One chat run whose one call commits (arguments holding SECRET)."""
    calls = chat_calls([("call_1", "f", f'{{"k": "{SECRET}"}}')])
    run = chat_run("r1", [chat_tool("f", {"type": "object"})], calls)
    return [orjson.dumps(envelope) for envelope in run]


def test_inject_then_extract_keeps_the_trace() -> None:
    """The headers inject() writes carry the current span's trace id; none without a span;
    oversized or odd headers are ignored."""
    tracer = TracerProvider().get_tracer("test")
    assert inject() == []
    with tracer.start_as_current_span("gateway") as span:
        headers = inject()
    assert [name for name, _ in headers] == ["traceparent"]
    context = trace.get_current_span(extract(headers)).get_span_context()
    assert context.trace_id == span.get_span_context().trace_id
    assert not trace.get_current_span(extract([("traceparent", b"x" * 600)])).get_span_context(
        ).is_valid
    assert not trace.get_current_span(extract(None)).get_span_context().is_valid


def test_a_run_span_continues_the_publishers_trace_and_tags_every_output() -> None:
    """The run's span has the publisher's trace id as its trace and its span as parent; each
    output of the run carries the run span's traceparent; the span ends with the final message,
    has an event per call, and no attribute or event holds argument text."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    runs = RunTracer(provider=provider)
    with provider.get_tracer("gateway").start_as_current_span("gateway") as parent:
        headers = inject()
    assembler = Assembler()
    seen: list[tuple[Topic, bytes]] = []
    for offset, value in enumerate(_envelopes()):
        was_open = assembler.is_open("r1")
        emits = assembler.feed_record(b"r1", value, 1000 + offset)
        runs.on_record(3, "r1", not was_open and assembler.is_open("r1"),
                       headers if offset == 0 else None, emits)
        for emit in emits:
            out = runs.headers(emit.key)
            assert out is not None
            seen.append((emit.topic, dict(out)["traceparent"]))
    trace_id = f"{parent.get_span_context().trace_id:032x}".encode()
    assert {topic for topic, _ in seen} >= {Topic.COMMITTED, Topic.FINAL}
    assert all(tp.split(b"-")[1] == trace_id for _, tp in seen)
    (span,) = [s for s in exported.get_finished_spans() if s.name == "latch.run"]
    assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
    assert span.attributes is not None and span.attributes["latch.status"] == "completed"
    assert [e.name for e in span.events] == ["latch.call.committed"]
    assert len(seen) >= 2
    assert SECRET not in span.to_json()
    runs.on_record(3, "r2", False, None, [])
    assert runs.headers("r1") is None and runs.open_spans == 0


def test_a_revoked_partition_ends_its_spans() -> None:
    """forget_partition ends the spans of the partition's open runs only."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    runs = RunTracer(provider=provider)
    runs.on_record(1, "a", True, None, [])
    runs.on_record(2, "b", True, None, [])
    runs.forget_partition(1)
    assert [s.attributes["latch.run_id"] for s in exported.get_finished_spans()
            if s.attributes] == ["a"]
    assert runs.headers("b") is not None and runs.headers("a") is None


def test_without_an_exporter_the_incoming_context_is_passed_on_as_it_came() -> None:
    """With spans off (otel_exporter none), no span is made, and each output of the run
    carries the run.start record's trace headers unchanged; a run without them gets none."""
    runs = RunTracer("none")
    assert runs.spans is False
    incoming = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                ("other", b"x")]
    assembler = Assembler()
    outputs = []
    for offset, value in enumerate(_envelopes()):
        was_open = assembler.is_open("r1")
        emits = assembler.feed_record(b"r1", value, 1000 + offset)
        runs.on_record(0, "r1", not was_open and assembler.is_open("r1"),
                       incoming if offset == 0 else None, emits)
        outputs += [runs.headers(emit.key) for emit in emits]
    assert outputs and all(out == incoming[:1] for out in outputs)
    runs.on_record(0, "r2", True, None, [])
    assert runs.headers("r2") is None and runs.headers("r1") is None


def test_trace_id_of_reads_only_a_well_formed_traceparent() -> None:
    """``trace_id_of`` gives the 32 lowercase hex digits of a ``traceparent``'s trace id,
    and None for a malformed value, a non-hex or all-zero trace id, or a short one (an
    audit record then says null rather than something a gateway never sent)."""
    from worker.runtime.observability.tracing import trace_id_of

    good = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id_of(f"00-{good}-00f067aa0ba902b7-01".encode()) == good
    assert trace_id_of(f"00-{good.upper()}-00f067aa0ba902b7-01".encode()) == good
    for bad in (b"", b"garbage", b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01",
                b"00-" + b"g" * 32 + b"-00f067aa0ba902b7-01",
                b"00-0x" + b"1" * 30 + b"-00f067aa0ba902b7-01",
                b"00-4bf92f35-00f067aa0ba902b7-01", b"00-" + "é".encode() * 16 + b"-1-01"):
        assert trace_id_of(bad) is None, bad
