"""``worker.runtime.admin``: the topics ``latch topics create`` makes and the settings it enforces
(issue 9: the events topic stamps records with the broker's time).
"""

from __future__ import annotations

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
