"""The worker's per-record path (``FaustEngine._step_event`` / ``_apply_event`` /
``_process``) and its acks, driven without a broker: the common case (the record is the
partition's next offset) skips the in-order generator and awaits nothing, records that emit
nothing are counted in batches, the run heads are written only when a run opens or
finishes, and each record is acked by faust after the loop body, except one withheld. The
outputs and heads must be those of the slow path."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import orjson
from builders import chat_calls, chat_chunk, chat_run, chat_tool
from faust_fakes import FaustStream
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from worker.core import Assembler, Emit, Topic
from worker.runtime.config import load_config
from worker.runtime.driver import Outgoing
from worker.runtime.faust_engine import engine as worker_app
from worker.runtime.observability.telemetry import Telemetry
from worker.runtime.partition import TICK, Heads, PartitionState

TOPIC = "hot.events"


class CountingHeads(dict[bytes, Any]):
    """The heads table as a dict that counts its writes."""

    writes = 0

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.writes += 1
        super().__setitem__(key, value)


def _messages(envelopes: Sequence[dict[str, Any]], first: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(topic=TOPIC, partition=0, offset=first + n, headers=[],
                            key=e["run_id"].encode(), value=orjson.dumps(e), timestamp=1.0)
            for n, e in enumerate(envelopes)]


def _worker() -> tuple[worker_app.FaustEngine, InMemoryMetricReader, CountingHeads,
                       list[Emit]]:
    latch = worker_app.FaustEngine(load_config(None, env={  # (done heads at the final)
        "LATCH_TOPICS__EVENTS": TOPIC, "LATCH_WORKER__WEB_PORT": "0",
        "LATCH_RESULTS__ENABLED": "false"}))
    reader = InMemoryMetricReader()
    latch.hooks.telemetry = Telemetry("none", readers=[reader], prometheus=False)
    latch.metrics = latch.hooks.metrics = latch.hooks.telemetry.metrics
    table = CountingHeads()
    latch.run_heads = latch.driver.heads = Heads(table, 3600)
    published: list[Emit] = []

    async def publish(state: PartitionState, outs: Sequence[Outgoing]) -> None:
        published.extend(out.emit for out in outs)

    latch.sends.publish = publish  # type: ignore[method-assign]
    latch.partitions[0] = PartitionState(Assembler(latch.config.assemble), next_offset=10)
    return latch, reader, table, published


def _records_counted(reader: InMemoryMetricReader) -> int:
    data = reader.get_metrics_data()
    assert data is not None
    return sum(p.value for rm in data.resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics if m.name == "latch_records_processed"
               for p in m.data.data_points)


def test_in_order_records_take_the_common_path_with_the_same_outcome() -> None:
    """A run delivered in offset order, with one record repeated (a redelivery), gives the
    offline core's outputs exactly once, writes two heads (open, done), and has counted every
    record applied (the repeat is not applied, so not counted)."""
    tools = [chat_tool("get_weather", {"type": "object"})]
    envelopes = chat_run("r1", tools, chat_calls([("call_1", "get_weather", '{"city": "x"}')]))
    offline = Assembler()
    expected = [e for env in envelopes for e in offline.feed_record(
        env["run_id"].encode(), orjson.dumps(env), 1000)]
    latch, reader, table, published = _worker()
    messages = _messages(envelopes, 10)
    tick = SimpleNamespace(topic=TOPIC, partition=0, offset=10 + len(messages), headers=[],
                           key=TICK,
                           value=orjson.dumps({"v": 1, "type": "tick", "ts": 2000}),
                           timestamp=2.0)

    async def feed() -> None:
        for message in [*messages[:3], messages[2], *messages[3:], tick]:
            await latch._apply_event(message)

    asyncio.run(feed())
    # (an audit record's deciding record is the worker's to fill in: null offline)
    assert [(e.topic, {**e.value, "source": None} if e.topic is Topic.AUDIT else e.value)
            for e in published] == [(e.topic, e.value) for e in expected]
    assert [e.value["source"]["offset"] for e in published if e.topic is Topic.AUDIT] == [
        messages[-1].offset]
    assert table.writes == 2 and table[b"r1"]["done"] is True
    assert latch.partitions[0].next_offset == tick.offset + 1
    assert _records_counted(reader) == len(messages) + 1


def test_without_faust_web_the_monitor_skips_per_message_statistics() -> None:
    """With faust's web off (the default), the app's Monitor keeps no per-message statistics
    (four calls per record less) but still records each partition's last inbound time, which
    faust's consumer reads for its slow-processing warnings; with the web on, faust's own
    Monitor counts messages as usual."""
    from faust.sensors import Monitor
    from faust.types import TP

    tp = TP(TOPIC, 0)
    message = SimpleNamespace(time_in=None)
    lean = _worker()[0].app.monitor
    assert type(lean) is not Monitor and isinstance(lean, Monitor)
    lean.on_message_in(tp, 3, message)  # type: ignore[arg-type]
    lean.on_stream_event_in(tp, 3, None, None)  # type: ignore[arg-type]
    assert lean.messages_received_total == 0 and lean.events_total == 0
    assert tp in lean.stream_inbound_time

    full = worker_app.FaustEngine(load_config(None, env={
        "LATCH_TOPICS__EVENTS": TOPIC, "LATCH_WORKER__WEB_ENABLED": "true",
        "LATCH_WORKER__WEB_PORT": "6099"})).app.monitor
    assert type(full) is Monitor
    full.on_message_in(tp, 3, message)  # type: ignore[arg-type]
    assert full.messages_received_total == 1


def test_an_early_cancel_gets_its_head_through_the_common_path() -> None:
    """A cancel for a run not started yet emits nothing and opens nothing, yet it must leave
    its ``{"p", "start", "cancel": true}`` head at its offset (a takeover's rebuild reads
    from there): the path that skips the heads for records that emit nothing must not skip
    it; the run's own start then replaces it."""
    latch, _, table, _ = _worker()
    cancel = {"v": 1, "run_id": "r9", "type": "cancel", "reason": "user_stop"}
    messages = _messages([cancel], 10)

    async def feed() -> None:
        for message in messages:
            await latch._apply_event(message)

    asyncio.run(feed())
    assert table[b"r9"] == {"p": 0, "start": 10, "cancel": True}
    assert latch.partitions[0].next_offset == 11


def _text_run() -> list[dict[str, Any]]:
    """A run of text deltas only, then its end."""
    chunks = [chat_chunk(content=word) for word in ("hi ", "there ", "again")]
    return chat_run("r1", [chat_tool("get_weather", {"type": "object"})], chunks)


def test_each_record_is_acked_in_order_and_a_cancelled_one_is_withheld() -> None:
    """Every record the events agent finishes is acked (faust's automatic ack, after the
    loop body), in offset order; a record whose processing is cancelled (the app stopping)
    is withheld, never acked, even though faust's stream acks its current event when it
    closes; the worker is not marked failed by a cancellation."""
    latch = _worker()[0]
    latch.partitions[0] = PartitionState(Assembler(latch.config.assemble), next_offset=0)
    messages = _messages(_text_run(), 0)
    log: list[str] = []
    asyncio.run(latch._events_agent(FaustStream(log, messages)))
    assert log == [f"ack {n}" for n in range(len(messages))]

    def cancelled(message: Any) -> None:
        raise asyncio.CancelledError

    latch = _worker()[0]
    latch._step_event = cancelled  # type: ignore[assignment,method-assign]
    log = []

    async def run() -> None:
        stream = FaustStream(log, _messages(_text_run(), 0))
        with contextlib.suppress(asyncio.CancelledError):
            await latch._events_agent(stream)

    asyncio.run(run())
    assert log == [] and not latch.failed


def _consumer(acked: list[int]) -> Any:
    """faust's consumer as ``Message.ack`` and the Cython stream iterator use it."""
    from collections import defaultdict

    def ack(m: Any) -> bool:  # faust's Consumer.ack: mark it, record the offset
        m.acked = True
        acked.append(m.offset)
        return True

    return SimpleNamespace(ack=ack, _unacked_messages=set(), _committed_offset=defaultdict(
        lambda: None), _acked_index=defaultdict(set), _acked=defaultdict(list), _n_acked=0,
        _waiting_for_ack=None)


def test_faust_never_records_a_withheld_message_as_safe_to_commit() -> None:
    """``_withhold`` relies on the installed faust: ``Message.ack(consumer)`` hands a message
    to ``Consumer.ack`` (the safe-to-commit bookkeeping) once, and skips one already marked
    acked; the Cython stream iterator's ack (``StreamIterator.after``, what the stream's
    automatic ack runs when faust's extension is built) records an offset only for a message
    not marked acked."""
    from faust.types.tuples import ConsumerMessage

    acked: list[int] = []
    consumer = _consumer(acked)
    message = ConsumerMessage(TOPIC, 0, 7, 1.0, 0, [], b"r1", b"{}", None)
    message.incref()  # the conductor's reference for the one stream that reads the topic
    assert message.ack(consumer) is True
    withheld = ConsumerMessage(TOPIC, 0, 8, 1.0, 0, [], b"r1", b"{}", None)
    withheld.incref()
    worker_app._withhold(withheld)
    assert withheld.ack(consumer) is False
    assert acked == [7]

    from faust._cython.streams import StreamIterator  # built with faust-streaming's wheel

    consumer = _consumer(acked := [])
    app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True,
                                                 _acking_topics={TOPIC}),
                          consumer=consumer, conf=_worker()[0].app.conf)
    sensors: list[int] = []
    stream = SimpleNamespace(
        channel=SimpleNamespace(__anext__=None), app=app, loop=None, on_merge=None,
        _on_stream_event_in=None, _on_message_in=None, _processors=[], _skipped_value=object(),
        _on_stream_event_out=lambda tp, offset, *_: sensors.append(offset),
        _on_message_out=lambda tp, offset, message: None)
    it = StreamIterator(stream)
    for offset, withhold in ((7, False), (8, True), (9, False)):
        m = ConsumerMessage(TOPIC, 0, offset, 1.0, 0, [], b"r1", b"{}", None)
        m.incref()
        if withhold:
            worker_app._withhold(m)
        it.after(SimpleNamespace(message=m), True, None)
    assert dict(consumer._acked) == {m.tp: [7, 9]} and consumer._n_acked == 2


def test_the_common_record_is_applied_without_a_coroutine() -> None:
    """A text delta of an open run (the partition's next offset, nothing to send) is applied
    by ``_step_event`` itself, which returns None (nothing to await); a record that emits
    (the run's end) returns the coroutine that publishes and confirms."""
    latch, _, _, published = _worker()
    envelopes = _text_run()
    messages = _messages(envelopes, 10)
    assert asyncio.run(latch._apply_event(messages[0])) is None  # opens the run
    state = latch.partitions[0]
    for message in messages[1:-1]:
        assert latch._step_event(message) is None
        assert state.next_offset == message.offset + 1
    rest = latch._step_event(messages[-1])
    assert rest is not None and not published
    asyncio.run(rest)  # type: ignore[arg-type]
    assert published and state.next_offset == messages[-1].offset + 1
