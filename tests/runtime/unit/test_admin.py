"""``worker.runtime.admin``: the topics ``latch topics create`` makes and the settings it enforces
(issue 9: the events topic stamps records with the broker's time).
"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from worker.runtime import admin
from worker.runtime.config import load_config


def test_events_topic_is_created_with_log_append_time() -> None:
    """``latch topics create`` makes the events topic stamp records with the broker's time
    (``LogAppendTime``), so no producer's clock decides idle expiry; the setting is enforced
    on an existing topic (tests/runtime/integration/test_worker_topics.py)."""
    config = load_config(None, env={})
    (events,) = [s for s in admin.specs(config) if s.name == config.topics.events]
    assert ("message.timestamp.type", "LogAppendTime") in events.config
    assert "message.timestamp.type" in admin.ENFORCED


def test_the_faust_engine_s_leader_topic_is_made_with_the_others() -> None:
    """``latch topics create`` for the faust engine makes faust's leader topic (one
    partition) with the rest, so that workers starting together never ask for a topic the
    first of them is still creating (aiokafka logs that as an ERROR); the kafka engine has
    none. A worker still starts without it (faust makes it): it is not required."""
    faust = load_config(None, env={"LATCH_WORKER__ENGINE": "faust"})
    kafka = load_config(None, env={"LATCH_WORKER__ENGINE": "kafka"})
    [leader] = [s for s in admin.specs(faust) if s.name == admin.faust_leader(faust)]
    assert (leader.name, leader.partitions) == (f"{faust.worker.app_id}-__assignor-__leader", 1)
    assert admin.faust_leader(kafka) not in {s.name for s in admin.specs(kafka)}


class _LaggingAdmin:
    """An admin client whose metadata lists a created topic only from its third answer on
    (a broker's metadata lagging its CreateTopics answers, as seen on a loaded machine)."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.answers = 0

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> Any:
        self.answers += 1
        visible = self.created if self.answers > 3 else []
        meta = SimpleNamespace(error=None, partitions={0: None, 1: None})
        return SimpleNamespace(topics={name: meta for name in visible})

    def create_topics(self, topics: list[Any], operation_timeout: float = 0) -> dict[str, Any]:
        self.created += [t.topic for t in topics]
        done: Future[None] = Future()
        done.set_result(None)
        return {t.topic: done for t in topics}


def test_create_returns_once_the_metadata_lists_what_it_created() -> None:
    """``latch topics create`` (and ``latch demo``) returns only once the broker's metadata
    lists every topic it created: a worker started at once never finds one missing."""
    client = _LaggingAdmin()
    spec = admin.TopicSpec("t.events", 2, 1)
    assert admin.create(client, [spec]) == [  # type: ignore[arg-type]
        "created t.events (2 partitions, replication 1)"]
    assert client.answers > 3
    assert "t.events" in client.list_topics().topics
