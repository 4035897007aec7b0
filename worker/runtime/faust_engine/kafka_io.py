"""The worker's Kafka plumbing that is not faust: client settings, and a bounded reader.

``latch.yaml``'s ``kafka`` section speaks librdkafka (``bootstrap.servers``,
``security.protocol``, ``sasl.mechanism`` ...), which confluent-kafka takes as is. faust and
aiokafka take the same ideas under other names; :func:`faust_credentials` and
:func:`aiokafka_options` map the named keys. Pass-through librdkafka settings
(``kafka.extra``) have no aiokafka equivalent: :func:`ignored_settings` lists them so the
worker can say so at start.

Supported: ``PLAINTEXT``; ``SSL`` (CA file, optional client certificate and key);
``SASL_PLAINTEXT`` and ``SASL_SSL`` with ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``.
GSSAPI and OAUTHBEARER need code and are refused with :class:`KafkaSetupError`.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

# aiokafka ships no py.typed marker (its classes are typed, but mypy cannot see them).
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition  # type: ignore[import-untyped]
from aiokafka.helpers import create_ssl_context  # type: ignore[import-untyped]

from worker.runtime.config import KafkaSettings

_SASL = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
_PROTOCOLS = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}


class KafkaSetupError(ValueError):
    """The ``kafka`` settings ask for something the worker's clients cannot do."""


def servers(kafka: KafkaSettings) -> list[str]:
    """``host:port`` of each bootstrap server."""
    return [s.strip() for s in kafka.bootstrap_servers.split(",") if s.strip()]


def _protocol(kafka: KafkaSettings) -> str:
    protocol = (kafka.security_protocol or "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise KafkaSetupError(f"kafka.security_protocol {protocol} is not supported")
    mechanism = (kafka.sasl_mechanism or "PLAIN").upper()
    if protocol.startswith("SASL") and mechanism not in _SASL:
        raise KafkaSetupError(f"kafka.sasl_mechanism {mechanism} is not supported by the "
                              f"worker yet (supported: {', '.join(sorted(_SASL))})")
    return protocol


def _ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    context: ssl.SSLContext = create_ssl_context(
        cafile=kafka.ssl_cafile, certfile=kafka.ssl_certfile, keyfile=kafka.ssl_keyfile)
    return context


def faust_credentials(kafka: KafkaSettings) -> Any:
    """The ``broker_credentials`` faust setting for these settings (None: plaintext)."""
    import faust

    protocol = _protocol(kafka)
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return faust.SSLCredentials(_ssl_context(kafka))
    return faust.SASLCredentials(
        username=kafka.sasl_username, password=kafka.sasl_password,
        mechanism=(kafka.sasl_mechanism or "PLAIN").upper(),
        ssl_context=_ssl_context(kafka) if protocol == "SASL_SSL" else None)


def aiokafka_options(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments that connect an aiokafka client as these settings say."""
    protocol = _protocol(kafka)
    options: dict[str, Any] = {"bootstrap_servers": servers(kafka), "security_protocol": protocol}
    if kafka.client_id:
        options["client_id"] = kafka.client_id
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = _ssl_context(kafka)
    if protocol.startswith("SASL"):
        options |= {"sasl_mechanism": (kafka.sasl_mechanism or "PLAIN").upper(),
                    "sasl_plain_username": kafka.sasl_username,
                    "sasl_plain_password": kafka.sasl_password}
    return options


def ignored_settings(kafka: KafkaSettings) -> list[str]:
    """Pass-through librdkafka settings that the worker's aiokafka clients cannot use."""
    return sorted(key.replace("_", ".") for key in kafka.extra)


async def read_range(options: dict[str, Any], topic: str, partition: int,
                     start: int, stop: int) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
    """The records of one partition with ``start <= offset < stop``, in order.

    A consumer of no group (nothing is committed), assigned to the one partition. Offsets
    below the log start (deleted by retention) are skipped. ``read_committed``, as the faust
    engine's consumer reads (decision 0009): the kafka engine's aborted ticks and cancels are
    not read, and its transaction markers leave gaps in the offsets.
    """
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False,
                                isolation_level="read_committed",
                                auto_offset_reset="earliest", **options)
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        while await consumer.position(tp) < stop:
            batch = await consumer.getmany(tp, timeout_ms=500)
            for record in batch.get(tp, []):
                if record.offset >= stop:
                    return
                yield record
    finally:
        await consumer.stop()


async def resume_offset(options: dict[str, Any], group: str, topic: str, partition: int) -> int:
    """Where ``group`` resumes ``partition``: its committed offset, or the log start when it
    has none (or retention deleted it). The consumer assigns, so it never joins the group."""
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(group_id=group, enable_auto_commit=False, **options)
    try:  # stopped even when it cannot start (the broker is away)
        await consumer.start()
        consumer.assign([tp])
        committed = await consumer.committed(tp)
        first = (await consumer.beginning_offsets([tp]))[tp]
    finally:
        await consumer.stop()
    return int(first if committed is None else max(committed, first))


async def end_offsets(options: dict[str, Any], topic: str,
                      partitions: list[int]) -> dict[int, int]:
    """The log end offset (the next offset to be written) of each of ``partitions``."""
    if not partitions:
        return {}
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False, **options)
    try:  # stopped even when it cannot start (the broker is away)
        await consumer.start()
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return {tp.partition: int(offset) for tp, offset in ends.items()}
