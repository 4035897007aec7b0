"""The heads table of the kafka engine: a dict, and the changelog records its writes become.

The faust engine keeps heads in a faust ``Table`` (``key_type=bytes``, faust's JSON values)
whose changelog is ``<app_id>-heads-changelog``; a head of events partition P lives in
changelog partition P. This table writes the same records to the same topic (raw ``run_id``
keys, JSON object values, ``None`` values as tombstones), so either engine restores the
other's heads. Writes are collected in :attr:`HeadsTable.pending` and the engine sends them
in the transaction of the record that made them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import orjson

__all__ = ["ChangelogWrite", "HeadsTable", "decode", "encode"]

#: One changelog record to send: (partition, key, value or None for a tombstone).
ChangelogWrite = tuple[int, bytes, bytes | None]


def encode(head: dict[str, Any]) -> bytes:
    """A head as the changelog holds it (JSON, as faust's ``json`` serializer writes)."""
    return orjson.dumps(head)


def decode(value: bytes) -> dict[str, Any] | None:
    """A changelog value as a head; ``None`` if it is not a JSON object (never written by
    Latch: ignored rather than trusted)."""
    try:
        head = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return head if isinstance(head, dict) else None


#: A head as the table keeps it: an open run's ``{"p": partition, "start": offset}`` as the
#: tuple ``(partition, offset)`` (56 bytes against a dict's 184: one per open run,
#: bench/bench_memory.py), any other head as its dict.
Stored = dict[str, Any] | tuple[int, int]


def _pack(head: dict[str, Any]) -> Stored:
    if len(head) == 2 and type(head.get("p")) is int and type(head.get("start")) is int:
        return head["p"], head["start"]
    return head


def _unpack(stored: Stored) -> dict[str, Any]:
    return {"p": stored[0], "start": stored[1]} if isinstance(stored, tuple) else stored


def _partition(stored: Stored) -> Any:
    return stored[0] if isinstance(stored, tuple) else stored.get("p")


class HeadsTable(MutableMapping[bytes, dict[str, Any]]):
    """Heads of the partitions one worker owns; every write is also a pending changelog
    record (a head's partition is its ``"p"``). Read, a head is always its dict."""

    def __init__(self) -> None:
        self.data: dict[bytes, Stored] = {}
        self.pending: list[ChangelogWrite] = []

    def __getitem__(self, key: bytes) -> dict[str, Any]:
        return _unpack(self.data[key])

    def __setitem__(self, key: bytes, head: dict[str, Any]) -> None:
        self.data[key] = _pack(head)
        self.pending.append((head["p"], key, encode(head)))

    def __delitem__(self, key: bytes) -> None:
        stored = self.data.pop(key)
        self.pending.append((_partition(stored), key, None))

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
            head = None if value is None else decode(value)
            if head is None:
                self.data.pop(key, None)
            else:
                self.data[key] = _pack(head | {"p": partition})

    def drop(self, partition: int) -> None:
        """Forget the heads of a partition this worker no longer owns (nothing is written)."""
        for key in [k for k, head in self.data.items() if _partition(head) == partition]:
            del self.data[key]
