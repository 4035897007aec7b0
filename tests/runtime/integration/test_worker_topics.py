"""``latch topics create`` against the real broker: it creates every topic the worker needs,
is idempotent, and refuses an existing topic with the wrong partition count."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from worker_harness import OUTPUTS, Stack

from worker.runtime import admin
from worker.runtime.engine import _check_topics


@pytest.fixture
def stack(kafka_bootstrap: str, kafka_admin: AdminClient,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """A stack whose topics do not exist yet, its LATCH_ variables set; deleted afterwards."""
    made = Stack(kafka_bootstrap, f"latch-it-topics-{uuid.uuid4().hex[:6]}", partitions=3)
    for name, value in made.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir("/")  # no ./latch.yaml
    yield made
    for future in kafka_admin.delete_topics(made.all_topics(), operation_timeout=30).values():
        with contextlib.suppress(KafkaException):
            future.result(timeout=60)


def test_creates_every_topic_once(stack: Stack, kafka_admin: AdminClient,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The first run creates events, control, the seven output topics (audit and pending among
    them), the results topic, the compacted heads changelog, the runner journal
    (compact,delete), the registry and, for the faust engine, faust's leader topic; the
    second run changes nothing."""
    assert admin.main(["create"]) == 0
    first = capsys.readouterr().out.splitlines()
    changelog = f"{stack.app_id}-heads-changelog"
    roles = ("events", "control", "committed", "errors", "final", "progress", "dlq", "audit",
             "results", "pending", "run_ended", "turns")
    assert set(OUTPUTS) <= set(roles)
    leader = f"{stack.app_id}-__assignor-__leader"  # the faust engine's (this stack's)
    names = [stack.topic(r) for r in roles] + [
        changelog, stack.topic("journal"), stack.topic("registry"), leader]
    assert [line.split()[:2] for line in first] == [["created", n] for n in names], first

    partitions = {n: admin._partition_count(kafka_admin, n) for n in names}
    assert partitions == {**dict.fromkeys(names, 3), stack.topic("registry"): 1, leader: 1}
    resource = ConfigResource(ConfigResource.Type.TOPIC, changelog)
    configs = kafka_admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.ms"].value == "3600000"  # so compaction can reach old heads
    resource = ConfigResource(ConfigResource.Type.TOPIC, stack.topic("journal"))
    configs = kafka_admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["cleanup.policy"].value == "compact,delete"  # the runner journal

    assert admin.main(["create"]) == 0
    second = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in second] == [["exists", n] for n in names], second


def test_wrong_partition_count_is_an_error(stack: Stack, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """An existing events topic with another partition count stops the command with exit
    status 2 and a message naming the topic, the expected and the actual count."""
    assert admin.main(["create"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("LATCH_TOPICS__PARTITIONS", "5")
    assert admin.main(["create"]) == 2
    err = capsys.readouterr().err
    assert f"topic {stack.topic('events')} has 3 partitions, expected 5" in err


def test_events_topic_stamps_records_with_the_brokers_time(
        stack: Stack, kafka_admin: AdminClient, capsys: pytest.CaptureFixture[str]) -> None:
    """The events topic is created with ``message.timestamp.type=LogAppendTime`` (idle expiry
    follows record time, which no producer may choose); an existing events topic with
    ``CreateTime`` stops ``latch topics create`` and the worker's start check with exit
    status 2 and a message naming the topic, the setting and the fix."""
    events = stack.topic("events")
    resource = ConfigResource(ConfigResource.Type.TOPIC, events)
    assert admin.main(["create"]) == 0
    assert admin._partition_count(kafka_admin, events) == 3  # metadata has it now
    configs = kafka_admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["message.timestamp.type"].value == "LogAppendTime"
    capsys.readouterr()

    entry = ConfigEntry("message.timestamp.type", "CreateTime",
                        incremental_operation=AlterConfigOpType.SET)
    altered = ConfigResource(ConfigResource.Type.TOPIC, events, incremental_configs=[entry])
    kafka_admin.incremental_alter_configs([altered])[altered].result(timeout=30)
    while kafka_admin.describe_configs([resource])[resource].result(timeout=30)[
            "message.timestamp.type"].value != "CreateTime":  # the broker applies it shortly
        time.sleep(0.1)
    assert admin.main(["create"]) == 2
    err = capsys.readouterr().err
    assert (f"topic {events} has message.timestamp.type=CreateTime, expected LogAppendTime"
            in err)
    config = stack.config()
    with pytest.raises(admin.TopicsError, match=r"message\.timestamp\.type=CreateTime"):
        _check_topics(config)
