"""The registry reader's follower thread (governance/registry_io.py, issue 32): a Kafka error
that ends its consumer is reported (a log line, ``/readyz`` not ready with the error,
``latch_registry_following`` 0) and a new consumer resumes at the next offset; before issue 32
the thread ended on the error and nothing in health said so. No broker: the consumers are
fakes that fail or deliver the way confluent-kafka's do."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.governance import registry, registry_io
from worker.runtime.governance.registry import POLICY
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads

GOOD = '@id("all")\npermit(principal, action, resource);\n'


class _Message:
    def __init__(self, key: bytes, value: bytes, offset: int) -> None:
        self._key, self._value, self._offset = key, value, offset

    def error(self) -> None:
        return None

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 2, 1_000


class _Fatal:
    """A message carrying a fatal error, as ``poll`` returns one."""

    def error(self) -> KafkaError:
        return KafkaError(KafkaError._FATAL, "fatal: the consumer is unusable", fatal=True)


class _Consumer:
    """``poll`` answers from ``script`` (a message, an exception to raise, or None), then
    None; records what it was assigned and whether it was closed."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.assigned, self.closed = list(script), [], False

    def poll(self, timeout: float) -> Any:
        if self.closed:
            raise RuntimeError("Consumer closed")
        if not self.script:
            time.sleep(min(timeout, 0.01))
            return None
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def assign(self, partitions: list[Any]) -> None:
        self.assigned.append([(p.topic, p.partition, p.offset) for p in partitions])

    def close(self) -> None:
        self.closed = True


def _wait(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def fast_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_io, "RESUME_AFTER_S", 0.05)


@pytest.mark.parametrize("failure", [
    KafkaException(KafkaError(KafkaError._TRANSPORT, "broker gone")),
    _Fatal(),
], ids=["poll raises", "fatal error"])
def test_a_kafka_error_is_reported_and_a_new_consumer_resumes(
        failure: Any, fast_resume: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The first consumer reads policy version 1 at offset 0, then fails; while it is
    broken ``/readyz`` is not ready and says why, and ``latch_registry_following`` is 0; a
    new consumer is assigned at offset 1 (nothing read twice, nothing skipped), reads version
    2, and the reader reports following again."""
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                    "LATCH_POLICY__MODE": "enforce"})
    hooks = EngineHooks(config)
    driver = Driver(config, hooks, Heads({}, 3600))
    reader = registry_io.RegistryReader(config)
    driver.registry = reader
    first = _Consumer([_Message(*registry.encode(POLICY, "", 1, GOOD), 0), failure])
    gate = threading.Event()
    second = _Consumer([])

    def make(_config: Any) -> _Consumer:
        gate.wait(10)  # (the test looks at the broken state before the new consumer reads)
        second.script.append(_Message(*registry.encode(POLICY, "", 2, GOOD + " "), 1))
        return second

    monkeypatch.setattr(registry_io, "_consumer", make)
    reader._consumer = first
    with caplog.at_level(logging.ERROR, logger="latch.worker"):
        reader._thread.start()
        try:
            _wait(lambda: reader.failure is not None)
            assert reader.latest_policy() == 1 and first.closed
            ready, body = hooks.health.ready()
            assert not ready and body["registry"]["following"] is False
            assert body["registry"]["error"] == reader.failure
            assert "latch_registry_following 0.0" in hooks.metrics.exposition().decode()
            gate.set()
            _wait(lambda: reader.latest_policy() == 2)
            _wait(lambda: reader.failure is None)
            assert second.assigned == [[(config.topics.registry, 0, 1)]]
            assert hooks.health.ready()[1]["registry"] == {"following": True, "error": None}
            assert "latch_registry_following 1.0" in hooks.metrics.exposition().decode()
        finally:
            gate.set()
            reader.stop()
    assert not reader._thread.is_alive()
    assert [r for r in caplog.records if "registry reader" in r.getMessage()]
