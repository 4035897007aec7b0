"""The kafka engine's client settings: a group consumer that reads committed records only and
moves offsets only through transactions, and a transactional producer."""

from __future__ import annotations

from typing import Any

from worker.runtime import admin
from worker.runtime.config import Config

__all__ = ["consumer_settings", "producer_settings"]


#: ``max.partition.fetch.bytes`` of the group consumer (librdkafka's default: 1 MiB).
FETCH_PARTITION_BYTES = 8 * 1024 * 1024


def consumer_settings(config: Config) -> dict[str, Any]:
    """The group consumer: offsets only through transactions, committed records only.

    ``max.partition.fetch.bytes`` 8 MiB (overridable under ``kafka:``): at librdkafka's 1 MiB
    a partition's fetch held about 3,700 envelopes, and on a 402,666-envelope backlog the
    engine waited for its fetches: 102,199 to 127,184 envelopes/s in 5 rounds, 145,000 to
    151,000 with 8 MiB (the bare loop, 139,000 to 160,000, gains nothing from it;
    docs/benchmarks.md). librdkafka's prefetch stays bounded by
    ``queued.max.messages.kbytes``."""
    return {"session.timeout.ms": 15000, "max.partition.fetch.bytes": FETCH_PARTITION_BYTES,
            **config.kafka.confluent_config(),
            "group.id": config.worker.app_id, "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed", "partition.assignment.strategy": "range"}


def producer_settings(config: Config, instance: str, batch_bytes: int | None = None
                      ) -> dict[str, Any]:
    """The transactional producer: Java's partitioner (a forwarded cancel lands in its run's
    partition, as the gateway's records do), output records up to the output topics' size.

    ``retry.backoff.ms`` 10 (librdkafka's default 100; overridable under ``kafka:``): right
    after a commit the coordinator is still writing the markers and answers the next
    transaction's AddOffsetsToTxn with CONCURRENT_TRANSACTIONS; each retry waited 100 ms, and
    ``send_offsets_to_transaction`` took 84 to 108 ms a transaction against 3 to 15 ms
    (measured on the local broker; Java's client lowered this backoff for the same reason,
    KAFKA-5477). Now 2 ms: with transactions committed as soon as their input is drained,
    the markers are usually written within a few ms, and a 10 ms backoff still made
    ``send_offsets_to_transaction`` take 12.5 ms at the median (2.1 to 3.6 ms at 2 ms; paced
    load of 1,000 envelopes/s, docs/benchmarks.md). librdkafka backs off exponentially from
    there (2, 4, 8 ms ...) to ``retry.backoff.max.ms`` on repeated failures.

    ``batch_bytes``: a ``batch.size`` below every written topic's ``max.message.bytes``
    (:meth:`worker.runtime.refusals.Limits.batch_bytes`; the broker refuses a whole batch over
    it)."""
    worker = config.worker
    batch = {} if batch_bytes is None else {"batch.size": batch_bytes}
    return {"retry.backoff.ms": 2, **config.kafka.confluent_config(), **batch,
            "transactional.id": f"{worker.app_id}-{instance}",
            "transaction.timeout.ms": int(worker.transaction_timeout_s * 1000),
            "partitioner": "murmur2_random", "linger.ms": 5,
            "message.max.bytes": admin.OUTPUT_MAX_BYTES,
            # delivery reports of failures only (all the engine counts): a report needs the
            # GIL, which the commit's thread would otherwise wait for while the loop runs
            "delivery.report.only.error": True}
