"""The worker's per-record step, shared by ``latch worker`` and ``latch replay``.

One events record in, the records to publish out::

    emits = step(assembler, Record(key, value, record_time_ms, Source(topic, partition, offset)))
    for emit in emits:
        producer.send(topic_of(emit.topic), key=out_key(emit, key), value=out_value(emit))

* A record without a key is a tick (fed to the core, which expires idle runs) or a DLQ record
  (``key_mismatch``: events are keyed by ``run_id``).
* Anything else goes to the partition's :class:`~worker.core.Assembler` with the record time
  in milliseconds; an exception in the core becomes one ``internal_error`` DLQ record, so a
  bug in Latch never stops a partition.
* A DLQ record keeps the input record's key; every other record is keyed by its run id.
* An audit record (one per call outcome) gets the record's place in the events topic
  (:func:`located`): the record that decided the outcome.

Replay decides the same as the live worker only because both run this code, record by record,
in offset order, with one assembler per events partition.
"""

from __future__ import annotations

import logging
import traceback
from typing import NamedTuple

import orjson

from worker.core import Assembler, DlqReason, Emit, Topic, decode
from worker.core.envelope import Rejected, Source, Tick
from worker.core.outputs import dlq_record

__all__ = ["Record", "Source", "failed", "keyless", "located", "out_key", "out_value",
           "record", "step"]

log = logging.getLogger("latch.worker")

class Record(NamedTuple):
    """An input record as the core sees it."""

    key: bytes | None
    value: bytes
    #: The record time (ms), None if the record has none.
    time_ms: int | None
    #: Where it was read.
    source: Source


_new = tuple.__new__


def record(key: bytes | None, value: bytes, time_ms: int | None, topic: str, partition: int,
           offset: int) -> Record:
    """A :class:`Record` read at ``topic[partition]@offset``, built as cheaply as a plain tuple
    (``tuple.__new__``: a NamedTuple's own ``__new__`` is a Python function, twice the cost
    per record)."""
    return _new(Record, (key, value, time_ms, _new(Source, (topic, partition, offset))))


def step(assembler: Assembler, record: Record) -> list[Emit]:
    """What the worker publishes for one events record, in order: the one step of both
    engines (through :meth:`worker.runtime.partition.PartitionState.apply`) and of replay."""
    key, value, time_ms, source = record  # (one unpacking: cheaper than four names read)
    if key is None:  # a tick or a bad record (every envelope but a tick has a key)
        emits = keyless(record)
        if emits is not None:
            return emits
    try:
        emits = assembler.feed_record(key, value, time_ms, source)
    except Exception as exc:  # a bug in Latch must not stop the partition
        return failed(record, exc)
    if emits:  # (most records emit nothing)
        located(emits, source)
    return emits


def located(emits: list[Emit], source: Source) -> None:
    """Write ``source``, the events record that made ``emits``, into their audit records
    (the core leaves it null: where a record was read is not the core's to know)."""
    where = None
    for emit in emits:
        if emit.topic is Topic.AUDIT:
            if where is None:
                where = {"topic": source.topic, "partition": source.partition,
                         "offset": source.offset}
            emit.value["source"] = dict(where)


def keyless(record: Record) -> list[Emit] | None:
    """The DLQ record for an events record without a key, unless it is a tick (None).

    Offline, the core takes envelopes without keys; on Kafka, events are keyed by run_id.
    """
    key, value, _, source = record
    if key is not None:
        return None
    envelope = decode(None, value)
    if isinstance(envelope, Tick):
        return None
    if not isinstance(envelope, Rejected):
        envelope = Rejected(DlqReason.KEY_MISMATCH, "the record has no key; events are keyed "
                            "by run_id", envelope.run_id)
    return [dlq_record(envelope, key, value, source)]


def failed(record: Record, exc: Exception) -> list[Emit]:
    """The DLQ record of a record the core failed on (``exc``), logged without its text."""
    key, value, _, source = record
    where = f"{source.topic}[{source.partition}]@{source.offset}"
    # The exception's message may quote the record: log its type and frames only.
    log.error("internal error on %s (%s); the record goes to the DLQ\n%s", where,
              type(exc).__name__, "".join(traceback.format_tb(exc.__traceback__)))
    detail = f"the worker failed on this record ({type(exc).__name__})"
    return [dlq_record(Rejected(DlqReason.INTERNAL_ERROR, detail), key, value, source)]


def out_key(emit: Emit, key: bytes | None) -> bytes | None:
    """The Kafka key of an emit of the input record keyed ``key``: a DLQ record keeps the
    input record's key, but for the summary of a run's late events (its run id: it is
    emitted at a tick or at another run's record; decision 0015)."""
    if emit.topic is Topic.DLQ and "late" not in emit.value:
        return key
    return (emit.key or "").encode()


def out_value(emit: Emit) -> bytes:
    """The Kafka value of an emit."""
    return orjson.dumps(emit.value)
