"""A cancel that reaches the events log before its run's ``run.start`` still cancels the run
when the worker that read it is killed before the run starts (issue 9, item 7), on both
engines.

The core remembers such a cancel, but a new owner of the partition rebuilds only what the
run heads point at. Before the fix no head covered the cancel's offset: the new worker never
read it, and the run committed the calls the user had stopped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    WorkerProcess,
    finished,
    make_stack,
    provider_run,
    publish,
    publish_envelopes,
)

PARTITIONS = 1


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """The test runs against both engines (``worker.engine``): the heads are shared logic."""
    return str(request.param)


@pytest.fixture
def stack(kafka_bootstrap: str, engine: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    # A long idle timeout: nothing of the run may end for another reason than the cancel.
    with make_stack(kafka_bootstrap, request.node.name, partitions=PARTITIONS,
                    worker__engine=engine,
                    agent_stream_assemble__assemble_idle_timeout_s="300") as made:
        yield made


def _forwarded_offset(stack: Stack, run_id: str, timeout: float = 60) -> int:
    """The offset of the cancel the worker forwarded into the events topic (read_committed:
    the kafka engine forwards it in a transaction)."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(stack.topic("events"), 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is None and msg.key() == run_id.encode():
                    return int(msg.offset())
        raise AssertionError(f"the cancel of {run_id} was not forwarded in {timeout}s")
    finally:
        consumer.close()


def _wait_committed_past(stack: Stack, offset: int, timeout: float = 60) -> None:
    """Wait until the worker group's committed events offset is past ``offset``: the record
    there was applied (and its heads written) before the worker goes."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": stack.app_id,
                         "enable.auto.commit": False})
    try:
        tp = TopicPartition(stack.topic("events"), 0)
        deadline = time.monotonic() + timeout
        committed = -1
        while time.monotonic() < deadline:
            committed = consumer.committed([tp], timeout=10)[0].offset
            if committed > offset:
                return
            time.sleep(0.2)
        raise AssertionError(f"committed {committed}, wanted past {offset}")
    finally:
        consumer.close()


def test_a_cancel_before_its_run_start_survives_a_killed_worker(stack: Stack,
                                                                tmp_path: Path) -> None:
    """A cancel for run R goes to the control topic before anything of R; the worker forwards
    it into the events log and applies it (the group commits past it), and is then killed
    with SIGKILL. A second worker takes the partition over; only then are R's ``run.start``
    and whole stream published. R ends ``cancelled`` as it starts: no call of it is opened or
    committed, and the rest of its stream, arriving after its end, goes nowhere (not even
    the DLQ)."""
    run_id = "early-cancel-r"
    first = WorkerProcess(stack, tmp_path / "first.log")
    second = None
    try:
        first.wait_ready()
        cancel = {"v": 1, "run_id": run_id, "type": "cancel", "reason": "user_stop"}
        publish(stack.bootstrap, stack.topic("control"),
                [(run_id.encode(), orjson.dumps(cancel))])
        _wait_committed_past(stack, _forwarded_offset(stack, run_id))
        first.kill()

        second = WorkerProcess(stack, tmp_path / "second.log")
        second.wait_ready()
        second.wait_for(r"partition 0: rebuilt")
        calls = [(f"call_{run_id}", "read_file", '{"path": "/stopped"}')]
        publish_envelopes(stack.bootstrap, stack.topic("events"),
                          provider_run("anthropic.messages", run_id, calls))

        reader = Reader(stack)
        reader.collect(finished([run_id]), timeout=60)
        final = reader.finals()[run_id]
        assert final["status"] == "cancelled", final
        assert final["outcomes"] == []  # ended at its run.start: no call ever opened
        assert not [r for r in reader.of("committed") if r.value["run_id"] == run_id]
        assert not [r for r in reader.of("dlq") if r.value.get("run_id") == run_id]
        reader.close()
        assert second.stop() == 0, second.tail()
        assert second.problems() == []
    finally:
        for proc in (first, second):
            if proc is not None and proc.proc.poll() is None:
                proc.kill()
