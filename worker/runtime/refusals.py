"""An output record that Kafka refuses for its own sake becomes a small DLQ record.

A record can be refused for what it is, not because the cluster failed: larger than its
topic's ``max.message.bytes`` (or the producer's limit), or invalid to the broker (KIP-467's
``INVALID_RECORD``). Sent again, it is refused again: if that stopped the worker, the next
owner would apply the same records, send the same record and stop too, and the partition
would stand still for good. So both engines, at the send:

* **check each output against its topic's limit before sending it** (:class:`Limits`, read
  from the cluster by :func:`worker.runtime.admin.max_message_bytes` when the worker starts
  and again after a refusal for size). A record over it is not sent; a ``output_refused``
  DLQ record (:func:`dlq_record`) goes in its place and the partition goes on;
* **take a refusal that comes back from the broker the same way** (the limit was lowered
  while the worker ran, or the broker found the record invalid): the faust engine at the
  send's future, the kafka engine in the delivery report and on the next try of the aborted
  transaction (``worker/runtime/kafka_engine/engine.py``);
* **keep batches under the smallest limit** (:meth:`Limits.batch_bytes`): the broker checks
  a whole batch against ``max.message.bytes`` and refuses every record in it, so records
  that fit one by one must not be batched past it.

The DLQ record is bounded: the reason, the refused record's topic, key, size and Kafka error,
the input record it came from, and never the refused value (``original_b64`` is empty). Any
other failure of a send is the cluster's: the worker stops as before, and its record is
processed again after a restart.

The size checked is an upper bound of the record batch that carries the record alone
(:func:`batch_size`), uncompressed: what librdkafka and Java's producer check too. With a
compressing producer a record just over the limit might have fitted compressed; it goes to
the DLQ all the same (topics made by ``latch topics create`` take 64 MiB).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from worker.core import DlqReason, Emit, Topic
from worker.core.envelope import Source
from worker.core.settings import OUTPUT_RECORD_BYTES
from worker.runtime.observability import logs

__all__ = ["Limits", "batch_size", "dlq_record", "run_of"]

log = logging.getLogger("latch.worker")

#: A record batch's own bytes (Kafka's ``DefaultRecordBatch.RECORD_BATCH_OVERHEAD``, with the
#: log's offset and length) plus the most a record's varints take (length, attributes,
#: timestamp and offset deltas, key and value lengths, header count): 61 + 5+1+10+5+5+5+5.
_BATCH_OVERHEAD = 97
#: The varints of one header (name and value lengths).
_HEADER_OVERHEAD = 10
#: What a record's headers (its run's trace context) take at most, for the quick check.
_HEADERS_SLACK = 4096
#: The largest output record a producer sends (:data:`worker.runtime.admin.OUTPUT_MAX_BYTES`).
OUTPUT_MAX_BYTES = OUTPUT_RECORD_BYTES


def batch_size(key: bytes | None, value: bytes,
               headers: Sequence[tuple[str, bytes]] | None = None) -> int:
    """An upper bound of the size of a record batch that holds this record alone."""
    size = _BATCH_OVERHEAD + len(value) + (0 if key is None else len(key))
    if headers:
        for name, header in headers:
            size += _HEADER_OVERHEAD + len(name.encode()) + len(header or b"")
    return size


class Limits:
    """The largest record batch each topic takes: its ``max.message.bytes``, no more than
    the producer's own limit (:data:`OUTPUT_MAX_BYTES`). A topic not read takes the
    producer's limit (the broker's answer then decides)."""

    def __init__(self, limits: Mapping[str, int] | None = None) -> None:
        self.limits: dict[str, int] = dict(limits or {})
        #: Per topic, the largest value that fits whatever its key and headers: most records
        #: are checked with one comparison (:meth:`over`).
        self.quick: dict[str, int] = {}
        self._quick()

    def _quick(self) -> None:
        self.quick = {topic: limit - _BATCH_OVERHEAD - _HEADERS_SLACK for topic, limit in
                      self.limits.items()}

    def limit(self, topic: str) -> int:
        return min(self.limits.get(topic, OUTPUT_MAX_BYTES), OUTPUT_MAX_BYTES)

    def replacement(self, emit: Emit, name: str, out_key: bytes | None, size: int, error: str,
                    key: bytes | None, source: Source | None) -> Emit:
        """The ``output_refused`` DLQ record that replaces ``emit`` (for topic ``name``, of
        ``size`` bytes, refused with ``error``), keyed by the input record's ``key``; logged
        (where, how large, why: never the value). Either engine sends it."""
        limit = self.limit(name)
        detail = (too_large_detail(name, size, limit) if size > limit
                  else refused_detail(name, size, error))
        where = logs.where(*source) if source else {}
        log.warning("an output record for %s (%d bytes) is refused (%s); an output_refused "
                    "DLQ record replaces it", name, size, error, extra=where)
        return dlq_record(name, out_key, size, error, detail, source, key, run_of(emit))

    def over(self, topic: str, key: bytes | None, value: bytes,
             headers: Sequence[tuple[str, bytes]] | None = None) -> int | None:
        """The record's size (:func:`batch_size`) if it is over its topic's limit, else None."""
        if len(value) + (0 if key is None else len(key)) <= self.quick.get(
                topic, OUTPUT_MAX_BYTES - _BATCH_OVERHEAD - _HEADERS_SLACK):
            return None
        size = batch_size(key, value, headers)
        return size if size > self.limit(topic) else None

    def batch_bytes(self, default: int) -> int:
        """A producer's batch size that no topic refuses: ``default``, or less."""
        return min([default, *self.limits.values()])

    def update(self, limits: Mapping[str, int]) -> bool:
        """Take newly read limits; return whether one changed."""
        changed = any(self.limits.get(topic) != limit for topic, limit in limits.items())
        self.limits.update(limits)
        self._quick()
        return changed

def run_of(emit: Emit) -> str | None:
    """The run an output belongs to (a DLQ record: the run its input named, if any)."""
    if emit.topic is Topic.DLQ:
        run = emit.value.get("run_id")
        return run if isinstance(run, str) else None
    return emit.key


def dlq_record(topic: str, key: bytes | None, size: int, error: str, detail: str,
               source: Source | None, input_key: bytes | None,
               run_id: str | None) -> Emit:
    """The ``output_refused`` DLQ record of an output record refused for its own sake:
    where it was going (``topic``), its ``key`` and ``size``, the Kafka ``error`` and a
    ``detail`` for people; ``source`` and ``input_key``: the input record that made it.
    Keyed, like every DLQ record, by the input record's key. Never the refused value."""
    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    src: dict[str, Any] = {} if source is None else source._asdict()
    src["key_b64"] = b64(input_key)
    record = {"v": 1, "reason": str(DlqReason.OUTPUT_REFUSED), "detail": detail,
              "source": src, "original_b64": "", "run_id": run_id,
              "refused": {"topic": topic, "key_b64": b64(key), "bytes": size, "error": error}}
    text_key = None if input_key is None else input_key.decode("utf-8", "replace")
    return Emit(Topic.DLQ, text_key, record)


def too_large_detail(topic: str, size: int, limit: int) -> str:
    return (f"the record for topic {topic} is {size} bytes, over the {limit} bytes the topic "
            f"takes (max.message.bytes); it was not sent")


def refused_detail(topic: str, size: int, error: str) -> str:
    return f"the broker refused the {size}-byte record for topic {topic} ({error})"
