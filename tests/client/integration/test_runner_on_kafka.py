"""The runner library on the real broker: a committed call delivered twice runs once, and its
one result continues the committed record's trace."""

from __future__ import annotations

import uuid

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from conftest import MakeTopic

from worker.client.runner import Runner
from worker.runtime.config import Config, KafkaSettings, TopicNames

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()


def test_a_call_delivered_twice_runs_once(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    """The same committed record twice on the committed topic (an at-least-once redelivery):
    the function runs once, one result lands on the results topic, paired by tool_call_id,
    with the committed record's trace id in its traceparent; a third record that is not a
    committed call runs nothing and is counted."""
    committed, results = make_topic("committed"), make_topic("results")
    config = Config(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                    topics=TopicNames(committed=committed, results=results))
    call = {"v": 1, "run_id": "r1", "tenant": "t", "provider": "anthropic.messages",
            "call_id": "toolu_1", "name": "add", "index": 0, "arguments": {"a": 2, "b": 3},
            "idempotency_key": "r1:toolu_1"}
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for value in (orjson.dumps(call), orjson.dumps(call), b'{"v": 1, "run_id": "r1"}'):
        producer.produce(committed, key=b"r1", value=value,
                         headers=[("traceparent", TRACEPARENT)])
    assert producer.flush(30) == 0

    ran: list[dict[str, int]] = []

    def add(args: dict[str, int]) -> int:
        ran.append(args)
        return args["a"] + args["b"]

    runner = Runner(config, {"add": add}, group_id=f"latch-test-runner-{uuid.uuid4().hex[:8]}")
    try:
        assert runner.run(max_records=3, timeout=1.0) == 3
    finally:
        runner.close()
    assert ran == [{"a": 2, "b": 3}]
    assert runner.metrics.rejected["not_a_committed_call"] == 1

    # assigned, not subscribed: no consumer group shared with another test
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(results, 0, OFFSET_BEGINNING)])
    found = []
    for _ in range(20):
        found += [m for m in consumer.consume(10, timeout=1.0) if m.error() is None]
        if found:
            break
    found += [m for m in consumer.consume(10, timeout=2.0) if m.error() is None]
    consumer.close()
    assert len(found) == 1
    result = orjson.loads(found[0].value())
    assert (result["tool_call_id"], result["content"], result["is_error"]) == ("toolu_1", "5",
                                                                              False)
    headers = dict(found[0].headers() or [])
    assert headers["traceparent"].decode().split("-")[1] == TRACE_ID
