"""A signing key rotation in the wrong order on the real broker, for each engine: the worker
signs with k2 (``signing.key_id`` switched) while a runner holds only k1. That runner stops
at the worker's call (SigningKeyError naming k2) without committing past it; a runner of
the same group holding k2 then runs the call once and answers it. Before, the first runner
skipped the record and committed its offset: the call never got a result."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer
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

from worker.client.runner import Runner, SigningKeyError
from worker.runtime.governance.signing import KEY_ID_HEADER, Verifier

OLD = b"integration-old-key-0123456789abcdef"
NEW = "integration-new-key-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[3]
KEY_VARIABLE = "LATCH_IT_ROTATION_KEY"  # no "__": not a setting, only where the key is


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=str(request.param), signing__key_id="k2",
                    signing__keys=f"{{k2: 'env:{KEY_VARIABLE}'}}",
                    it_rotation_key=NEW) as made:
        yield made


def results(stack: Stack, count: int) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "unused",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([stack.topic("results")])
    found: list[dict[str, Any]] = []
    for _ in range(20):
        found += [orjson.loads(m.value()) for m in consumer.consume(10, timeout=1.0)
                  if m.error() is None]
        if len(found) >= count:
            break
    found += [orjson.loads(m.value()) for m in consumer.consume(10, timeout=2.0)
              if m.error() is None]
    consumer.close()
    return found


def serve(runner: Runner, records: int) -> int:
    """Run ``runner`` for ``records`` records, at most 60 s."""
    stopped = threading.Event()
    timer = threading.Timer(60, stopped.set)
    timer.start()
    try:
        return runner.run(stopped, max_records=records, timeout=0.5)
    finally:
        timer.cancel()
        runner.close()


def test_a_runner_without_the_workers_new_key_stops_and_a_runner_with_it_answers(
        stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker commits a call signed with k2; a runner holding only k1 raises
    SigningKeyError naming k2 and runs nothing; a runner of the same group holding k1 and k2
    then runs the call once (its offset was not committed past) and answers it."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    worker = WorkerProcess(stack, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        publish_envelopes(stack.bootstrap, stack.topic("events"), provider_run(
            "openai.chat", "rotated-1", [("call_ok", "read_file", '{"path": "/tmp/a"}')]))
        reader = Reader(stack, roles=("committed", "final"))
        (mine,) = [r for r in reader.collect(finished(["rotated-1"])) if r.role == "committed"]
        reader.close()
        assert dict(mine.headers)[KEY_ID_HEADER] == b"k2"
    finally:
        assert worker.stop() == 0, worker.tail()

    ran: list[Any] = []

    def read_file(args: Any) -> str:
        ran.append(args)
        return "contents"

    group = f"latch-it-runner-{uuid.uuid4().hex[:8]}"
    behind = Runner(stack.config(), {"read_file": read_file}, group_id=group,
                    verifier=Verifier({"k1": OLD}))
    with pytest.raises(SigningKeyError, match="'k2'"):
        serve(behind, 1)
    assert ran == [] and behind.metrics.rejected["unknown_key"] == 1

    rotated = Runner(stack.config(), {"read_file": read_file}, group_id=group,
                     verifier=Verifier({"k1": OLD, "k2": NEW.encode()}))
    assert serve(rotated, 1) == 1
    assert ran == [{"path": "/tmp/a"}]
    answers = results(stack, 1)
    assert [(r["tool_call_id"], r["content"]) for r in answers] == [("call_ok", "contents")]
