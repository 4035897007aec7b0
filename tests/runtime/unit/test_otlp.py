"""``worker.otel_exporter: otlp``: the worker's metrics and run spans reach an OTLP/HTTP
collector (a local HTTP server standing in for one), configured by the standard
``OTEL_EXPORTER_OTLP_ENDPOINT``, through the hooks both engines call."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import driving
import orjson
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from worker.core import Assembler
from worker.runtime import step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads, PartitionState
from worker.tools.demo import example_file, load_envelopes

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
HEADERS = [("traceparent", f"00-{TRACE_ID}-b7ad6b7169203331-01".encode())]


class Collector:
    """An OTLP/HTTP receiver: the protobuf bodies posted to each path."""

    def __init__(self) -> None:
        self.posts: dict[str, list[bytes]] = {}
        posts = self.posts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                posts.setdefault(self.path, []).append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[Collector]:
    made = Collector()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", made.endpoint)
    try:
        yield made
    finally:
        made.close()


def sums(posts: list[bytes]) -> dict[str, float]:
    """The last value of each counter (cumulative sums, over all label sets) and the count
    of each histogram, by OTLP metric name."""
    found: dict[str, float] = {}
    for body in posts:
        request = ExportMetricsServiceRequest.FromString(body)
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.HasField("sum"):
                        found[metric.name] = sum(p.as_int or p.as_double
                                                 for p in metric.sum.data_points)
                    elif metric.HasField("histogram"):
                        found[metric.name] = sum(p.count for p in metric.histogram.data_points)
    return found


def test_otlp_exports_the_metrics_and_the_run_spans(collector: Collector) -> None:
    """The demo's runs through the driver and EngineHooks with otel_exporter otlp: at
    shutdown the collector holds the metrics by their names (one invalid_json, six committed
    calls, seven argument sizes, every record) and one latch.run span per run, in the trace
    the run.start records' traceparent carried; no span holds argument text."""
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                    "LATCH_WORKER__OTEL_EXPORTER": "otlp"})
    hooks = EngineHooks(config)
    driver = Driver(config, hooks, Heads({}, 3600))
    state = PartitionState(Assembler(config.assemble), next_offset=0)
    state.assembler.sizes = []
    envelopes = load_envelopes(example_file(), "otlp/")
    for offset, envelope in enumerate(envelopes):
        record = step.record(str(envelope["run_id"]).encode(), orjson.dumps(envelope),
                             1_000 + offset, "events", 0, offset)
        driving.apply(driver, state, record, HEADERS)
    hooks.stop(None)  # flushes both exporters

    metrics = sums(collector.posts["/v1/metrics"])
    assert metrics["tool_assemble_invalid_json"] == 1
    assert metrics["tool_assemble_overflow"] == 0
    assert metrics["tool_assemble_args_bytes"] == 7
    assert metrics["latch_records_processed"] == len(envelopes)
    assert metrics["latch_runs_finished"] == 8
    assert {"latch_call_outcomes", "latch_dlq_records", "latch_send_failures",
            "tool_execute_rejected_not_committed"} <= set(metrics)

    spans = [span for body in collector.posts["/v1/traces"]
             for resource in ExportTraceServiceRequest.FromString(body).resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    runs = [span for span in spans if span.name == "latch.run"]
    assert len(runs) == len({e["run_id"] for e in envelopes}) == 8
    assert {span.trace_id.hex() for span in runs} == {TRACE_ID}
    text = b"".join(collector.posts["/v1/traces"] + collector.posts["/v1/metrics"])
    for argument in (b"France", b"Paris", b"Fresh red apple", b"cursor", b"Edinburgh",
                     b"NASDAQ"):  # argument text of the demo's committed calls
        assert argument not in text
