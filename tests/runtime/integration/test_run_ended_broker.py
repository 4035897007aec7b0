"""Abort feedback on a real broker, for both engines (issue 26, item 4; decision 0015).

A run that Latch ends for a reason of its own (here its text budget, ``max_run_text_bytes``)
gets one ``run.ended`` record on ``topics.run_ended``; the gateway's :class:`Publisher`, which
follows that topic, fires its callback and sets the run's event; and the 21 events the gateway
still sends afterwards give one DLQ record that sums them up (``late.count`` 21), not 21.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    WorkerProcess,
    make_stack,
    partition_of,
    running_worker,
)

from worker.client.publisher import Publisher, RunEnded

#: Text bytes a run may hold: the first content delta below is larger.
TEXT_LIMIT = 600
LATE = 21
WAIT_S = 45.0


@pytest.fixture(scope="module", params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, f"run-ended-{request.param}", partitions=2,
                    worker__engine=str(request.param),
                    agent_stream_assemble__max_run_text_bytes=str(TEXT_LIMIT),
                    agent_stream_assemble__assemble_idle_timeout_s="3") as made:
        yield made


@pytest.fixture(scope="module")
def worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with running_worker(stack, tmp_path_factory.mktemp(stack.engine) / "worker.log") as proc:
        yield proc


def _chunk(text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def _end_by_budget(stack: Stack, worker: WorkerProcess, run_id: str, late: int
                   ) -> list[RunEnded]:
    """Send run ``run_id`` past its text budget, wait for its end (the publisher's event and
    callback), then send ``late`` events more; the ``run.ended`` records the callback saw."""
    seen: list[RunEnded] = []
    fired = threading.Event()

    def on_ended(ended: RunEnded) -> None:
        seen.append(ended)
        fired.set()

    publisher = Publisher(stack.config())
    try:
        publisher.on_run_ended(on_ended)
        stopped = publisher.ended(run_id)
        run = publisher.run(run_id, "openai.chat", [])
        run.event(_chunk("hello"))
        run.event(_chunk("x" * (2 * TEXT_LIMIT)))  # crosses max_run_text_bytes: ended
        publisher.flush()
        assert stopped.wait(WAIT_S), f"no run.ended:\n{worker.tail()}"
        assert fired.wait(WAIT_S)
        assert run.stopped.is_set()
        for n in range(late):  # a gateway that did not stop (yet)
            run.event(_chunk(f"late {n}"))
        publisher.flush()
    finally:
        publisher.close()
    return seen


def _sentinel(run_id: str, partitions: int) -> str:
    """A run id of the same partition as ``run_id``."""
    return next(f"{run_id}-sentinel-{n}" for n in range(1000)
                if partition_of(f"{run_id}-sentinel-{n}", partitions)
                == partition_of(run_id, partitions))


def _summarised(run_id: str) -> Any:
    key = run_id.encode()
    return lambda rs: any(r.role == "dlq" and r.key == key for r in rs)


def test_budget_end_gives_one_run_ended_and_one_late_summary(
        stack: Stack, worker: WorkerProcess) -> None:
    """A run ended by its text budget: exactly one ``run.ended`` record (reason
    ``budget_exceeded``, its events partition and offsets), the publisher's callback and the
    run's event fire, and 21 later events of the run give exactly one DLQ record, reason
    ``run_finished``, with ``late.count`` 21 and their first and last offsets. No second
    summary comes: a sentinel run of the same partition, ended and sent a late event once the
    first summary is out, has its own summary (a quiet ``assemble_idle_timeout_s`` of record
    time, ticks, later) read before the first run's records are counted."""
    run_id = f"ended-{stack.engine}"
    seen = _end_by_budget(stack, worker, run_id, LATE)
    assert [e.run_id for e in seen] == [run_id]
    assert seen[0].reason == "budget_exceeded" and seen[0].status == "failed"

    reader = Reader(stack, ("final", "dlq", "run_ended"))
    try:
        reader.collect(_summarised(run_id), timeout=WAIT_S)
        sentinel = _sentinel(run_id, stack.partitions)
        assert [e.run_id for e in _end_by_budget(stack, worker, sentinel, 1)] == [sentinel]
        records = [r for r in reader.collect(_summarised(sentinel), timeout=WAIT_S)
                   if r.key == run_id.encode()]
    finally:
        reader.close()
    ended = [r.value for r in records if r.role == "run_ended"]
    assert len(ended) == 1
    assert ended[0]["run_id"] == run_id and ended[0]["reason"] == "budget_exceeded"
    events = ended[0]["events"]
    assert events["topic"] == stack.topic("events")
    assert events["first_offset"] is not None and events["last_offset"] > events["first_offset"]
    assert [r.value["status"] for r in records if r.role == "final"] == ["failed"]
    dlq = [r for r in records if r.role == "dlq"]
    assert len(dlq) == 1, [d.value for d in dlq]
    assert dlq[0].key == run_id.encode()
    summary = dlq[0].value
    assert summary["reason"] == "run_finished" and summary["run_id"] == run_id
    assert summary["original_b64"] == ""
    late = summary["late"]
    assert late["count"] == LATE
    assert late["last_offset"] - late["first_offset"] >= LATE - 1
    assert late["first_seq"] == 3 and late["last_seq"] == 3 + LATE - 1
