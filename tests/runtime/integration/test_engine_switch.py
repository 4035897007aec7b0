"""One deployment switches engines both ways on the real broker (issue 23, item 11;
decision 0009): the kafka engine, then the faust engine, then the kafka engine again, on one
config (app id, topics, consumer group, heads changelog), each deciding runs, and runs left
open by one engine finished by the next.

The kafka engine writes its heads in transactions, so its changelog ends in commit markers
(and holds aborted records when a transaction fails): faust's recovery, which waited for a
record at the changelog's end offset minus one, never finished, and read aborted records.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.consumer.fetcher import READ_COMMITTED  # type: ignore[import-untyped]
from confluent_kafka import Consumer, Producer, TopicPartition
from conftest import MakeTopic
from faust.types import TP
from worker_harness import (
    Reader,
    Stack,
    WorkerProcess,
    assert_same_outcomes,
    expected,
    finished,
    make_stack,
    partition_of,
    provider_run,
    publish_envelopes,
    two_call_runs,
)

from worker.runtime import admin
from worker.runtime.faust_engine import app as faust_app
from worker.runtime.partition import encode_head

PARTITIONS = 2


@pytest.fixture
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=PARTITIONS) as made:
        yield made


def _phase(stack: Stack, engine: str, log: Path,
           publish: list[dict[str, object]], done: list[str]) -> WorkerProcess:
    """Run ``engine`` on the stack until every run of ``done`` has its final message (the
    envelopes of ``publish`` sent once it is ready), then stop it cleanly."""
    stack.settings["LATCH_WORKER__ENGINE"] = engine
    worker = WorkerProcess(stack, log)
    try:
        worker.wait_ready()
        publish_envelopes(stack.bootstrap, stack.topic("events"), publish)
        reader = Reader(stack)
        try:
            reader.collect(finished(done), timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{engine} engine: {exc}\n{worker.tail(40)}") from None
        finally:
            reader.close()
        assert worker.stop() == 0
        assert worker.problems() == []
        return worker
    finally:
        if worker.proc.poll() is None:
            worker.kill()


def _halves(runs: dict[str, list[dict[str, object]]]
            ) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    heads = [e for run in runs.values() for e in run[: len(run) // 2]]
    tails = [e for run in runs.values() for e in run[len(run) // 2:]]
    return heads, tails


def _rebuilt_open(worker: WorkerProcess) -> int:
    """How many open runs the worker's rebuilds found, over its partitions."""
    return sum(int(n) for n in re.findall(r"; (\d+) runs open", worker.log()))


def test_kafka_then_faust_then_kafka_on_one_deployment(stack: Stack, tmp_path: Path) -> None:
    """kafka -> faust -> kafka on one config. Each phase decides runs published to it, and
    finishes the runs the previous engine left half-streamed (their open heads read from the
    other engine's changelog: the faust engine's recovery gets through the kafka engine's
    commit markers). The outcomes of all runs are the offline core's."""
    first, second, third = (two_call_runs(p, PARTITIONS, 1) for p in ("k1", "f2", "k3"))
    open1, open2 = (two_call_runs(p, PARTITIONS, 1) for p in ("k1open", "f2open"))
    heads1, tails1 = _halves(open1)
    heads2, tails2 = _halves(open2)
    every = [e for runs in (first, second, third) for run in runs.values() for e in run]

    kafka1 = _phase(stack, "kafka", tmp_path / "kafka1.log",
                    [e for run in first.values() for e in run] + heads1, list(first))
    assert _rebuilt_open(kafka1) == 0
    faust = _phase(stack, "faust", tmp_path / "faust.log",
                   [e for run in second.values() for e in run] + tails1 + heads2,
                   [*second, *open1])
    assert _rebuilt_open(faust) == len(open1)  # the kafka engine's open heads, restored
    kafka2 = _phase(stack, "kafka", tmp_path / "kafka2.log",
                    [e for run in third.values() for e in run] + tails2, [*third, *open2])
    assert _rebuilt_open(kafka2) == len(open2)  # the faust engine's open heads, restored

    reader = Reader(stack)
    try:
        reader.collect(finished([*first, *second, *third, *open1, *open2]), timeout=30)
        assert_same_outcomes(reader, expected(every + heads1 + tails1 + heads2 + tails2,
                                              stack.config()))
    finally:
        reader.close()


def test_the_faust_engine_reads_no_aborted_head(stack: Stack, tmp_path: Path) -> None:
    """A head in an aborted transaction of the heads changelog (a kafka-engine transaction
    that failed) never happened: a faust engine started on the changelog must not read it.
    The aborted head says run R is done; R is open in the events log, so a worker that read
    the aborted head would drop R's records and never decide it. R gets its final message,
    and the committed transaction after the aborted one (its head for another run) is read."""
    config = stack.config()
    changelog = admin.heads_changelog(config)
    [run_id, other] = [f"aborted-{n}" for n in range(2)]
    partition = partition_of(run_id, PARTITIONS)
    producer = Producer({"bootstrap.servers": stack.bootstrap,
                         "transactional.id": f"{stack.app_id}-test"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(changelog, key=run_id.encode(), partition=partition,
                     value=encode_head({"p": partition, "done": True, "seq": 3,
                                        "status": "completed", "at": 0}))
    assert producer.flush(30) == 0  # in the log: abort_transaction purges what is unsent
    producer.abort_transaction(30)
    producer.begin_transaction()  # committed: its marker is the changelog's last offset
    producer.produce(changelog, key=other.encode(), partition=partition,
                     value=encode_head({"p": partition, "done": True, "seq": 3,
                                        "status": "completed", "at": 0}))
    producer.commit_transaction(30)
    run = provider_run("openai.chat", run_id,
                       [("call_1", "read_file", orjson.dumps({"path": "/a"}).decode())])
    worker = _phase(stack, "faust", tmp_path / "faust.log", run, [run_id])
    assert "runs open" in worker.log()
    reader = Reader(stack)
    try:
        reader.collect(finished([run_id]), timeout=30)
        assert_same_outcomes(reader, expected(run, config))
    finally:
        reader.close()


def test_last_records_skips_markers_and_aborted_records(kafka_bootstrap: str,
                                                         make_topic: MakeTopic) -> None:
    """Where faust's recovery of a changelog partition ends: the last record a
    read_committed reader receives. Partition 0 ends in a commit marker (offset 2, after a
    plain record and a committed one: the end is 3, the last record 1); partition 1 ends in
    an aborted transaction longer than the first look back (``TAIL``), so the reader looks
    further and finds the committed record before it; partition 2 holds only an aborted
    transaction (no record: the log start minus one); partition 3 is empty."""
    topic = make_topic(partitions=4)
    plain = Producer({"bootstrap.servers": kafka_bootstrap})
    plain.produce(topic, b"v", key=b"k", partition=0)
    plain.produce(topic, b"v", key=b"k", partition=1)
    assert plain.flush(30) == 0
    producer = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"{topic}-test"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"v", key=b"k", partition=0)
    producer.commit_transaction(30)
    for partition, count in ((1, faust_app.TAIL * 2), (2, 3)):
        producer.begin_transaction()
        for _ in range(count):
            producer.produce(topic, b"aborted", key=b"k", partition=partition)
        assert producer.flush(30) == 0  # in the log: abort_transaction purges what is unsent
        producer.abort_transaction(30)
    ends = {p: Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "unused"})
            .get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(4)}
    assert ends == {0: 3, 1: 2 + faust_app.TAIL * 2, 2: 4, 3: 0}  # markers included
    tps = [TP(topic, p) for p in range(4)]
    found = asyncio.run(faust_app.last_records(
        {"bootstrap_servers": kafka_bootstrap}, tps))
    assert found == {tps[0]: 1, tps[1]: 0, tps[2]: -1, tps[3]: -1}


def test_the_faust_engines_consumer_reads_committed(kafka_bootstrap: str) -> None:
    """The faust engine's consumer (the one faust reads events, control and the heads
    changelog with) is created at read_committed, though faust picks that for exactly-once
    apps only. It is set on the consumer faust creates, before it starts: this checks what
    the started consumer's fetcher uses, and fails if an aiokafka or faust upgrade stops it
    from taking."""
    async def isolation() -> int:
        app = faust_app.App("isolation-check", reader_options={},
                                 broker=f"kafka://{kafka_bootstrap}")
        consumer: Any = app.consumer
        created = consumer._new_consumer_thread()._create_worker_consumer(app.transport)
        await created.start()
        try:
            level: int = created._fetcher._isolation_level
            return level
        finally:
            await created.stop()

    assert asyncio.run(isolation()) == READ_COMMITTED
