"""The kafka engine's recovery from what failed its every-kind chaos run (docs/chaos.md): a
cancel the broker acknowledged must end its run ``cancelled``, forwarded into the events log
exactly once, even when

* the transactional producer wedges in ``send_offsets_to_transaction`` with the forwarded
  cancel in its open transaction (librdkafka can wait there without bound:
  confluentinc/librdkafka#5456; after a broker restart every chaos worker did), and
* the cancel's control partition stands still longer than the idle timeout (its owner
  killed, no worker for a while) and is then taken over: the new owner must forward the
  cancel before its first tick, which would otherwise expire the run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from worker_harness import (
    Reader,
    Stack,
    WorkerProcess,
    finished,
    make_stack,
    provider_run,
    publish,
    publish_envelopes,
)

from worker.runtime.kafka_engine import reader

IDLE_TIMEOUT_S = 6
#: Control records ahead of the stalled cancel: more than ``worker.batch_max_records``.
BACKLOG = 3000

#: Run first in the worker: the first ``send_offsets_to_transaction`` that carries a control
#: offset (the batch that forwarded the cancel) never returns, as librdkafka's did.
WEDGE_ONCE = """
import threading
import confluent_kafka
from worker.runtime.kafka_engine import engine as kafka_engine

class WedgeOnce(confluent_kafka.Producer):
    wedged = False

    def send_offsets_to_transaction(self, positions, metadata, timeout=None):
        if not WedgeOnce.wedged and any(tp.topic.endswith(".control") for tp in positions):
            WedgeOnce.wedged = True
            print("test: send_offsets_to_transaction wedged", flush=True)
            threading.Event().wait()
        return super().send_offsets_to_transaction(positions, metadata, timeout)

kafka_engine.Producer = WedgeOnce
"""


def _stack(bootstrap: str, request: pytest.FixtureRequest, **settings: str
           ) -> contextlib.AbstractContextManager[Stack]:
    """One partition, a kafka-engine worker slot of a stable instance id (a successor fences
    its predecessor at once), a short idle timeout."""
    return make_stack(bootstrap, request.node.name, partitions=1, worker__engine="kafka",
                      worker__transaction_timeout_s="5", worker__instance_id="slot-0",
                      agent_stream_assemble__assemble_idle_timeout_s=str(IDLE_TIMEOUT_S),
                      **settings)


@pytest.fixture
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with _stack(kafka_bootstrap, request) as made:
        yield made


@pytest.fixture
def fast_ticks(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """Ticks every 0.2 s: one falls due while the first control records are forwarded."""
    with _stack(kafka_bootstrap, request, worker__tick_interval_s="0.2") as made:
        yield made


def _cut_run(stack: Stack, run_id: str) -> bytes:
    """Publish the first envelopes of a run (half a tool call, no end); return its cancel."""
    calls = [(f"call_{run_id}", "read_file", '{"path": "/stopped"}')]
    publish_envelopes(stack.bootstrap, stack.topic("events"),
                      provider_run("anthropic.messages", run_id, calls)[:4])
    return orjson.dumps({"v": 1, "run_id": run_id, "type": "cancel", "reason": "user_stop"})


def _wait_committed(stack: Stack, role: str, offset: int, timeout: float = 30) -> None:
    """Wait until the workers' group has committed ``offset`` of the role's partition 0."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": stack.app_id,
                         "isolation.level": "read_committed"})
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            [tp] = consumer.committed([TopicPartition(stack.topic(role), 0)], timeout=10)
            if tp.offset >= offset:
                return
            time.sleep(0.2)
        raise AssertionError(f"{role}[0] not committed to {offset} in {timeout}s")
    finally:
        consumer.close()


def _until_idle_timeout_passed(stack: Stack, run_id: str) -> None:
    """Return once the wall clock is ``IDLE_TIMEOUT_S`` past the record time of the run's last
    event. This wait is inherent: a worker's tick carries its own clock, and nothing but time
    brings it past the idle timeout with no worker running (a tick the test wrote itself would
    expire the run ahead of the cancel whatever the worker does). Any worker started after this
    writes its first tick past the idle timeout."""
    last_ms = max(msg.timestamp()[1] for msg in reader.read(
        {"bootstrap.servers": stack.bootstrap}, stack.topic("events"), 0)
        if msg.key() == run_id.encode())
    time.sleep(max(0.0, last_ms / 1000 + IDLE_TIMEOUT_S - time.time()))


def _assert_cancelled_once(stack: Stack, run_id: str) -> None:
    """The run's final says ``cancelled``, its one call has one error result ``cancelled``,
    and the events log holds its cancel marker once at read_committed."""
    out = Reader(stack)
    try:
        out.collect(finished([run_id]), timeout=90)
        assert out.finals()[run_id]["status"] == "cancelled"
        errors = [r.value for r in out.of("errors") if r.value["run_id"] == run_id]
        assert [(e["state"], e["reason"]) for e in errors] == [("cancelled", "cancelled")]
    finally:
        out.close()
    markers = [msg for msg in reader.read({"bootstrap.servers": stack.bootstrap},
                                          stack.topic("events"), 0)
               if msg.key() == run_id.encode() and b'"type":"cancel"' in (msg.value() or b"")]
    assert len(markers) == 1


def test_a_cancel_in_a_wedged_transaction_is_forwarded_once(stack: Stack,
                                                           tmp_path: Path) -> None:
    """The worker forwards a cancel and its commit wedges in ``send_offsets_to_transaction``.
    It replaces the producer (same ``transactional.id``: the wedged one is fenced, its
    transaction with the forwarded cancel aborted), rebuilds from the committed offsets and
    forwards the cancel again: the run ends ``cancelled`` and read_committed readers see the
    cancel once. (Before: the worker blocked for good and the run never ended.)"""
    worker = WorkerProcess(stack, tmp_path / "w.log", prelude=WEDGE_ONCE)
    try:
        worker.wait_ready()
        run_id = "wedge-1"
        cancel = _cut_run(stack, run_id)
        publish(stack.bootstrap, stack.topic("control"), [(run_id.encode(), cancel)])
        worker.wait_for("send_offsets_to_transaction wedged")
        _assert_cancelled_once(stack, run_id)
        assert "replacing the wedged transactional producer" in worker.log()
        assert worker.stop() == 0
        assert worker.problems() == []
    finally:
        if worker.proc.poll() is None:
            worker.kill()


def test_a_cancel_that_waited_past_the_idle_timeout_is_forwarded_before_the_first_tick(
        fast_ticks: Stack, tmp_path: Path) -> None:
    """A run is cut; the worker that owns its partitions is killed with SIGKILL; the cancel is
    acknowledged behind 3,000 other control records, and no worker runs until the idle
    timeout has passed since the run's last event. The worker that then takes the partitions
    over forwards the whole control backlog before it writes its first tick: the run ends
    ``cancelled``, not ``idle_timeout``. (Before: the first tick went out after the first
    batch of control records, ahead of the cancel.)"""
    first = WorkerProcess(fast_ticks, tmp_path / "a.log")
    second = None
    try:
        first.wait_ready()
        run_id = "stall-1"
        cancel = _cut_run(fast_ticks, run_id)
        _wait_committed(fast_ticks, "events", 4)  # the run is open in the first worker
        first.kill()
        # Other control records first (poison: to the DLQ), more than one batch of records:
        # the cancel is not among the first records the next owner consumes.
        backlog = [(b"poison-%d" % n, b"not an envelope") for n in range(BACKLOG)]
        publish(fast_ticks.bootstrap, fast_ticks.topic("control"),
                [*backlog, (run_id.encode(), cancel)])
        _until_idle_timeout_passed(fast_ticks, run_id)
        second = WorkerProcess(fast_ticks, tmp_path / "b.log")
        second.wait_ready()
        _assert_cancelled_once(fast_ticks, run_id)
        assert second.stop() == 0
        assert second.problems() == []
    finally:
        for proc in (first, second):
            if proc is not None and proc.proc.poll() is None:
                proc.kill()
