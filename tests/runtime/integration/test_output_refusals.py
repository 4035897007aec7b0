"""An output record its topic refuses (larger than the topic's ``max.message.bytes``) becomes
an ``output_refused`` DLQ record, on the real broker, with either engine: the partition goes
on, later runs are decided, and the worker does not exit (issue 23, item 1).

Two ways in: the committed topic's limit is small already when the worker starts (the
record is checked before it is sent), or it is lowered while the worker runs (the broker
refuses the record; the faust engine sees it at the send's future, the kafka engine in the
delivery report of a transaction that then aborts and is applied again).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    WorkerProcess,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
)

#: The committed topic's max.message.bytes: a committed call with ~30 KB of arguments is over.
SMALL = 20_000


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param) as made:
        yield made


def _limit(stack: Stack, role: str, max_bytes: int) -> None:
    client = AdminClient({"bootstrap.servers": stack.bootstrap})
    entry = ConfigEntry("max.message.bytes", str(max_bytes),
                        incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, stack.topic(role),
                              incremental_configs=[entry])
    client.incremental_alter_configs([resource])[resource].result(timeout=30)


def _wait_limit(stack: Stack, role: str, max_bytes: int, timeout: float = 30.0) -> None:
    """Until the broker describes the topic with the limit ``_limit`` set."""
    client = AdminClient({"bootstrap.servers": stack.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, stack.topic(role))
    deadline = time.monotonic() + timeout
    while True:
        entries = client.describe_configs([resource])[resource].result(timeout=30)
        if entries["max.message.bytes"].value == str(max_bytes):
            return
        assert time.monotonic() < deadline, f"max.message.bytes of {role} is still not {max_bytes}"
        time.sleep(0.1)


def _runs() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    path = orjson.dumps({"path": "/" + "a" * 30_000}).decode()
    big = provider_run("openai.chat", "big", [("call_big", "read_file", path)], size=4_000)
    small = provider_run("openai.chat", "small", [("call_small", "read_file",
                                                    '{"path": "/s"}')])
    return big, small


def _check(stack: Stack, worker: WorkerProcess) -> None:
    """Publish a run whose committed call is over the limit, then a normal one: the first
    call's output_refused DLQ record (bounded, naming topic, key, size), the second call
    committed, both runs finished, the worker alive and stopping cleanly."""
    big, small = _runs()
    publish_envelopes(stack.bootstrap, stack.topic("events"), big + small)
    reader = Reader(stack)
    try:
        reader.collect(finished(["big", "small"]), timeout=90)
        committed = [r.value["call_id"] for r in reader.of("committed")]
        assert committed == ["call_small"]
        [dlq] = reader.of("dlq")
        value = dlq.value
        assert value["reason"] == "output_refused"
        assert value["refused"]["topic"] == stack.topic("committed")
        assert value["refused"]["key_b64"] == base64.b64encode(b"big").decode()
        assert value["refused"]["bytes"] > SMALL
        assert value["refused"]["error"] == "MSG_SIZE_TOO_LARGE"
        assert value["original_b64"] == "" and value["run_id"] == "big"
        assert value["source"]["topic"] == stack.topic("events")
        assert dlq.key == b"big"
        text = orjson.dumps(value).decode()
        assert len(text) < 2_000 and "aaaa" not in text  # never the refused value
        assert reader.finals()["big"]["status"] == "completed"
        assert reader.finals()["small"]["status"] == "completed"
    finally:
        reader.close()
    assert worker.proc.poll() is None, worker.tail()
    assert worker.stop() == 0, worker.tail()


def test_an_output_over_its_topics_limit_at_start_goes_to_the_dlq(
        stack: Stack, tmp_path: Path) -> None:
    """The committed topic takes 20,000 bytes when the worker starts: the oversize committed
    call is checked before it is sent and replaced by its output_refused DLQ record."""
    _limit(stack, "committed", SMALL)
    worker = WorkerProcess(stack, tmp_path / "w.log")
    try:
        worker.wait_ready()
        _check(stack, worker)
    finally:
        worker.kill()


def test_an_output_the_broker_refuses_goes_to_the_dlq(stack: Stack, tmp_path: Path) -> None:
    """The committed topic's limit is lowered while the worker runs: the broker refuses the
    oversize committed call; the worker reads the limit again and sends the output_refused
    DLQ record instead of stopping."""
    worker = WorkerProcess(stack, tmp_path / "w.log")
    try:
        worker.wait_ready()
        _limit(stack, "committed", SMALL)
        _wait_limit(stack, "committed", SMALL)  # the broker applies the topic's new setting
        _check(stack, worker)
    finally:
        worker.kill()
