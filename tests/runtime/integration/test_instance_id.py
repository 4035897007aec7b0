"""Two kafka-engine workers given one ``worker.instance_id`` (issue 23, item 8), on the real
broker: the newer one refuses to start (exit status 2, an error naming the id and what to
do) instead of fencing the live one, which goes on deciding runs; a worker whose
predecessor with the same id was killed starts once the dead one's session expires."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_harness import (
    Reader,
    Stack,
    WorkerProcess,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
)


@pytest.fixture
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1, worker__engine="kafka",
                    worker__instance_id="slot-0") as made:
        yield made


def _decided(stack: Stack, run_id: str) -> None:
    """Publish a one-call run; wait for its final message."""
    publish_envelopes(stack.bootstrap, stack.topic("events"),
                      provider_run("openai.chat", run_id, [(f"call_{run_id}", "read_file",
                                                            '{"path": "/p"}')]))
    reader = Reader(stack)
    try:
        reader.collect(finished([run_id]), timeout=60)
    finally:
        reader.close()


def test_a_second_worker_with_a_live_workers_instance_id_refuses_to_start(
        stack: Stack, tmp_path: Path) -> None:
    """A runs with instance id slot-0; B, started with the same id, exits 2 (after the
    session timeout and grace) with an error naming slot-0 and the fix, without fencing A:
    A stays up, is never fenced, and decides a run published after B gave up."""
    a = WorkerProcess(stack, tmp_path / "a.log")
    b = None
    try:
        a.wait_ready()
        b = WorkerProcess(stack, tmp_path / "b.log")
        assert b.proc.wait(60) == 2, b.tail()
        assert "another live worker holds worker.instance_id slot-0" in b.log()
        assert "Give each worker its own worker.instance_id" in b.log()
        assert "kafka engine ready" not in b.log()
        _decided(stack, "after-b")
        assert a.proc.poll() is None, a.tail()
        assert "fenced" not in a.log().lower(), a.tail()
        assert a.stop() == 0, a.tail()
    finally:
        for worker in (a, b):
            if worker is not None and worker.proc.poll() is None:
                worker.kill()


def test_a_restart_after_its_predecessor_was_killed_is_not_refused(
        stack: Stack, tmp_path: Path) -> None:
    """A (slot-0) is killed: its member stays in the group until its session expires. C,
    started at once with slot-0, waits for that and starts (it is not refused), then decides
    a run."""
    a = WorkerProcess(stack, tmp_path / "a.log")
    c = None
    try:
        a.wait_ready()
        a.kill()
        began = time.monotonic()
        c = WorkerProcess(stack, tmp_path / "c.log")
        c.wait_for("kafka engine ready", timeout=60)
        assert "is held by a member of group" in c.log()  # the dead one was seen, waited for
        assert time.monotonic() - began < 40
        _decided(stack, "after-c")
        assert c.stop() == 0, c.tail()
    finally:
        for worker in (a, c):
            if worker is not None and worker.proc.poll() is None:
                worker.kill()
