"""The kafka engine's bounded ``read_committed`` reader (``worker/runtime/kafka_engine/reader.py``),
without a broker: which consumer errors a rebuild's read passes over. The real-broker proofs
are ``tests/runtime/integration/test_kafka_engine_recovery.py``."""

from __future__ import annotations

from confluent_kafka import KafkaError

from worker.runtime.kafka_engine import reader


def test_a_reader_reads_on_past_errors_the_consumer_recovers_from() -> None:
    """A broker or node away (transport, all brokers down, destroyed handle, no leader) is
    passed over by the rebuild's reader; an unknown partition or a fatal error is not."""
    assert all(reader.passing(KafkaError(code)) for code in (
        KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._DESTROY_BROKER,
        KafkaError.LEADER_NOT_AVAILABLE))
    assert not reader.passing(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    assert not reader.passing(KafkaError(KafkaError._TRANSPORT, fatal=True))
