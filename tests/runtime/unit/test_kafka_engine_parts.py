"""The kafka engine's pieces without a broker: a batch's bounds and offsets, and the loop's
batches and commits. The heads table and its changelog records: ``test_kafka_engine_heads.py``;
the client settings that make exactly once hold: ``test_kafka_engine_settings.py``."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException

from worker.core import Assembler, Topic
from worker.runtime.config import load_config
from worker.runtime.kafka_engine.engine import KafkaEngine
from worker.runtime.kafka_engine.transaction import Batch
from worker.runtime.partition import PartitionState


def test_a_batch_is_due_by_records_or_by_age_and_commits_the_next_offsets() -> None:
    """A batch is due once it holds the maximum records or has been open the maximum time;
    the positions it commits are the next offsets, one per input partition, sorted."""
    batch = Batch(began=100.0)
    assert not batch.due(100.05, max_records=3, max_s=0.1)
    assert batch.due(100.2, max_records=3, max_s=0.1)
    batch.records = 3
    assert batch.due(100.0, max_records=3, max_s=0.1)
    batch.offsets[("events", 2)] = 8
    batch.offsets[("control", 0)] = 2
    batch.offsets[("events", 2)] = 9
    assert [(tp.topic, tp.partition, tp.offset) for tp in batch.positions()] == [
        ("control", 0, 2), ("events", 2, 9)]
    batch.events_topic = "events"
    batch.events[1] = 5
    batch.events[2] = 11  # the events partitions the loop records by number
    assert [(tp.topic, tp.partition, tp.offset) for tp in batch.positions()] == [
        ("control", 0, 2), ("events", 1, 5), ("events", 2, 11)]


class _Message:
    """A consumed events record, as confluent-kafka hands it over."""

    def __init__(self, topic: str, partition: int, offset: int, key: bytes,
                 doc: dict[str, Any]) -> None:
        self._where, self._key, self._value = (topic, partition, offset), key, orjson.dumps(doc)

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000 + self._where[2]

    def headers(self) -> None:
        return None


class _Producer:
    """Records what the engine queues in its transaction."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, int | None]] = []
        self.transactions = 0

    def begin_transaction(self) -> None:
        self.transactions += 1

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                partition: int | None = None, **options: Any) -> None:
        self.sent.append((topic, key, partition))


def test_one_consume_calls_records_count_in_the_batch_once_each() -> None:
    """The batch's record count and the next offset of each events partition (what the
    transaction commits, KIP-447) come out of one ``consume`` call as they did record by
    record (noted once at the call's end since issue 24): every applied record and
    forwarded control record counted; a repeat and a record of a partition not owned
    neither counted nor moving an offset; an owned partition without records not in the
    offsets."""
    config = load_config(None, env={"LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    engine = KafkaEngine(config)  # clients that never connect
    engine.txn.producer = _Producer()  # type: ignore[assignment]
    for partition in (0, 1, 5):
        engine.partitions[partition] = PartitionState(Assembler(config.assemble), 10)
    engine.control_next[1] = 3
    run = {"v": 1, "provider": "openai.chat", "seq": 0, "type": "run.start", "tools": []}
    cancel = {"v": 1, "type": "cancel", "run_id": "x", "ts": 1}
    messages = [_Message(engine.events, 0, 10, b"a", run | {"run_id": "a"}),
                _Message(engine.events, 1, 10, b"b", run | {"run_id": "b"}),
                _Message(engine.events, 0, 9, b"a", run | {"run_id": "a"}),  # a repeat
                _Message(engine.control, 1, 3, b"x", cancel),
                _Message(engine.events, 2, 10, b"c", run | {"run_id": "c"}),  # not owned
                _Message(engine.events, 1, 12, b"d", run | {"run_id": "d"})]  # (a gap)
    engine._apply_events(messages)  # type: ignore[arg-type]
    batch = engine.txn.batch
    assert batch is not None and batch.records == 4
    assert [(tp.topic, tp.partition, tp.offset) for tp in batch.positions()] == sorted([
        (engine.events, 0, 11), (engine.events, 1, 13), (engine.control, 1, 4)])
    engine._apply_events([_Message(engine.events, 5, 10, b"e", run | {"run_id": "e"})])  # type: ignore[list-item]
    assert batch.records == 5 and batch.events == {0: 11, 1: 13, 5: 11}


def test_per_record_only_the_offset_moves_unless_a_run_opens_or_ends() -> None:
    """In one transaction: the record that opens a run writes its head, records that neither
    open nor end a run write nothing (no head, no output) and only advance the partition's
    next offset and the batch's position, and the record that ends the run sends its outputs
    and its ``done`` head."""
    config = load_config(None, env={"LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    engine = KafkaEngine(config)  # clients that never connect
    producer = _Producer()
    engine.txn.producer = producer  # type: ignore[assignment]
    engine.partitions[3] = PartitionState(Assembler(config.assemble), next_offset=10)
    run = {"v": 1, "run_id": "r1", "provider": "openai.chat"}
    docs = [run | {"seq": 0, "type": "run.start", "tenant": "t1", "tools": []}]
    docs += [run | {"seq": n, "type": "provider.event", "event": {
        "id": "c1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}}
        for n in (1, 2, 3)]
    docs.append(run | {"seq": 4, "type": "stream.end"})
    messages = [_Message(engine.events, 3, 10 + n, b"r1", doc) for n, doc in enumerate(docs)]

    engine._apply_events(messages[:1])  # type: ignore[arg-type]
    assert producer.sent == [(engine.changelog, b"r1", 3)]
    for msg in messages[1:4]:
        engine._apply_events([msg])  # type: ignore[list-item]
    assert producer.sent == [(engine.changelog, b"r1", 3)]
    batch = engine.txn.batch
    assert batch is not None and batch.records == 4
    assert [(tp.topic, tp.partition, tp.offset) for tp in batch.positions()] == [
        (engine.events, 3, 14)]
    assert engine.partitions[3].next_offset == 14

    engine._apply_events(messages[4:])  # type: ignore[arg-type]
    topics = [topic for topic, _, _ in producer.sent[1:]]
    assert topics[-1] == engine.changelog and engine.outputs[Topic.FINAL] in topics
    assert engine.table[b"r1"]["done"] is True
    assert batch.positions()[0].offset == 15 and producer.transactions == 1
    engine._apply_events(messages[2:3])  # type: ignore[arg-type]  # a repeat: ignored
    assert batch.records == 5
    engine.consumer.close()


class _Consumer:
    """Hands the loop scripted ``consume`` results (each capped at what was asked) and
    records each call's (num_messages, timeout); stops the engine when the script ends."""

    def __init__(self, engine: KafkaEngine, script: list[list[_Message]]) -> None:
        self.engine, self.script, self.calls = engine, script, list[tuple[int, float]]()

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        self.calls.append((num_messages, timeout))
        return _scripted(self.engine, self.script, num_messages)


def _scripted(engine: KafkaEngine, script: list[list[_Message]],
              num_messages: int) -> list[_Message]:
    """The next scripted ``consume`` result, capped at ``num_messages``; at the script's end,
    stop the engine and return nothing."""
    if not script:
        engine.stopping = True
        return []
    taken = script[0][:num_messages]
    script[0] = script[0][num_messages:]
    if not script[0]:
        script.pop(0)
    return taken


def _looping_engine(max_records: int, script: list[list[_Message]] | None = None,
                    ) -> tuple[KafkaEngine, _Consumer, list[int]]:
    """An engine with a fake producer and consumer, partition 0 owned, no tick or lag read
    due; returns it, its consumer and the list of each commit's record count."""
    config = load_config(None, env={
        "LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1", "LATCH_WORKER__TICK_INTERVAL_S": "3600",
        "LATCH_WORKER__BATCH_MAX_RECORDS": str(max_records)})
    engine = KafkaEngine(config)  # clients that never connect
    engine.consumer.close()
    engine.txn.producer = _Producer()  # type: ignore[assignment]
    engine.partitions[0] = PartitionState(Assembler(config.assemble), next_offset=0)
    engine.lags_read = float("inf")
    commits: list[int] = []

    def commit(rewind: bool = True, wait: bool = True) -> None:
        if engine.txn.batch is not None:
            commits.append(engine.txn.batch.records)
        engine.txn.batch = None

    engine._commit = commit  # type: ignore[method-assign]
    consumer = _Consumer(engine, script or [])
    engine.consumer = consumer  # type: ignore[assignment]
    return engine, consumer, commits


def _deltas(engine: KafkaEngine, first: int, count: int) -> list[_Message]:
    """``count`` events records of one run (a start, then text deltas) from offset ``first``."""
    run = {"v": 1, "run_id": "r1", "provider": "openai.chat"}
    docs = [run | {"seq": n, "type": "provider.event", "event": {
        "id": "c1", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}}
        for n in range(first, first + count)]
    if first == 0:
        docs[0] = run | {"seq": 0, "type": "run.start", "tenant": "t1", "tools": []}
    return [_Message(engine.events, 0, first + n, b"r1", doc) for n, doc in enumerate(docs)]


def test_the_loop_commits_as_soon_as_its_input_is_drained() -> None:
    """Under a paced load the transaction commits once the records already fetched are
    taken (a ``consume`` without waiting returned fewer than asked), not after
    ``batch_max_ms``: a first record is waited for, the rest taken with a zero time-out, and
    each burst is its own transaction."""
    engine, consumer, commits = _looping_engine(10_000)
    first, second = _deltas(engine, 0, 3), _deltas(engine, 3, 2)
    consumer.script = [first[:1], first[1:], [], second[:1], second[1:]]
    engine._loop()
    assert commits == [3, 2]
    assert consumer.calls[:3] == [(1, 0.1), (1000, 0.0), (1, 0.1)]
    assert engine.partitions[0].next_offset == 5


def test_the_loop_still_bounds_a_transaction_under_a_backlog() -> None:
    """While every ``consume`` returns all it was asked (a backlog), the transaction is
    committed at ``batch_max_records``, never larger: the loop asks only for the room left."""
    engine, consumer, commits = _looping_engine(4)
    consumer.script = [_deltas(engine, 0, 10)]  # fewer than asked only at the end
    engine._loop()
    assert commits == [4, 4, 2]
    assert all(num <= 4 for num, _ in consumer.calls)


class _Transactions(_Producer):
    """A transactional producer whose ``commit_transaction`` waits for ``release`` and then
    fails with ``failure``, if set; records each call in ``calls``."""

    def __init__(self, failure: KafkaError | None = None) -> None:
        super().__init__()
        self.release, self.failure = threading.Event(), failure
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        super().begin_transaction()
        self.calls.append(f"begin {len(self.sent)}")

    def send_offsets_to_transaction(self, positions: list[Any], *args: Any) -> None:
        self.calls.append(f"offsets {[tp.offset for tp in positions]}")

    def commit_transaction(self, timeout: float) -> None:
        self.release.wait()
        if self.failure is not None:
            raise KafkaException(self.failure)
        self.calls.append(f"commit {len(self.sent)}")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


class _GroupConsumer:
    def consumer_group_metadata(self) -> object:
        return object()

    def assignment(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def _committing_engine(producer: _Transactions) -> KafkaEngine:
    config = load_config(None, env={"LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    engine = KafkaEngine(config)  # clients that never connect
    engine.consumer.close()
    engine.txn.producer = producer  # type: ignore[assignment]
    engine.consumer = _GroupConsumer()  # type: ignore[assignment]
    engine.partitions[0] = PartitionState(Assembler(config.assemble), next_offset=0)
    return engine


def _run_messages(engine: KafkaEngine, run_id: str, first: int) -> list[_Message]:
    """A whole run (start, one text delta, end) at offsets ``first`` on."""
    run = {"v": 1, "run_id": run_id, "provider": "openai.chat"}
    docs = [run | {"seq": 0, "type": "run.start", "tenant": "t1", "tools": []},
            run | {"seq": 1, "type": "provider.event", "event": {
                "id": "c1", "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}},
            run | {"seq": 2, "type": "stream.end"}]
    return [_Message(engine.events, 0, first + n, run_id.encode(), doc)
            for n, doc in enumerate(docs)]


def test_the_next_batch_is_applied_while_the_previous_commits_and_sent_after_it() -> None:
    """While a batch's commit is in flight the loop applies the next batch's records: their
    outputs and heads are held, not sent, until the commit returns; then the producer
    begins the next transaction and sends them, in order, before that batch commits with
    its own offsets (one transaction at a time, in offset order)."""
    producer = _Transactions()
    engine = _committing_engine(producer)
    engine._apply_events(_run_messages(engine, "r1", 0))
    first = list(producer.sent)
    engine._commit(wait=False)
    assert engine.txn.committing is not None and engine.txn.batch is None
    engine._apply_events(_run_messages(engine, "r2", 3))
    assert producer.sent == first and producer.transactions == 1  # held
    assert engine.txn.batch is not None and len(engine.txn.batch.held) == len(first)
    producer.release.set()
    engine._after(engine.txn.settle(), rewind=True)
    assert producer.transactions == 2 and engine.txn.committing is None
    assert [key for _, key, _ in producer.sent] == [b"r1"] * len(first) + [b"r2"] * len(first)
    engine._commit()
    assert producer.calls == [f"begin {0}", "offsets [3]", f"commit {len(first)}",
                              f"begin {len(first)}", "offsets [6]",
                              f"commit {2 * len(first)}"]
    assert engine.partitions[0].next_offset == 6 and engine.txn.batch is None


def test_a_commit_that_fails_takes_the_next_batch_with_it_and_rewinds() -> None:
    """When the commit in flight must be aborted, the next batch (applied meanwhile, held)
    is never sent nor committed: its offsets are past the aborted ones. The transaction is
    aborted and every owned partition rebuilt from its committed offset."""
    failure = KafkaError(KafkaError._FENCED, "aborted by the test", txn_requires_abort=True)
    producer = _Transactions(failure)
    engine = _committing_engine(producer)
    rewound: list[bool] = []
    engine._take_over = lambda partitions, seek: rewound.append(seek)  # type: ignore[method-assign]
    engine._apply_events(_run_messages(engine, "r1", 0))
    sent = list(producer.sent)
    engine._commit(wait=False)
    engine._apply_events(_run_messages(engine, "r2", 3))
    producer.release.set()
    engine._after(engine.txn.settle(), rewind=True)
    assert engine.txn.batch is None and engine.txn.committing is None
    assert producer.sent == sent and producer.transactions == 1  # r2's records never sent
    assert producer.calls == ["begin 0", "offsets [3]", "abort"] and rewound == [True]
    assert engine.table.pending == []


class _SlowCommits(_Transactions):
    """Transactions whose ``commit_transaction`` takes until ``release`` (at most 0.1 s)."""

    def commit_transaction(self, timeout: float) -> None:
        self.release.wait(0.1)
        self.release.clear()
        self.calls.append(f"commit {len(self.sent)}")


class _WatchingConsumer(_GroupConsumer):
    """Scripted ``consume`` results (as :class:`_Consumer`); notes at each call whether a
    commit was in flight, then lets that commit return and waits for it."""

    def __init__(self, engine: KafkaEngine, producer: _SlowCommits,
                 script: list[list[_Message]]) -> None:
        self.engine, self.producer, self.script = engine, producer, script
        self.calls: list[tuple[int, float, bool]] = []

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        commit = self.engine.txn.committing
        in_flight = commit is not None and not commit.done.is_set()
        self.calls.append((num_messages, timeout, in_flight))
        if in_flight:  # it returns now (so that the next call sees it returned)
            self.producer.release.set()
            assert commit is not None and commit.done.wait(5)
        return _scripted(self.engine, self.script, num_messages)


def _watched_engine(max_records: int) -> tuple[KafkaEngine, _SlowCommits, _WatchingConsumer]:
    config = load_config(None, env={
        "LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1", "LATCH_WORKER__TICK_INTERVAL_S": "3600",
        "LATCH_WORKER__BATCH_MAX_RECORDS": str(max_records)})
    engine = KafkaEngine(config)  # clients that never connect
    engine.consumer.close()
    producer = _SlowCommits()
    engine.txn.producer = producer  # type: ignore[assignment]
    engine.partitions[0] = PartitionState(Assembler(config.assemble), next_offset=0)
    engine.lags_read = float("inf")
    consumer = _WatchingConsumer(engine, producer, [])
    engine.consumer = consumer  # type: ignore[assignment]
    return engine, producer, consumer


def test_a_drained_batch_commits_while_the_loop_takes_the_records_that_arrive() -> None:
    """Under a paced load (each ``consume`` drains what was fetched) a drained batch commits
    in its thread and the loop goes on consuming: the records that arrive meanwhile are
    applied and held, none is cut into a transaction of its own, and they all commit in the
    next transaction, begun once this commit returns (seen one short poll later at most).
    Fails on the loop that waited for the commit before consuming again (issue 24: a sync
    wait under a backlog, each time ``consume`` found the fetched records used up), and on
    the one that committed the held batch at its first drained turn (cut at its first
    record, which waited for this commit while the records behind it waited for one more)."""
    engine, producer, consumer = _held_engine(10_000)
    first, second = _deltas(engine, 0, 3), _deltas(engine, 3, 3)
    consumer.script = [first[:1], first[1:], second[:1], second[1:2], second[2:], []]
    consumer.release_at = 4
    engine._loop()
    assert consumer.calls == [(1, 0.1, False), (1000, 0.0, False), (1, 0.005, True),
                              (1000, 0.001, True), (1000, 0.001, True), (1000, 0.0, False),
                              (1, 0.1, False)]
    assert producer.calls == ["begin 0", "offsets [3]", "commit 1",
                              "begin 1", "offsets [6]", "commit 1"]


def test_under_a_backlog_a_batch_commits_while_the_next_is_applied() -> None:
    """While ``consume`` returns all it was asked (a backlog), a batch ended by its bounds
    commits in its thread while the loop consumes and applies the next one; the last,
    drained batch commits the same way. Offsets commit in order."""
    engine, producer, consumer = _watched_engine(4)
    consumer.script = [_deltas(engine, 0, 10)]
    engine._loop()
    assert [in_flight for _, _, in_flight in consumer.calls] == [
        False, False, True, False, True, False, True]
    engine._commit()  # (as the worker does when it stops)
    assert [call for call in producer.calls if not call.startswith("begin")] == [
        "offsets [4]", "commit 1", "offsets [8]", "commit 1", "offsets [10]", "commit 1"]
    assert engine.txn.committing is None and engine.txn.batch is None


class _HeldCommits(_SlowCommits):
    """Transactions whose first ``commit_transaction`` waits for ``release`` (at most 3 s);
    the others return at once."""

    def commit_transaction(self, timeout: float) -> None:
        self.release.wait(3)
        self.calls.append(f"commit {len(self.sent)}")


class _ReleasingConsumer(_WatchingConsumer):
    """As :class:`_WatchingConsumer`, but a commit in flight returns only at the call that
    hands over ``release_at`` (the index of a scripted result)."""

    release_at = -1

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        commit = self.engine.txn.committing
        in_flight = commit is not None and not commit.done.is_set()
        self.calls.append((num_messages, timeout, in_flight))
        if in_flight and len(self.calls) - 1 == self.release_at:
            self.producer.release.set()
            assert commit is not None and commit.done.wait(5)
        return _scripted(self.engine, self.script, num_messages)


def _held_engine(max_records: int
                 ) -> tuple[KafkaEngine, _HeldCommits, _ReleasingConsumer]:
    """:func:`_watched_engine` whose first commit returns only at the consume call
    ``consumer.release_at``."""
    engine, _, _ = _watched_engine(max_records)
    producer = _HeldCommits()
    engine.txn.producer = producer  # type: ignore[assignment]
    consumer = _ReleasingConsumer(engine, producer, [])
    engine.consumer = consumer  # type: ignore[assignment]
    return engine, producer, consumer


def test_a_batch_due_while_the_commit_is_in_flight_takes_records_until_it_returns() -> None:
    """Under a backlog, a batch that reaches its bounds while the previous batch's commit is
    still in flight does not stop the loop (issue 24: on a 402,666-envelope backlog the loop
    waited for commits as long as it applied records): it takes records, a full
    ``consume`` call at a time, until that commit returns, then commits everything it took.
    Offsets commit in order. Fails on the loop that waited for the commit once due."""
    engine, producer, consumer = _held_engine(4)
    records = _deltas(engine, 0, 12)
    consumer.script = [records[:1], records[1:4], records[4:5], records[5:8], records[8:10],
                       records[10:]]
    consumer.release_at = 4
    began = time.monotonic()
    engine._loop()
    assert time.monotonic() - began < 2  # never waited out the held commit
    assert [(want, in_flight) for want, _, in_flight in consumer.calls] == [
        (1, False), (3, False), (1, True), (3, True), (1000, True), (1000, False), (1, False)]
    assert [call for call in producer.calls if not call.startswith("begin")] == [
        "offsets [4]", "commit 1", "offsets [12]", "commit 1"]
    assert engine.txn.committing is None and engine.txn.batch is None
