"""Every decision audited, on the real broker, for each engine: the audit topic holds one
record per call outcome (committed, failed, cancelled, idle), with the outcome's ids, the
events record that decided it (a record of that run, at that partition and offset), the run's
trace id, and never argument text; with the kafka engine, read at read_committed, exactly
once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    finished,
    make_stack,
    partition_of,
    provider_run,
    publish_envelopes,
    running_worker,
)

SECRET = "sk-live-51HxAUDITsecretDoNotLeak9999"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=str(request.param),
                    agent_stream_assemble__assemble_idle_timeout_s="3") as made:
        yield made


def events_record(stack: Stack, partition: int, offset: int) -> tuple[bytes, dict[str, object]]:
    """The key and value of the events record at ``partition``/``offset``."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(stack.topic("events"), partition, offset)])
    try:
        for _ in range(20):
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                assert msg.offset() == offset
                return msg.key(), orjson.loads(msg.value())
        raise AssertionError(f"no events record at {partition}@{offset}")
    finally:
        consumer.close()


def test_one_audit_record_per_call_outcome(stack: Stack, tmp_path: Path) -> None:
    """Four runs (a committed and an invalid call, traced by its run.start's traceparent; a
    committed call whose argument holds a secret; a run cancelled through the control topic;
    a run left idle until a tick expires it) give one audit record per committed call and
    error result, with its idempotency key, tool call id, name, outcome and reason; its
    source is the events record that decided it, in the run's partition (a record of the run,
    or the tick that expired the idle one); its size is that of the committed record's
    arguments (no audit key: no digest); the traced run's records carry its trace id;
    the secret is nowhere in the audit topic; the kafka engine writes no duplicate."""
    with running_worker(stack, tmp_path / "worker.log"):
        traced = provider_run("openai.chat", "au-traced", [
            ("call_ok", "read_file", '{"path": "/srv/a"}'),
            ("call_bad", "read_file", '{"path": ')])
        producer = Producer({"bootstrap.servers": stack.bootstrap,
                             "partitioner": "murmur2_random"})
        for n, envelope in enumerate(traced):
            producer.produce(stack.topic("events"), key=b"au-traced",
                             value=orjson.dumps(envelope),
                             headers=[("traceparent", TRACEPARENT)] if n == 0 else None)
        assert producer.flush(30) == 0
        publish_envelopes(stack.bootstrap, stack.topic("events"), [
            *provider_run("anthropic.messages", "au-secret",
                          [("toolu_1", "read_file", f'{{"path": "/srv/{SECRET}"}}')]),
            *provider_run("openai.responses", "au-cancel",
                          [("fc_1", "read_file", '{"path": "/srv/c"}')], end=False)[:3],
            *provider_run("openai.chat", "au-idle",
                          [("call_idle", "read_file", '{"path": "/srv/i"}')], end=False)[:3]])
        publish_envelopes(stack.bootstrap, stack.topic("control"), [
            {"v": 1, "run_id": "au-cancel", "type": "cancel", "reason": "user_stop"}])
        runs = ["au-traced", "au-secret", "au-cancel", "au-idle"]
        reader = Reader(stack, roles=("committed", "errors", "final", "audit"))
        reader.collect(lambda records: finished(runs)(records) and len(
            [r for r in records if r.role == "audit"]) >= len(
            [r for r in records if r.role in ("committed", "errors")]), timeout=90)
        reader.close()

    outcomes = {r.value["idempotency_key"]: r.value
                for r in reader.records if r.role in ("committed", "errors")}
    audits = [r for r in reader.records if r.role == "audit"]
    keys = Counter(a.value["idempotency_key"] for a in audits)
    assert set(keys) == set(outcomes)
    if stack.engine == "kafka":
        assert max(keys.values()) == 1, f"duplicates at read_committed: {keys}"
    assert {(a.value["run_id"], a.value["outcome"], a.value["reason"]) for a in audits} == {
        ("au-traced", "committed", None), ("au-traced", "error", "invalid_json"),
        ("au-secret", "committed", None), ("au-cancel", "error", "cancelled"),
        ("au-idle", "error", "assemble_idle_timeout")}
    for audit in audits:
        value = audit.value
        outcome = outcomes[value["idempotency_key"]]
        assert audit.key == value["run_id"].encode()
        assert value["tool_call_id"] == outcome.get("call_id", outcome.get("tool_call_id"))
        assert value["name"] == outcome["name"] == "read_file"
        assert value["policy"] == {"mode": "off"}
        source = value["source"]
        assert source["topic"] == stack.topic("events")
        assert source["partition"] == partition_of(value["run_id"], stack.partitions)
        key, _ = events_record(stack, source["partition"], source["offset"])
        # the run's own record, or, for the idle run, the tick that expired it
        assert key == (b"__latch_tick__" if value["run_id"] == "au-idle"
                       else value["run_id"].encode())
        if value["outcome"] == "committed":
            data = orjson.dumps(outcome["arguments"])
            assert value["arguments"] == {"bytes": len(data)}  # no audit key: size only
        assert value["trace_id"] == (TRACE_ID if value["run_id"] == "au-traced" else None)
    assert SECRET.encode() not in b"".join(orjson.dumps(a.value) for a in audits)
