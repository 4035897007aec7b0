"""Telemetry counts outcomes by closed labels and never carries argument text."""

from __future__ import annotations

import orjson
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from worker.core import Assembler
from worker.runtime.observability.telemetry import Telemetry

SECRET = "hunter2-SECRET-token"


def _run() -> list[bytes]:
    tools = [{"type": "function", "function": {"name": "login", "parameters": {
        "type": "object", "properties": {"password": {"type": "integer"}}}}}]
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [{
        "index": 0, "id": "call_1", "function": {"name": "login",
                                                 "arguments": f'{{"password": "{SECRET}"}}'}}]}}]}
    envs = [{"v": 1, "run_id": "r1", "seq": 0, "type": "run.start", "provider": "openai.chat",
             "tools": tools},
            {"v": 1, "run_id": "r1", "seq": 1, "type": "provider.event", "event": chunk},
            {"v": 1, "run_id": "r1", "seq": 2, "type": "stream.end"},
            {"v": 2, "garbage": SECRET}]
    return [orjson.dumps(e) for e in envs]


def test_counters_use_closed_labels_only() -> None:
    """A schema failure is counted by provider, reason and state; no label or value anywhere
    in the exported metrics (OpenTelemetry data or Prometheus text) holds the argument text."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry("none", readers=[reader])
    assembler = Assembler()
    assembler.sizes = []
    for value in _run():
        telemetry.record(assembler.feed_record(None, value), assembler.sizes)
    data = reader.get_metrics_data()
    assert data is not None
    dumped = data.to_json()
    assert SECRET not in dumped
    assert SECRET.encode() not in telemetry.metrics.exposition()
    points = {m.name: m.data.data_points for rm in data.resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    errors = points["latch_call_outcomes"]
    assert [dict(p.attributes or {}) for p in errors] == [
        {"provider": "openai.chat", "reason": "schema_invalid", "state": "failed"}]
    assert [p.value for p in points["latch_records_processed"]] == [4]
    assert [dict(p.attributes or {}) for p in points["latch_dlq_records"] if p.value] == [
        {"reason": "unsupported_version"}]
    assert [p.count for p in points["tool_assemble_args_bytes"]] == [1]
    telemetry.shutdown()
