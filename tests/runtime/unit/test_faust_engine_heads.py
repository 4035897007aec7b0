"""The faust engine's heads (worker/runtime/faust_engine/heads.py): its table keeps an open
run's head packed, writes every head to its changelog as the JSON object both engines read,
and reads a recovered changelog back packed; :class:`FaustHeadsMap` registers each written
key's partition with faust's store and drops the heads of partitions owned elsewhere; the
driver's writes are staged (:class:`StagedHeads`), read back at once and written into the
table only when the engine says, in order."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.serializers import codecs

from worker.core import Assembler
from worker.runtime.config import load_config
from worker.runtime.faust_engine.engine import FaustEngine
from worker.runtime.faust_engine.heads import (
    FaustHeadsMap,
    FaustHeadsTable,
    HeadsCodec,
    StagedHeads,
)
from worker.runtime.kafka_engine.heads import KafkaHeadsTable as KafkaHeadsTable
from worker.runtime.partition import Heads, PartitionState

HEADS = [
    {"p": 2, "start": 40},
    {"p": 0, "start": 7, "cancel": True},
    {"p": 1, "done": True, "seq": 12, "status": "completed", "at": 1_700_000_000_000},
]


class _Table(dict[bytes, Any]):
    """A table as FaustHeadsMap reads it, its store without a partition registry."""

    data: Any = None


@pytest.fixture(scope="module")
def latch() -> FaustEngine:
    return FaustEngine(load_config(None, env={"LATCH_TOPICS__PARTITIONS": "3"}))


def test_the_worker_table_and_its_changelog_topic_use_the_head_codec(latch: FaustEngine
                                                                      ) -> None:
    """Both directions: the writes (the table's serializer) and recovery (the changelog
    topic's schema, built by faust's table manager when the table was made)."""
    assert isinstance(latch.heads, FaustHeadsTable)
    assert isinstance(latch.heads.value_serializer, HeadsCodec)
    topic = latch.heads.changelog_topic
    assert isinstance(topic.value_serializer, HeadsCodec)
    message = SimpleNamespace(value=b'{"p": 2, "start": 40}', headers={})
    assert topic.schema.loads_value(latch.app, message) == (2, 40)


@pytest.mark.parametrize("head", HEADS)
def test_each_head_is_written_as_the_json_object_both_engines_read(head: dict[str, Any]
                                                                   ) -> None:
    """Every head round-trips through ``HeadsCodec`` (an open run's packed), is written as the JSON
    object orjson and faust's json codec read, and the kafka engine's heads table restores it."""
    codec = HeadsCodec()
    packed = codec.loads(codec.dumps(head))
    assert packed == ((2, 40) if head == HEADS[0] else head)  # only an open run's is packed
    for written in (codec.dumps(head), codec.dumps(packed)):
        assert orjson.loads(written) == head
        assert codecs.get_codec("json").loads(written) == head  # faust's json codec
    kafka = KafkaHeadsTable()
    kafka.restore(head["p"], [(b"run", codec.dumps(packed))])
    assert kafka[b"run"] == head


@pytest.mark.parametrize("value", [b"[1, 2]", b"\xff", b"7", b'"p"', b"{"])
def test_a_changelog_value_that_is_no_head_reads_as_none_and_is_skipped(value: bytes) -> None:
    """A changelog value that is no head decodes to None, and the tracked table skips it:
    not listed, ``get`` gives None, indexing raises ``KeyError``."""
    assert HeadsCodec().loads(value) is None
    table = FaustHeadsMap(_Table({b"bad": None, b"open": (1, 9)}))
    assert dict(table.items()) == {b"open": {"p": 1, "start": 9}}
    assert table.get(b"bad") is None
    with pytest.raises(KeyError):
        table[b"bad"]


def test_heads_read_as_dicts_while_an_open_head_is_kept_packed() -> None:
    """An opened run's head is stored packed as ``(partition, offset)`` yet reads as its dict, and
    ``Heads.load`` gives the partition's open runs with their start offsets."""
    store = _Table()
    heads = Heads(FaustHeadsMap(store), retention_s=60)
    heads.opened(b"open", partition=1, offset=17)
    assert store == {b"open": (1, 17)}
    assert heads.table[b"open"] == {"p": 1, "start": 17}
    assert heads.load(PartitionState(Assembler(), next_offset=30), 1) == {b"open": 17}


class _Store:
    """faust's memory store as :class:`FaustHeadsMap` sees it: its data (here the table's own
    mapping, as faust's table reads its store), and the registry of each key's partition
    that changelog recovery fills."""

    def __init__(self, data: dict[bytes, Any]) -> None:
        self.data = data
        self._key_partition: dict[bytes, int] = {}


class _ChangelogTable(_Table):
    """A table whose deletes (in faust: a tombstone to the changelog) are noted."""

    def __init__(self) -> None:
        super().__init__()
        self.data = _Store(self)
        self.deleted: list[bytes] = []

    def __delitem__(self, key: bytes) -> None:
        self.deleted.append(key)
        super().__delitem__(key)


def test_a_written_head_registers_its_partition_and_keep_only_drops_the_others() -> None:
    """Each head written through the map registers its key's partition with the store (as
    recovery would); ``keep_only`` drops from memory every key of a partition not owned and
    says how many, without a changelog write (no delete through the table)."""
    table = _ChangelogTable()
    heads = FaustHeadsMap(table)
    heads[b"a"] = {"p": 0, "start": 1}
    heads[b"b"] = {"p": 1, "start": 2}
    heads[b"c"] = {"p": 2, "done": True, "seq": 3, "status": "completed"}
    assert table.data._key_partition == {b"a": 0, b"b": 1, b"c": 2}
    assert heads.keep_only([1]) == 2
    assert dict(heads.items()) == {b"b": {"p": 1, "start": 2}}
    assert table.data._key_partition == {b"b": 1} and table.deleted == []
    del heads[b"b"]  # a deletion through the map is a changelog write
    assert table.deleted == [b"b"]
    assert FaustHeadsMap(_Table()).keep_only([0]) == 0  # a store without the registry


def test_staged_heads_read_back_at_once_and_reach_the_store_only_when_written() -> None:
    """A head the driver writes is read back at once (``[]``, ``get``, ``in``, ``items``,
    ``len``) while the store holds none; ``take_pending`` gives the writes once, in order;
    ``write`` puts them into the store, after which the stage is empty."""
    store: dict[bytes, Any] = {b"old": {"p": 0, "start": 1}}
    staged = StagedHeads(store)
    staged[b"r1"] = {"p": 0, "start": 5}
    assert staged[b"r1"] == {"p": 0, "start": 5} and staged.get(b"r1") == {"p": 0, "start": 5}
    assert b"r1" not in store
    assert dict(staged.items()) == {b"old": {"p": 0, "start": 1}, b"r1": {"p": 0, "start": 5}}
    assert sorted(staged) == [b"old", b"r1"] and len(staged) == 2
    pending = staged.take_pending()
    assert pending == [(b"r1", {"p": 0, "start": 5})]
    assert staged.take_pending() == []
    staged.write(pending)
    assert store[b"r1"] == {"p": 0, "start": 5} and staged.staged == {}


def test_a_staged_delete_hides_the_head_until_it_is_written() -> None:
    """Deleting a head the store holds stages a deletion: the head reads as gone at once
    (``KeyError``, ``get`` default, not listed) while the store keeps it until the write;
    deleting a head that is nowhere raises ``KeyError`` and stages nothing."""
    store: dict[bytes, Any] = {b"r1": {"p": 0, "done": True, "seq": 1, "status": "completed"}}
    staged = StagedHeads(store)
    del staged[b"r1"]
    with pytest.raises(KeyError):
        staged[b"r1"]
    assert staged.get(b"r1", "gone") == "gone" and list(staged) == [] and b"r1" in store
    with pytest.raises(KeyError):
        del staged[b"never"]
    pending = staged.take_pending()
    assert pending == [(b"r1", None)]
    staged.write(pending)
    assert store == {} and staged.staged == {}


def test_writes_reach_the_store_in_order_and_a_later_stage_stays_staged() -> None:
    """Two writes of one key reach the store in order (the last wins); a head staged again
    after the engine took the pending writes stays staged (read back) when the earlier
    writes are written, and reaches the store with its own write."""
    store: dict[bytes, Any] = {}
    staged = StagedHeads(store)
    staged[b"r1"] = {"p": 0, "start": 5}
    staged[b"r1"] = {"p": 0, "done": True, "seq": 2, "status": "completed"}
    first = staged.take_pending()
    staged[b"r1"] = {"p": 0, "done": True, "seq": 3, "status": "cancelled"}
    staged.write(first)
    assert store[b"r1"]["seq"] == 2
    assert staged[b"r1"]["seq"] == 3  # the newer stage still reads back
    staged.write(staged.take_pending())
    assert store[b"r1"]["seq"] == 3 and staged.staged == {}
