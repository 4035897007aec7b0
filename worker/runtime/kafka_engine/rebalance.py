"""The kafka engine's rebalances: what the consumer's ``on_assign``, ``on_revoke`` and
``on_lost`` do, and the takeover they drive (a rebuild of each events partition as it was at
its committed offset: worker/runtime/takeover.py's generator, fed with this engine's reads).

* **Assigned**: the commit in flight settles, the driver notes the partitions
  (:meth:`Assignment.assigned`), each is rebuilt: its heads restored from the changelog (read
  to its end), the open runs' records from the earliest open ``start`` up to the committed
  offset fed to a fresh assembler (outputs discarded: they were committed with that offset),
  and consumed from that offset.
* **Revoked**: the open transaction commits while the partitions are still ours, then they go.
* **Lost**: someone else owns them already: the transaction is aborted, they go.
* **Rewound** after an aborted transaction (:meth:`KafkaEngine._after`): every owned partition
  is taken over again from its committed offset, by a seek.

A mix-in of :class:`~worker.runtime.kafka_engine.engine.KafkaEngine`: the attributes it reads
are the engine's, declared below.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from confluent_kafka import Consumer, KafkaException, TopicPartition

from worker.runtime import takeover
from worker.runtime.assignment import Assignment
from worker.runtime.config import Config
from worker.runtime.driver import Driver
from worker.runtime.kafka_engine import reader
from worker.runtime.kafka_engine.heads import KafkaHeadsTable
from worker.runtime.kafka_engine.sends import Sends
from worker.runtime.kafka_engine.transaction import CLIENT_TIMEOUT_S, Outcome, Transaction
from worker.runtime.partition import PartitionState
from worker.runtime.step import Record

_T = TypeVar("_T")

log = logging.getLogger("latch.worker")

_CLIENT_TIMEOUT_S = CLIENT_TIMEOUT_S


class Rebalance:
    """The consumer's rebalance callbacks and the takeover (mixed into the engine)."""

    config: Config
    events: str
    control: str
    changelog: str
    instance: str
    ready: bool
    consumer: Consumer
    txn: Transaction
    table: KafkaHeadsTable
    driver: Driver
    sends: Sends
    owned: Assignment
    partitions: dict[int, PartitionState]
    control_next: dict[int, int]
    results: str | None
    results_next: dict[int, int]
    reader_settings: dict[str, str]

    if TYPE_CHECKING:  # the engine's (engine.py)
        def _after(self, outcome: Outcome | None, rewind: bool) -> None: ...
        def _commit(self, rewind: bool = True, wait: bool = True) -> None: ...

    def _on_assign(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        """Rebuild each events partition as it was at its committed offset; consume every
        partition from that offset."""
        self._after(self.txn.settle(), rewind=False)  # (none in flight: revoked first)
        self.owned.assigned([tp.partition for tp in assigned if tp.topic == self.events],
                            [tp.partition for tp in assigned if tp.topic == self.control])
        self._take_over(assigned, seek=False)
        if not self.ready:
            self.ready = True
            log.info("kafka engine ready (transactional.id %s-%s)", self.config.worker.app_id,
                     self.instance)

    def _on_revoke(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        """Commit the open transaction while the partitions are still ours, then drop them."""
        self._commit(rewind=False)
        self._drop(revoked)

    def _on_lost(self, consumer: Consumer, lost: list[TopicPartition]) -> None:
        """The partitions are someone else's already: abort, drop them."""
        self._after(self.txn.settle(), rewind=False)  # the commit in flight, done or aborted
        self._after(self.txn.abandon("the assignment was lost"), rewind=False)
        self.table.take_pending()  # (a batch not begun: nothing sent, its heads go)
        self._drop(lost)

    def _drop(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions are not ours any more: the driver drops their states and offsets
        (:meth:`Assignment.revoked`); their heads go from the table."""
        partitions = list(partitions)
        events = [tp.partition for tp in partitions if tp.topic == self.events]
        self.owned.revoked(events, [tp.partition for tp in partitions
                                    if tp.topic == self.control])
        for tp in partitions:
            if tp.topic == self.results:
                self.results_next.pop(tp.partition, None)
        for partition in events:
            self.table.drop(partition)

    def _take_over(self, partitions: list[TopicPartition], seek: bool) -> None:
        """Rebuild ``partitions`` at their committed offsets and consume from there (assign
        them, or seek when they are assigned already)."""
        if not partitions:
            return
        committed = self._query(lambda: self.consumer.committed(partitions,
                                                                timeout=_CLIENT_TIMEOUT_S))
        changelogs = reader.read_all(self.reader_settings, self.changelog,
                                     [tp.partition for tp in committed if tp.topic == self.events])
        positions = []
        for tp in committed:
            low, _ = self._query(functools.partial(self.consumer.get_watermark_offsets, tp,
                                                   timeout=_CLIENT_TIMEOUT_S))
            resume = max(tp.offset, low)
            if tp.topic == self.events:
                self.table.restore(tp.partition, changelogs[tp.partition])
                self.partitions[tp.partition] = self._rebuild(tp.partition, resume)
            elif tp.topic == self.control:
                self.control_next[tp.partition] = resume
            elif tp.topic == self.results:
                self.results_next[tp.partition] = resume
            positions.append(TopicPartition(tp.topic, tp.partition, resume))
        if seek:
            for tp in positions:
                self.consumer.seek(tp)
        else:
            self.consumer.assign(positions)
        self.owned.log_assigned(self.partitions)

    def _query(self, call: Callable[[], _T]) -> _T:
        """A broker query of a takeover, again while it fails other than fatally (for up to
        twice the client time-out): a cluster node killed mid-query destroys its broker
        handle (``_DESTROY_BROKER``), and the takeover must outlast that."""
        deadline = time.monotonic() + 2 * _CLIENT_TIMEOUT_S
        while True:
            try:
                return call()
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal() or time.monotonic() > deadline:
                    raise
                log.warning("takeover: %s; retrying", error.str())
                time.sleep(0.5)

    def _rebuild(self, partition: int, resume: int) -> PartitionState:
        """A fresh assembler for ``partition`` in its state at offset ``resume`` (its heads
        restored already): the driver's takeover (worker/runtime/takeover.py), driven with
        this engine's reads; what it returns to send (runs that finished during the
        rebuild, never expected with transactions: a head commits with its outputs) goes
        into the transaction."""
        rebuild = self.driver.rebuild(self.events, partition, resume)
        read = next(rebuild)
        assert read is not None  # (the first thing a rebuild yields: what to read)
        chunk: list[Record] = []  # (sent from here: the driver never pulls from a reader)
        if read.start < read.end:
            for msg in reader.read(self.reader_settings, read.topic, partition, read.start,
                                   read.end):
                chunk.append(reader.record_of(msg))
                if len(chunk) >= takeover.CHUNK:
                    rebuild.send(chunk)
                    chunk = []
        if chunk:
            rebuild.send(chunk)
        rebuilt = takeover.end(rebuild)
        work = rebuilt.work
        if work.out or work.heads:
            self.txn.begin()
            self.sends.publish(work.out)
            self.sends.write_heads(work.heads)
        return rebuilt.state
