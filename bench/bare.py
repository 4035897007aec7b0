"""The bare contenders of ``bench/bench_worker.py``: the least work a worker could do.

Each reads the events topic with its own consumer group from the earliest offset, parses
every value with ``orjson.loads`` and, for each ``stream.end``, produces one record (the
envelope's key, a small JSON value) to its output topic: the floor that Latch's per-record
work (the core, the heads, the outputs, the acks) is measured against.

    python bench/bare.py faust   # a faust agent, with the settings Latch's worker uses
    python bench/bare.py loop    # a confluent-kafka consume -> parse -> produce loop

Configured by the environment: ``BARE_BOOTSTRAP``, ``BARE_EVENTS`` (topic), ``BARE_OUTPUT``
(topic), ``BARE_GROUP`` (consumer group / faust app id), ``BARE_PARTITIONS``.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import orjson


def _env() -> tuple[str, str, str, str, int]:
    e = os.environ
    return (e["BARE_BOOTSTRAP"], e["BARE_EVENTS"], e["BARE_OUTPUT"], e["BARE_GROUP"],
            int(e.get("BARE_PARTITIONS", "6")))


def faust_agent() -> int:
    """A faust agent: parse each value, forward one record per ``stream.end``."""
    import faust

    bootstrap, events_name, output_name, group, partitions = _env()
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                           "value_serializer": "raw"}
    app = faust.App(group, broker=f"kafka://{bootstrap}", store="memory://",
                    topic_partitions=partitions, processing_guarantee="at_least_once",
                    consumer_auto_offset_reset="earliest", web_enabled=False,
                    autodiscover=False, broker_session_timeout=6,
                    broker_heartbeat_interval=1, broker_commit_interval=0.5)
    events = app.topic(events_name, partitions=partitions, **raw)
    output = app.topic(output_name, **raw)

    @app.agent(events, name=f"{group}.events", concurrency=1)
    async def forward(stream: Any) -> None:
        async for event in stream.events():
            doc = orjson.loads(event.message.value)
            if doc.get("type") == "stream.end":
                await output.send(key=event.message.key, value=b'{"type":"final"}')

    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def kafka_loop() -> int:
    """confluent-kafka: consume in batches, parse, produce per ``stream.end``, commit async."""
    from confluent_kafka import Consumer, Producer

    bootstrap, events_name, output_name, group, _ = _env()
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    consumer.subscribe([events_name])
    loads, produce = orjson.loads, producer.produce
    while not stopping:
        batch = consumer.consume(1000, timeout=0.1)
        for msg in batch:
            if msg.error() is not None:
                continue
            if loads(msg.value()).get("type") == "stream.end":
                produce(output_name, key=msg.key(), value=b'{"type":"final"}')
        producer.poll(0)
        if batch:
            consumer.commit(asynchronous=True)
    producer.flush(30)
    consumer.close()
    return 0


if __name__ == "__main__":
    modes = {"faust": faust_agent, "loop": kafka_loop}
    if len(sys.argv) != 2 or sys.argv[1] not in modes:
        sys.exit(f"usage: {sys.argv[0]} faust|loop")
    sys.exit(modes[sys.argv[1]]())
