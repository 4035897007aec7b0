"""The ``heads`` table as :class:`~worker.runtime.partition.Heads` writes it: faust's table,
with each written key's partition told to faust's local store.

Why (issue 9, item 9): faust's in-memory store learns which partition a key belongs to only
from changelog recovery (``Store._key_partition``, filled by ``apply_changelog_batch``), and
after each recovery drops the keys of partitions this worker no longer owns
(``Store.on_recovery_completed``). A head written *live* was never registered, so it stayed
in memory after its partition was revoked. When the partition came back, recovery re-read
the changelog, but if compaction had meanwhile removed the tombstone that ended the head (a
finished run's head, deleted after ``finished_run_retention_s``), nothing removed the stale
copy: the worker saw the finished run as open, re-read the log from its start and published
its outcomes again. Registering every written key lets faust's own clean-up drop it with its
partition, so after any sequence of revocations and re-assignments the changelog alone (what
recovery reads) decides the heads.

That clean-up runs only when faust's recovery of the new assignment completes, and faust's
recovery can stall until the next rebalance (seen in CI: a worker whose partition went away
and came back within one stalled recovery kept the stale head; faust-streaming issues #21,
#74, #597 describe such stalls). So the worker also drops, itself, every key of the
partitions it does not own as each assignment arrives (:meth:`keep_only`). That is safe
because faust forgets a revoked changelog partition's read offset (``Recovery.revoke``): when
the partition comes back, recovery re-reads its changelog from the earliest offset.

Stores without that registry (``rocksdb://`` keeps one database per partition and drops
revoked ones itself) are written as they are.

**Packed heads.** :class:`FaustHeadsTable` is faust's table with its values written and read by
:class:`HeadsCodec`: the changelog holds each head as the JSON object faust's ``json`` codec
and the kafka engine write, and the table keeps an open run's head as the tuple
``partition.pack_head`` makes (128 bytes less per open run than its dict,
bench/bench_memory.py). :class:`FaustHeadsMap` packs what it writes and unpacks what
it reads, so :class:`~worker.runtime.partition.Heads` sees dicts only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, MutableMapping
from typing import Any

import faust
from faust.serializers import codecs

from worker.runtime.partition import (
    StoredHead,
    decode_head,
    encode_head,
    pack_head,
    unpack_head,
)

__all__ = ["FaustHeadsMap", "FaustHeadsTable", "HeadsCodec"]


class HeadsCodec(codecs.Codec):
    """A head's changelog value: a JSON object, read back packed (``pack_head``); a value
    that is not a JSON object (never written by Latch) reads as None, which the table skips.
    """

    def _dumps(self, obj: Any) -> bytes:
        return encode_head(unpack_head(obj))

    def _loads(self, s: bytes) -> Any:
        head = decode_head(s)
        return None if head is None else pack_head(head)


class FaustHeadsTable(faust.Table[bytes, Any]):
    """faust's table, its values through :class:`HeadsCodec` both ways: the table manager
    builds the changelog topic (which decodes what recovery reads) from the table's
    ``value_serializer`` once the table is made, and each write is sent with it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.value_serializer = HeadsCodec()


class FaustHeadsMap(MutableMapping[bytes, Any]):
    """A mapping over a faust table whose writes register the head's partition (``"p"``)
    with the table's local store, as changelog recovery does."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __getitem__(self, key: bytes) -> Any:
        stored = self.table[key]
        if stored is None:
            raise KeyError(key)
        return unpack_head(stored)

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.table[key] = pack_head(value)
        registry = getattr(self.table.data, "_key_partition", None)
        if registry is not None:
            registry[key] = value["p"]

    def __delitem__(self, key: bytes) -> None:
        del self.table[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)

    def keep_only(self, partitions: Collection[int]) -> int:
        """Drop the local copy of every key registered to a partition not in
        ``partitions`` (no changelog write: the partition's owner keeps it); return how many.
        """
        store = self.table.data
        registry = getattr(store, "_key_partition", None)
        if registry is None:
            return 0
        owned = set(partitions)
        gone = [key for key, partition in registry.items() if partition not in owned]
        for key in gone:
            store.data.pop(key, None)
            registry.pop(key, None)
        return len(gone)

    def get(self, key: bytes, default: Any = None) -> Any:
        stored: StoredHead | None = self.table.get(key)
        return default if stored is None else unpack_head(stored)

    def items(self) -> Iterator[tuple[bytes, Any]]:  # type: ignore[override]
        return ((key, unpack_head(stored)) for key, stored in self.table.items()
                if stored is not None)


#: One head write the engine makes once the outputs before it are delivered: (key, the head,
#: or None to delete it).
HeadWrite = tuple[bytes, dict[str, Any] | None]


#: What :meth:`StagedHeads.take_pending` returns when nothing is staged (never written to).
_NONE: list[HeadWrite] = []


class StagedHeads(MutableMapping[bytes, Any]):
    """The heads as the driver writes them on the faust engine: each write is staged (read
    back at once) and listed, and the engine writes the list into :attr:`store` (faust's
    table, whose writes are changelog records) once the outputs of the records that made
    them are confirmed (:meth:`take_pending`, :meth:`write`): a run's ``done`` head never
    reaches the changelog before its outcomes."""

    def __init__(self, store: MutableMapping[bytes, Any]) -> None:
        self.store = store
        #: The staged heads by key (None: deleted), and the writes in order.
        self.staged: dict[bytes, dict[str, Any] | None] = {}
        self.pending: list[HeadWrite] = []

    def __getitem__(self, key: bytes) -> Any:
        staged = self.staged
        if key in staged:
            head = staged[key]
            if head is None:
                raise KeyError(key)
            return head
        return self.store[key]

    def get(self, key: bytes, default: Any = None) -> Any:
        staged = self.staged
        if key in staged:
            head = staged[key]
            return default if head is None else head
        return self.store.get(key, default)

    def __setitem__(self, key: bytes, head: Any) -> None:
        self.staged[key] = head
        self.pending.append((key, head))

    def __delitem__(self, key: bytes) -> None:
        if self.get(key) is None:
            raise KeyError(key)
        self.staged[key] = None
        self.pending.append((key, None))

    def __iter__(self) -> Iterator[bytes]:
        staged = self.staged
        yield from (key for key in self.store if key not in staged)
        yield from (key for key, head in list(staged.items()) if head is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def items(self) -> Iterator[tuple[bytes, Any]]:  # type: ignore[override]
        staged = self.staged
        for key, head in self.store.items():
            if key not in staged:
                yield key, head
        yield from ((key, head) for key, head in list(staged.items()) if head is not None)

    def take_pending(self) -> list[HeadWrite]:
        """The writes staged since the last call (still read back until :meth:`write`); the
        one empty list :data:`_NONE` when there are none (most records: no list made)."""
        pending = self.pending
        if not pending:
            return _NONE
        self.pending = []
        return pending

    def write(self, writes: list[HeadWrite]) -> None:
        """Write ``writes`` into the store, in order (in the stream's context: faust sends a
        table write's changelog record to the current event's partition)."""
        store, staged = self.store, self.staged
        for key, head in writes:
            if head is None:
                if store.get(key) is not None:
                    del store[key]
            else:
                store[key] = head
            if key in staged and staged[key] is head:
                del staged[key]
