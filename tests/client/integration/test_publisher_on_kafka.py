"""The publisher against a real broker.

The forwarding design rests on one fact tested here: librdkafka's ``murmur2_random``
partitioner (the gateway's producer) and aiokafka's ``DefaultPartitioner`` (the faust worker,
when it forwards a cancel from the control topic into the events topic) put the same key on
the same partition. Then ``latch publish`` and ``latch tail --json`` round-trip a file.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from confluent_kafka import Producer

from worker.client.publisher import Delivery, Publisher
from worker.runtime.config import Config, KafkaSettings, TopicNames

#: make_topic(suffix, partitions=1) -> topic name (tests/conftest.py)
MakeTopic = Callable[..., str]
PARTITIONS = 12
REPO = Path(__file__).resolve().parents[3]


def run_ids(n: int) -> list[str]:
    shapes = ["r{}", "run-{:08d}", "tenant-7/conv-{}/turn-3", "ünïcødé-{}", "{}", "x" * 97 + "{}"]
    return [shapes[i % len(shapes)].format(i) for i in range(n)]


def test_events_and_cancels_land_on_the_partition_aiokafka_computes(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    """600 runs' events and cancels, sent by the publisher (librdkafka ``murmur2_random``),
    land on the partition aiokafka's ``DefaultPartitioner`` computes, as does the worker's
    forwarded cancel."""
    events = make_topic("events", partitions=PARTITIONS)
    control = make_topic("control", partitions=PARTITIONS)
    config = Config(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                    topics=TopicNames(events=events, control=control))
    deliveries: list[Delivery] = []
    publisher = Publisher(config, on_delivery=deliveries.append)
    assert publisher.check_topics() == {events: PARTITIONS, control: PARTITIONS}
    keys = run_ids(600)
    for run_id in keys:
        run = publisher.run(run_id, "openai.chat", [])
        run.event({"choices": []})
        publisher.cancel(run_id, "user_stop")
        run.end()
    publisher.flush(60)

    landed: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for d in deliveries:
        landed[d.key][d.topic].add(d.partition)
    assert len(deliveries) == 4 * len(keys)
    everything = list(range(PARTITIONS))
    expected = {k: DefaultPartitioner()(k.encode(), everything, everything) for k in keys}
    for run_id in keys:
        assert landed[run_id] == {events: {expected[run_id]}, control: {expected[run_id]}}, run_id
    assert len({p for p in expected.values()}) == PARTITIONS  # the keys spread over all 12

    # And the way the worker forwards: an aiokafka producer sending the cancel to the events
    # topic under the run's key lands beside the run's events.
    forwarded = asyncio.run(_aiokafka_partitions(kafka_bootstrap, events, keys[:60]))
    assert forwarded == {k: expected[k] for k in keys[:60]}


async def _aiokafka_partitions(bootstrap: str, topic: str, keys: list[str]) -> dict[str, int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)  # default partitioner, as faust
    await producer.start()
    try:
        out = {}
        for key in keys:
            cancel = {"v": 1, "run_id": key, "type": "cancel", "reason": "user_stop"}
            meta = await producer.send_and_wait(topic, orjson.dumps(cancel), key=key.encode())
            out[key] = meta.partition
        return out
    finally:
        await producer.stop()


# -- latch publish, latch tail --------------------------------------------------------------


def latch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout, check=False)


@pytest.fixture
def config_file(kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path) -> Path:
    topics: dict[str, Any] = {
        name: make_topic(name, partitions=3) for name in ("events", "control", "committed")
    }
    for name in ("errors", "final", "progress", "dlq"):  # named, never created
        topics[name] = f"latch-test.absent.{name}.{tmp_path.name}"
    topics["partitions"] = 3
    path = tmp_path / "latch.yaml"
    path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": kafka_bootstrap},
                                    "topics": topics}))
    return path


def test_publish_then_tail_round_trip(config_file: Path, tmp_path: Path) -> None:
    """``latch publish`` sends a JSON Lines file (skipping a bad line, exit 1) and
    ``latch tail`` reads back every envelope on its topic, each run in seq order; ``--run``
    and ``--max`` filter."""
    envelopes: list[dict[str, Any]] = []
    for n in range(5):
        run_id = f"round-trip-{n}"
        envelopes += [
            {"v": 1, "run_id": run_id, "seq": 0, "type": "run.start",
             "provider": "anthropic.messages", "tools": []},
            {"v": 1, "run_id": run_id, "seq": 1, "type": "provider.event",
             "event": {"type": "message_start", "message": {"id": f"msg_{n}"}}},
        ]
        if n == 2:
            envelopes.append({"v": 1, "run_id": run_id, "type": "cancel", "reason": "user_stop"})
        envelopes.append({"v": 1, "run_id": run_id, "seq": 2, "type": "stream.end"})
    lines = [orjson.dumps(e).decode() for e in envelopes]
    lines.insert(3, "{this is not json")
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")

    published = latch("publish", "--config", str(config_file), str(source), cwd=tmp_path)
    assert published.returncode == 1, published.stderr  # one line skipped
    assert "line 4: not valid JSON" in published.stderr
    topics = yaml.safe_load(config_file.read_text())["topics"]
    assert published.stdout == (f"sent 16 envelopes for 5 runs to {topics['control']} (1), "
                                f"{topics['events']} (15); skipped 1 line\n")

    tailed = latch("tail", "--config", str(config_file), "--json", "--from-beginning",
                   "--topics", "events,control", "--timeout", "5", cwd=tmp_path)
    assert tailed.returncode == 0, tailed.stderr
    got = [orjson.loads(line) for line in tailed.stdout.splitlines()]
    expected = [{"topic": "control" if e["type"] == "cancel" else "events",
                 "key": e["run_id"], "value": e} for e in envelopes]
    key = lambda r: (r["topic"], r["key"], r["value"].get("seq", -1))  # noqa: E731
    assert sorted(got, key=key) == sorted(expected, key=key)
    for run_id in {e["run_id"] for e in envelopes}:  # each run in order (one partition)
        seqs = [r["value"]["seq"] for r in got if r["key"] == run_id and r["topic"] == "events"]
        assert seqs == [0, 1, 2]

    limited = latch("tail", "--config", str(config_file), "--from-beginning", "--topics",
                    "events", "--run", "round-trip-3", "--max", "2", cwd=tmp_path)
    assert limited.returncode == 0, limited.stderr
    readable = [line.split(" ", 1)[1] for line in limited.stdout.splitlines()]
    assert readable == ["events round-trip-3 #0 run.start anthropic.messages",
                        "events round-trip-3 #1 provider.event message_start"]


def test_tail_prints_output_records_readably(config_file: Path, tmp_path: Path) -> None:
    """``latch tail`` prints a committed call on the real broker as one readable line with a clock,
    and skips default topics that do not exist, saying so."""
    topics = yaml.safe_load(config_file.read_text())["topics"]
    committed = {"v": 1, "run_id": "r1", "tenant": "t1", "provider": "openai.chat",
                 "call_id": "call_abc", "name": "read_file", "index": 0,
                 "arguments": {"path": "/tmp/a"}, "idempotency_key": "r1:call_abc"}
    producer = Producer({"bootstrap.servers": yaml.safe_load(config_file.read_text())
                         ["kafka"]["bootstrap_servers"]})
    producer.produce(topics["committed"], orjson.dumps(committed), key=b"r1")
    assert producer.flush(30) == 0
    tailed = latch("tail", "--config", str(config_file), "--from-beginning", "--max", "1",
                   "--timeout", "30", cwd=tmp_path)
    assert tailed.returncode == 0, tailed.stderr
    # The other default topics (errors, final, dlq) were never created.
    assert "does not exist; skipped" in tailed.stderr
    clock, line = tailed.stdout.rstrip("\n").split(" ", 1)
    assert line == 'committed r1 call_abc read_file {"path": "/tmp/a"}'
    assert len(clock) == 8


def test_publish_refuses_missing_topics_instead_of_auto_creating_them(
    kafka_bootstrap: str, kafka_admin: Any, tmp_path: Path
) -> None:
    """``latch publish`` to topics that do not exist exits 2 naming the topic, and the broker
    does not auto-create it."""
    missing = f"latch-test.never-created.{tmp_path.name}"
    path = tmp_path / "latch.yaml"
    path.write_text(yaml.safe_dump({"kafka": {"bootstrap_servers": kafka_bootstrap},
                                    "topics": {"events": missing, "control": missing + ".c"}}))
    source = tmp_path / "in.jsonl"
    source.write_text('{"v":1,"run_id":"r1","seq":0,"type":"stream.end"}\n')
    result = latch("publish", "--config", str(path), str(source), cwd=tmp_path)
    assert result.returncode == 2
    assert f"{missing} failed: the topic does not exist" in result.stderr
    assert missing not in kafka_admin.list_topics(timeout=10).topics
