"""``worker/tools/chaos/runner_child.py``, the transactional runner ``latch chaos --runners``
kills and restarts, without Kafka: its tool and its step hook write the execution log that
``verify.verify_runners`` reads (``S KEY PID`` at a tool's start, ``E KEY PID`` at its return,
``C KEY PID`` once the call's transaction committed), and a call so logged is ``once``. The
kills themselves are tests/tools/integration/test_chaos_run.py's."""

from __future__ import annotations

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
