"""A bounded reader of one partition, at ``read_committed`` as the kafka engine consumes.

A consumer of no group (it never commits), assigned to the one partition. Offsets below the
log start (deleted by retention) are skipped. Records of aborted transactions are not seen,
and neither are transaction markers: offsets have gaps, which is why the reader stops at the
partition's end or at the first offset at or past ``stop``, not at ``stop - 1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from worker.runtime.observability import logs
from worker.runtime.step import Record, Source

_new = tuple.__new__

__all__ = ["lags", "passing", "read", "read_all", "record_at", "record_of", "where"]


def where(msg: Message) -> tuple[str, int, int]:
    """A consumed record's topic, partition and offset (always set on a record)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def record_of(msg: Message) -> Record:
    """A confluent-kafka message as the core takes it (record time in ms, or None)."""
    return record_at(msg, *where(msg))


def record_at(msg: Message, topic: str, partition: int, offset: int) -> Record:
    """:func:`record_of`, its topic, partition and offset read already (the engine's hot
    path reads them first, to skip a repeat)."""
    kind, ts = msg.timestamp()
    # step.record inlined (the engine's every record): a NamedTuple at a tuple's cost
    return _new(Record, (msg.key(), msg.value() or b"", None if kind == 0 else ts,
                         _new(Source, (topic, partition, offset))))


#: Errors the consumer reports and recovers from by itself (a broker or cluster node away).
_PASSING = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                      KafkaError._DESTROY_BROKER, KafkaError._TIMED_OUT, KafkaError._RESOLVE,
                      KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION})


def passing(error: KafkaError) -> bool:
    """Whether a consumer error is one librdkafka recovers from itself: read on."""
    return not error.fatal() and error.code() in _PASSING


def _reader(settings: Mapping[str, str]) -> Consumer:
    # fetch.wait.max.ms: an empty partition's end is known at once, not after 500 ms
    return Consumer(logs.kafka_config({
        **settings, "group.id": "latch-reader", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest",
        "isolation.level": "read_committed", "fetch.wait.max.ms": 10}))


def read(settings: Mapping[str, str], topic: str, partition: int, start: int | None = None,
         stop: int | None = None) -> Iterator[Message]:
    """The committed records of a partition from ``start`` (None: the beginning) to ``stop``
    (excluded; None: its end as the reader finds it)."""
    consumer = _reader(settings)
    try:
        offset = OFFSET_BEGINNING if start is None else start
        consumer.assign([TopicPartition(topic, partition, offset)])
        while True:
            for msg in consumer.consume(1000, timeout=0.1):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    if not passing(error):
                        raise KafkaException(error)
                if stop is not None and where(msg)[2] >= stop:
                    return
                yield msg
    finally:
        consumer.close()


def read_all(settings: Mapping[str, str], topic: str, partitions: Iterable[int]
             ) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    """The committed (key, value) records of several partitions of a topic, each from its
    beginning to its end as the reader finds it, read by one consumer."""
    found: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in partitions}
    if not found:
        return found
    consumer = _reader(settings)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in found])
        left = set(found)
        while left:
            for msg in consumer.consume(1000, timeout=0.1):
                error = msg.error()
                _, partition, _ = where(msg)
                if error is None:
                    found[partition].append((msg.key(), msg.value()))
                elif error.code() == KafkaError._PARTITION_EOF:
                    left.discard(partition)
                elif not passing(error):
                    raise KafkaException(error)
        return found
    finally:
        consumer.close()


def lags(consumer: Consumer, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    """Each of ``partitions``' lag: its end offset in the consumer's cache (at
    ``read_committed``, the last stable offset; no request to the broker) less the
    consumer's position, which passes the transaction markers that no record follows. A
    partition the consumer cannot say yet is left out (unknown until the next turn)."""
    found: dict[int, int] = {}
    try:
        positions = consumer.position([TopicPartition(topic, p) for p in partitions])
        for tp in positions:
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if high >= 0 and tp.offset >= 0:
                found[tp.partition] = max(0, high - tp.offset)
    except KafkaException:  # unknown until the next turn
        pass
    return found
