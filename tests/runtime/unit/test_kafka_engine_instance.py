"""One live kafka-engine worker per ``worker.instance_id``
(``worker/runtime/kafka_engine/instance.py``), without a broker: the consumer's client id that
names the instance, the check a starting worker makes through the group's members (start
when none holds the id, or once a dead predecessor's session expires; refuse while a live one
holds it; skip, with a warning, when the group cannot be described), and the hint a fenced
worker stops with. The real-broker proof is ``tests/runtime/integration/test_instance_id.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.runtime.config import Config, load_config
from worker.runtime.kafka_engine import instance

W0 = {"LATCH_WORKER__INSTANCE_ID": "w-0", "LATCH_WORKER__APP_ID": "app"}


def test_the_consumer_client_id_names_the_instance_only_when_one_is_set() -> None:
    """With worker.instance_id the consumer's client.id is the configured client id (or
    latch-worker) and the instance; without one, librdkafka's default stays."""
    assert instance.client_id(load_config(None, env={})) is None
    assert instance.client_id(load_config(None, env={"LATCH_WORKER__INSTANCE_ID": "w-0"})) \
        == "latch-worker-w-0"
    assert instance.client_id(load_config(None, env={"LATCH_WORKER__INSTANCE_ID": "w-0",
                                                     "LATCH_KAFKA__CLIENT_ID": "gw"})) \
        == "gw-w-0"


def test_a_fenced_producers_error_hints_at_a_shared_instance_id() -> None:
    """The error a fenced worker stops with names its instance id, through a chain of
    causes; other errors get no hint."""
    config = load_config(None, env={"LATCH_WORKER__INSTANCE_ID": "w-0"})
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    try:
        raise RuntimeError("transaction") from fenced
    except RuntimeError as exc:
        assert "worker.instance_id w-0" in instance.fenced_hint(exc, config)
    epoch = KafkaException(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH))
    assert "worker.instance_id w-0" in instance.fenced_hint(epoch, config)
    assert instance.fenced_hint(KafkaException(KafkaError(KafkaError._TRANSPORT)), config) == ""
    assert instance.fenced_hint(RuntimeError("other"), config) == ""


class _Admin:
    """The AdminClient as :func:`instance.check` uses it: each describe answers the group's
    members from ``answers`` in turn (the last one again once they run out); an exception
    in ``answers`` is raised by the describe's result."""

    def __init__(self, answers: list[Any]) -> None:
        self.made: list[dict[str, Any]] = []
        self.answers: Iterator[Any] = iter(answers)
        self.last: Any = None

    def __call__(self, settings: dict[str, Any]) -> _Admin:
        self.made.append(settings)
        return self

    def describe_consumer_groups(self, groups: list[str], request_timeout: float) -> Any:
        answer = next(self.answers, self.last)
        self.last = answer

        def result(timeout: float) -> Any:
            if isinstance(answer, Exception):
                raise answer
            return SimpleNamespace(members=[SimpleNamespace(client_id=c, host=h)
                                            for c, h in answer])

        return {groups[0]: SimpleNamespace(result=result)}


def _checking(monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> _Admin:
    """``instance.check`` against a fake group that answers ``answers``, polling at once."""
    admin = _Admin(answers)
    monkeypatch.setattr(instance, "AdminClient", admin)
    monkeypatch.setattr(instance, "_POLL_S", 0.0)
    monkeypatch.setattr(instance, "GRACE_S", 0.0)
    return admin


def _config() -> Config:
    return load_config(None, env=W0)


def test_without_an_instance_id_nothing_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``worker.instance_id``: no admin client is made, the worker starts."""
    admin = _checking(monkeypatch, [[("latch-worker-w-0", "/10.0.0.1")]])
    instance.check(load_config(None, env={}), {}, session_s=0.0)
    assert admin.made == []


def test_a_group_without_the_id_lets_the_worker_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Members with other client ids (other instances) do not hold this worker's id."""
    admin = _checking(monkeypatch, [[("latch-worker-w-1", "/10.0.0.2")]])
    instance.check(_config(), {"bootstrap.servers": "b:9092"}, session_s=10.0)
    assert len(admin.made) == 1


def test_a_dead_predecessor_is_waited_for_until_it_leaves(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A member with this worker's client id that goes away within the session timeout (a
    killed predecessor expiring): the worker waits for it, logs both ends, then starts."""
    held = [("latch-worker-w-0", "/10.0.0.1")]
    _checking(monkeypatch, [held, held, []])
    with caplog.at_level("INFO", logger="latch.worker"):
        instance.check(_config(), {}, session_s=60.0)
    assert "worker.instance_id w-0 is held by a member of group app" in caplog.text
    assert "the previous holder of worker.instance_id w-0 left the group" in caplog.text


def test_a_live_holder_refuses_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A member with this worker's client id that stays past the session timeout and the
    grace heartbeats: :class:`InstanceTaken`, naming the id, the group, the client id and
    the holder's host, and what to do."""
    _checking(monkeypatch, [[("latch-worker-w-0", "/10.0.0.1")]])
    with pytest.raises(instance.InstanceTaken) as taken:
        instance.check(_config(), {}, session_s=0.0)
    message = str(taken.value)
    assert "worker.instance_id w-0" in message and "consumer group app" in message
    assert "client.id latch-worker-w-0" in message and "host /10.0.0.1" in message
    assert "Give each worker its own worker.instance_id" in message


def test_a_group_that_cannot_be_described_skips_the_check(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No DESCRIBE permission on the group: the check is skipped with a warning naming the
    group and the error, and the worker starts."""
    denied = KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "denied"))
    _checking(monkeypatch, [denied])
    with caplog.at_level("WARNING", logger="latch.worker"):
        instance.check(_config(), {}, session_s=60.0)
    assert "cannot describe consumer group app (denied)" in caplog.text
