"""Fixtures for tests against a real Kafka broker.

``kafka_bootstrap`` uses whatever answers at ``LATCH_TEST_BOOTSTRAP`` (default
127.0.0.1:9092: ``latch broker start`` or ``docker compose up kafka``); if nothing does, it
starts the managed broker with :mod:`worker.tools.broker` and stops it when the session ends
(a broker that was already running is left alone).

``make_topic`` creates uniquely named topics for one test and deletes them afterwards.
Every test in an ``integration`` folder (``tests/<layer>/integration/``) is marked
``integration`` (``pytest -m "not integration"`` skips them).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from worker.tools import broker

LOOPBACK = {"127.0.0.1", "localhost", "::1"}

#: make_topic(suffix="", partitions=1, config=None) -> topic name
MakeTopic = Callable[..., str]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in item.path.parent.parts:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The bootstrap address of a broker that answers; starts the managed one if needed, and
    then stops it at the end of the session."""
    bootstrap = os.environ.get("LATCH_TEST_BOOTSTRAP", broker.DEFAULT_BOOTSTRAP)
    if broker.answers(bootstrap, timeout=5.0):
        yield bootstrap
        return
    host, _, port = bootstrap.rpartition(":")
    if host not in LOOPBACK:
        pytest.fail(f"no Kafka broker answers at {bootstrap} (LATCH_TEST_BOOTSTRAP)")
    if broker.main(["start", "--port", port]) != 0:
        pytest.fail(f"`latch broker start --port {port}` failed; see its error above")
    try:
        yield f"{broker.HOST}:{port}"
    finally:
        if not broker.stop():
            print(f"the broker this session started on port {port} was no longer running")


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


def _topic_name(test_name: str, suffix: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", test_name)[:80].strip("-")
    parts = ["latch-test", stem, suffix, uuid.uuid4().hex[:8]]
    return ".".join(part for part in parts if part)


def _wait_for_leaders(admin: AdminClient, topic: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if (
            meta is not None
            and meta.error is None
            and meta.partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} has no leader after {timeout:.0f}s")


@pytest.fixture
def make_topic(kafka_admin: AdminClient, request: pytest.FixtureRequest) -> Iterator[MakeTopic]:
    """Create uniquely named topics (``make_topic("events", partitions=3)``); delete them after."""
    created: list[str] = []

    def make(suffix: str = "", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = _topic_name(request.node.name, suffix)
        new = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        kafka_admin.create_topics([new], operation_timeout=30)[name].result(timeout=60)
        created.append(name)
        _wait_for_leaders(kafka_admin, name)
        return name

    yield make
    if created:
        for future in kafka_admin.delete_topics(created, operation_timeout=30).values():
            with contextlib.suppress(KafkaException):  # a leftover test topic is harmless
                future.result(timeout=60)
