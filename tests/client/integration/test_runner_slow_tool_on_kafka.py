"""A tool longer than max.poll.interval.ms on the real broker: two runners in one group (one
partition each), the call's tool blocks past the interval; the runner keeps its membership
(its partitions paused, polled), so the other runner never gets the call's partition: the
call runs once, is answered once, and neither runner stops (no JournalError). Both modes:
the journal (transactional) and the plain runner."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer
from conftest import MakeTopic
from worker_harness import read_results as results

from worker.client.runner import Runner
from worker.runtime.config import Config, KafkaSettings, TopicNames

#: The group's max.poll.interval.ms in this test: the broker's group.min.session.timeout.ms
#: (6 s by default) bounds session.timeout.ms from below, and librdkafka wants
#: max.poll.interval.ms >= session.timeout.ms.
MAX_POLL_INTERVAL_MS = 6000
#: How long past max.poll.interval.ms the tool blocks: time enough for librdkafka to leave
#: the group (it checks each second) and the other runner to be assigned and run the call.
BEYOND_S = 12.0


def call(key: str) -> bytes:
    return orjson.dumps({"v": 1, "run_id": f"run-{key}", "tenant": "t",
                         "provider": "anthropic.messages", "call_id": f"toolu_{key}",
                         "name": "slow", "index": 0, "arguments": {"key": key},
                         "idempotency_key": key})


class WatchedConsumer(Consumer):
    """A consumer whose assignment the test reads from its own list (calling the consumer
    from the test's thread while a runner polls it can deadlock on the GIL)."""

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.assigned: list[int] = []
        #: Set when a revoke callback starts (before the runner's own runs).
        self.revoking = threading.Event()
        on_assign, on_revoke = callbacks.get("on_assign"), callbacks.get("on_revoke")

        def assigned(consumer: Any, partitions: Any) -> None:
            self.assigned += [tp.partition for tp in partitions]
            if on_assign is not None:
                on_assign(consumer, partitions)

        def revoked(consumer: Any, partitions: Any) -> None:
            if partitions:
                self.revoking.set()
            if on_revoke is not None:
                on_revoke(consumer, partitions)

        super().subscribe(topics, **{**callbacks, "on_assign": assigned,
                                     "on_revoke": revoked})



@pytest.mark.parametrize("mode", ["journal", "plain"])
def test_a_tool_longer_than_max_poll_interval_runs_once(
        kafka_bootstrap: str, make_topic: MakeTopic, mode: str) -> None:
    """Two runners share a group over two partitions; once both hold one, a call arrives and
    its tool blocks until max.poll.interval.ms plus BEYOND_S have passed, or until a second
    execution starts (what happened before: the first runner left the group, the other took
    its partition and ran the call again, and the first stopped with JournalError). Then the
    tool is released: it ran once, one result is visible at read_committed, and both runners
    stop cleanly when asked."""
    committed = make_topic("committed", partitions=2)
    results_topic = make_topic("results")
    journal = make_topic("journal", config={"cleanup.policy": "compact"})
    suffix = uuid.uuid4().hex[:8]
    group = f"latch-runner-slow-{suffix}"
    config = Config(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                    topics=TopicNames(committed=committed, results=results_topic,
                                      journal=journal))
    started: list[str] = []
    second = threading.Event()
    release = threading.Event()

    def slow(args: dict[str, str]) -> str:
        started.append(args["key"])
        if len(started) > 1:
            second.set()
        release.wait(120)
        return f"done {args['key']}"

    runners, threads, failures = [], [], []
    stop = threading.Event()
    for n in range(2):
        consumer = WatchedConsumer({**config.kafka.confluent_config(), "group.id": group,
                             "session.timeout.ms": MAX_POLL_INTERVAL_MS,
                             "heartbeat.interval.ms": 500,
                             "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "isolation.level": "read_committed"})
        runners.append(Runner(config, {"slow": slow}, consumer=consumer, group_id=group,
                              transactional_id=(f"{group}-{n}" if mode == "journal" else None),
                              transaction_timeout_s=60.0))

    def serve(runner: Runner) -> None:
        try:
            runner.run(stop, timeout=0.2)
        except BaseException as exc:  # the test reports it
            failures.append(exc)

    for runner in runners:
        threads.append(threading.Thread(target=serve, args=(runner,), daemon=True))
        threads[-1].start()
    try:
        deadline = time.monotonic() + 60
        while not all(getattr(r.consumer, "assigned", None) for r in runners):
            assert time.monotonic() < deadline, "the runners were not both assigned"
            assert not failures, failures
            time.sleep(0.1)
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(committed, key=b"run-k1", value=call("k1"))
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 60
        while not started:
            assert time.monotonic() < deadline, "the call did not reach a tool"
            time.sleep(0.05)
        second.wait(MAX_POLL_INTERVAL_MS / 1000 + BEYOND_S)
        release.set()
        found = results(kafka_bootstrap, results_topic, want=1)
    finally:
        release.set()
        stop.set()
        for thread in threads:
            thread.join(60)
        for runner in runners:
            runner.close()
    assert started == ["k1"], started
    assert [r["content"] for r in found] == ["done k1"]
    assert not failures, failures


@pytest.mark.parametrize("mode", ["journal", "plain"])
def test_a_runner_joining_while_a_tool_runs_does_not_run_the_call_again(
        kafka_bootstrap: str, make_topic: MakeTopic, mode: str) -> None:
    """One runner holds the only partition and runs a slow call; a second runner joins the
    group (a rebalance: the first's partition is revoked while its tool runs). The revoke
    waits for the tool (released once the revoke started) and records the call before the
    partition goes, so whichever runner gets the partition finds the call journaled (or its
    offset committed): one execution, one result, neither runner fails."""
    committed = make_topic("committed")
    results_topic = make_topic("results")
    journal = make_topic("journal", config={"cleanup.policy": "compact"})
    group = f"latch-runner-join-{uuid.uuid4().hex[:8]}"
    config = Config(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
                    topics=TopicNames(committed=committed, results=results_topic,
                                      journal=journal))
    started: list[str] = []
    release, rerun = threading.Event(), threading.Event()

    def slow(args: dict[str, str]) -> str:
        started.append(args["key"])
        if len(started) > 1:
            rerun.set()
        release.wait(120)
        return f"done {args['key']}"

    def runner(n: int) -> Runner:
        consumer = WatchedConsumer({**config.kafka.confluent_config(), "group.id": group,
                                    "session.timeout.ms": MAX_POLL_INTERVAL_MS,
                                    "heartbeat.interval.ms": 500,
                                    "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
                                    "enable.auto.commit": False,
                                    "auto.offset.reset": "earliest",
                                    "isolation.level": "read_committed"})
        return Runner(config, {"slow": slow}, consumer=consumer, group_id=group,
                      transactional_id=(f"{group}-{n}" if mode == "journal" else None))

    stop, failures, threads = threading.Event(), [], []

    def serve(made: Runner) -> None:
        try:
            made.run(stop, timeout=0.2)
        except BaseException as exc:  # the test reports it
            failures.append(exc)

    first = runner(0)
    runners = [first]
    threads.append(threading.Thread(target=serve, args=(first,), daemon=True))
    threads[-1].start()
    try:
        deadline = time.monotonic() + 60
        while not getattr(first.consumer, "assigned", None):
            assert time.monotonic() < deadline and not failures, failures
            time.sleep(0.1)
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(committed, key=b"run-k1", value=call("k1"))
        assert producer.flush(30) == 0
        while not started:
            assert time.monotonic() < deadline, "the call did not reach a tool"
            time.sleep(0.05)
        runners.append(runner(1))
        threads.append(threading.Thread(target=serve, args=(runners[1],), daemon=True))
        threads[-1].start()
        first.consumer.revoking.wait(MAX_POLL_INTERVAL_MS / 1000 + BEYOND_S)
        release.set()
        found = results(kafka_bootstrap, results_topic, want=1)
        deadline = time.monotonic() + 30  # the group settles: the partition assigned again

        def reassigned() -> bool:
            second = getattr(runners[1].consumer, "assigned", [])
            return first.consumer.assigned.count(0) > 1 or 0 in second  # type: ignore[attr-defined]

        while not reassigned():
            assert time.monotonic() < deadline, "the partition was not assigned again"
            time.sleep(0.1)
        rerun.wait(5)  # time for its new owner to read the call (and, wrongly, run it)
    finally:
        release.set()
        stop.set()
        for thread in threads:
            thread.join(60)
        for made in runners:
            made.close()
    assert started == ["k1"], started
    assert [r["content"] for r in found] == ["done k1"]
    assert not failures, failures
