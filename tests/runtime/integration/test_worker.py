"""The worker on the real broker: one worker process per test, runs of every provider in,
committed calls, error results, final messages and DLQ records out."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from worker_harness import (
    ENGINES,
    PROVIDERS,
    Reader,
    Stack,
    WorkerProcess,
    assert_same_outcomes,
    expected,
    finished,
    make_stack,
    provider_run,
    publish,
    publish_envelopes,
    run_ids,
    running_worker,
)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Each test runs against both engines (``worker.engine``)."""
    return str(request.param)


@pytest.fixture
def stack(kafka_bootstrap: str, engine: str, request: pytest.FixtureRequest
          ) -> Iterator[Stack]:
    settings = getattr(request, "param", {}) | {"worker__engine": engine}
    with make_stack(kafka_bootstrap, request.node.name, partitions=3, **settings) as made:
        yield made


@pytest.fixture
def worker(stack: Stack, tmp_path: Path) -> Iterator[WorkerProcess]:
    with running_worker(stack, tmp_path / "worker.log") as proc:
        yield proc


def test_end_to_end_each_provider(stack: Stack, worker: WorkerProcess) -> None:
    """Runs of all three providers, spread over every partition, come out exactly as the
    offline core decides: valid calls committed in index order, an invalid one as an error
    result, one final message per run, all keyed by run_id."""
    ids = run_ids("e2e", stack.partitions, per_partition=2)
    envelopes = []
    for n, run_id in enumerate(ids):
        provider = PROVIDERS[n % len(PROVIDERS)]
        calls = [(f"call_{run_id}_a", "read_file", '{"path": "/etc/hosts"}'),
                 (f"call_{run_id}_b", "read_file", '{"path": 7}'),
                 (f"call_{run_id}_c", "read_file", '{"path": "/tmp/\\u00e9t\\u00e9"}')]
        envelopes += provider_run(provider, run_id, calls, size=5)
    publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)

    reader = Reader(stack)
    reader.collect(finished(ids))
    wanted = expected(envelopes, stack.config())
    assert_same_outcomes(reader, wanted)
    assert len({r.value["run_id"] for r in reader.of("committed")}) == len(ids)
    assert {r.value["reason"] for r in reader.of("errors")} == {"schema_invalid"}
    assert all(r.key == r.value["run_id"].encode() for r in reader.records)
    assert reader.of("dlq") == []


def test_cancel_through_the_control_topic(stack: Stack, worker: WorkerProcess) -> None:
    """A cancel on the control topic reaches its run through the events partition: the open
    calls are cancelled, the run ends ``cancelled``, later events are ignored; a control record
    that is not a cancel goes to the DLQ with its original bytes."""
    run_id, done_id = run_ids("cancel", stack.partitions, per_partition=1)[:2]
    calls = [(f"call_{run_id}", "read_file", '{"path": "/secret"}')]
    head = provider_run("anthropic.messages", run_id, calls)[:4]
    publish_envelopes(stack.bootstrap, stack.topic("events"), head)
    done = provider_run("openai.chat", done_id, calls)
    publish_envelopes(stack.bootstrap, stack.topic("events"), done)
    reader = Reader(stack)
    reader.collect(finished([done_id]))

    bad_control = b'{"v": 1, "run_id": "%s", "type": "pause"}' % run_id.encode()
    publish(stack.bootstrap, stack.topic("control"), [
        (run_id.encode(), orjson.dumps({"v": 1, "run_id": run_id, "type": "cancel",
                                        "reason": "user_stop"})),
        (run_id.encode(), bad_control),
        # a cancel for a finished run changes nothing
        (done_id.encode(), orjson.dumps({"v": 1, "run_id": done_id, "type": "cancel"}))])
    reader.collect(lambda records: finished([run_id])(records) and len(reader.of("dlq")) >= 1)
    tail = provider_run("anthropic.messages", run_id, calls)[4:]
    publish_envelopes(stack.bootstrap, stack.topic("events"), tail)

    final = reader.finals()[run_id]
    assert final["status"] == "cancelled"
    [error] = [r.value for r in reader.of("errors") if r.value["run_id"] == run_id]
    assert (error["state"], error["reason"]) == ("cancelled", "cancelled")
    assert "/secret" not in orjson.dumps(error).decode()
    [dlq] = reader.of("dlq")
    assert dlq.value["reason"] == "invalid_envelope"
    assert base64.b64decode(dlq.value["original_b64"]) == bad_control
    assert dlq.key == run_id.encode()
    assert reader.finals()[done_id]["status"] == "completed"
    assert not [r for r in reader.of("committed") if r.value["run_id"] == run_id]


@pytest.mark.parametrize("stack", [{"agent_stream_assemble__assemble_idle_timeout_s": "2"}],
                         indirect=True)
def test_idle_timeout_driven_by_ticks(stack: Stack, worker: WorkerProcess) -> None:
    """A run that stops receiving events fails its open calls ``assemble_idle_timeout`` once
    a tick (written every second into each owned partition) is 2 s past its last event."""
    ids = run_ids("idle", stack.partitions, per_partition=1)
    calls = [("call_idle", "read_file", '{"path": "/a"}')]
    envelopes = [e for run_id in ids
                 for e in provider_run("openai.responses", run_id, calls)[:3]]
    publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)

    reader = Reader(stack)
    reader.collect(finished(ids), timeout=30)
    for run_id in ids:
        assert reader.finals()[run_id]["status"] == "idle_timeout"
    reasons = {(r.value["run_id"], r.value["reason"]) for r in reader.of("errors")}
    assert reasons == {(run_id, "assemble_idle_timeout") for run_id in ids}


def test_poison_records_go_to_the_dlq(stack: Stack, worker: WorkerProcess) -> None:
    """Garbage bytes, a wrong key, a missing key, a non-object, an unknown provider and an
    event for an unknown run each become one DLQ record with the original bytes and a reason,
    while the good runs around them complete."""
    good = run_ids("good", stack.partitions, per_partition=1)
    calls = [("call_ok", "read_file", '{"path": "/ok"}')]
    runs = [provider_run(p, r, calls) for p, r in zip(PROVIDERS, good, strict=False)]
    wrong_key = orjson.dumps(runs[0][1])
    poison: list[tuple[bytes | None, bytes]] = [
        (b"junk", b"\xff\xfe not json"),
        (b"someone-else", wrong_key),
        (None, orjson.dumps({"v": 1, "run_id": "nokey", "seq": 0, "type": "stream.end"})),
        (b"list", b"[1, 2, 3]"),
        (b"odd", orjson.dumps({"v": 1, "run_id": "odd", "seq": 0, "type": "run.start",
                               "provider": "cohere.chat", "tools": []})),
        (b"ghost", orjson.dumps({"v": 1, "run_id": "ghost", "seq": 3, "type": "stream.end"})),
    ]
    records: list[tuple[bytes | None, bytes]] = []
    for n in range(max(len(r) for r in runs)):
        records += [(run[n]["run_id"].encode(), orjson.dumps(run[n])) for run in runs
                    if n < len(run)]
        if n < len(poison):
            records.append(poison[n])
    publish(stack.bootstrap, stack.topic("events"), records)

    reader = Reader(stack)
    reader.collect(lambda rs: finished(good)(rs) and len(reader.of("dlq")) >= len(poison))
    assert_same_outcomes(reader, expected([e for run in runs for e in run], stack.config()))
    dlq = {base64.b64decode(r.value["original_b64"]): r for r in reader.of("dlq")}
    assert set(dlq) == {value for _, value in poison}
    reasons = {value: dlq[value].value["reason"] for _, value in poison}
    assert list(reasons.values()) == ["undecodable", "key_mismatch", "key_mismatch",
                                      "invalid_envelope", "unknown_provider", "unknown_run"]
    assert {value: dlq[value].key for _, value in poison} == dict(
        (value, key) for key, value in poison)
    for record in dlq.values():
        assert record.value["source"]["topic"] == stack.topic("events")


def test_a_large_poison_record_reaches_the_dlq(stack: Stack, worker: WorkerProcess) -> None:
    """A 900 KiB undecodable record becomes a DLQ record of about 1.2 MiB (its bytes in
    base64), over Kafka's default 1 MiB limit: the output topics and the worker's producer
    take larger records, so it is delivered and the partition moves on."""
    garbage = b"\xff" + b"x" * (900 * 1024)
    run_id = run_ids("after", stack.partitions)[0]
    calls = [("call_after", "read_file", '{"path": "/a"}')]
    publish(stack.bootstrap, stack.topic("events"), [(run_id.encode(), garbage)])
    publish_envelopes(stack.bootstrap, stack.topic("events"),
                      provider_run("openai.chat", run_id, calls))
    reader = Reader(stack)
    reader.collect(lambda rs: finished([run_id])(rs) and len(reader.of("dlq")) == 1)
    [dlq] = reader.of("dlq")
    assert dlq.value["reason"] == "undecodable"
    assert base64.b64decode(dlq.value["original_b64"]) == garbage
    assert len(orjson.dumps(dlq.value)) > 1024 * 1024
    assert reader.finals()[run_id]["status"] == "completed"


FAILING_SENDS = """
import worker.runtime.faust_engine.sends
async def publish(self, state, key, emits, record_ms=None, source=None):
    if emits:
        raise ConnectionError("injected: the broker refused the send")
worker.runtime.faust_engine.sends.Sends.publish = publish
"""


@pytest.mark.parametrize("engine", ["faust"])  # the fault is injected into the faust engine
@pytest.mark.parametrize("stack", [{"worker__tick_interval_s": "3600"}], indirect=True)
def test_a_failed_send_stops_the_worker_with_the_record_unacked(
        stack: Stack, tmp_path: Path) -> None:
    """When the outputs of a record cannot be sent, the worker exits non-zero without
    committing that record's offset, so the next worker processes it again (at least once)."""
    proc = WorkerProcess(stack, tmp_path / "worker.log", prelude=FAILING_SENDS)
    try:
        proc.wait_ready()
        publish(stack.bootstrap, stack.topic("events"), [(b"bad", b"not json")])
        assert proc.proc.wait(30) != 0
    finally:
        if proc.proc.poll() is None:
            proc.kill()
    assert "cannot process" in proc.log()
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": stack.app_id})
    try:
        tps = [TopicPartition(stack.topic("events"), p) for p in range(stack.partitions)]
        assert [tp.offset < 0 for tp in consumer.committed(tps, timeout=10)] == [True] * 3
    finally:
        consumer.close()
