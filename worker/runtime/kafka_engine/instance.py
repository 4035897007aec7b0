"""One live kafka-engine worker per ``worker.instance_id``.

The transactional producer's ``transactional.id`` is ``<app_id>-<instance_id>``. Two live
workers given one ``instance_id`` fence each other: each ``init_transactions`` bumps the
producer epoch, the other's next transactional call fails as fenced, that worker exits,
is restarted, fences the first in turn, and so on for good. The worker therefore refuses
to start while another **live** worker holds its id; a restart whose predecessor is dead
must still start.

How a starting worker tells the two apart: the consumer group. When ``instance_id`` is
set, the engine's group consumer carries it in its ``client.id`` (:func:`client_id`:
the configured ``kafka.client_id``, or ``latch-worker``, then ``-<instance_id>``), which
the group coordinator reports for each member (DescribeConsumerGroups). Before its
``init_transactions`` (so before it can fence anyone) a starting worker looks for a member
with its own client id (:func:`check`):

* none: it starts (the usual case, and a restart after a clean stop, whose consumer left
  the group);
* one that goes away within the session timeout (``session.timeout.ms``) and a grace: it
  was a dead predecessor, which the coordinator expires once it misses its heartbeats for
  that long (a killed pod restarted at once). The worker then starts; its partitions would
  not have moved before that expiry anyway;
* one that stays longer: it heartbeats, so another worker holds the id. The newer worker
  stops with exit status 2 and an error naming the id and what to do; the older one never
  noticed.

Two workers that start at the same moment both pass, and one fences the other at once:
the fenced one exits (its error says that a worker with the same ``worker.instance_id``
may be running) and, restarted, finds the other in the group and refuses. A group that
cannot be described (no DESCRIBE permission on it) skips the check, with a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from worker.runtime.config import Config
from worker.runtime.observability import logs

__all__ = ["InstanceTaken", "check", "client_id", "fenced_hint"]

log = logging.getLogger("latch.worker")

#: How long past the session timeout a member with our client id may stay before it counts
#: as live (the coordinator's expiry is not to the millisecond).
GRACE_S = 5.0
_POLL_S = 1.0
_TIMEOUT_S = 15.0
#: The errors of a producer fenced by a newer one with its ``transactional.id``.
FENCED = frozenset({KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                    KafkaError._FENCED})


class InstanceTaken(Exception):
    """Another live worker holds this worker's ``instance_id``: exit 2."""


def client_id(config: Config) -> str | None:
    """The group consumer's ``client.id`` when ``worker.instance_id`` is set, else None
    (librdkafka's default)."""
    instance = config.worker.instance_id
    if not instance:
        return None
    return f"{config.kafka.client_id or 'latch-worker'}-{instance}"


def check(config: Config, settings: Mapping[str, Any], session_s: float) -> None:
    """Return once no live member of the worker group has this worker's client id (waiting
    up to ``session_s`` and :data:`GRACE_S` for a dead one to expire); raise
    :class:`InstanceTaken` if one stays."""
    mine = client_id(config)
    if mine is None:
        return
    group = config.worker.app_id
    client = AdminClient(logs.kafka_config(dict(settings)))
    deadline = time.monotonic() + session_s + GRACE_S
    waited = False
    while True:
        try:
            members = client.describe_consumer_groups(
                [group], request_timeout=_TIMEOUT_S)[group].result(timeout=_TIMEOUT_S).members
        except KafkaException as exc:
            log.warning("cannot describe consumer group %s (%s): not checking that worker."
                        "instance_id %s is this worker's alone", group, exc.args[0].str(),
                        config.worker.instance_id)
            return
        holders = [m for m in members if m.client_id == mine]
        if not holders:
            if waited:
                log.info("the previous holder of worker.instance_id %s left the group",
                         config.worker.instance_id)
            return
        if time.monotonic() > deadline:
            hosts = ", ".join(sorted({m.host for m in holders}))
            raise InstanceTaken(
                f"another live worker holds worker.instance_id {config.worker.instance_id} "
                f"(consumer group {group}, client.id {mine}, host {hosts}); two workers with "
                f"one instance_id fence each other's transactions (transactional.id "
                f"{group}-{config.worker.instance_id}) for good. Give each worker its own "
                f"worker.instance_id (e.g. its pod name), or stop the other one")
        if not waited:
            waited = True
            log.info("worker.instance_id %s is held by a member of group %s: waiting up to "
                     "%.0fs for it to leave (a stopped predecessor's session expires)",
                     config.worker.instance_id, group, session_s + GRACE_S)
        time.sleep(_POLL_S)


def fenced_hint(exc: BaseException, config: Config) -> str:
    """For an error that says this producer was fenced: a hint that a second worker with
    the same ``worker.instance_id`` may be running ('' otherwise)."""
    while exc is not None:
        if isinstance(exc, KafkaException) and isinstance(exc.args[0], KafkaError) \
                and exc.args[0].code() in FENCED:
            return (f" (a newer producer with this transactional.id started: if this worker "
                    f"was not replaced on purpose, another worker runs with worker.instance_id "
                    f"{config.worker.instance_id})")
        exc = exc.__cause__  # type: ignore[assignment]
    return ""
