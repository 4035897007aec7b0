"""``worker/tools/chaos/runner_child.py``, the transactional runner ``latch chaos --runners``
kills and restarts, without Kafka: its tool and its step hook write the execution log that
``verify.verify_runners`` reads (``S KEY PID`` at a tool's start, ``E KEY PID`` at its return,
``C KEY PID`` once the call's transaction committed), and a call so logged is ``once``. The
kills themselves are tests/tools/integration/test_chaos_run.py's."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import orjson
import pytest

from worker.tools.chaos import runner_child
from worker.tools.chaos.verify import OutRecord, verify_runners


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "executions.log"
    monkeypatch.setattr(runner_child, "_log_path", str(path))
    monkeypatch.setattr(runner_child.time, "sleep", lambda seconds: None)
    return path


def test_a_call_run_and_committed_is_logged_start_end_commit(log: Path) -> None:
    """The step before the tool names the call, the tool logs its start and end and answers
    with the call's key, and the step after the commit logs ``C``: three lines of this
    process, in that order."""
    runner_child._step("before_tool", "r1:c1")
    assert runner_child._tool({"path": "/a"}) == "done r1:c1"
    runner_child._step("after_commit", "r1:c1")
    runner_child._step("other_step", "r1:c1")  # (any other step writes nothing)
    pid = str(os.getpid())
    assert [line.split(" ") for line in log.read_text().splitlines()] == [
        ["S", "r1:c1", pid], ["E", "r1:c1", pid], ["C", "r1:c1", pid]]


def test_the_log_it_writes_is_what_the_verifier_reads(log: Path) -> None:
    """A committed call with one result, run and committed once by the child, passes
    ``verify_runners`` as ``once``, one execution; run twice, it is no longer ``once``."""
    runner_child._step("before_tool", "k1")
    runner_child._tool({})
    runner_child._step("after_commit", "k1")
    records = [OutRecord("committed", 0, 0, b"r1", orjson.dumps({"idempotency_key": "k1"})),
               OutRecord("results", 0, 0, b"r1", orjson.dumps({"idempotency_key": "k1"}))]
    verdict = verify_runners(records, log.read_text())
    assert (verdict.calls, verdict.results, verdict.once) == (1, 1, 1), verdict.failures
    assert not verdict.failures
    assert verdict.executions == 1
    runner_child._step("before_tool", "k1")
    runner_child._tool({})
    assert verify_runners(records, log.read_text()).once == 0


class _Producer:
    """Records what the runner does with its producer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def begin_transaction(self) -> None:
        self.calls.append(("begin", None))

    def produce(self, topic: str, key: bytes | None = None, value: bytes | None = None,
                headers: object = None) -> None:
        self.calls.append(("produce", value))

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append(("commit", None))


def _misbehaving(monkeypatch: pytest.MonkeyPatch) -> tuple[runner_child.MisbehavingRunner,
                                                            _Producer]:
    from worker.runtime.config import load_config
    from worker.tools.chaos.plan import Misbehaviour

    producer = _Producer()
    runner = runner_child.MisbehavingRunner(
        load_config(None, env={}), dict.fromkeys(runner_child.TOOL_SCHEMAS, runner_child._tool),
        consumer=object(), producer=producer)
    runner._on_step = runner_child._step
    monkeypatch.setattr(runner_child.MisbehavingRunner, "misbehaviour",
                        Misbehaviour(seed=1, hang_rate=0.5, twice_rate=0.5))
    return runner, producer


def _call(key: str) -> bytes:
    return orjson.dumps({"v": 1, "run_id": "r1", "tenant": "t", "provider": "openai.chat",
                         "call_id": "c1", "name": "read_file", "arguments": {"path": "/a"},
                         "idempotency_key": key, "index": 0})


def test_a_hung_call_is_taken_and_never_answered(log: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A call the misbehaviour hangs on: no tool runs, no result (the offset only), ``H``."""
    from worker.tools.chaos.plan import HANG

    runner, _ = _misbehaving(monkeypatch)
    key = next(f"r1:k{n}" for n in range(100) if runner.misbehaviour.of(f"r1:k{n}") == HANG)
    outcome = runner.handle(_call(key))
    assert (outcome.status, outcome.value) == ("duplicate", None)
    assert log.read_text().split() == ["H", key, str(os.getpid())]


def test_a_call_answered_twice_gets_the_same_result_in_a_second_transaction(
        log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call the misbehaviour answers twice: its first transaction as any call's, then one
    more with the same result record, logged ``D`` once committed; another call: once."""
    from worker.tools.chaos.plan import TWICE

    runner, producer = _misbehaving(monkeypatch)
    monkeypatch.setattr(runner_child.Runner, "_transact", lambda *args: None)
    keys = [f"r1:k{n}" for n in range(100)]
    key = next(k for k in keys if runner.misbehaviour.of(k) == TWICE)
    outcome = runner.handle(_call(key))
    assert outcome.status == "executed"
    runner._transact(outcome, None, None)
    assert producer.calls == [("begin", None), ("produce", outcome.value), ("commit", None)]
    assert log.read_text().splitlines()[-1].split() == ["D", key, str(os.getpid())]
    producer.calls.clear()
    runner._transact(dataclasses.replace(outcome, status="duplicate"), None, None)
    assert producer.calls == []
