"""A cancel acknowledged by the broker ends its run's calls ``cancelled`` even when the
worker that owns its control partition is killed (SIGKILL) while the cancel is in flight
(issue 9, item 15).

The chaos run on a 3-broker cluster lost such a cancel in 2 of 5 runs: faust started the
control partition past it on the surviving worker, and the worker repaired a skipped range
only when a later record of the same partition arrived, which never came. Now each tick
compares every owned control partition's next offset with its log end and reads a range that
stood still
(``worker.runtime.faust_engine.gaps``). faust's skip cannot be forced from outside, so this
test fails on the old code only when faust skips; the deterministic proof of the repair is
``tests/runtime/unit/test_faust_engine.py::test_a_cancel_faust_never_delivers_is_forwarded_at_the_next_ticks``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from worker_harness import (
    Reader,
    Stack,
    WorkerProcess,
    assignments,
    finished,
    make_stack,
    partition_of,
    provider_run,
    publish,
    publish_envelopes,
    run_ids,
    worker_pair,
)

PARTITIONS = 2


@pytest.fixture
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    # A long idle timeout: a lost cancel shows as a run that never ends within the test.
    with make_stack(kafka_bootstrap, request.node.name, partitions=PARTITIONS,
                    agent_stream_assemble__assemble_idle_timeout_s="300",
                    worker__tick_interval_s="1") as made:
        yield made


def _owned(worker: WorkerProcess) -> set[int]:
    found = assignments(worker)
    return found[-1] if found else set()


@pytest.fixture
def pair(stack: Stack, tmp_path: Path) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """Two workers that own one partition each (events and control, co-partitioned)."""
    with worker_pair(stack, tmp_path) as made:
        yield made


def test_a_cancel_in_flight_survives_a_kill_of_its_control_partitions_owner(
        stack: Stack, pair: tuple[WorkerProcess, WorkerProcess]) -> None:
    """A run streams half a tool call through worker A; its cancel is published to the
    control topic and A, the owner of that control partition, is killed with SIGKILL at
    once. The other worker takes the partitions over and the run ends ``cancelled`` with its
    call's error result ``cancelled``; the rest of the stream, sent afterwards, commits
    nothing."""
    victim, survivor = pair
    (partition,) = _owned(victim)
    run_id = next(r for r in run_ids("gap", PARTITIONS) if partition_of(r, PARTITIONS)
                  == partition)
    calls = [(f"call_{run_id}", "read_file", '{"path": "/stopped"}')]
    envelopes = provider_run("anthropic.messages", run_id, calls)
    publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes[:4])
    victim.wait_for(rf"partition {partition}: rebuilt")  # the victim has the run open

    cancel = {"v": 1, "run_id": run_id, "type": "cancel", "reason": "user_stop"}
    publish(stack.bootstrap, stack.topic("control"), [(run_id.encode(), orjson.dumps(cancel))])
    victim.kill()

    reader = Reader(stack)
    reader.collect(finished([run_id]), timeout=90)
    assert reader.finals()[run_id]["status"] == "cancelled"
    [error] = [r.value for r in reader.of("errors") if r.value["run_id"] == run_id]
    assert (error["state"], error["reason"]) == ("cancelled", "cancelled")

    # The rest of the stream, then a whole run in the same partition: once that one is
    # final, the rest was applied before it.
    later = next(r for r in run_ids("later", PARTITIONS) if partition_of(r, PARTITIONS)
                 == partition)
    publish_envelopes(stack.bootstrap, stack.topic("events"), [
        *envelopes[4:], *provider_run("openai.chat", later, [(f"call_{later}", "read_file",
                                                              '{"path": "/later"}')])])
    reader.collect(finished([run_id, later]), timeout=60)
    assert not [r for r in reader.of("committed") if r.value["run_id"] == run_id]
    assert _owned(survivor) == set(range(PARTITIONS))
    assert survivor.stop() == 0
