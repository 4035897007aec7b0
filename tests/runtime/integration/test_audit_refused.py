"""The audit topic tells no untruth and no secret, on the real broker, with either engine
(issue 32, item 10).

A committed call its topic refuses (over ``max.message.bytes``: at the worker's check before
the send, or by the broker after the limit was lowered while the worker ran) becomes an
``output_refused`` DLQ record; its audit record says ``refused`` (reason ``output_refused``,
what it was, Kafka's error), not ``committed``. The worker runs with an audit key read from a
variable (``audit.keys``): every audit record's digest is an HMAC under it, named by its id,
and there is no unkeyed hash. Who sends what here: the gateway the events (this test), the
broker the refusal, the operator the key (the worker's environment).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from test_output_refusals import SMALL, _limit, _runs
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    WorkerProcess,
    finished,
    make_stack,
    publish_envelopes,
)

KEY = "integration-audit-key-0123456789abcdef"


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, audit__key_id="it-1",
                    audit__keys='{"it-1": "env:LATCH_IT_AUDIT_KEY"}',
                    it_audit_key=KEY) as made:
        yield made


def _lowered(stack: Stack, role: str, max_bytes: int, timeout: float = 30.0) -> None:
    """Wait until the broker describes ``role``'s topic with the lowered limit."""
    client = AdminClient({"bootstrap.servers": stack.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, stack.topic(role))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = client.describe_configs([resource])[resource].result(timeout=10)
        if entries["max.message.bytes"].value == str(max_bytes):
            return
        time.sleep(0.1)
    raise AssertionError(f"{stack.topic(role)}: max.message.bytes is not {max_bytes}")


def _check(stack: Stack, worker: WorkerProcess) -> None:
    """The oversize run's committed call: an output_refused DLQ record and an audit record
    saying ``refused``; the small run's: committed, audited ``committed`` with the HMAC of its
    arguments under the key; one audit record per outcome (the kafka engine: exactly one, at
    read_committed, also across the aborted transaction); the key in no record."""
    big, small = _runs()
    publish_envelopes(stack.bootstrap, stack.topic("events"), big + small)
    reader = Reader(stack, roles=("committed", "errors", "final", "dlq", "audit"))
    try:
        reader.collect(lambda records: finished(["big", "small"])(records) and len(
            [r for r in records if r.role == "audit"]) >= 2, timeout=90)
    finally:
        reader.close()
    assert [r.value["reason"] for r in reader.of("dlq")] == ["output_refused"]
    [committed] = [r.value for r in reader.of("committed")]
    audits = {r.value["run_id"]: r.value for r in reader.of("audit")}
    keys = Counter(r.value["idempotency_key"] for r in reader.of("audit"))
    assert set(audits) == {"big", "small"}
    if stack.engine == "kafka":
        assert max(keys.values()) == 1, keys
    refused = audits["big"]
    assert (refused["outcome"], refused["reason"]) == ("refused", "output_refused")
    assert refused["refused"] == {"outcome": "committed", "reason": None,
                                  "error": "MSG_SIZE_TOO_LARGE"}
    assert refused["idempotency_key"] == "big:call_big"
    assert refused["arguments"]["key_id"] == "it-1" and refused["arguments"]["bytes"] > SMALL
    ok = audits["small"]
    data = orjson.dumps(committed["arguments"])
    assert (ok["outcome"], ok["reason"]) == ("committed", None)
    assert ok["arguments"] == {"bytes": len(data), "key_id": "it-1",
                               "hmac": hmac.new(KEY.encode(), data, hashlib.sha256).hexdigest()}
    everything = b"".join(orjson.dumps(r.value) for r in reader.records)
    assert KEY.encode() not in everything and b"sha256" not in everything
    assert hashlib.sha256(data).hexdigest().encode() not in everything
    assert worker.proc.poll() is None, worker.tail()
    assert KEY not in worker.log(), "the audit key is in the worker's log"
    assert worker.stop() == 0, worker.tail()


def test_an_outcome_refused_before_the_send_is_audited_refused(
        stack: Stack, tmp_path: Path) -> None:
    """The committed topic takes 20,000 bytes when the worker starts: the oversize committed
    call is checked before it is sent; its audit record says ``refused``."""
    _limit(stack, "committed", SMALL)
    worker = WorkerProcess(stack, tmp_path / "w.log")
    try:
        worker.wait_ready()
        _check(stack, worker)
    finally:
        worker.kill()


def test_an_outcome_the_broker_refuses_is_audited_refused(stack: Stack, tmp_path: Path) -> None:
    """The committed topic's limit is lowered while the worker runs: the broker refuses the
    committed call (faust: at the send's future, after which the audit record is sent; kafka:
    the transaction aborts and, applied again, the call is refused before its audit record);
    its audit record says ``refused``."""
    worker = WorkerProcess(stack, tmp_path / "w.log")
    try:
        worker.wait_ready()
        _limit(stack, "committed", SMALL)
        _lowered(stack, "committed", SMALL)
        _check(stack, worker)
    finally:
        worker.kill()
