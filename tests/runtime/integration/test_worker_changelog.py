"""The table holds run heads, not argument buffers: its changelog grows by a few small
records per run, however many bytes of arguments the run streams."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from worker_harness import (
    Reader,
    WorkerProcess,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
)

ARGUMENT_BYTES = 256 * 1024
FRAGMENT = 16


def changelog(bootstrap: str, topic: str, partitions: int) -> list[tuple[bytes, bytes]]:
    """Every record now in the changelog topic, as (key, value)."""
    return [(key, value) for _, key, value in _records(bootstrap, topic, partitions)]


def _records(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, bytes, bytes]]:
    """Every record now in ``topic``, as (offset, key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
        consumer.assign(tps)
        records: list[tuple[bytes, bytes]] = []
        seen = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + 30
        while any(seen[p] < end for p, end in ends.items()) and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is None:
                    seen[msg.partition()] = msg.offset() + 1
                    records.append((msg.offset(), msg.key(), msg.value()))
        return records
    finally:
        consumer.close()


def test_changelog_bytes_do_not_grow_with_argument_bytes(
        kafka_bootstrap: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A 256 KiB argument streamed in 16-byte fragments through the real broker costs the
    changelog two small records (the run's open head and its done head): far below the
    3x-the-argument bound that a buffer-in-the-table design would blow through (O(n^2))."""
    text = orjson.dumps({"path": "x" * (ARGUMENT_BYTES - 11)}).decode()
    assert len(text.encode()) == ARGUMENT_BYTES
    run_id = "big-run"
    envelopes = provider_run("openai.chat", run_id, [("call_big", "read_file", text)],
                             size=FRAGMENT)
    assert len(envelopes) > ARGUMENT_BYTES // FRAGMENT

    # (the result latch off: a run's head closes at its final message, not at its turn)
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    results__enabled="false") as stack:
        worker = WorkerProcess(stack, tmp_path / "worker.log")
        try:
            worker.wait_ready()
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            reader = Reader(stack)
            reader.collect(finished([run_id]), timeout=55)
            [committed] = reader.of("committed")
            assert committed.value["arguments"] == orjson.loads(text)
            topic = f"{stack.app_id}-heads-changelog"
            deadline = time.monotonic() + 15
            while len(records := changelog(stack.bootstrap, topic, 1)) < 2:
                assert time.monotonic() < deadline, f"changelog holds {records}"
                time.sleep(0.5)
            assert worker.stop() == 0
        finally:
            if worker.proc.poll() is None:
                worker.kill()
        # The worker's ticks go into the events partition too, and one may come before the
        # run's first envelope: the open head names that envelope's offset, whatever it is.
        offsets = [offset for offset, key, _ in _records(stack.bootstrap, stack.topic("events"),
                                                         1) if key == run_id.encode()]
        start, last = min(offsets), max(offsets)

    changelog_bytes = sum(len(k) + len(v) for k, v in records)
    ratio = changelog_bytes / ARGUMENT_BYTES
    print(f"\nchangelog: {len(records)} records, {changelog_bytes} bytes for "
          f"{ARGUMENT_BYTES} argument bytes in {len(envelopes)} envelopes: ratio {ratio:.5f}")
    # (a rebalance may write a head twice, with the same value: at least once)
    heads = [orjson.loads(v) for _, v in records]
    assert all(isinstance(h.pop("at", 0), int) for h in heads)  # the done head's record time
    assert {orjson.dumps(h) for h in heads} == {orjson.dumps(h) for h in [
        {"p": 0, "start": start},
        # "o": read to past the run's last envelope (a decision read again below it is a
        # repeat, not a second decision)
        {"p": 0, "done": True, "seq": len(envelopes) - 1, "status": "completed",
         "o": last + 1}]}, heads
    assert ratio <= 3


def test_finished_heads_are_tombstoned_after_the_retention(
        kafka_bootstrap: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A finished run's done head leaves the table once ``finished_run_retention_s`` of
    record time has passed (pruned at a tick): the changelog gets a tombstone for it, so the
    table does not grow by one head per run forever, while an open run keeps its head."""
    done_run, open_run = "short-run", "still-open"
    envelopes = provider_run("openai.chat", done_run, [("call_1", "read_file", '{"path": "/a"}')])
    opened = provider_run("openai.chat", open_run, [("call_2", "read_file", '{"path": "/b"}')])
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    results__enabled="false",  # (done heads at the final message)
                    worker__finished_run_retention_s="1",
                    agent_stream_assemble__assemble_idle_timeout_s="600") as stack:
        worker = WorkerProcess(stack, tmp_path / "worker.log")
        try:
            worker.wait_ready()
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes + opened[:2])
            Reader(stack).collect(finished([done_run]), timeout=30)
            topic = f"{stack.app_id}-heads-changelog"
            deadline = time.monotonic() + 30
            records = changelog(stack.bootstrap, topic, 1)
            while (done_run.encode(), None) not in records:
                assert time.monotonic() < deadline, f"no tombstone; changelog holds {records}"
                time.sleep(0.5)
                records = changelog(stack.bootstrap, topic, 1)
            assert worker.stop() == 0
        finally:
            if worker.proc.poll() is None:
                worker.kill()
    latest = dict(records)
    assert latest[done_run.encode()] is None
    assert set(orjson.loads(latest[open_run.encode()])) == {"p", "start"}
