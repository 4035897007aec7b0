"""The kafka engine's rebalances (``worker/runtime/kafka_engine/rebalance.py``), without a
broker: a revocation commits the open transaction while the partitions are still owned, a
lost assignment aborts it, both let the partitions' states and heads go, and a takeover's
broker queries outlast a destroyed broker handle. The real-broker proofs are
``tests/runtime/integration/test_kafka_engine_recovery.py`` and ``test_worker_failover.py``."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from worker.core import Assembler
from worker.runtime.config import load_config
from worker.runtime.kafka_engine import engine as kafka_engine
from worker.runtime.partition import PartitionState, encode_head


def _owning(partitions: list[int]) -> kafka_engine.KafkaEngine:
    """An engine that owns ``partitions`` of the events and control topics, each events
    partition with a head in its table."""
    config = load_config(None, env={})
    engine = kafka_engine.KafkaEngine(config)
    for partition in partitions:
        engine.partitions[partition] = PartitionState(Assembler(config.assemble), next_offset=3)
        engine.control_next[partition] = 1
        engine.table.restore(partition, [(b"run-%d" % partition,
                                          encode_head({"p": partition, "start": 0}))])
    return engine


def _topic_partitions(engine: kafka_engine.KafkaEngine, partitions: list[int]) -> list[Any]:
    return [TopicPartition(topic, p) for p in partitions for topic in (engine.events,
                                                                         engine.control)]


def test_a_revocation_commits_while_the_partitions_are_still_owned_then_drops_them() -> None:
    """``on_revoke``: the open transaction commits first (its partitions still owned, so
    their offsets are this worker's to commit); then the revoked partitions' states,
    forwarded offsets and heads go, and the others stay."""
    engine = _owning([0, 1])
    owned_at_commit: list[list[int]] = []

    def commit(rewind: bool = True, wait: bool = True) -> None:
        owned_at_commit.append(sorted(engine.partitions))

    engine._commit = commit  # type: ignore[method-assign]
    engine._on_revoke(engine.consumer, _topic_partitions(engine, [1]))
    assert owned_at_commit == [[0, 1]]
    assert sorted(engine.partitions) == [0] and sorted(engine.control_next) == [0]
    assert b"run-0" in engine.table and b"run-1" not in engine.table


def test_a_lost_assignment_aborts_the_transaction_and_drops_the_partitions() -> None:
    """``on_lost``: someone else owns the partitions already, so nothing is committed: the
    transaction is abandoned (aborted), the pending heads writes forgotten, the lost
    partitions dropped."""
    engine = _owning([0, 1])
    abandoned: list[str] = []

    def commit(rewind: bool = True, wait: bool = True) -> None:
        pytest.fail("a lost assignment commits nothing")

    def abandon(reason: str) -> None:
        abandoned.append(reason)

    engine._commit = commit  # type: ignore[method-assign]
    engine.txn.abandon = abandon  # type: ignore[method-assign,assignment]
    engine._on_lost(engine.consumer, _topic_partitions(engine, [0, 1]))
    assert abandoned == ["the assignment was lost"]
    assert engine.partitions == {} and engine.control_next == {}
    assert b"run-0" not in engine.table and b"run-1" not in engine.table
    assert engine.table.take_pending() == []


def test_a_takeover_query_outlasts_a_destroyed_broker_handle() -> None:
    """``_query`` calls again after a non-fatal failure (a cluster node killed mid-query:
    ``_DESTROY_BROKER``, which stopped two workers of the 3-broker chaos run) and returns the
    answer; a fatal error is raised at once."""
    engine = kafka_engine.KafkaEngine(load_config(None, env={}))
    failures = [KafkaException(KafkaError(KafkaError._DESTROY_BROKER))]

    def query() -> tuple[int, int]:
        if failures:
            raise failures.pop()
        return 0, 7

    assert engine._query(query) == (0, 7)
    fatal = KafkaException(KafkaError(KafkaError._FENCED, fatal=True))

    def fenced() -> None:
        raise fatal

    with pytest.raises(KafkaException):
        engine._query(fenced)
