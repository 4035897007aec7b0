"""The kafka engine's sends (``worker/runtime/kafka_engine/sends.py``), with a fake
transaction and no broker: the outputs go into the transaction in order, a committed call's
record time noted for its latency; one over its limit goes as its ``output_refused`` DLQ
record, as does one librdkafka refuses at once or the broker found invalid before, any other
error raising; the heads changelog writes go to their partitions; a failed delivery report is
counted (progress aside) and a refusal for the record's own sake is noted for the
transaction's abort. The real-broker proofs: ``test_kafka_engine_on_kafka.py`` and
``test_transactions_refused.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.core import Emit, Topic
from worker.runtime.config import load_config
from worker.runtime.driver import Driver, Outgoing
from worker.runtime.hooks import EngineHooks
from worker.runtime.kafka_engine.heads import KafkaHeadsTable
from worker.runtime.kafka_engine.sends import Sends
from worker.runtime.partition import Heads
from worker.runtime.step import Source

_NAMES = {topic: f"t.{topic.value}" for topic in Topic}


class _Transaction:
    """A transaction that notes each record produced into it (``refuse``: topic -> the
    error code librdkafka raises at once for a record sent there)."""

    def __init__(self, refuse: dict[str, int] | None = None) -> None:
        self.produced: list[tuple[str, bytes | None, bytes | None, int | None]] = []
        self.refuse = refuse or {}
        self.batch = SimpleNamespace(committed=[])
        self.refusal: str | None = None

    def produce(self, topic: str, key: bytes | None, value: bytes | None,
                partition: int | None = None, headers: Any = None) -> None:
        if topic in self.refuse:
            raise KafkaException(KafkaError(self.refuse[topic]))
        self.produced.append((topic, key, value, partition))


def _sends(txn: _Transaction) -> tuple[Sends, list[tuple[Topic, int | None, bool]]]:
    """Sends into ``txn``; the deliveries the hooks counted."""
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0"})
    table = KafkaHeadsTable()
    driver = Driver(config, EngineHooks(config), Heads(table, 3600))
    sends = Sends(driver, driver.hooks, dict(_NAMES), "t.changelog", table)
    sends.txn = txn  # type: ignore[assignment]
    counted: list[tuple[Topic, int | None, bool]] = []
    driver.hooks.delivered = (  # type: ignore[method-assign]
        lambda topic, record_ms, ok: counted.append((topic, record_ms, ok)))
    return sends, counted


def _out(topic: Topic, value: bytes = b"{}", refused: bool = False) -> Outgoing:
    """One prepared output of run ``r1`` (read from ``ev[0]@7`` with key ``in`` at 1,234)."""
    return Outgoing(Emit(topic, "r1", {"idempotency_key": "r1:c1"}), topic, _NAMES[topic],
                    b"r1", value, None, refused=refused, in_key=b"in",
                    source=Source("ev", 0, 7), record_ms=1_234)


def test_outputs_go_into_the_transaction_in_order() -> None:
    """Each output is produced into the transaction in order; a committed call's record
    time is noted on the batch (its latency counts from there); one prepared as refused
    (over its limit) goes to the DLQ as it is."""
    txn = _Transaction()
    sends, _ = _sends(txn)
    sends.publish([_out(Topic.COMMITTED, b"c"), _out(Topic.DLQ, b"r", refused=True),
                   _out(Topic.FINAL, b"f")])
    assert [(t, v) for t, _, v, _ in txn.produced] == [
        ("t.committed", b"c"), ("t.dlq", b"r"), ("t.final", b"f")]
    assert txn.batch.committed == [1_234]


@pytest.mark.parametrize("code", [KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD])
def test_a_record_librdkafka_refuses_at_once_is_replaced_by_its_dlq_record(code: int) -> None:
    """librdkafka refuses the committed call at once (its size, or invalid): its
    ``output_refused`` DLQ record goes in its place, keyed by the input record's key,
    naming the error and never the arguments; the outputs after it still go."""
    txn = _Transaction(refuse={"t.committed": code})
    sends, _ = _sends(txn)
    sends.publish([_out(Topic.COMMITTED, b'{"arguments": "secret"}'), _out(Topic.FINAL)])
    (dlq, final) = txn.produced
    assert (dlq[0], dlq[1], final[0]) == ("t.dlq", b"in", "t.final")
    record = orjson.loads(dlq[2] or b"")
    assert record["reason"] == "output_refused"
    assert KafkaError(code).name() in (dlq[2] or b"").decode()
    assert b"secret" not in (dlq[2] or b"")
    assert txn.batch.committed == []


def test_another_error_at_once_raises() -> None:
    """An error that is not the record's own (the queue is full, the transaction is in a
    wrong state) raises: the engine handles it, nothing goes to the DLQ."""
    txn = _Transaction(refuse={"t.committed": KafkaError._STATE})
    sends, _ = _sends(txn)
    with pytest.raises(KafkaException):
        sends.publish([_out(Topic.COMMITTED)])
    assert txn.produced == []


def _report(topic: str, key: bytes = b"r1", value: bytes = b"v") -> Any:
    return SimpleNamespace(topic=lambda: topic, key=lambda: key, value=lambda: value)


def test_a_record_the_broker_found_invalid_is_replaced_when_applied_again() -> None:
    """A delivery report says the broker found a record invalid: the transaction learns it
    (``invalid``, the abort then replaces the producer), and when the record is applied
    again the same output goes to the DLQ as ``output_refused`` instead of being sent."""
    txn = _Transaction()
    sends, counted = _sends(txn)
    sends.delivered(KafkaError(KafkaError.INVALID_RECORD), _report("t.committed", b"r1", b"c"))
    assert txn.refusal == "invalid"
    assert counted == [(Topic.COMMITTED, None, False)]
    sends.publish([_out(Topic.COMMITTED, b"c")])
    (dlq,) = txn.produced
    assert dlq[0] == "t.dlq" and b"INVALID_RECORD" in (dlq[2] or b"")


def test_delivery_reports_count_failures_and_note_refusals_for_size() -> None:
    """A successful report does nothing; a failure of an output is counted, of progress or
    of a topic not an output (the changelog) is not; a refusal for size marks the
    transaction ``size``, and an invalid record after it does not lower that to
    ``invalid``."""
    txn = _Transaction()
    sends, counted = _sends(txn)
    sends.delivered(None, _report("t.final"))
    assert counted == [] and txn.refusal is None
    sends.delivered(KafkaError(KafkaError._MSG_TIMED_OUT), _report("t.progress"))
    sends.delivered(KafkaError(KafkaError._MSG_TIMED_OUT), _report("t.changelog"))
    assert counted == [] and txn.refusal is None
    sends.delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _report("t.final"))
    sends.delivered(KafkaError(KafkaError.INVALID_RECORD), _report("t.errors"))
    assert txn.refusal == "size"
    assert counted == [(Topic.FINAL, None, False), (Topic.ERRORS, None, False)]


def test_heads_writes_go_to_the_changelog_in_their_partitions() -> None:
    """The heads writes the driver took go to the changelog, each in its head's partition
    (a tombstone as None); without writes given, the table's pending ones go, once."""
    txn = _Transaction()
    sends, _ = _sends(txn)
    sends.write_heads([(2, b"r1", b'{"p":2,"start":4}'), (0, b"r2", None)])
    assert txn.produced == [("t.changelog", b"r1", b'{"p":2,"start":4}', 2),
                            ("t.changelog", b"r2", None, 0)]
    sends.table[b"r3"] = {"p": 1, "start": 9}
    sends.write_heads()
    sends.write_heads()
    assert txn.produced[2:] == [("t.changelog", b"r3", b'{"p":1,"start":9}', 1)]
