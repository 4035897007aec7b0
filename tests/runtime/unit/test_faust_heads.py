"""The faust engine's heads table keeps an open run's head packed, writes every head to its
changelog as the JSON object both engines read, and reads a recovered changelog back packed
(worker/runtime/faust_engine/heads.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.serializers import codecs

from worker.core import Assembler
from worker.runtime.config import load_config
from worker.runtime.faust_engine.engine import FaustEngine
from worker.runtime.faust_engine.heads import FaustHeadsMap, FaustHeadsTable, HeadsCodec
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
