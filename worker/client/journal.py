"""The runner journal (decision 0012): which calls a transactional runner has recorded.

:class:`JournalStore` is the :class:`DedupStore` of a
``Runner(..., transactional_id=...)``: the keys of the compacted journal topic
(``topics.journal``, ``schemas/journal-entry.schema.json``), read to its end at start and at
each assignment. Its records are written by transactional runners only (the journal's ACL):
one per executed call, keyed by ``idempotency_key``, never with arguments or content.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from worker.runtime.observability import logs

__all__ = ["CLIENT_TIMEOUT_S", "DedupStore", "JournalError", "JournalStore", "MemoryStore",
           "journal_record"]

#: How long a journal read may wait for a partition's end (and the time-out of each
#: transactional call, worker.client.runner).
CLIENT_TIMEOUT_S = 30.0


class DedupStore(Protocol):
    """Which idempotency keys have been executed (and their results delivered)."""

    def seen(self, key: str) -> bool: ...

    def remember(self, key: str) -> None: ...


class MemoryStore:
    """The default store: the last ``max_keys`` keys, in memory."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._keys: OrderedDict[str, None] = OrderedDict()

    def seen(self, key: str) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        return False

    def remember(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)


class JournalError(RuntimeError):
    """The transactional runner cannot record a call's outcome (its transaction was aborted,
    fenced, or its producer does not answer): it stops. The call named in the message ran
    and its result is not recorded: it runs again once a runner restarts (the documented
    repeat), never silently within this process."""


def journal_record(call: Mapping[str, Any], is_error: bool) -> dict[str, Any]:
    """The journal's value for an executed ``call`` (``schemas/journal-entry.schema.json``):
    which call ran and how it ended; never its arguments nor its result's content."""
    return {"v": 1, "idempotency_key": call["idempotency_key"], "run_id": call["run_id"],
            "tool_call_id": call["call_id"], "name": call["name"], "is_error": is_error}


class JournalStore:
    """A :class:`DedupStore` on the runner journal (``topics.journal``): the keys of the
    journal's records, read at ``read_committed`` to each partition's end by :meth:`load`
    (the runner calls it at start and at each assignment, before it consumes a call), and
    the keys this process recorded (:meth:`remember`, after their transaction committed).
    Every key within the journal's retention is held in memory (some 100 bytes each)."""

    def __init__(self, settings: Mapping[str, Any], topic: str,
                 timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.topic, self.timeout_s = topic, timeout_s
        self._keys: set[str] = set()
        self._settings = dict(settings)
        self._reader: Consumer | None = None
        #: Records read from the journal so far.
        self.read = 0

    def seen(self, key: str) -> bool:
        return key in self._keys

    def remember(self, key: str) -> None:
        self._keys.add(key)

    def __len__(self) -> int:
        return len(self._keys)

    def load(self) -> int:
        """Read what the journal gained since the last load, to every partition's end as it
        is now (a transaction still open on it is waited for, up to ``timeout_s``); return
        how many records were read. Raises :class:`JournalError` when the journal is
        missing or its end is not reached in time."""
        consumer = self._open()
        deadline = time.monotonic() + self.timeout_s
        ends: dict[int, int] = {}
        for tp in consumer.assignment():
            low, high = consumer.get_watermark_offsets(tp, timeout=self.timeout_s,
                                                       cached=False)
            if high > low:  # an empty partition (or one retention emptied) is read already
                ends[tp.partition] = high
        read = 0
        while ends:
            positions = consumer.position([TopicPartition(self.topic, p) for p in ends])
            # the position passes the transaction markers no record follows
            ends = {tp.partition: ends[tp.partition] for tp in positions
                    if tp.offset < ends[tp.partition]}
            if not ends:
                break
            if time.monotonic() > deadline:
                raise JournalError(f"the journal {self.topic!r} was not read to its end within "
                                   f"{self.timeout_s:.0f} s (partitions {sorted(ends)} behind: "
                                   "a transaction left open?)")
            for msg in consumer.consume(1000, timeout=0.1):
                error = msg.error()
                if error is not None:
                    if error.fatal():
                        raise JournalError(f"reading the journal: {error.str()}")
                    continue
                key = msg.key()
                if key is not None:
                    self._keys.add(key.decode("utf-8", "replace"))
                read += 1
        self.read += read
        return read

    def _open(self) -> Consumer:
        if self._reader is not None:
            return self._reader
        reader = Consumer(logs.kafka_config({
            **self._settings, "group.id": "latch-runner-journal", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10}))
        metadata = reader.list_topics(self.topic, timeout=self.timeout_s).topics.get(self.topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            reader.close()
            raise JournalError(f"the journal topic {self.topic!r} does not exist (create it "
                               "with `latch topics create`)")
        reader.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                       for p in sorted(metadata.partitions)])
        self._reader = reader
        return reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
