"""``latch topics create``: provision every topic the worker reads and writes.

The events and control topics and the heads changelog (``<app_id>-heads-changelog``,
compacted) must have the same partition count: a run's records, its cancels and its head
live in partitions of the same number. The output topics take the same count. An existing
topic with the right count is left alone, so the command is idempotent; one with another
count is an error that names it (exit status 2), because repartitioning moves runs between
partitions and must be done by hand.

The events topic is created with ``message.timestamp.type=LogAppendTime``: its record times
(from which idle expiry is measured) are the broker's, never a producer's. An existing events
topic with ``CreateTime`` is refused, here and when the worker starts, with the command that
fixes it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource  # not re-exported for mypy
from confluent_kafka.cimpl import NewTopic

from worker.core.settings import OUTPUT_RECORD_BYTES
from worker.runtime.config import Config, ConfigError, load_config
from worker.runtime.observability import logs
from worker.runtime.refusals import Limits

log = logging.getLogger("latch.worker")

EXIT_OK, EXIT_USAGE, EXIT_KAFKA = 0, 2, 1
_TIMEOUT_S = 30.0

#: The largest record the worker may write to an output topic (``max.message.bytes`` of the
#: output topics; the worker's producer takes the same limit). Kafka's default, 1 MiB, is too
#: small: a DLQ record carries its input record in base64 (4/3 of a record that may itself be
#: near 1 MiB), and a final message carries the argument text of all of a run's calls. A record
#: over the limit could never be sent, and the worker would stop on it at every restart. The
#: core's own constant (``worker.core.settings.OUTPUT_RECORD_BYTES``): it keeps every committed
#: call, error result and final message it emits below it, and the configuration refuses
#: limits that would let one outgrow it.
OUTPUT_MAX_BYTES = OUTPUT_RECORD_BYTES


#: The events topic's records carry the broker's time, not the producer's: idle expiry is
#: measured in record time, so a gateway's clock (skewed, or chosen to expire other runs) must
#: not set it. Checked on existing topics too (:data:`ENFORCED`).
LOG_APPEND_TIME = ("message.timestamp.type", "LogAppendTime")
#: Topic settings that an existing topic must have as well: a wrong value is an error.
ENFORCED = frozenset({LOG_APPEND_TIME[0]})


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: tuple[tuple[str, str], ...] = ()


class TopicsError(Exception):
    """An existing topic does not fit the configuration."""


def heads_changelog(config: Config) -> str:
    """The name faust gives the changelog of the ``heads`` table."""
    return f"{config.worker.app_id}-heads-changelog"


def faust_leader(config: Config) -> str:
    """The name of faust's leader-election topic (``LeaderAssignor``: ``<app_id>-__assignor-
    __leader``, one partition), which the faust engine otherwise creates as it starts: two
    workers starting together then each ask for its metadata before the broker has it, and
    aiokafka logs an ERROR for a topic that is there a moment later."""
    return f"{config.worker.app_id}-__assignor-__leader"


def copartitioned(config: Config) -> list[TopicSpec]:
    """The topics whose partitions must match the events topic's: events, control, changelog."""
    names = {config.topics.events, config.topics.control, heads_changelog(config)}
    return [s for s in specs(config) if s.name in names]


def specs(config: Config) -> list[TopicSpec]:
    """Every topic the worker needs, as the configuration describes it, and the runner's
    results and journal topics (the worker never touches them; ``latch topics create`` makes
    them)."""
    t = config.topics
    inputs = [TopicSpec(t.events, t.partitions, t.replication_factor, (LOG_APPEND_TIME,)),
              TopicSpec(t.control, t.partitions, t.replication_factor)]
    large = (("max.message.bytes", str(OUTPUT_MAX_BYTES)),)
    outputs = [TopicSpec(name, t.partitions, t.replication_factor, large)
               for name in (t.committed, t.errors, t.final, t.progress, t.dlq, t.audit,
                            t.results, t.pending, t.run_ended, t.turns)]
    # Compacted, with hourly segments and an eager cleaner: Kafka never compacts the active
    # segment (7 days by default), and every takeover reads the whole changelog back
    # (docs/recovery.md: 41,000 records took 5.4 s, 2.8 s once compacted).
    hour_ms = "3600000"
    compacted = (("cleanup.policy", "compact"), ("segment.ms", hour_ms),
                 ("min.cleanable.dirty.ratio", "0.1"), ("delete.retention.ms", hour_ms))
    # The runner's journal (decision 0012): one record per executed call, each its own
    # idempotency key, so compaction only drops a key's repeats; retention (the broker's
    # default, 7 days, as the committed topic's) drops what no redelivery can ask about.
    journal = TopicSpec(t.journal, t.partitions, t.replication_factor,
                        (("cleanup.policy", "compact,delete"), *compacted[1:]))
    # The registry (runtime/governance/registry.py): one partition, every version kept (its keys
    # carry a content digest), broker append times for the toolset wait rule.
    registry = TopicSpec(t.registry, 1, t.replication_factor,
                         (("cleanup.policy", "compact"), LOG_APPEND_TIME))
    # The faust engine's leader topic, made here with the rest (not by the first worker's
    # start, which races the others' metadata: :func:`faust_leader`).
    leader = ([TopicSpec(faust_leader(config), 1, t.replication_factor)]
              if config.worker.engine == "faust" else [])
    return [*inputs, *outputs, TopicSpec(heads_changelog(config), t.partitions,
                                         t.replication_factor, compacted), journal, registry,
            *leader]


def create(admin: AdminClient, wanted: Sequence[TopicSpec]) -> list[str]:
    """Create the missing topics; return one line per topic saying what was done.

    Raises :class:`TopicsError` when an existing topic has another partition count.
    """
    existing = _existing(admin, [s.name for s in wanted])
    _check(wanted, existing)
    _check_enforced(admin, [s for s in wanted if s.name in existing])
    missing = [s for s in wanted if s.name not in existing]
    lines = {s.name: f"exists  {s.name} ({s.partitions} partitions)" for s in wanted
             if s.name in existing}
    if missing:
        futures = admin.create_topics(
            [NewTopic(s.name, num_partitions=s.partitions,
                      replication_factor=s.replication_factor, config=dict(s.config))
             for s in missing], operation_timeout=_TIMEOUT_S)
        for spec in missing:
            try:
                futures[spec.name].result(timeout=_TIMEOUT_S * 2)
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
                # created meanwhile, or missing from a stale metadata answer: check it
                _check([spec], {spec.name: _partition_count(admin, spec.name)})
                lines[spec.name] = f"exists  {spec.name} ({spec.partitions} partitions)"
                continue
            extra = "".join(f", {key} {value}" for key, value in spec.config)
            lines[spec.name] = (f"created {spec.name} ({spec.partitions} partitions, "
                                f"replication {spec.replication_factor}{extra})")
        _listed(admin, [s.name for s in missing])
    return [lines[s.name] for s in wanted]


def _listed(admin: AdminClient, names: Sequence[str]) -> None:
    """Wait until the broker's metadata lists each of ``names`` whole (a created topic is
    there once its create answers, but a metadata answer may lag it: a worker started at once
    would find it missing, as `latch demo` did on a fresh, loaded broker); at most
    ``_TIMEOUT_S``, then :class:`TopicsError` naming the ones still missing."""
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        topics = admin.list_topics(timeout=_TIMEOUT_S).topics
        late = [name for name in names if name not in topics
                or topics[name].error is not None or not topics[name].partitions]
        if not late:
            return
        if time.monotonic() > deadline:
            raise TopicsError(f"topics {', '.join(late)} were created but the broker's "
                              f"metadata does not list them after {_TIMEOUT_S:.0f} s")
        time.sleep(0.1)


def verify(admin: AdminClient, required: Sequence[str], exact: Sequence[TopicSpec]) -> None:
    """Raise :class:`TopicsError` unless the ``required`` topics exist and the ``exact``
    ones that exist have their partition counts."""
    existing = _existing(admin, [*required, *(s.name for s in exact)])
    missing = [name for name in required if name not in existing]
    if missing:
        raise TopicsError(f"missing topics {', '.join(missing)} (create them with "
                          f"`latch topics create`)")
    _check(exact, existing)
    _check_enforced(admin, [s for s in exact if s.name in existing])


def _check(wanted: Sequence[TopicSpec], existing: dict[str, int]) -> None:
    wrong = [f"topic {s.name} has {existing[s.name]} partitions, expected {s.partitions}"
             for s in wanted if s.name in existing and existing[s.name] != s.partitions]
    if wrong:
        raise TopicsError("; ".join(wrong))


def _check_enforced(admin: AdminClient, wanted: Sequence[TopicSpec]) -> None:
    """Raise :class:`TopicsError` when an existing topic has another value for one of the
    :data:`ENFORCED` settings of its spec (saying how to fix it)."""
    asked = {s.name: {k: v for k, v in s.config if k in ENFORCED} for s in wanted}
    resources = {name: ConfigResource(ConfigResource.Type.TOPIC, name)
                 for name, settings in asked.items() if settings}
    if not resources:
        return
    futures = admin.describe_configs(list(resources.values()))
    wrong = []
    for name, resource in resources.items():
        actual = futures[resource].result(timeout=_TIMEOUT_S)
        for key, value in asked[name].items():
            have = actual[key].value if key in actual else None
            if have != value:
                wrong.append(f"topic {name} has {key}={have}, expected {value} (fix: "
                             f"kafka-configs.sh --alter --entity-type topics --entity-name "
                             f"{name} --add-config {key}={value})")
    if wrong:
        raise TopicsError("; ".join(wrong))


def _existing(admin: AdminClient, names: Sequence[str]) -> dict[str, int]:
    """The partition count of each of ``names`` that exists. A topic whose metadata is not
    whole yet (just created: an error, or no partitions) is asked for again until it is."""
    topics = admin.list_topics(timeout=_TIMEOUT_S).topics
    return {name: len(meta.partitions) if meta.error is None and meta.partitions
            else _partition_count(admin, name)
            for name, meta in topics.items() if name in names}


def _partition_count(admin: AdminClient, name: str) -> int:
    """The partition count of an existing topic, waiting for metadata to show it."""
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        meta = admin.list_topics(topic=name, timeout=_TIMEOUT_S).topics.get(name)
        if meta is not None and meta.error is None and meta.partitions:
            return len(meta.partitions)
        if time.monotonic() > deadline:
            raise TopicsError(f"topic {name} exists but its metadata never arrived")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    """``latch topics create [--config FILE]``."""
    parser = argparse.ArgumentParser(prog="latch topics", description="Provision the topics.")
    sub = parser.add_subparsers(required=True, metavar="ACTION")
    create_cmd = sub.add_parser("create", help="create every topic the worker needs")
    create_cmd.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"latch topics: {exc}", file=sys.stderr)
        return EXIT_USAGE
    settings: dict[str, str | int | float | bool] = {**config.kafka.confluent_config()}
    admin = AdminClient(logs.kafka_config(settings))
    try:
        for line in create(admin, specs(config)):
            print(line)
    except TopicsError as exc:
        print(f"latch topics: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KafkaException as exc:
        print(f"latch topics: Kafka error: {exc.args[0].str()}", file=sys.stderr)
        return EXIT_KAFKA
    return EXIT_OK


#: Kafka's default ``max.message.bytes``, for a topic whose setting cannot be read.
KAFKA_DEFAULT_MAX = 1048588


def read_limits(limits: Limits, settings: Mapping[str, Any], topics: Iterable[str],
                default_batch: int) -> tuple[bool, int | None]:
    """Read the written ``topics``' limits into ``limits`` (:func:`max_message_bytes`; both
    engines, at start and after a refusal for size): whether one changed, and the producer
    batch size the limits allow when it is below ``default_batch`` (None: the default
    does; the broker refuses a whole batch over a topic's limit)."""
    changed = limits.update(max_message_bytes(settings, topics))
    batch = limits.batch_bytes(default_batch)
    return changed, None if batch >= default_batch else batch


def max_message_bytes(settings: Mapping[str, Any], topics: Iterable[str]) -> dict[str, int]:
    """Each topic's effective ``max.message.bytes`` (its own, or the broker's default). A
    topic that cannot be described is left out, with a warning (its refusals then come from
    the broker; :class:`worker.runtime.refusals.Limits` takes them)."""
    names = sorted(set(topics))
    client = AdminClient(logs.kafka_config(dict(settings)))
    resources = {name: ConfigResource(ConfigResource.Type.TOPIC, name) for name in names}
    limits: dict[str, int] = {}
    try:
        futures = client.describe_configs(list(resources.values()),
                                          request_timeout=_TIMEOUT_S)
    except KafkaException as exc:
        log.warning("cannot read the topics' max.message.bytes (%s)", exc.args[0].str())
        return limits
    for name, resource in resources.items():
        try:
            entry = futures[resource].result(timeout=_TIMEOUT_S).get("max.message.bytes")
            limits[name] = int(entry.value) if entry is not None and entry.value else \
                KAFKA_DEFAULT_MAX
        except (KafkaException, ValueError) as exc:
            log.warning("cannot read max.message.bytes of topic %s (%s)", name,
                        type(exc).__name__)
    return limits
