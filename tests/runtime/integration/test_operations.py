"""Operable in production, on the real broker, with each engine (faust, and the kafka
engine's transactions): ``/metrics`` after the demo's runs holds the values those runs imply,
``/readyz`` turns ready only after the takeover's rebuild, and the trace the gateway's
publisher started is on the committed records' headers."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client.parser import text_string_to_metric_families
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    WorkerProcess,
    finished,
    http_get,
    make_stack,
    readiness,
    start_worker,
)

from worker.client.publisher import Publisher
from worker.core import Assembler
from worker.tools import broker
from worker.tools.demo import example_file, load_envelopes

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(port: int) -> Samples:
    answer = http_get(port, "/metrics")
    assert answer is not None and answer[0] == 200
    found: Samples = {}
    for family in text_string_to_metric_families(answer[1].decode()):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(value for key, value in samples.get(name, {}).items()
               if all((k, v) in key for k, v in labels.items()))


#: A prelude that makes each rebuild last at least half a second (both engines rebuild
#: inside Health.rebuilding), so that /readyz is seen answering during one.
SLOW_REBUILD = """
import contextlib, time
from worker.runtime.observability import health
_rebuilding = health.Health.rebuilding
@contextlib.contextmanager
def _slow(self, partition):
    with _rebuilding(self, partition):
        time.sleep(0.5)
        yield
health.Health.rebuilding = _slow
"""


def json_lines(proc: WorkerProcess) -> list[dict[str, object]]:
    """The worker's output, each line a JSON object (worker.log_format: json)."""
    lines = []
    for line in proc.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line[:200]!r}") from None
        assert isinstance(entry, dict) and {"ts", "level", "logger", "message"} <= set(entry)
        lines.append(entry)
    return lines


def caught_up(port: int, proc: WorkerProcess, ticks: int = 12, timeout: float = 30.0) -> None:
    """Wait until the worker applied ``ticks`` more records (its own ticks: nothing else is
    published meanwhile) and every owned partition's lag gauge reads 0 records: it applied
    everything up to the end it can read (with the kafka engine, the transaction markers
    after its ticks are no lag)."""
    records = total(scrape(port), "latch_records_processed_total") + ticks
    lags: dict[tuple[tuple[str, str], ...], float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, proc.tail()
        samples = scrape(port)
        lags = samples.get("latch_consumer_lag_records", {})
        applied = total(samples, "latch_records_processed_total")
        if applied >= records and len(lags) == 3 and not any(lags.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"lag never 0 in {timeout}s: {lags}")


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=3,
                    worker__engine=request.param) as made:
        yield made


def offline(envelopes: list[dict[str, object]]) -> Counter[tuple[str, str, str]]:
    """What the core decides for the envelopes: outcomes by (provider, state, reason)."""
    found: Counter[tuple[str, str, str]] = Counter()
    assembler = Assembler()
    for envelope in envelopes:
        for emit in assembler.feed_record(None, orjson.dumps(envelope)):
            value = emit.value
            if emit.topic.value == "committed":
                found[(value["provider"], "committed", "")] += 1
            elif emit.topic.value == "errors":
                found[(value["provider"], value["state"], value["reason"])] += 1
    return found


def test_metrics_readiness_and_traces_on_the_real_broker(stack: Stack, tmp_path: Path) -> None:
    """The demo's runs through a worker (of each engine): its /metrics hold one invalid_json,
    six committed calls and every outcome the offline core decides, one undecodable dead
    letter, one commit latency per committed call, one argument size per checked call, the
    open run in latch_runs_open, no lag (records, seconds) once the worker caught up; the
    committed records, and every other output of the runs, carry the publisher's trace id.
    A second worker that takes over after the first stops is not ready while it rebuilds
    (each rebuild made to last half a second), nor until it has rebuilt its partitions (the
    open run's records re-read); it logs one JSON object per line, each rebuild with its
    partition and offset, the Kafka clients' lines among them."""
    provider = TracerProvider()
    demo = load_envelopes(example_file(), "ops/")
    held = [{"v": 1, "run_id": "ops/held", "seq": 0, "type": "run.start",
             "provider": "openai.chat", "tools": []}]
    port = broker.free_ports()
    first = start_worker(stack, tmp_path / "first.log", port)
    try:
        assert readiness(port, first)[-1]["member"] is True
        gateway = provider.get_tracer("gateway")
        with gateway.start_as_current_span("gateway") as span, Publisher(stack.config()) as pub:
            for envelope in [*held, *demo]:
                # a cancel straight into the events topic, where the control agent would
                # forward it: in the file's order, so the outcome is the offline one
                pub.send_raw(str(envelope["run_id"]), orjson.dumps(envelope))
            pub.send_raw("ops/poison", b"{not json")  # one dead letter, undecodable
        trace_id = f"{span.get_span_context().trace_id:032x}"
        runs = sorted({str(e["run_id"]) for e in demo})
        reader = Reader(stack)
        records = reader.collect(finished(runs), timeout=90)
        reader.close()
        committed = [r for r in records if r.role == "committed"]
        assert len(committed) == 6
        outputs = [r for r in records if r.role in ("committed", "errors", "final")]
        assert len(outputs) == 6 + 3 + len(runs)
        for record in outputs:  # every output of a run, the committed calls' first
            traceparent = dict(record.headers)["traceparent"].decode()
            assert traceparent.split("-")[1] == trace_id

        samples = scrape(port)
        assert total(samples, "tool_assemble_invalid_json_total") == 1
        assert total(samples, "tool_assemble_overflow_total") == 0
        outcomes = Counter({(dict(k)["provider"], dict(k)["state"], dict(k)["reason"]): v
                            for k, v in samples["latch_call_outcomes_total"].items()})
        assert outcomes == offline([*held, *demo])
        assert total(samples, "latch_call_outcomes_total", state="committed") == 6
        assert total(samples, "latch_runs_finished_total") == len(runs)
        assert total(samples, "tool_assemble_args_bytes_count") == 7
        assert total(samples, "tool_assemble_to_commit_seconds_count") == 6
        assert total(samples, "latch_records_processed_total") >= len(demo) + 1
        assert total(samples, "latch_runs_open") == 1  # ops/held
        assert total(samples, "latch_buffered_bytes_budget") > 0
        assert total(samples, "latch_send_failures_total") == 0
        assert total(samples, "latch_rebuild_seconds_count") == 3  # one takeover each
        # the lag gauges may still be unknown (the kafka engine reads them once a second)
        caught_up(port, first)  # a lag of 0 records on each of the 3 partitions
        samples = scrape(port)  # everything applied, the poison record too
        assert len(samples["latch_consumer_lag_seconds"]) == 3
        assert samples["latch_dlq_records_total"][(("reason", "undecodable"),)] == 1
        assert total(samples, "latch_dlq_records_total") == 1
        assert total(samples, "latch_consumer_lag_seconds") == 0
    finally:
        assert first.stop() == 0, first.tail()

    second = start_worker(stack, tmp_path / "second.log", port, log_format="json",
                          prelude=SLOW_REBUILD)
    try:
        answers = readiness(port, second)
        assert answers[0]["http"] == 503
        # seen during a rebuild, as a member of the group: not ready
        assert [a for a in answers if a["http"] == 503 and a["member"] and a["rebuilding"]]
        assert answers[-1]["owned"] == [0, 1, 2] and answers[-1]["rebuilding"] == 0
        samples = scrape(port)
        assert total(samples, "latch_rebuild_seconds_count") == 3
        assert total(samples, "latch_rebuild_records_total") >= 1  # the held run's start
        assert total(samples, "latch_runs_open") == 1
        health = http_get(port, "/healthz")
        assert health is not None and health[0] == 200
    finally:
        assert second.stop() == 0, second.tail()
    assert first.problems() == []
    lines = json_lines(second)
    assert not [e for e in lines if e["level"] in ("error", "critical")]
    rebuilt = [e for e in lines if str(e["message"]).startswith("partition ")
               and "rebuilt before offset" in str(e["message"])]
    assert {e.get("partition") for e in rebuilt} == {0, 1, 2}, rebuilt
    assert all(isinstance(e.get("offset"), int) and e.get("topic") == stack.topic("events")
               for e in rebuilt), rebuilt
    if stack.engine == "faust":  # aiokafka's own lines (its coordinator's), as JSON too
        assert any(str(e["logger"]).startswith("aiokafka.") for e in lines)
    # (librdkafka's lines, when it has any, go to the latch.kafka logger: every line above
    # is JSON, and test_hooks checks the kafka engine's clients log there)
