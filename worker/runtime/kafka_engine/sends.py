"""What the kafka engine sends into its transaction, and what it learns from refusals.

The engine (``engine.py``) hands the driver a batch of records; the driver returns what they
need sent, prepared (:meth:`Driver.apply_all`'s ``Work``); :class:`Sends` puts it into the
open transaction (``transaction.py``): the outputs, in order (:meth:`Sends.publish`), and
the heads changelog writes the records made (:meth:`Sends.write_heads`). It also reads the
producer's delivery reports (:meth:`Sends.delivered`, the producer's ``on_delivery``): a
failed output is counted, and a
record refused for its own sake (worker/runtime/refusals.py) is noted, so that the
transaction's abort replaces the producer (transaction.py, step 6) and the record, applied
again, goes to the DLQ as ``output_refused`` in its place (:meth:`Sends.refuse`).
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message

from worker.core import Topic
from worker.runtime import refusals
from worker.runtime.driver import Driver, Outgoing
from worker.runtime.hooks import EngineHooks
from worker.runtime.kafka_engine.heads import ChangelogWrite, KafkaHeadsTable
from worker.runtime.kafka_engine.transaction import Transaction

__all__ = ["INVALID", "TOO_LARGE", "Sends"]

#: Errors of a record refused for its size (synchronously by ``produce``, or in the
#: delivery report: the broker refuses the whole batch that held it).
TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                       KafkaError.INVALID_MSG_SIZE})
#: The broker found this record invalid (KIP-467: the others of its batch are reported as
#: ``_INVALID_DIFFERENT_RECORD`` and are sent again).
INVALID = frozenset({KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG})


class Sends:
    """The engine's outputs and heads writes into :attr:`txn`; the producer's delivery
    reports."""

    #: The transaction sent into, set by the engine once made (its producer's ``on_delivery``
    #: is :meth:`delivered`, so this object comes first).
    txn: Transaction

    def __init__(self, driver: Driver, hooks: EngineHooks, outputs: dict[Topic, str],
                 changelog: str, table: KafkaHeadsTable) -> None:
        self.driver, self.hooks = driver, hooks
        self.outputs, self.changelog, self.table = outputs, changelog, table
        self.topic_of = {name: topic for topic, name in outputs.items()}
        #: Records the broker found invalid: (topic, key, value size) -> the error's name.
        self.invalid: dict[tuple[str, bytes | None, int], str] = {}

    def publish(self, outs: Sequence[Outgoing]) -> None:
        """Send each prepared output (:attr:`Work.out`), in order. One the topic would refuse
        (found invalid by the broker before, or refused by the client at once) is not
        sent: a small ``output_refused`` DLQ record goes in its place (:meth:`refuse`; over
        the topic's limit: prepared so by the driver, :meth:`Driver.outgoing`), and the
        audit record of a refused outcome, after it, says so (:meth:`Driver.reaudit`)."""
        invalid, txn, driver = self.invalid, self.txn, self.driver
        dlq = self.outputs[Topic.DLQ]
        for out in outs:
            if out.refused:
                txn.produce(dlq, out.key, out.value)
                continue
            if driver.refusals:  # (an outcome before it refused at its send)
                out = driver.reaudit(out)
            name, out_key, value, headers = out.name, out.key, out.value, out.headers
            if invalid and (name, out_key, len(value)) in invalid:
                self.refuse(out, refusals.batch_size(out_key, value, headers),
                            invalid[(name, out_key, len(value))])
                continue
            try:
                txn.produce(name, out_key, value, headers=headers)
            except KafkaException as exc:  # refused by librdkafka at once
                if exc.args[0].code() not in TOO_LARGE | INVALID:
                    raise
                self.refuse(out, refusals.batch_size(out_key, value, headers),
                            exc.args[0].name())
                continue
            if out.topic is Topic.COMMITTED and txn.batch is not None:
                txn.batch.committed.append(out.record_ms)

    def refuse(self, out: Outgoing, size: int, error: str) -> None:
        """Send, instead of ``out``, its ``output_refused`` DLQ record, keyed by the input
        record's key (:meth:`Driver.refused`)."""
        self.txn.produce(self.outputs[Topic.DLQ], out.in_key, self.driver.refused(
            out.emit, out.name, out.key, size, error, out.in_key, out.source))

    def write_heads(self, writes: Sequence[ChangelogWrite] | None = None) -> None:
        """Send the heads changelog writes the applied records made (``writes``: those the
        driver took, :attr:`Work.heads`; None: those the table holds)."""
        if writes is None:
            writes = self.table.take_pending()
        produce, changelog = self.txn.produce, self.changelog
        for partition, key, value in writes:
            produce(changelog, key, value, partition)

    def delivered(self, error: KafkaError | None, msg: Message) -> None:
        """The producer's delivery report of a failed record (served while the transaction
        commits, in the commit's thread): a failure of an output is counted (progress aside)
        and the transaction then aborts. A record refused for its own sake is noted
        (``txn.refusal``; an invalid one in :attr:`invalid`): the transaction's abort then
        replaces the producer (transaction.py, step 6)."""
        if error is None:
            return
        name = str(msg.topic())
        topic = self.topic_of.get(name)
        if topic is not None and topic is not Topic.PROGRESS:
            self.hooks.delivered(topic, None, False)
        code = error.code()
        if code in TOO_LARGE:
            self.txn.refusal = "size"
        elif code in INVALID:
            self.invalid[(name, msg.key(), len(msg.value() or b""))] = error.name()
            self.txn.refusal = self.txn.refusal or "invalid"
