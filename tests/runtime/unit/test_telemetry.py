"""Telemetry counts outcomes by closed labels and never carries argument text."""

from __future__ import annotations

import orjson
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from worker.core import Assembler
from worker.runtime.telemetry import Telemetry

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
    in the exported metrics contains the argument text."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry("none", readers=[reader])
    assembler = Assembler()
    for value in _run():
        telemetry.record(assembler.feed_record(None, value))
    data = reader.get_metrics_data()
    assert data is not None
    dumped = data.to_json()
    assert SECRET not in dumped
    points = {m.name: m.data.data_points for rm in data.resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    errors = points["latch.calls.errors"]
    assert [dict(p.attributes or {}) for p in errors] == [
        {"provider": "openai.chat", "reason": "schema_invalid", "state": "failed"}]
    assert [p.value for p in points["latch.records.processed"]] == [4]
    assert [dict(p.attributes or {}) for p in points["latch.dlq.records"]] == [
        {"reason": "unsupported_version"}]
    telemetry.shutdown()
