"""A transactional runner for ``latch chaos --runners N``, run as a subprocess the driver
kills with SIGKILL at random moments and restarts (same transactional id: the restarted
runner fences its predecessor and reads the journal).

Every tool the plan's runs call is registered with one function that appends to the
execution log (``LOG``, one line each, fsync'd): ``S KEY PID`` when the tool starts, ``E KEY
PID`` when it returns (after a short random sleep, so that kills land inside tools too), and
``C KEY PID`` once the call's transaction (result, journal record, consumed offset) committed.
:func:`worker.tools.chaos.verify.verify_runners` reads it.

Misbehaviour (``--hang-rate``, ``--twice-rate``; :class:`~worker.tools.chaos.plan.Misbehaviour`
decides which calls): a *hung* call is taken and never answered (``H KEY PID``; its offset is
committed with no result, as a tool that never returns would leave it, without stalling the
calls behind it): the worker's result latch must answer it ``tool_timeout``. A call answered
*twice* gets its result, then, in a transaction of its own, the same result record again
(``D KEY PID`` once that second transaction committed): the worker must send the second to
the DLQ (``result_duplicate``), never into the turn record.

Arguments: BOOTSTRAP COMMITTED RESULTS JOURNAL GROUP TRANSACTIONAL_ID LOG [SEED HANG_RATE
TWICE_RATE].
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

import orjson
from confluent_kafka import Consumer

from worker.client.runner import Outcome, Runner
from worker.runtime.config import Config, KafkaSettings, TopicNames
from worker.tools.chaos.plan import HANG, TOOL_SCHEMAS, TWICE, Misbehaviour

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


class MisbehavingRunner(Runner):
    """A transactional :class:`Runner` that hangs on some calls and answers others twice."""

    misbehaviour = Misbehaviour()

    def handle(self, value: bytes | None, topic: str | None = None,
               headers: Any = None) -> Outcome:
        key = _key(value)
        if key is not None and self.misbehaviour.of(key) == HANG:
            _write("H", key)
            return Outcome("duplicate", idempotency_key=key)  # (no result: the offset only)
        return super().handle(value, topic, headers)

    def _transact(self, outcome: Outcome, message: Any, headers: Any) -> None:
        super()._transact(outcome, message, headers)
        key = outcome.idempotency_key or ""
        if outcome.status == "executed" and self.misbehaviour.of(key) == TWICE:
            self.producer.begin_transaction()
            self.producer.produce(self.config.topics.results, key=outcome.key,
                                  value=outcome.value, headers=headers)
            self.producer.commit_transaction(30)
            _write("D", key)


def _key(value: bytes | None) -> str | None:
    try:
        call = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    key = call.get("idempotency_key") if isinstance(call, dict) else None
    return key if isinstance(key, str) else None


def main() -> None:
    global _log_path
    bootstrap, committed, results, journal, group, transactional_id, _log_path = sys.argv[1:8]
    if len(sys.argv) > 8:
        seed, hang, twice = sys.argv[8:11]
        MisbehavingRunner.misbehaviour = Misbehaviour(int(seed), float(hang), float(twice))
    config = Config(kafka=KafkaSettings(bootstrap_servers=bootstrap),
                    topics=TopicNames(committed=committed, results=results, journal=journal))
    consumer = Consumer({**config.kafka.confluent_config(), "group.id": group,
                         "group.instance.id": transactional_id, "session.timeout.ms": 6000,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    runner = MisbehavingRunner(config, dict.fromkeys(TOOL_SCHEMAS, _tool), consumer=consumer,
                    transactional_id=transactional_id, transaction_timeout_s=10.0)
    runner._on_step = _step  # the test-only hook: which call the tool runs, and its commit
    runner.serve(timeout=0.2)


if __name__ == "__main__":
    main()
