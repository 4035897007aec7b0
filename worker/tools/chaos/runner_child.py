"""A transactional runner for ``latch chaos --runners N``, run as a subprocess the driver
kills with SIGKILL at random moments and restarts (same transactional id: the restarted
runner fences its predecessor and reads the journal).

Every tool the plan's runs call is registered with one function that appends to the
execution log (``LOG``, one line each, fsync'd): ``S KEY PID`` when the tool starts, ``E KEY
PID`` when it returns (after a short random sleep, so that kills land inside tools too), and
``C KEY PID`` once the call's transaction (result, journal record, consumed offset) committed.
:func:`worker.tools.chaos.verify.verify_runners` reads it.

Arguments: BOOTSTRAP COMMITTED RESULTS JOURNAL GROUP TRANSACTIONAL_ID LOG.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

from confluent_kafka import Consumer

from worker.client.runner import Runner
from worker.runtime.config import Config, KafkaSettings, TopicNames
from worker.tools.chaos.plan import TOOL_SCHEMAS

_current = {"key": ""}
_log_path = ""


def _write(mark: str, key: str) -> None:
    fd = os.open(_log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{mark} {key} {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _step(step: str, key: str) -> None:
    if step == "before_tool":
        _current["key"] = key
    elif step == "after_commit":
        _write("C", key)


def _tool(args: Any) -> str:
    key = _current["key"]
    _write("S", key)
    time.sleep(random.uniform(0.0, 0.05))
    _write("E", key)
    return f"done {key}"


def main() -> None:
    global _log_path
    bootstrap, committed, results, journal, group, transactional_id, _log_path = sys.argv[1:8]
    config = Config(kafka=KafkaSettings(bootstrap_servers=bootstrap),
                    topics=TopicNames(committed=committed, results=results, journal=journal))
    consumer = Consumer({**config.kafka.confluent_config(), "group.id": group,
                         "group.instance.id": transactional_id, "session.timeout.ms": 6000,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    runner = Runner(config, dict.fromkeys(TOOL_SCHEMAS, _tool), consumer=consumer,
                    transactional_id=transactional_id, transaction_timeout_s=10.0)
    runner._on_step = _step  # the test-only hook: which call the tool runs, and its commit
    runner.serve(timeout=0.2)


if __name__ == "__main__":
    main()
