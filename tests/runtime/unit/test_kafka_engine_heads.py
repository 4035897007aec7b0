"""The kafka engine's heads table (``worker/runtime/kafka_engine/heads.py``), without a
broker: each head written or deleted is one pending changelog record in the head's partition
(the faust engine's encoding, so either engine restores the other's heads), an open run's head
is kept packed, a restore replays a partition's changelog and writes nothing, and a revoked
partition's heads go without a write."""

from __future__ import annotations

import pytest
from faust.serializers import codecs

from worker.core import Assembler, RunStatus
from worker.runtime.config import load_config
from worker.runtime.kafka_engine.heads import KafkaHeadsTable
from worker.runtime.partition import Heads, PartitionState, decode_head, encode_head


def test_heads_written_become_pending_changelog_records_in_their_partition() -> None:
    """Each head written or deleted through ``Heads`` is one pending changelog record in the
    head's partition (a tombstone for a delete), taken once."""
    table = KafkaHeadsTable()
    heads = Heads(table, retention_s=1)
    state = PartitionState(Assembler(load_config(None, env={}).assemble), next_offset=0)
    heads.opened(b"run-1", 2, 40)
    heads.opened(b"run-2", 0, 41)
    del table[b"run-2"]
    assert table.take_pending() == [(2, b"run-1", b'{"p":2,"start":40}'),
                                    (0, b"run-2", b'{"p":0,"start":41}'), (0, b"run-2", None)]
    assert table.take_pending() == []
    assert dict(table) == {b"run-1": {"p": 2, "start": 40}}
    assert table.data[b"run-1"] == (2, 40)  # an open run's head is kept compact
    heads.finished(state, 2, ["run-1"])  # any other head is kept as it is
    assert table[b"run-1"]["done"] is True and isinstance(table.data[b"run-1"], dict)
    table.drop(2)
    assert dict(table) == {}
    assert state.next_offset == 0


def test_restore_replays_a_partitions_changelog_and_writes_nothing() -> None:
    """Restoring a partition keeps the last value of each key, drops tombstoned keys and
    values that are not JSON objects, leaves other partitions' heads alone, and queues no
    changelog record."""
    table = KafkaHeadsTable()
    table.data[b"other"] = {"p": 1, "start": 3}
    table.data[b"stale"] = {"p": 0, "start": 1}
    table.restore(0, [(b"a", encode_head({"p": 0, "start": 5})),
                      (b"b", encode_head({"p": 0, "start": 6})),
                      (b"a", encode_head({"p": 0, "done": True, "seq": 9, "status": "completed"})),
                      (b"b", None), (b"c", b"[1, 2]"), (b"d", b"\xff"), (None, b"{}")])
    assert dict(table) == {b"other": {"p": 1, "start": 3},
                           b"a": {"p": 0, "done": True, "seq": 9, "status": "completed"}}
    assert table.pending == []
    table.drop(1)
    assert list(table) == [b"a"]


def test_changelog_values_are_read_by_faust_and_faust_values_by_us() -> None:
    """A head this engine writes decodes with faust's ``json`` codec (the faust engine's
    table values), and a head faust writes decodes here: the engines share one changelog."""
    head = {"p": 3, "done": True, "seq": 12, "status": "cancelled", "at": 1700000000000}
    json_codec = codecs.get_codec("json")
    assert json_codec.loads(encode_head(head)) == head
    assert decode_head(json_codec.dumps(head)) == head


def test_restored_heads_give_the_assembler_its_finished_runs_and_the_open_starts() -> None:
    """After a restore, ``Heads.load`` registers the partition's finished runs with the new
    assembler and returns the open runs' start offsets (the rebuild's starting points)."""
    table = KafkaHeadsTable()
    table.restore(1, [(b"open", encode_head({"p": 1, "start": 17})),
                      (b"done", encode_head({"p": 1, "done": True, "seq": 4,
                                             "status": "cancelled"}))])
    state = PartitionState(Assembler(load_config(None, env={}).assemble), next_offset=30)
    assert Heads(table, retention_s=60).load(state, 1) == {b"open": 17}
    assert state.assembler.finished("done") == (4, RunStatus.CANCELLED)


def test_a_delete_of_a_missing_head_raises_and_writes_nothing() -> None:
    """Deleting a head the table does not hold raises ``KeyError`` (the mapping's contract,
    which ``Heads`` relies on) and queues no tombstone."""
    table = KafkaHeadsTable()
    with pytest.raises(KeyError):
        del table[b"never"]
    assert table.take_pending() == []


def test_a_restored_head_belongs_to_the_partition_it_was_read_from() -> None:
    """A changelog head is restored into the partition whose changelog held it, whatever
    its own ``"p"`` says (the changelog partition is the events partition), and dropped
    with that partition."""
    table = KafkaHeadsTable()
    table.restore(2, [(b"moved", encode_head({"p": 5, "start": 3}))])
    assert table[b"moved"] == {"p": 2, "start": 3}
    table.drop(5)
    assert b"moved" in table
    table.drop(2)
    assert len(table) == 0 and table.take_pending() == []
