"""faust's :class:`App` as the faust engine makes it: reading the topics the kafka engine writes
in transactions (decision 0009).

The kafka engine writes its heads changelog, its ticks and its forwarded cancels in Kafka
transactions. A transaction ends with a commit or abort marker: a control record that takes an
offset and is never delivered to a consumer; an aborted transaction's records stay in the log.
faust, at ``processing_guarantee="at_least_once"`` (the faust engine's), reads every topic at
``read_uncommitted`` and counts a changelog partition recovered once it has received the
record at the partition's end offset minus one. After the kafka engine, that offset is a
marker: recovery waited for it for good (faust-streaming issue #47 for exactly-once apps;
faust's own fix there, ``detect_aborted_tx``, runs only for them), and it would have applied
the heads of aborted transactions.

Two changes, both to faust's consumer side only (nothing faust writes changes):

* :class:`App`'s consumer reads at ``read_committed`` (:class:`_ConsumerThread`): aborted
  records (changelog heads, ticks, cancels) are skipped, as the kafka engine skips them.
  faust's own writes are not transactional, so they are visible at once as before.
* :class:`Recovery` ends a changelog partition's recovery at the last record a
  ``read_committed`` reader actually receives below the partition's end (its last stable
  offset): :func:`last_records` reads each partition's tail to find it. faust's recovery then
  counts the partition recovered when it has applied that record, as before, with no wait
  on a marker.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition  # type: ignore[import-untyped]
from faust.tables import TableManager as _TableManager
from faust.tables.recovery import Recovery as _Recovery
from faust.transport.drivers import aiokafka as _driver
from faust.types import TP

__all__ = ["App", "Recovery", "TableManager", "last_records"]

#: How many offsets back from a partition's end the first look for its last record reads
#: (a transaction's records and its marker); each next look reads this many times further.
TAIL = 64


async def last_records(options: Mapping[str, Any], tps: Collection[TP]) -> dict[TP, int]:
    """Per partition, the offset of the last record a ``read_committed`` consumer receives
    below the partition's end (its last stable offset); the log start minus one if there is
    none (an empty partition, or one that holds only markers and aborted records).

    Reads each partition back from its end, ``TAIL`` offsets, then ``TAIL`` times as many,
    until a record is received or the log start is reached: one consumer of no group."""
    found: dict[TP, int] = {}
    if not tps:
        return found
    consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False,
                                isolation_level="read_committed",
                                auto_offset_reset="earliest", **options)
    try:  # stopped even when it cannot start (the broker is away)
        await consumer.start()
        parts = {TopicPartition(tp.topic, tp.partition): tp for tp in tps}
        firsts = await consumer.beginning_offsets(list(parts))
        ends = await consumer.end_offsets(list(parts))  # read_committed: last stable offsets
        todo = {tp for tp in parts if ends[tp] > firsts[tp]}
        for tp in set(parts) - todo:
            found[parts[tp]] = ends[tp] - 1
        consumer.assign(list(todo))
        window = TAIL
        while todo:
            starts = {tp: max(firsts[tp], ends[tp] - window) for tp in todo}
            last = await _read_to_ends(consumer, starts, ends)
            for tp in list(todo):
                if tp in last or starts[tp] == firsts[tp]:
                    found[parts[tp]] = last.get(tp, firsts[tp] - 1)
                    todo.discard(tp)
            window *= TAIL
    finally:
        await consumer.stop()
    return found


async def _read_to_ends(consumer: AIOKafkaConsumer, starts: Mapping[TopicPartition, int],
                        ends: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Read each partition from its start until the consumer's position reaches its end
    (markers and aborted records move the position without a record); return the offset of
    the last record received below the end, for the partitions that received one."""
    last: dict[TopicPartition, int] = {}
    for tp, start in starts.items():
        consumer.seek(tp, start)
    pending = set(starts)
    while pending:
        batch = await consumer.getmany(*pending, timeout_ms=200)
        for tp, records in batch.items():
            for record in records:
                if record.offset < ends[tp]:
                    last[tp] = record.offset
        for tp in list(pending):
            if await consumer.position(tp) >= ends[tp]:
                pending.discard(tp)
    return last


class Recovery(_Recovery):
    """faust's recovery, its highwaters the last records a ``read_committed`` reader gets."""

    async def _build_highwaters(self, consumer: Any, tps: set[TP], destination: Any,
                                title: str) -> None:
        app: Any = self.app
        highwaters = await last_records(app.reader_options, tps)
        self.log.info("Highwater for %s changelog partitions (last committed records):\n%s",
                      title, self._highwater_logtable(highwaters, title=title))
        destination.clear()
        destination.update(highwaters)


class TableManager(_TableManager):
    """faust's table manager with :class:`Recovery`."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = Recovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery  # type: ignore[return-value]


class _ConsumerThread(_driver.AIOKafkaConsumerThread):
    """faust's aiokafka consumer thread; its worker consumer reads at ``read_committed``."""

    def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # faust picks read_committed for exactly-once apps only; aiokafka hands this to its
        # fetcher when the consumer starts (test_engine_switch checks that it takes).
        consumer._isolation_level = "read_committed"
        return consumer


class _Consumer(_driver.Consumer):
    def _new_consumer_thread(self) -> _driver.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(_driver.Transport):
    Consumer = _Consumer


class App(faust.App):
    """faust's app with a ``read_committed`` consumer and :class:`Recovery`;
    ``reader_options``: how :func:`last_records` connects (``kafka_io.aiokafka_options``)."""

    def __init__(self, id: str, *, reader_options: Mapping[str, Any], **options: Any) -> None:
        super().__init__(id, TableManager=TableManager, **options)
        self.reader_options = dict(reader_options)

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)
