"""The heads table of the kafka engine: a dict, and the changelog records its writes become.

The faust engine keeps heads in a faust ``Table`` (``key_type=bytes``, JSON object values:
``faust_engine.heads.HeadsCodec``) whose changelog is ``<app_id>-heads-changelog``; a head of events
partition P lives in changelog partition P. This table writes the same records to the same
topic (raw ``run_id`` keys, JSON object values, ``None`` values as tombstones), so either
engine restores the other's heads. Writes are collected in :attr:`KafkaHeadsTable.pending` and the
engine sends them in the transaction of the record that made them. Both engines keep an open
run's head packed (``partition.pack_head``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

from worker.runtime.partition import (
    StoredHead,
    decode_head,
    encode_head,
    head_partition,
    pack_head,
    unpack_head,
)

__all__ = ["ChangelogWrite", "KafkaHeadsTable"]

#: One changelog record to send: (partition, key, value or None for a tombstone).
ChangelogWrite = tuple[int, bytes, bytes | None]


class KafkaHeadsTable(MutableMapping[bytes, dict[str, Any]]):
    """Heads of the partitions one worker owns; every write is also a pending changelog
    record (a head's partition is its ``"p"``). Read, a head is always its dict."""

    def __init__(self) -> None:
        self.data: dict[bytes, StoredHead] = {}
        self.pending: list[ChangelogWrite] = []

    def __getitem__(self, key: bytes) -> dict[str, Any]:
        return unpack_head(self.data[key])

    def __setitem__(self, key: bytes, head: dict[str, Any]) -> None:
        self.data[key] = pack_head(head)
        self.pending.append((head["p"], key, encode_head(head)))

    def __delitem__(self, key: bytes) -> None:
        stored = self.data.pop(key)
        self.pending.append((head_partition(stored), key, None))

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def take_pending(self) -> list[ChangelogWrite]:
        """The changelog records written since the last call."""
        pending, self.pending = self.pending, []
        return pending

    def restore(self, partition: int, records: Iterable[tuple[bytes | None, bytes | None]]
                ) -> None:
        """Replace the heads of ``partition`` with those of its changelog ``records`` (in
        offset order; a tombstone deletes). Nothing becomes pending."""
        self.drop(partition)
        for key, value in records:
            if key is None:
                continue
            head = None if value is None else decode_head(value)
            if head is None:
                self.data.pop(key, None)
            else:
                self.data[key] = pack_head(head | {"p": partition})

    def drop(self, partition: int) -> None:
        """Forget the heads of a partition this worker no longer owns (nothing is written)."""
        for key in [k for k, head in self.data.items() if head_partition(head) == partition]:
            del self.data[key]
