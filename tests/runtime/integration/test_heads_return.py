"""Heads are exact after a partition moves away and comes back once compaction has removed
the tombstone of a run that finished elsewhere meanwhile (issue 9, item 9).

Worker A opens a run R live (its ``start`` head is written by A), then R's partition moves
to worker B, which finishes R and, after ``finished_run_retention_s``, tombstones its head.
The heads changelog is set to compact eagerly, and the test waits until no record of R is
left in it. Then B stops and the partition returns to A, whose faust recovery re-reads the
changelog (nothing about R). Before the fix, A's memory store still held R's live-written
``start`` head: A re-read R from its start, R finished during the rebuild, and A published
R's final message a second time. Now A sees no open run, and R has one final message.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from worker_harness import (
    Reader,
    Stack,
    WorkerProcess,
    assignments,
    finished,
    make_stack,
    partition_of,
    provider_run,
    publish_envelopes,
    run_ids,
)

from worker.runtime import admin

PARTITIONS = 2
EAGER_COMPACTION = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
                    "delete.retention.ms": "0", "min.compaction.lag.ms": "0",
                    "max.compaction.lag.ms": "1000"}


@pytest.fixture
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    # (the result latch off: done heads at the final message, as the offline core decides)
    with make_stack(kafka_bootstrap, request.node.name, partitions=PARTITIONS,
                    worker__finished_run_retention_s="1", worker__tick_interval_s="0.5",
                    results__enabled="false") as made:
        client = AdminClient({"bootstrap.servers": made.bootstrap})
        changelog = admin.heads_changelog(made.config())
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                   for k, v in EAGER_COMPACTION.items()]
        resource = ConfigResource(ConfigResource.Type.TOPIC, changelog,
                                  incremental_configs=entries)
        client.incremental_alter_configs([resource])[resource].result(timeout=30)
        yield made


def _keys_in_changelog(stack: Stack, partition: int) -> set[bytes]:
    """Every key that a record of the changelog partition still holds (tombstones too)."""
    topic = admin.heads_changelog(stack.config())
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    try:
        tp = TopicPartition(topic, partition, OFFSET_BEGINNING)
        _, end = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([tp])
        keys: set[bytes] = set()
        position = -1
        while position < end - 1:
            batch = consumer.consume(500, timeout=1)
            if not batch:
                break
            for msg in batch:
                if msg.error() is None:
                    keys.add(msg.key() or b"")
                    position = msg.offset()
        return keys
    finally:
        consumer.close()


def _run_in(prefix: str, partition: int) -> str:
    return next(r for r in run_ids(prefix, PARTITIONS, per_partition=1)
                if partition_of(r, PARTITIONS) == partition)


def _whole(run_id: str) -> list[dict[str, object]]:
    return provider_run("openai.chat", run_id, [(f"call_{run_id}", "read_file",
                                                 '{"path": "/p"}')])


def test_a_partition_back_after_compaction_sees_no_finished_run_as_open(
        stack: Stack, tmp_path: Path) -> None:
    """R is opened on A, finished and tombstoned on B, compacted out of the changelog; when
    its partition returns to A, A rebuilds no open run and R keeps exactly one final
    message."""
    a = WorkerProcess(stack, tmp_path / "a.log")
    b = None
    try:
        a.wait_ready()
        heads = {p: provider_run("openai.chat", _run_in("back", p),
                                 [(f"call_back_{p}", "read_file", '{"path": "/r"}')])
                 for p in range(PARTITIONS)}
        publish_envelopes(stack.bootstrap, stack.topic("events"),
                          [e for run in heads.values() for e in run[:3]])
        for p in range(PARTITIONS):  # A has opened both runs, live
            a.wait_for(rf"partition {p}: rebuilt")
        deadline = time.monotonic() + 30  # the run.start records are applied: heads written
        while not all(str(run[0]["run_id"]).encode() in _keys_in_changelog(stack, p)
                      for p, run in heads.items()):
            assert time.monotonic() < deadline, "A never wrote the runs' heads"
            time.sleep(0.2)

        b = WorkerProcess(stack, tmp_path / "b.log")
        b.wait_ready()
        deadline = time.monotonic() + 40
        while not (assignments(b) and len(assignments(b)[-1]) == 1):
            assert time.monotonic() < deadline, "B never got a partition"
            time.sleep(0.2)
        (q,) = assignments(b)[-1]
        run = heads[q]
        run_id = str(run[0]["run_id"])
        publish_envelopes(stack.bootstrap, stack.topic("events"), run[3:])
        reader = Reader(stack)
        reader.collect(finished([run_id]), timeout=60)

        # B tombstones R's head after the retention; more runs on q roll the changelog's
        # segments so that the cleaner can remove R's records, the tombstone included.
        deadline, n = time.monotonic() + 240, 0
        while run_id.encode() in _keys_in_changelog(stack, q):
            assert time.monotonic() < deadline, "compaction never removed the run's records"
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              _whole(_run_in(f"roll{n}", q)))
            n += 1
            time.sleep(2)

        assert b.stop() == 0
        deadline = time.monotonic() + 60
        while assignments(a)[-1] != set(range(PARTITIONS)):
            assert time.monotonic() < deadline, "the partition never came back to A"
            time.sleep(0.2)
        later = _run_in("later", q)
        publish_envelopes(stack.bootstrap, stack.topic("events"), _whole(later))
        reader.collect(finished([later]), timeout=60)
        finals = [r for r in reader.of("final") if r.value["run_id"] == run_id]
        assert len(finals) == 1, a.tail()
        assert "finished during the rebuild without a done head" not in a.log()
        assert a.stop() == 0
    finally:
        for proc in (a, b):
            if proc is not None and proc.proc.poll() is None:
                proc.kill()
