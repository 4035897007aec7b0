"""The faust engine's per-record overheads in one process, best of several passes (µs per
record): the hand-written ack (``await Stream.ack(event)``: ``Event.ack``, ``Message.ack``,
``Consumer.ack``, the sensors) against faust's Cython stream iterator's ack
(``StreamIterator.after``, the automatic ack the worker now leaves to faust), and the events
agent's common record through ``await _apply_event`` (two coroutines) against
``_step_event`` (none). faust's consumer is a stand-in with its bookkeeping fields; the
sensors are the worker's (``LeanMonitor``, faust_engine/settings.py). No broker.

    python -P bench/faust_ack_path.py     # with the compiled core: the build's interpreter
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
from faust._cython.streams import StreamIterator
from faust.events import Event
from faust.streams import Stream
from faust.transport.consumer import Consumer
from faust.types.tuples import ConsumerMessage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from builders import chat_chunk, chat_run, chat_tool

from worker.core import Assembler
from worker.runtime.config import load_config
from worker.runtime.faust_engine import engine as worker_app
from worker.runtime.partition import Heads, PartitionState

N = 20_000
LATCH = worker_app.FaustEngine(load_config(None, env={"LATCH_TOPICS__EVENTS": "t"}))
LATCH.app.sensors.add(LATCH.app.monitor)  # what faust's boot does
LATCH.run_heads = Heads({}, 3600)  # type: ignore[arg-type]  # no table outside faust's stream


def _consumer() -> Any:
    consumer = SimpleNamespace(
        _unacked_messages=set(), _committed_offset=defaultdict(lambda: None),
        _acked_index=defaultdict(set), _acked=defaultdict(list), _n_acked=0,
        _waiting_for_ack=None)
    consumer.app = SimpleNamespace(consumer=consumer, topics=SimpleNamespace(
        acks_enabled_for=lambda topic: True, _acking_topics={"t"}), conf=LATCH.app.conf)
    consumer.ack = lambda message: Consumer.ack(consumer, message)  # type: ignore[arg-type]
    return consumer


def _events(consumer: Any) -> list[Event]:
    out = []
    for offset in range(N):
        message = ConsumerMessage("t", 0, offset, 1.0, 0, [], b"r1", b"{}", None)
        message.incref()
        out.append(Event(consumer.app, b"r1", b"{}", [], message))
    return out


def hand_ack() -> float:
    consumer = _consumer()
    stream = SimpleNamespace(_on_stream_event_out=LATCH.app.sensors.on_stream_event_out,
                             _on_message_out=LATCH.app.sensors.on_message_out)
    events = _events(consumer)

    async def run() -> float:
        began = time.perf_counter()
        for event in events:
            await Stream.ack(stream, event)  # type: ignore[arg-type]
        return time.perf_counter() - began
    return asyncio.run(run())


def faust_ack() -> float:
    consumer = _consumer()
    stream = SimpleNamespace(
        channel=SimpleNamespace(__anext__=None), app=consumer.app, loop=None, on_merge=None,
        _on_stream_event_in=None, _on_message_in=None, _processors=[], _skipped_value=object(),
        _on_stream_event_out=LATCH.app.sensors.on_stream_event_out,
        _on_message_out=LATCH.app.sensors.on_message_out)
    after = StreamIterator(stream).after
    events = _events(consumer)
    began = time.perf_counter()
    for event in events:
        after(event, True, None)
    return time.perf_counter() - began


def _messages() -> list[SimpleNamespace]:
    tools = [chat_tool("get_weather", {"type": "object"})]
    envelopes = chat_run("r1", tools, [chat_chunk(content="w") for _ in range(N)])[:-1]
    return [SimpleNamespace(topic="t", partition=0, offset=n, headers=[], key=b"r1",
                            value=orjson.dumps(e), timestamp=1.0)
            for n, e in enumerate(envelopes)]


def agent_path(step: bool) -> float:
    LATCH.partitions[0] = PartitionState(Assembler(LATCH.config.assemble), next_offset=0)
    messages = _messages()

    async def run() -> float:
        await LATCH._apply_event(messages[0])  # opens the run
        began = time.perf_counter()
        if step:
            for message in messages[1:]:
                rest = LATCH._step_event(message)
                if rest is not None:
                    await rest
        else:
            for message in messages[1:]:
                await LATCH._apply_event(message)
        return time.perf_counter() - began
    return asyncio.run(run())


def main() -> None:
    cases = [("ack: await Stream.ack (by hand, before)", hand_ack),
             ("ack: faust's Cython iterator (now)", faust_ack),
             ("common record: await _apply_event (before)", lambda: agent_path(False)),
             ("common record: _step_event (now)", lambda: agent_path(True))]
    for _ in range(2):  # interleaved: a burst of other load hits both sides
        for name, case in cases:
            best = min(case() for _ in range(5))
            print(f"{name}: {best / N * 1e6:.2f} µs per record", flush=True)


if __name__ == "__main__":
    main()
