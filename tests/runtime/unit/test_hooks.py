"""The operability hooks both engines call (worker/runtime/hooks.py), and the kafka engine's
use of them without a broker: records and outcomes counted, the run's trace on its outputs,
readiness around rebuilds, commit latency only once a transaction commits, send failures
from delivery reports, and lag that transaction markers do not inflate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import driving
import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from worker_harness import provider_run

from worker.core import Assembler, Emit, Topic
from worker.runtime import step
from worker.runtime.config import Config, load_config
from worker.runtime.driver import Driver
from worker.runtime.hooks import EngineHooks
from worker.runtime.kafka_engine import engine as kafka_engine
from worker.runtime.partition import TICK, Heads, PartitionState
from worker.runtime.step import Record, Source

TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
HEADERS = [("traceparent", TRACEPARENT)]


def config() -> Config:
    return load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0"})


def records(envelopes: list[dict[str, Any]], partition: int = 0) -> Iterator[Record]:
    for offset, envelope in enumerate(envelopes):
        yield step.record(str(envelope["run_id"]).encode(), orjson.dumps(envelope),
                          1_000 + offset, "events", partition, offset)


def apply(hooks: EngineHooks, state: PartitionState, record: Record, headers: Any = None
          ) -> tuple[list[Emit], bool]:
    """``Driver.apply`` (which calls the hooks for each record), read as these tests read
    it: the record's emits, and whether it opened its run."""
    run_id = record[0].decode() if record[0] else ""
    was_open = state.assembler.is_open(run_id)
    applied = driving.apply(Driver(hooks.config, hooks, Heads({}, 3600)), state, record, headers)
    return ([] if applied is None else applied.emits,
            not was_open and state.assembler.is_open(run_id))


def one_run(run_id: str = "r1") -> list[dict[str, Any]]:
    """A run with one committed call and one call of an unknown tool."""
    return provider_run("openai.chat", run_id, [("c1", "read_file", '{"path": "a"}'),
                                                 ("c2", "nope", "{}")])


def sample(hooks: EngineHooks, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    found = 0.0
    for family in text_string_to_metric_families(hooks.metrics.exposition().decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                found += s.value
    return found


def test_apply_counts_each_record_and_puts_the_runs_trace_on_its_outputs() -> None:
    """Each applied record counts once; the headers function is called only for the record
    that opens the run; every output of the run carries the incoming traceparent; the run's
    outcomes are counted by state."""
    hooks = EngineHooks(config())
    state = PartitionState(Assembler(config().assemble), next_offset=0)
    state.assembler.sizes = []  # as after a takeover (hooks.rebuilding)
    asked = 0

    def headers() -> list[tuple[str, bytes]]:
        nonlocal asked
        asked += 1
        return HEADERS

    envelopes = one_run()
    traced: list[Topic] = []
    opened_at = []
    for record in records(envelopes):
        emits, opened = apply(hooks, state, record, headers)
        if opened:
            opened_at.append(record.source.offset)
        for emit in emits:
            if emit.topic is not Topic.PROGRESS:
                assert hooks.headers(emit) == HEADERS
                traced.append(emit.topic)
    assert asked == 1 and opened_at == [0]
    assert traced == [Topic.COMMITTED, Topic.AUDIT, Topic.ERRORS, Topic.AUDIT, Topic.FINAL]
    assert sample(hooks, "latch_records_processed_total") == len(envelopes)
    assert sample(hooks, "latch_call_outcomes_total", state="committed") == 1
    assert sample(hooks, "tool_assemble_args_bytes_count") == 2


def test_a_record_that_emits_nothing_is_counted_and_still_lets_an_ended_run_go() -> None:
    """A record that opens nothing and emits nothing takes the short path (counted, not
    traced), except right after a run ended: then the tracer still forgets that run, as it
    does at every record after a final message."""
    hooks = EngineHooks(config())
    state = PartitionState(Assembler(config().assemble), next_offset=0)
    first, second = one_run("r1"), one_run("r2")
    applied = [apply(hooks, state, record, HEADERS)[0]
               for record in records([second[0], *first, second[1], second[2]])]
    assert applied[-2:] == [[], []]  # r2's first events: nothing emitted
    assert hooks.tracing.headers("r1") is None and hooks.tracing.open_spans == 1
    assert hooks.tracing.headers("r2") == HEADERS
    assert sample(hooks, "latch_records_processed_total") == len(first) + 3


def test_readiness_and_rebuild_metrics_around_a_rebuild() -> None:
    """Not ready while a partition rebuilds; ready after; the rebuild's records are counted
    once and the sizes of calls it replayed are not; a revocation makes the worker not ready
    and ends the partition's run traces."""
    hooks = EngineHooks(config())
    hooks.assigned([0])
    with hooks.rebuilding(0) as rebuild:
        assert not hooks.health.ready()[0]
        state = PartitionState(Assembler(config().assemble), next_offset=0)
        state.assembler.sizes = [10, 20]
        rebuild.state, rebuild.records = state, 7
    assert hooks.health.ready()[0]
    assert state.assembler.sizes == []
    assert sample(hooks, "latch_rebuild_records_total") == 7
    assert sample(hooks, "latch_rebuild_seconds_count") == 1
    start = next(records(one_run()))
    apply(hooks, state, start, HEADERS)
    assert hooks.tracing.headers("r1") == HEADERS
    hooks.revoked([0])
    assert hooks.tracing.headers("r1") is None
    assert not hooks.health.ready()[0]


def test_delivered_counts_failures_by_topic_and_commit_latency_of_committed_calls() -> None:
    """A failed delivery counts under its topic; a delivered committed call adds one commit
    latency; a delivered final message adds none."""
    hooks = EngineHooks(config())
    hooks.delivered(Topic.ERRORS, 1_000, False)
    hooks.delivered(Topic.COMMITTED, 1_000, True)
    hooks.delivered(Topic.FINAL, 1_000, True)
    assert sample(hooks, "latch_send_failures_total", topic="errors") == 1
    assert sample(hooks, "latch_send_failures_total") == 1
    assert sample(hooks, "tool_assemble_to_commit_seconds_count") == 1


# -- the kafka engine's use of the hooks, with fake clients ------------------------------


class FakeProducer:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.produced: list[tuple[str, bytes | None, dict[str, Any]]] = []
        self.fail_commit: KafkaError | None = None

    def produce(self, topic: str, value: bytes | None, key: bytes | None, *args: Any,
                **options: Any) -> None:
        self.produced.append((topic, key, options))

    def begin_transaction(self) -> None:
        pass

    def send_offsets_to_transaction(self, *args: Any) -> None:
        pass

    def commit_transaction(self, timeout: float) -> None:
        if self.fail_commit is not None:
            raise KafkaException(self.fail_commit)

    def abort_transaction(self, timeout: float) -> None:
        pass


class FakeConsumer:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.positions: dict[int, int] = {}
        self.highs: dict[int, int] = {}

    def consumer_group_metadata(self) -> object:
        return object()

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions[tp.partition])
                for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = False
                              ) -> tuple[int, int]:
        assert cached  # never a request to the broker from the lag gauges
        return 0, self.highs[tp.partition]


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> kafka_engine.KafkaEngine:
    monkeypatch.setattr(kafka_engine, "Producer", FakeProducer)
    monkeypatch.setattr(kafka_engine, "Consumer", FakeConsumer)
    return kafka_engine.KafkaEngine(config())


def committed_run(engine: kafka_engine.KafkaEngine) -> list[Emit]:
    """Apply one run to partition 0 (opened with trace headers); its emits."""
    state = engine.partitions[0] = PartitionState(Assembler(config().assemble), 0)
    emits: list[Emit] = []
    for record in records(one_run()):
        applied = driving.apply(engine.driver, state, record, HEADERS)
        emits += [] if applied is None else applied.emits
    return emits


def test_the_kafka_engine_counts_commit_latency_only_once_its_transaction_commits(
        engine: kafka_engine.KafkaEngine) -> None:
    """A committed call sent in a transaction that aborts adds no commit latency; sent in one
    that commits, it adds one. Its clients log through ``latch.kafka``; every output of a
    traced run carries the trace headers, and delivery reports come through the producer's
    own callback (failures only: it counts no progress record, and notes refusals)."""
    assert engine.txn.producer.settings["logger"].name == "latch.kafka"  # type: ignore[attr-defined]
    assert engine.consumer.settings["logger"].name == "latch.kafka"  # type: ignore[attr-defined]
    emits = committed_run(engine)
    fake: FakeProducer = engine.txn.producer  # type: ignore[assignment]
    fake.fail_commit = KafkaError(KafkaError._FAIL, "boom", txn_requires_abort=True)
    engine.txn.begin()
    engine.sends.publish(list(engine.driver.outgoing(b"r1", emits, engine.outputs, None,
                                                    1_000)))
    engine._commit(rewind=False)
    assert sample(engine.hooks, "tool_assemble_to_commit_seconds_count") == 0
    fake.fail_commit = None
    engine.txn.begin()
    engine.sends.publish(list(engine.driver.outgoing(b"r1", emits, engine.outputs, None,
                                                    1_000)))
    engine._commit()
    assert sample(engine.hooks, "tool_assemble_to_commit_seconds_count") == 1
    for _, _, options in fake.produced:
        assert options["headers"] == HEADERS
        assert "on_delivery" not in options
    assert fake.settings["on_delivery"] == engine.sends.delivered  # type: ignore[attr-defined]


def test_the_kafka_engine_counts_a_failed_delivery_under_its_topic(
        engine: kafka_engine.KafkaEngine) -> None:
    """A delivery report with an error counts one send failure for the output's topic."""
    class Msg:
        def topic(self) -> str:
            return engine.outputs[Topic.FINAL]

    engine.sends.delivered(KafkaError(KafkaError._MSG_TIMED_OUT), Msg())  # type: ignore[arg-type]
    engine.sends.delivered(None, Msg())  # type: ignore[arg-type]
    assert sample(engine.hooks, "latch_send_failures_total", topic="final") == 1
    assert sample(engine.hooks, "latch_send_failures_total") == 1


def test_the_kafka_engines_lag_is_behind_its_position_not_behind_transaction_markers(
        engine: kafka_engine.KafkaEngine) -> None:
    """Lag is the cached end offset less the consumer's position: a partition whose last
    record is followed by a transaction marker (position past it) has none; a partition with
    records unread has their count; the gauges show both."""
    fake: FakeConsumer = engine.consumer  # type: ignore[assignment]
    engine.partitions[0] = PartitionState(Assembler(config().assemble), next_offset=5)
    engine.partitions[1] = PartitionState(Assembler(config().assemble), next_offset=5)
    fake.positions, fake.highs = {0: 6, 1: 5}, {0: 6, 1: 9}
    engine._read_lags()
    lags = {view.partition: view.lag_records for view in engine._partition_views()}
    assert lags == {0: 0, 1: 4}
    assert engine._alive()


def test_the_kafka_engine_logs_one_json_object_per_line_when_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``worker.log_format: json`` installs the JSON formatter for the kafka engine too (the
    logging configuration both engines use), at the configured level."""
    import logging

    from worker.runtime import kafka_engine as package
    from worker.runtime.observability.logs import JsonFormatter

    monkeypatch.setattr(kafka_engine, "Producer", FakeProducer)
    monkeypatch.setattr(kafka_engine, "Consumer", FakeConsumer)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        package.build(load_config(None, env={
            "LATCH_WORKER__HTTP_PORT": "0", "LATCH_WORKER__LOG_FORMAT": "json",
            "LATCH_WORKER__LOG_LEVEL": "warning"}))
        added = [h for h in root.handlers if h not in saved[0]]
        assert added and all(isinstance(h.formatter, JsonFormatter) for h in added)
        assert root.level == logging.WARNING
    finally:
        for handler in [h for h in root.handlers if h not in saved[0]]:
            root.removeHandler(handler)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_the_kafka_engine_exits_2_when_its_http_port_is_taken(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A kafka-engine worker whose ``worker.http_port`` is in use says so and exits with
    status 2 before it touches Kafka (as the faust engine does)."""
    import signal
    import socket

    monkeypatch.setattr(kafka_engine, "Producer", FakeProducer)
    monkeypatch.setattr(kafka_engine, "Consumer", FakeConsumer)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        engine = kafka_engine.KafkaEngine(
            load_config(None, env={"LATCH_WORKER__HTTP_PORT": str(port)}))
        try:
            assert engine.run() == 2
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    assert f"cannot serve worker.http_port {port}" in capsys.readouterr().err


def test_apply_feeds_the_core_as_the_partitions_step_does() -> None:
    """``Driver.apply`` (the hooks' per-record work around the core's one step) emits what
    ``PartitionState.apply`` emits, record for record, and moves the partition's clock the
    same way: a keyed record, one without a time, one older than the clock, a tick (the core
    expires the idle run) and a record without a key (DLQ)."""
    hooks = EngineHooks(config())
    by_hooks = PartitionState(Assembler(config().assemble), next_offset=0)
    by_state = PartitionState(Assembler(config().assemble), next_offset=0)
    recs = list(records(one_run("r1")[:3]))
    source = Source("events", 0, 9)
    recs[1] = recs[1]._replace(time_ms=None)  # no record time
    recs[2] = recs[2]._replace(time_ms=5)  # older than the clock
    tick = orjson.dumps({"v": 1, "type": "tick", "ts": 0})
    recs += [Record(TICK, tick, 10_000_000, source),
             Record(None, b'{"v": 1}', 10_000_001, source)]
    for record in recs:
        got = apply(hooks, by_hooks, record)[0]
        want = by_state.apply(record)
        assert [(e.topic, e.key, e.value) for e in got] == [
            (e.topic, e.key, e.value) for e in want]
        assert by_hooks.clock_ms == by_state.clock_ms
    assert {e.topic for e in apply(hooks, by_hooks, recs[-1])[0]} == {Topic.DLQ}
    assert by_hooks.clock_ms == 10_000_001


class _Failing:
    """An assembler whose core raises on every record (a bug in Latch)."""

    sizes = None
    early_cancels_waiting = 0
    runs_opened = 0
    pairing = None

    def is_open(self, run_id: str) -> bool:
        return False

    def feed_record(self, *args: Any) -> list[Emit]:
        raise RuntimeError("a bug")


def test_a_failure_of_the_core_is_one_internal_error_dlq_record() -> None:
    """When the core raises on a keyed record, ``Driver.apply`` returns one DLQ record
    (reason ``internal_error``, the input record's key and bytes) instead of raising: a bug
    in Latch never stops the partition."""
    hooks = EngineHooks(config())
    state = PartitionState(_Failing(), next_offset=0)  # type: ignore[arg-type]
    record = next(records(one_run("r1")))
    emits, opened = apply(hooks, state, record)
    assert not opened and [e.topic for e in emits] == [Topic.DLQ]
    assert emits[0].value["reason"] == "internal_error"
    assert state.clock_ms == record[2]
