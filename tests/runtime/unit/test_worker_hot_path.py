"""The worker's per-record path (``LatchWorker._apply_event`` / ``_process``), driven without a
broker: the common case (the record is the partition's next offset) skips the in-order
generator, records that emit nothing are counted in batches, and the run heads are written
only when a run opens or finishes. The outputs and heads must be those of the slow path."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import orjson
from builders import chat_calls, chat_run, chat_tool
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from worker.core import Assembler, Emit
from worker.runtime import app as worker_app
from worker.runtime.config import load_config
from worker.runtime.partition import TICK, Heads, PartitionState
from worker.runtime.telemetry import Telemetry

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


def _worker() -> tuple[worker_app.LatchWorker, InMemoryMetricReader, CountingHeads,
                       list[Emit]]:
    latch = worker_app.LatchWorker(load_config(None, env={
        "LATCH_TOPICS__EVENTS": TOPIC, "LATCH_WORKER__WEB_PORT": "0"}))
    reader = InMemoryMetricReader()
    latch.hooks.telemetry = Telemetry("none", readers=[reader], prometheus=False)
    latch.metrics = latch.hooks.metrics = latch.hooks.telemetry.metrics
    table = CountingHeads()
    latch.run_heads = Heads(table, 3600)
    published: list[Emit] = []

    async def publish(state: PartitionState, key: bytes | None,
                      emits: Sequence[Emit], record_ms: int | None = None) -> None:
        published.extend(emits)

    latch._publish = publish  # type: ignore[method-assign]
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
    assert [(e.topic, e.value) for e in published] == [(e.topic, e.value) for e in expected]
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

    full = worker_app.LatchWorker(load_config(None, env={
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
