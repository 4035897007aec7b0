"""The transactional runner's journal on the real broker (issue 26, item 2): a runner killed
with SIGKILL at every step of a call, then restarted, executes each call once, except the
calls a kill interrupted between the tool's start and the transaction's commit (twice, as the
runner's docstring, docs/runner.md and decision 0012 say); copies of recorded calls arriving
after the restart never run; each call has exactly one result at read_committed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import orjson
from confluent_kafka import Producer
from conftest import MakeTopic
from worker_harness import read_results as results

CHILD = Path(__file__).with_name("journal_runner_child.py")
CHECKOUT = Path(__file__).resolve().parents[3]
STEPS = ("before_tool", "in_tool", "after_tool", "after_commit")


def call(key: str) -> bytes:
    return orjson.dumps({"v": 1, "run_id": f"run-{key}", "tenant": "t",
                         "provider": "anthropic.messages", "call_id": f"toolu_{key}",
                         "name": "record", "index": 0, "arguments": {"key": key},
                         "idempotency_key": key})


def publish(bootstrap: str, topic: str, keys: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key in keys:
        producer.produce(topic, key=f"run-{key}".encode(), value=call(key))
    assert producer.flush(30) == 0



def test_a_runner_killed_at_every_step_runs_each_call_once_but_a_crash_mid_tool(
        kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path) -> None:
    """One call per kill point (before the tool, inside it, after it before the commit, after
    the commit); a runner subprocess is SIGKILLed at each in turn and restarted with the same
    transactional id. Then a copy of every call and a fresh call arrive, and a last runner
    (a new process, reading the journal at start) handles them. Executions counted by the
    tool's own fsync'd log: once for a kill before the tool and after the commit, twice for
    a kill inside the tool or after it (the documented window), once for the fresh call; no
    copy runs again; every call has exactly one result at read_committed."""
    committed, results_topic = make_topic("committed"), make_topic("results")
    journal = make_topic("journal", config={"cleanup.policy": "compact"})
    suffix = uuid.uuid4().hex[:8]
    group, transactional_id = f"latch-runner-test-{suffix}", f"latch-runner-test-{suffix}-0"
    log = tmp_path / "executions.log"
    log.touch()
    env_base = os.environ | {"LATCH_TEST_LOG": str(log), "PYTHONUNBUFFERED": "1",
                             "PYTHONPATH": os.pathsep.join(
                                 p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, str(CHILD), kafka_bootstrap, committed, results_topic, journal,
            group, transactional_id]
    keys = [f"k-{step}" for step in STEPS]
    publish(kafka_bootstrap, committed, keys)

    def start(step: str = "", key: str = "") -> subprocess.Popen[bytes]:
        env = env_base | {"LATCH_TEST_KILL_STEP": step, "LATCH_TEST_KILL_KEY": key}
        return subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)

    for step, key in zip(STEPS, keys, strict=True):
        child = start(step, key)
        try:
            output, _ = child.communicate(timeout=120)
        except subprocess.TimeoutExpired as exc:
            child.kill()
            output, _ = child.communicate()
            raise AssertionError(f"the runner was not killed at {step}: {output.decode()}"
                                 ) from exc
        assert child.returncode == -signal.SIGKILL, (step, output.decode())

    publish(kafka_bootstrap, committed, [*keys, "k-fresh"])
    child = start()
    try:
        found = results(kafka_bootstrap, results_topic, want=5)
    finally:
        child.send_signal(signal.SIGTERM)
        output, _ = child.communicate(timeout=60)
    assert child.returncode == 0, output.decode()

    executions = Counter(log.read_text().split())
    assert executions == {"k-before_tool": 1, "k-in_tool": 2, "k-after_tool": 2,
                          "k-after_commit": 1, "k-fresh": 1}, output.decode()
    assert sorted(r["idempotency_key"] for r in found) == sorted([*keys, "k-fresh"])
    assert all(r["content"] == f"done {r['idempotency_key']}" for r in found)
