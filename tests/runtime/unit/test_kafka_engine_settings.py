"""The kafka engine's client settings (``worker/runtime/kafka_engine/settings.py``): a group
consumer that reads committed records only and moves offsets only through transactions, and a
transactional producer, whatever the ``kafka:`` section passes through; the tuned defaults
that section may still override."""

from __future__ import annotations

from worker.runtime import admin
from worker.runtime.config import load_config
from worker.runtime.kafka_engine.settings import (
    FETCH_PARTITION_BYTES,
    consumer_settings,
    producer_settings,
)


def test_client_settings_hold_exactly_once_whatever_the_kafka_section_says() -> None:
    """The consumer reads committed records and never commits on its own, in the worker's
    group, even when pass-through settings say otherwise; the producer is transactional,
    named after the app and the instance, with the configured timeout and Java's
    partitioner (a forwarded cancel lands in its run's partition)."""
    config = load_config(None, env={
        "LATCH_WORKER__APP_ID": "app", "LATCH_WORKER__TRANSACTION_TIMEOUT_S": "7",
        "LATCH_KAFKA__ENABLE_AUTO_COMMIT": "true", "LATCH_KAFKA__ISOLATION_LEVEL":
        "read_uncommitted", "LATCH_KAFKA__SESSION_TIMEOUT_MS": "6000"})
    consumer = consumer_settings(config)
    assert (consumer["group.id"], consumer["enable.auto.commit"],
            consumer["isolation.level"], consumer["session.timeout.ms"]) == (
        "app", False, "read_committed", "6000")
    producer = producer_settings(config, "slot-1")
    assert (producer["transactional.id"], producer["transaction.timeout.ms"],
            producer["partitioner"]) == ("app-slot-1", 7000, "murmur2_random")


def test_the_transactional_producer_retries_quickly_unless_configured_otherwise() -> None:
    """The producer's retry backoff is 2 ms (librdkafka's 100 ms default made each
    ``send_offsets_to_transaction`` wait out CONCURRENT_TRANSACTIONS retries right after the
    previous commit); a ``kafka:`` setting still overrides it."""
    assert producer_settings(load_config(None, env={}), "i")["retry.backoff.ms"] == 2
    config = load_config(None, env={"LATCH_KAFKA__RETRY_BACKOFF_MS": "50"})
    assert producer_settings(config, "i")["retry.backoff.ms"] == "50"


def test_the_consumer_fetches_8_mib_a_partition_unless_configured_otherwise() -> None:
    """The group consumer asks for up to 8 MiB a partition a fetch (librdkafka's 1 MiB held
    the engine back under a backlog, issue 24); a ``kafka:`` setting still overrides it."""
    settings = consumer_settings(load_config(None, env={}))
    assert settings["max.partition.fetch.bytes"] == 8 * 1024 * 1024
    config = load_config(None, env={"LATCH_KAFKA__MAX_PARTITION_FETCH_BYTES": "1048576"})
    assert consumer_settings(config)["max.partition.fetch.bytes"] == "1048576"


def test_the_producer_batch_size_is_set_only_when_the_limits_ask() -> None:
    """``batch.size`` is left to librdkafka unless the output topics' limits ask for less
    (``batch_bytes``); the producer may send records up to the largest output, reports only
    failed deliveries, and lingers 5 ms."""
    config = load_config(None, env={})
    assert "batch.size" not in producer_settings(config, "i")
    producer = producer_settings(config, "i", batch_bytes=9_000)
    assert producer["batch.size"] == 9_000
    assert producer["message.max.bytes"] == admin.OUTPUT_MAX_BYTES
    assert producer["delivery.report.only.error"] is True
    assert producer["linger.ms"] == 5


def test_the_kafka_section_cannot_move_the_group_or_its_offsets() -> None:
    """The consumer's group, offset reset, offset store and assignment strategy are the
    engine's, whatever ``kafka:`` says; ``kafka:`` connection settings pass through to both
    clients."""
    config = load_config(None, env={
        "LATCH_WORKER__APP_ID": "app", "LATCH_KAFKA__BOOTSTRAP_SERVERS": "b1:9092,b2:9092",
        "LATCH_KAFKA__GROUP_ID": "elsewhere", "LATCH_KAFKA__AUTO_OFFSET_RESET": "latest",
        "LATCH_KAFKA__ENABLE_AUTO_OFFSET_STORE": "true",
        "LATCH_KAFKA__TRANSACTIONAL_ID": "stolen"})
    consumer = consumer_settings(config)
    assert (consumer["group.id"], consumer["auto.offset.reset"],
            consumer["enable.auto.offset.store"], consumer["partition.assignment.strategy"]
            ) == ("app", "earliest", False, "range")
    assert consumer["bootstrap.servers"] == "b1:9092,b2:9092"
    producer = producer_settings(config, "w-0")
    assert producer["transactional.id"] == "app-w-0"
    assert producer["bootstrap.servers"] == "b1:9092,b2:9092"
    assert consumer_settings(load_config(None, env={}))[
        "max.partition.fetch.bytes"] == FETCH_PARTITION_BYTES
