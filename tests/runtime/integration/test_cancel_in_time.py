"""A cancel in time is a cancel, on both engines (issue 33, item 5).

Through Kafka, a cancel that the control topic acknowledged two seconds before its run's
next fragment was produced was sometimes ignored by the faust engine, and the call committed:
the first cancel after the worker reported ready. The tests that existed waited for the
forwarded cancel, so a slow forward passed them; these do not wait for it.

* :func:`test_a_cancel_acknowledged_in_time_cancels_the_call`: a fresh worker, ``/readyz``
  ready, the run's head (its call open), a cancel acknowledged by the control topic, 2 s,
  then the rest of the run: the call is cancelled, never committed.
* :func:`test_ready_only_once_the_control_backlog_is_forwarded`: cancels already in the
  control log when the worker starts are all forwarded (their markers' record times) before
  ``/readyz`` first answers 200.
* :func:`test_ready_when_a_transaction_marker_ends_a_control_partition`: a commit marker
  takes the last offset of each control partition and is never a record: the worker still
  turns ready, its cancels forwarded.
* :func:`test_forwards_within_the_bound`: the time from each cancel's acknowledgement to its
  forwarded marker's record time in the events log stays under the bound the README states
  (``FORWARD_BOUND_S``), with a margin for a loaded machine, from the first cancel after
  ``/readyz`` turns ready on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from builders import CHAT, cancel, split_open_run
from confluent_kafka import Producer
from worker_harness import (
    ENGINES,
    Markers,
    Stack,
    WorkerProcess,
    make_stack,
    produce_acked,
    publish,
    publish_envelopes,
    readiness,
    run_ids,
    run_outputs,
    start_worker,
)

from worker.tools import broker

PARTITIONS = 3
#: How long before the run's next fragment the control topic acknowledged the cancel.
AHEAD_S = 2.0
#: The forward's bound as the README states it (Guarantees), and the margin a loaded test
#: machine gets on top of it.
FORWARD_BOUND_S = 1.0
MARGIN_S = 1.0
WAIT_S = 45.0
#: Cancels in the control log before the worker starts.
BACKLOG = 3000
#: The faust engine's own timings (worker/runtime/faust_engine/settings.py and faust's
#: defaults), not the harness's quick ones: the outside check ran a worker as deployed.
DEPLOYED_FAUST = {"broker_session_timeout": 15, "broker_heartbeat_interval": 3,
                  "broker_rebalance_timeout": 60, "broker_commit_interval": 2.8}


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    # The default tick interval (5 s), as a deployment runs; a long idle timeout: nothing
    # of a run may end for another reason than its cancel.
    with make_stack(kafka_bootstrap, request.node.name, partitions=PARTITIONS,
                    worker__engine=str(request.param), worker__tick_interval_s="5",
                    agent_stream_assemble__assemble_idle_timeout_s="300") as made:
        yield made


@contextlib.contextmanager
def _ready_worker(stack: Stack, tmp_path: Path) -> Iterator[WorkerProcess]:
    """A fresh worker of the stack, its ``/readyz`` just turned 200; killed afterwards."""
    port = broker.free_ports()
    proc = start_worker(stack, tmp_path / "worker.log", port, **DEPLOYED_FAUST)
    try:
        readiness(port, proc)
        yield proc
    finally:
        if proc.proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("backlog", [0, BACKLOG])
def test_a_cancel_acknowledged_in_time_cancels_the_call(
        stack: Stack, tmp_path: Path, backlog: int) -> None:
    """The first cancel after ``/readyz`` turned ready, acknowledged 2 s before the run goes
    on, cancels the open call: one ``cancelled`` error result, no committed call. With
    ``backlog`` cancels of other runs in the control log before the worker started (a
    group new to the topic, or one that was away): before issue 33 the worker said ready
    while it was still forwarding them, and this cancel waited behind them."""
    _publish_backlog(stack, backlog)
    with _ready_worker(stack, tmp_path) as proc:
        _cancel_in_time(stack, proc)


def _cancel_in_time(stack: Stack, proc: WorkerProcess) -> None:
    run_id = "in-time"
    head, rest = split_open_run(CHAT, run_id)
    publish_envelopes(stack.bootstrap, stack.topic("events"), head)
    produce_acked(stack.bootstrap, stack.topic("control"), run_id.encode(),
                  orjson.dumps(cancel(run_id)))
    time.sleep(AHEAD_S)  # the scenario itself: the gateway's next fragment comes 2 s later
    publish_envelopes(stack.bootstrap, stack.topic("events"), rest)

    mine = run_outputs(stack, run_id, WAIT_S)
    assert [r.value["tool_call_id"] for r in mine if r.role == "committed"] == [], \
        proc.tail()
    errors = [(r.value["tool_call_id"], r.value["reason"]) for r in mine if r.role == "errors"]
    assert errors == [("call_1", "cancelled")]
    [final] = [r.value for r in mine if r.role == "final"]
    assert final["status"] == "cancelled", final


def _publish_backlog(stack: Stack, count: int) -> None:
    """``count`` cancels of other runs into the control topic, spread over its partitions."""
    old = run_ids("old", PARTITIONS, count // PARTITIONS)
    publish(stack.bootstrap, stack.topic("control"),
            [(r.encode(), orjson.dumps(cancel(r))) for r in old])


def test_forwards_within_the_bound(stack: Stack, tmp_path: Path) -> None:
    """Cancels one after another, from the moment ``/readyz`` turned ready (with a control
    backlog from before the start), four per control partition: each one's forwarded marker
    is in the events log, its record time within the bound (plus the margin) of the cancel's
    acknowledgement."""
    _publish_backlog(stack, BACKLOG)
    late = []
    with _ready_worker(stack, tmp_path) as proc, contextlib.closing(Markers(stack)) as markers:
        for run_id in run_ids("bound", PARTITIONS, per_partition=4):
            acked = produce_acked(stack.bootstrap, stack.topic("control"), run_id.encode(),
                                  orjson.dumps(cancel(run_id)))
            _, marker_ms, _ = markers.wait(run_id, WAIT_S)
            took = marker_ms / 1000 - acked
            if took > FORWARD_BOUND_S + MARGIN_S:
                late.append((run_id, round(took, 3)))
        assert late == [], proc.tail()


def test_ready_only_once_the_control_backlog_is_forwarded(stack: Stack, tmp_path: Path) -> None:
    """Cancels in every control partition before the worker starts: each one's forwarded
    marker was written (its record time) before ``/readyz`` first answered 200; the answers
    before it said which control partitions were not forwarding yet."""
    backlog = run_ids("backlog", PARTITIONS, per_partition=BACKLOG // PARTITIONS)
    publish(stack.bootstrap, stack.topic("control"),
            [(run_id.encode(), orjson.dumps(cancel(run_id))) for run_id in backlog])
    port = broker.free_ports()
    proc = start_worker(stack, tmp_path / "worker.log", port, **DEPLOYED_FAUST)
    markers = Markers(stack)
    try:
        answers = readiness(port, proc, every=0.01)
        ready_ms = answers[-1]["at"] * 1000
        late = {run_id: markers.wait(run_id, WAIT_S)[1] - ready_ms for run_id in backlog}
    finally:
        markers.close()
        if proc.proc.poll() is None:
            proc.kill()
    assert {r: ms for r, ms in late.items() if ms > 0} == {}
    assert answers[-1]["control_not_forwarding"] == []


def test_ready_when_a_transaction_marker_ends_a_control_partition(
        stack: Stack, tmp_path: Path) -> None:
    """A gateway that writes its cancels in a transaction leaves a commit marker at the end
    of each control partition (an offset, never a record): the worker still turns ready, and
    every cancel is forwarded."""
    backlog = run_ids("txn", PARTITIONS)
    producer = Producer({"bootstrap.servers": stack.bootstrap, "partitioner": "murmur2_random",
                         "transactional.id": f"{stack.app_id}-gateway"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for run_id in backlog:
        producer.produce(stack.topic("control"), orjson.dumps(cancel(run_id)), run_id.encode())
    producer.commit_transaction(30)
    port = broker.free_ports()
    proc = start_worker(stack, tmp_path / "worker.log", port, **DEPLOYED_FAUST)
    markers = Markers(stack)
    try:
        assert readiness(port, proc)[-1]["control_not_forwarding"] == []
        for run_id in backlog:
            markers.wait(run_id, WAIT_S)
    finally:
        markers.close()
        if proc.proc.poll() is None:
            proc.kill()
