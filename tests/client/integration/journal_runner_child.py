"""A transactional runner for the journal's restart test (test_runner_journal_on_kafka.py),
run as a subprocess: it kills itself with SIGKILL at the step ``LATCH_TEST_KILL_STEP`` names
(``before_tool``, ``in_tool``, ``after_tool``, ``after_commit``) of the call whose
idempotency key is ``LATCH_TEST_KILL_KEY``; its tool appends the call's key to
``LATCH_TEST_LOG`` (fsync'd) at its start, one line per execution. SIGTERM stops it cleanly.

Arguments: BOOTSTRAP COMMITTED RESULTS JOURNAL GROUP TRANSACTIONAL_ID.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from confluent_kafka import Consumer

from worker.client.runner import Runner
from worker.runtime.config import Config, KafkaSettings, TopicNames

STEP = os.environ.get("LATCH_TEST_KILL_STEP", "")
KEY = os.environ.get("LATCH_TEST_KILL_KEY", "")
LOG = os.environ["LATCH_TEST_LOG"]


def die_at(step: str, key: str) -> None:
    if step == STEP and key == KEY:
        os.kill(os.getpid(), signal.SIGKILL)


def record(args: dict[str, Any]) -> str:
    with open(LOG, "a") as log:
        log.write(args["key"] + "\n")
        log.flush()
        os.fsync(log.fileno())
    die_at("in_tool", args["key"])
    return f"done {args['key']}"


def main() -> None:
    bootstrap, committed, results, journal, group, transactional_id = sys.argv[1:7]
    config = Config(kafka=KafkaSettings(bootstrap_servers=bootstrap),
                    topics=TopicNames(committed=committed, results=results, journal=journal))
    # static membership: a restarted instance takes its partitions back at once
    consumer = Consumer({**config.kafka.confluent_config(), "group.id": group,
                         "group.instance.id": transactional_id, "session.timeout.ms": 6000,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    runner = Runner(config, {"record": record}, consumer=consumer,
                    transactional_id=transactional_id, transaction_timeout_s=10.0)
    runner._on_step = die_at  # the test-only hook
    runner.serve(timeout=0.2)


if __name__ == "__main__":
    main()
