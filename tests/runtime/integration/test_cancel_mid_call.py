"""A cancel that reaches a run while one of its tool calls is still streaming cancels that
call, on both engines and for every provider (issue 23, item 13).

The run of each test: ``run.start``, the provider's events up to the call's first argument
fragment (the call is open), applied by the worker; then a cancel on the control topic,
forwarded by the worker into the run's events partition; then the rest of the stream (the
last fragment, the call's end, the message's end, ``stream.end``). Exactly one error result,
``cancelled``, for the open call; no committed call; the run's final says ``cancelled``; the
outputs are those of the offline core (``latch assemble``) fed the same history.

The waits follow the records instead of the clock: the head is applied when the group's
committed offset passes it, the cancel is in the log when its marker can be read from the
events topic, and the rest is applied when the committed offset passes it too; each wait is
bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import orjson
import pytest
from builders import NEW_PROVIDERS, PROVIDERS, cancel, split_open_run
from confluent_kafka import Consumer, TopicPartition
from worker_harness import (
    ENGINES,
    Markers,
    Stack,
    WorkerProcess,
    expected,
    make_stack,
    partition_of,
    publish,
    publish_envelopes,
    run_outputs,
    running_worker,
)

from worker.core import Topic

PARTITIONS = 3
#: The call's argument text, streamed in two fragments: the cancel comes between them.
ARGUMENTS = '{"path": "/c"}'
#: How long each wait for the worker may take (a worker applies a record in milliseconds).
WAIT_S = 30.0


@pytest.fixture(scope="module", params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """One stack per engine; the tests of a module share it (their runs differ)."""
    # A long idle timeout: nothing of a run may end for another reason than its cancel.
    with make_stack(kafka_bootstrap, f"cancel-mid-{request.param}", partitions=PARTITIONS,
                    worker__engine=str(request.param),
                    agent_stream_assemble__assemble_idle_timeout_s="300") as made:
        yield made


@pytest.fixture(scope="module")
def worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with running_worker(stack, tmp_path_factory.mktemp(stack.engine) / "worker.log") as proc:
        yield proc


def _end_offset(stack: Stack, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "unused"})
    try:
        _, high = consumer.get_watermark_offsets(
            TopicPartition(stack.topic("events"), partition), timeout=10)
        return int(high)
    finally:
        consumer.close()


def _wait_applied(stack: Stack, partition: int, end: int) -> None:
    """Wait until the worker group's committed offset of the events ``partition`` reaches
    ``end``: every record before it was applied and its outputs confirmed."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": stack.app_id,
                         "enable.auto.commit": False})
    try:
        tp = TopicPartition(stack.topic("events"), partition)
        deadline = time.monotonic() + WAIT_S
        committed = -1
        while time.monotonic() < deadline:
            committed = consumer.committed([tp], timeout=10)[0].offset
            if committed >= end:
                return
            time.sleep(0.1)
        raise AssertionError(f"events[{partition}] committed at {committed}, wanted {end}")
    finally:
        consumer.close()


@pytest.mark.parametrize("provider", [*PROVIDERS, *NEW_PROVIDERS])
def test_a_cancel_between_two_argument_fragments_cancels_the_call(
        stack: Stack, worker: WorkerProcess, provider: str) -> None:
    """For each provider and engine: the run's call is open (its first argument fragment
    applied) when its cancel arrives through the control topic and is forwarded into the
    run's events partition; the rest of the stream follows. The call gets exactly one error
    result, ``cancelled``, and is never committed; the run ends ``cancelled``; the worker's
    outputs for the run are the offline core's for the same history."""
    run_id = f"cancel-mid-{provider}"
    partition = partition_of(run_id, PARTITIONS)
    head, rest = split_open_run(provider, run_id, ARGUMENTS)
    assert head[-1]["type"] == "provider.event" and rest[-1]["type"] == "stream.end"

    publish_envelopes(stack.bootstrap, stack.topic("events"), head)
    _wait_applied(stack, partition, _end_offset(stack, partition))  # the call is open
    marker = cancel(run_id)
    publish(stack.bootstrap, stack.topic("control"), [(run_id.encode(), orjson.dumps(marker))])
    markers = Markers(stack)
    try:
        assert markers.wait(run_id, WAIT_S)[0] == partition  # behind the head, before the rest
    finally:
        markers.close()
    publish_envelopes(stack.bootstrap, stack.topic("events"), rest)
    _wait_applied(stack, partition, _end_offset(stack, partition))  # the rest applied too

    mine = run_outputs(stack, run_id, WAIT_S)
    errors = [(r.value["tool_call_id"], r.value["state"], r.value["reason"])
              for r in mine if r.role == "errors"]
    assert errors == [("call_1", "cancelled", "cancelled")]
    assert [r for r in mine if r.role == "committed"] == []
    assert [r for r in mine if r.role == "dlq"] == []
    [final] = [r.value for r in mine if r.role == "final"]
    assert final["status"] == "cancelled", final

    offline = expected([*head, marker, *rest], stack.config())
    for topic in (Topic.COMMITTED, Topic.ERRORS, Topic.FINAL):
        assert [r.value for r in mine if r.role == topic.value] == [
            e.value for e in offline if e.topic is topic], topic
