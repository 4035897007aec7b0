"""A cluster that refuses Kafka transactions stops the kafka engine at start with one log
line naming the cause and saying that ``worker.engine: faust`` works without transactions,
exit status 1 (issue 34). The error-to-message mapping (``transaction.refusal``) and the
engine's start, without a broker; the real broker that refuses is
``tests/runtime/integration/test_transactions_refused.py``."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.runtime.config import load_config
from worker.runtime.kafka_engine import engine as kafka_engine
from worker.runtime.kafka_engine import transaction

TID = "latch-worker-0"
FAUST = "run worker.engine: faust, which works without transactions"


def _failure(code: int, text: str = "refused", fatal: bool = False) -> KafkaException:
    return KafkaException(KafkaError(code, text, fatal=fatal))


@pytest.mark.parametrize(("code", "cause"), [
    (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
     f"the cluster denies this worker's principal the transactional id {TID} (Kafka ACLs"),
    (KafkaError.CLUSTER_AUTHORIZATION_FAILED,
     "the cluster denies this worker's principal IdempotentWrite on the cluster"),
    (KafkaError.UNSUPPORTED_VERSION, "the cluster does not support transactions"),
    (KafkaError._UNSUPPORTED_FEATURE, "the cluster does not support transactions"),
    (KafkaError._TIMED_OUT, f"no transaction coordinator registered transactional id {TID} "
     "within 2.5s (worker.init_timeout_s): the cluster's transaction state log"),
    (KafkaError.COORDINATOR_NOT_AVAILABLE, "transaction.state.log.replication.factor"),
    (KafkaError._TRANSPORT, "the cluster did not start this worker's transactions"),
])
def test_each_refusal_names_its_cause_and_the_faust_engine(code: int, cause: str) -> None:
    """One line: the cause, the client's own error (name and words), and the way out."""
    line = transaction.refusal(_failure(code, "the broker said so"), TID, 2.5)
    assert "\n" not in line
    assert line.startswith("the kafka engine needs Kafka transactions and ")
    assert cause in line
    assert f"[{KafkaError(code).name()}: the broker said so]" in line
    assert FAUST in line


def test_a_failure_without_a_kafka_error_still_says_what_to_do() -> None:
    """Anything else ``init_transactions`` raises: its own words, and the way out."""
    line = transaction.refusal(RuntimeError("boom"), TID, 30.0)
    assert "the cluster did not start this worker's transactions [boom]" in line
    assert FAUST in line


class _Refusing:
    """A producer whose ``init_transactions`` fails as a cluster without the ACL makes it."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def init_transactions(self, timeout: float) -> None:
        self.timeouts.append(timeout)
        raise _failure(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                       "Transactional Id authorization failed.", fatal=True)


class _Consumer:
    def close(self) -> None:
        pass


def test_the_engine_stops_at_start_with_one_line_and_exit_status_1(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``KafkaEngine.run``: ``init_transactions`` gets ``worker.init_timeout_s`` and its
    refusal is one ERROR line (no traceback), exit status 1; nothing is consumed."""
    config = load_config(None, env={"LATCH_WORKER__INIT_TIMEOUT_S": "3",
                                    "LATCH_WORKER__INSTANCE_ID": "worker-0",
                                    "LATCH_WORKER__HTTP_PORT": "0"})
    engine = kafka_engine.KafkaEngine(config)
    producer = _Refusing()
    engine.txn.producer = producer  # type: ignore[assignment]
    subscribed: list[Any] = []
    consumer = _Consumer()
    consumer.subscribe = lambda *a, **k: subscribed.append(a)  # type: ignore[attr-defined]
    engine.consumer = consumer  # type: ignore[assignment]
    monkeypatch.setattr(kafka_engine.instance, "check", lambda *args: None)
    monkeypatch.setattr(engine, "_read_limits", lambda replace=True: False)
    monkeypatch.setattr(engine.registry, "start", lambda: None)
    with caplog.at_level(logging.INFO, logger="latch.worker"):
        assert engine.run() == 1
    assert producer.timeouts == [3.0]
    assert not subscribed
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert errors[0].exc_info is None and "\n" not in line
    assert line.startswith("not starting: the kafka engine needs Kafka transactions and the "
                           "cluster denies this worker's principal the transactional id "
                           "latch-worker-0")
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in line and FAUST in line


def test_the_default_init_timeout_is_the_client_timeout() -> None:
    """30 s unless ``worker.init_timeout_s`` says otherwise (the test broker's refusal is
    bounded by a short one)."""
    config = load_config(None, env={})
    assert config.worker.init_timeout_s == transaction.CLIENT_TIMEOUT_S
    assert kafka_engine.KafkaEngine(config).txn.init_timeout_s == transaction.CLIENT_TIMEOUT_S
