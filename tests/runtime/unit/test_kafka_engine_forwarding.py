"""The kafka engine's control forwarding (``worker/runtime/kafka_engine/forwarding.py``),
without a broker: a control record of an owned partition goes into the events topic (a cancel,
keyed by its run) or to the DLQ (a record the control topic does not take), in the open
transaction with its partition's next offset; a repeat or a partition owned elsewhere is not
forwarded; and the control backlog is read from the consumer's cached end offsets only.
The real-broker proofs are ``tests/runtime/integration/test_cancel_in_time.py`` and
``test_control_gap.py``."""

from __future__ import annotations

from typing import Any

import orjson
from builders import cancel
from kafka_fakes import EngineMessage

from worker.core import Topic
from worker.runtime.config import load_config
from worker.runtime.kafka_engine import engine as kafka_engine


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                partition: int | None = None, **options: Any) -> None:
        self.sent.append((topic, key, value))


class _Consumer:
    """The cached end offset of each control partition, as the last fetch reported it."""

    def __init__(self, high: dict[int, int]) -> None:
        self.high = high

    def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
        assert cached  # never a request to the broker from the loop
        return 0, self.high.get(tp.partition, -1001)

    def close(self) -> None:
        pass


def _forwarding(next_offsets: dict[int, int]) -> tuple[kafka_engine.KafkaEngine, _Producer]:
    engine = kafka_engine.KafkaEngine(load_config(None, env={}))
    producer = _Producer()
    engine.txn.producer = producer  # type: ignore[assignment]
    engine.control_next.update(next_offsets)
    return engine, producer


def _control(engine: kafka_engine.KafkaEngine, offset: int, value: Any,
             partition: int = 0) -> EngineMessage:
    return EngineMessage(engine.control, offset, b"r1", orjson.dumps(value), partition)


def test_a_cancel_is_forwarded_into_the_events_topic_with_its_next_offset() -> None:
    """A cancel at the next offset of an owned control partition goes into the events topic,
    keyed by its run, in the open transaction; the partition's next offset moves past it and
    is noted for the transaction's commit."""
    engine, producer = _forwarding({0: 4})
    engine._forward(_control(engine, 4, cancel("r1")))  # type: ignore[arg-type]
    assert [(topic, key) for topic, key, _ in producer.sent] == [(engine.events, b"r1")]
    assert orjson.loads(producer.sent[0][2] or b"")["type"] == "cancel"
    assert engine.control_next == {0: 5}
    batch = engine.txn.batch
    assert batch is not None and batch.offsets == {(engine.control, 0): 5}
    assert batch.records == 1


def test_a_repeat_or_a_partition_owned_elsewhere_is_not_forwarded() -> None:
    """A control record below its partition's next offset (read again after a rewind) or of
    a control partition this worker does not own sends nothing and opens no transaction."""
    engine, producer = _forwarding({0: 4})
    engine._forward(_control(engine, 3, cancel("r1")))  # type: ignore[arg-type]
    engine._forward(_control(engine, 9, cancel("r1"), partition=1))  # type: ignore[arg-type]
    assert producer.sent == [] and engine.txn.batch is None
    assert engine.control_next == {0: 4}


def test_a_record_the_control_topic_does_not_take_goes_to_the_dlq() -> None:
    """A control record that is not a control envelope is not forwarded into any run's
    history: it goes to the DLQ, and its offset is consumed all the same."""
    engine, producer = _forwarding({0: 0})
    engine._forward(_control(engine, 0, {"v": 1, "type": "run.start"}))  # type: ignore[arg-type]
    assert [topic for topic, _, _ in producer.sent] == [engine.outputs[Topic.DLQ]]
    assert engine.control_next == {0: 1}


def test_the_control_backlog_is_read_from_the_cached_ends() -> None:
    """Behind while an owned control partition's end is unknown (just assigned) or past its
    next offset to forward; caught up once every owned partition is forwarded to its end."""
    engine, _ = _forwarding({0: 5, 1: 2})
    engine.consumer = _Consumer({0: 5})  # type: ignore[assignment]
    assert engine._control_ends() == {0: 5, 1: -1001}
    assert engine._control_behind()
    engine.consumer = _Consumer({0: 5, 1: 3})  # type: ignore[assignment]
    assert engine._control_behind()
    engine.control_next[1] = 3
    assert not engine._control_behind()
