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
