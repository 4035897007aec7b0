"""The kafka engine's guards against what failed its chaos run, without a broker: a
transactional call that never returns is reported (so the producer can be replaced), and a
tick waits for the control records already in the log to be forwarded (for a bounded time).
The real-broker proofs are ``tests/runtime/integration/test_kafka_engine_recovery.py``; the
rebalances' guards (a takeover query outlasting a destroyed broker handle):
test_kafka_engine_rebalance.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from worker.core import Assembler
from worker.runtime import driver
from worker.runtime.config import load_config
from worker.runtime.kafka_engine import engine as kafka_engine
from worker.runtime.kafka_engine import transaction
from worker.runtime.partition import TICK, PartitionState


class _Consumer:
    """The cached end offset of each control partition, as the last fetch reported it."""

    def __init__(self) -> None:
        self.high: dict[int, int] = {}

    def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
        assert cached  # never a request to the broker from the loop
        return 0, self.high.get(tp.partition, -1001)

    def close(self) -> None:
        pass


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, int | None]] = []

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                partition: int | None = None, **options: Any) -> None:
        self.sent.append((topic, key, partition))


def test_a_tick_waits_for_the_control_backlog_for_a_bounded_time() -> None:
    """No tick while an owned control partition's end is unknown or past the next offset to
    forward; a tick once it is forwarded; and a tick anyway after ``driver.TICK_DEFER_MAX_S``
    of waiting."""
    config = load_config(None, env={"LATCH_WORKER__TICK_INTERVAL_S": "1"})
    engine = kafka_engine.KafkaEngine(config)
    consumer, producer = _Consumer(), _Producer()
    engine.consumer, engine.txn.producer = consumer, producer  # type: ignore[assignment]
    engine.partitions[0] = PartitionState(Assembler(config.assemble), next_offset=0)
    engine.control_next[0] = 5

    assert engine._tick(100.0) is False  # end unknown: just assigned
    consumer.high[0] = 7
    assert engine._tick(101.0) is False  # two control records not forwarded yet
    engine.control_next[0] = 7
    assert engine._tick(102.0) is True
    assert producer.sent == [(engine.events, TICK, 0)]

    consumer.high[0] = 8
    assert engine._tick(200.0) is False
    assert engine._tick(200.0 + driver.TICK_DEFER_MAX_S - 0.5) is False
    assert engine._tick(200.0 + driver.TICK_DEFER_MAX_S) is True
    assert len(producer.sent) == 2


class _GroupConsumer(_Consumer):
    def consumer_group_metadata(self) -> object:
        return object()

    def assignment(self) -> list[Any]:
        return []


def test_a_wedged_offsets_call_replaces_the_producer_and_too_many_stop_the_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit whose ``send_offsets_to_transaction`` never returns gets a new producer
    (initialised for transactions: that fences the wedged one); once more than
    ``MAX_WEDGED`` calls are wedged at once, the worker stops (exit 1) instead of piling up
    fenced producers."""
    monkeypatch.setattr(transaction, "_WEDGED_GRACE_S", -0.95)  # a wait of 0.05 s, not 3 s
    config = load_config(None, env={"LATCH_WORKER__TRANSACTION_TIMEOUT_S": "1"})
    engine = kafka_engine.KafkaEngine(config)
    release = threading.Event()
    made: list[Any] = []

    class Wedging(_Producer):
        initialised = False

        def send_offsets_to_transaction(self, *args: Any) -> None:
            release.wait()

        def init_transactions(self, timeout: float) -> None:
            self.initialised = True

    def new_producer() -> Any:
        made.append(Wedging())
        return made[-1]

    engine.txn.make_producer = new_producer
    engine.txn.producer = new_producer()
    engine.consumer = _GroupConsumer()  # type: ignore[assignment]
    try:
        for n in range(transaction.MAX_WEDGED):
            engine.txn.batch = transaction.Batch(0.0, offsets={(engine.events, 0): 1})
            engine._commit(rewind=False)
            assert len(made) == n + 2 and made[-1].initialised
            assert engine.txn.producer is made[-1] and engine.txn.batch is None
        engine.txn.batch = transaction.Batch(0.0, offsets={(engine.events, 0): 1})
        with pytest.raises(transaction.Fatal):
            engine._commit(rewind=False)
    finally:
        release.set()
