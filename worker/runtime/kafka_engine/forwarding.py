"""The kafka engine's control forwarding: each record of an owned control partition (a
cancel, an approval, ...) goes into the events topic keyed by its run (murmur2, as the gateway
partitions) or to the DLQ, in the open transaction with the control partition's next offset
(the driver decides where: :meth:`Driver.forward`); and what readiness and the tick rule ask
of it: whether an owned control partition has records in the log not yet forwarded.

A mix-in of :class:`~worker.runtime.kafka_engine.engine.KafkaEngine`: the attributes it reads
are the engine's, declared below.
"""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from worker.core import Topic
from worker.runtime.assignment import Assignment
from worker.runtime.driver import Driver
from worker.runtime.kafka_engine import reader
from worker.runtime.kafka_engine.transaction import Transaction


class Forwarding:
    """The control records forwarded into the events topic (mixed into the engine)."""

    events: str
    control: str
    outputs: dict[Topic, str]
    consumer: Consumer
    txn: Transaction
    driver: Driver
    owned: Assignment
    control_next: dict[int, int]
    #: The results topic (None: the result latch is off) and the next offset to forward of
    #: each results partition this worker owns.
    results: str | None
    results_next: dict[int, int]

    def _forward(self, msg: Message) -> None:
        """A control or results record of an owned partition, not forwarded before: into the
        events topic (a cancel, a result, keyed by its run) or to the DLQ, with its
        partition's next offset."""
        name, partition, offset = reader.where(msg)
        forwarded = self.results_next if name == self.results else self.control_next
        expected = forwarded.get(partition)
        if expected is None or offset < expected:
            return
        batch = self.txn.begin()
        routed = self.driver.forward(reader.record_of(msg))
        if routed is not None:  # (None: the latch's own result, not forwarded)
            topic, key, value = routed
            self.txn.produce(self.events if topic is None else self.outputs[topic], key, value)
        forwarded[partition] = offset + 1
        batch.offsets[(name, partition)] = offset + 1
        batch.records += 1

    def _control_behind(self) -> bool:
        """Whether an owned control partition has records in the log (its end as the last
        fetch reported it; unknown right after an assignment) not yet forwarded."""
        return self.owned.control_behind(self._control_ends())

    def _control_forwarding(self) -> None:
        """Report the control partitions forwarded up to their ends (readiness): their
        positions, which pass transaction markers, at their ends as the last fetch said."""
        try:
            read = {tp.partition: tp.offset for tp in self.consumer.position(
                [TopicPartition(self.control, p) for p in self.control_next])}
        except KafkaException:
            return
        self.owned.control_forwarding(self._control_ends(), read=read)

    def _control_ends(self) -> dict[int, int | None]:
        """Each owned control partition's end as the last fetch reported it (None: unknown)."""
        ends: dict[int, int | None] = {}
        for partition in self.control_next:
            try:
                _, ends[partition] = self.consumer.get_watermark_offsets(
                    TopicPartition(self.control, partition), cached=True)
            except KafkaException:
                ends[partition] = None
        return ends
