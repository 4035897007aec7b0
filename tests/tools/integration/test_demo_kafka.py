"""``latch demo --engine kafka`` as a user runs it, approving as a known person (issue 32
item 3): with no approver keys no decision counts, so the demo's approve of its one held call
is signed with a key made for the run (worker/tools/demo_approver.py), and the call commits,
on the kafka engine as on the faust one (test_demo.py). The approve the demo wrote to the
control topic carries its signature; the key itself is in no output."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from test_demo import check_outcomes, demo_config, latch_demo, pid_alive, worker_pid  # noqa: F401
from yaml import safe_load

from worker.tools.demo_approver import KEY_ID


def _control(config: Path) -> list[dict[str, object]]:
    """Every envelope of the demo's control topic, from the beginning."""
    settings = safe_load(config.read_text())
    topic = settings["topics"]["control"]
    consumer = Consumer({"bootstrap.servers": settings["kafka"]["bootstrap_servers"],
                         "group.id": "unused", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    parts = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    values, ended = [], set()
    while ended != set(parts):
        for msg in consumer.consume(100, timeout=1.0):
            if msg.error() is None:
                values.append(orjson.loads(msg.value()))
            elif msg.error().code() == KafkaError._PARTITION_EOF:
                ended.add(msg.partition())
    consumer.close()
    return values


def test_the_demo_on_the_kafka_engine_approves_signed_and_the_call_commits(
        demo_config: Path) -> None:  # noqa: F811 (the fixture, imported)
    """``latch demo --engine kafka`` prints every documented outcome (the held
    ``get_stock_price`` approved, then committed; no dead letter) and stops its worker; its
    approve on the control topic is signed with the demo approver's key id, and no
    64-hex-character key appears in what the demo printed."""
    done = latch_demo(demo_config, "--engine", "kafka", "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "engine kafka" in done.stdout
    check_outcomes(done.stdout)
    assert "signed with the demo approver's key" in done.stdout
    assert not pid_alive(worker_pid(done.stdout))
    decisions = [v for v in _control(demo_config) if v.get("type") == "approve"]
    assert len(decisions) == 1
    signature = decisions[0]["signature"]
    assert isinstance(signature, dict) and signature["key"] == KEY_ID
    assert not re.search(r"\b[0-9a-f]{64}\b", done.stdout + done.stderr)
