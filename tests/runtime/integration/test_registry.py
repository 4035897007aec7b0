"""The registry topic on the real broker, with both engines (issue 25 item 3): a run naming a
toolset by reference commits its call; a run naming a version that never comes fails
``unknown_toolset`` after ``registry.wait_s``; ``latch registry put`` refuses a version that
exists already; ``latch replay`` of the events topic decides as the live worker did, across a
policy set version registered mid-stream (its markers in the events log)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import cancel
from worker_harness import (
    ENGINES,
    TOPIC_ROLES,
    Reader,
    Stack,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    run_ids,
    running_worker,
    tools,
)

from worker.runtime.governance import registry_io
from worker.runtime.governance.registry import (
    FENCE,
    POLICY,
    POLICY_MARKER,
    TOOLSET,
    marker_version,
)


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=request.param, registry__wait_s="2") as made:
        yield made


def _by_reference(run_id: str, version: int) -> list[dict[str, Any]]:
    envelopes = provider_run("openai.chat", run_id, [(f"call_{run_id}", "read_file",
                                                      '{"path": "/srv/a"}')])
    envelopes[0]["tools"] = {"toolset": "files", "version": version}
    return envelopes


def _latch(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker", *args], capture_output=True,
                          text=True, timeout=120, env=os.environ | stack.env())


def _outcomes(values: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    return sorted((v["run_id"], v.get("call_id") or v["tool_call_id"], v.get("reason"))
                  for v in values)


def test_toolsets_by_reference_decide_the_same_live_and_in_replay(
        stack: Stack, tmp_path: Path) -> None:
    """Version 1 of toolset ``files`` registered: a run naming it commits its call; a run
    naming version 7 (never registered) fails ``unknown_toolset`` once the wait is over; a
    second put of version 1 is refused (exit 2, "exists already"); a policy set registered
    mid-stream gets a marker into each owned events partition; ``latch replay`` of the whole
    events topic gives the same outcomes for every call."""
    config = stack.config()
    registry_io.put(config, TOOLSET, "files", 1, tools("openai.chat", ["read_file"]))
    spec = tmp_path / "files.json"
    spec.write_bytes(orjson.dumps(tools("openai.chat", ["read_file"])))
    refused = _latch(stack, "registry", "put", "toolset", "files", "--version", "1",
                     "--tools", str(spec))
    assert refused.returncode == 2 and "exists already" in refused.stderr, refused.stderr
    reader = Reader(stack)
    try:
        with running_worker(stack, tmp_path / "worker.log"):
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              _by_reference("known", 1) + _by_reference("never", 7))
            reader.collect(finished(["known", "never"]), timeout=90)
            policy = tmp_path / "p.cedar"
            policy.write_text("permit(principal, action, resource);\n")
            put = _latch(stack, "registry", "put", "policy", "--version", "1", "--file",
                         str(policy))
            if "cedarpy is not installed" not in put.stderr:
                assert put.returncode == 0, put.stderr
            else:  # pragma: no cover  (the policy step installs cedarpy)
                registry_io.put(config, POLICY, "", 1, policy.read_text())
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              _by_reference("after", 1))
            reader.collect(finished(["after"]), timeout=90)
            # the marker goes beside the worker's next tick after it read the version, which
            # may come after the run finished: wait for it while the worker runs
            deadline = time.monotonic() + 60
            while POLICY_MARKER not in _events_keys(stack) and time.monotonic() < deadline:
                time.sleep(1)
        live = _outcomes([o.value for o in reader.of("committed") + reader.of("errors")])
    finally:
        reader.close()
    assert live == [("after", "call_after", None), ("known", "call_known", None),
                    ("never", "call_never", "unknown_toolset")]
    listed = _latch(stack, "registry", "list")
    assert "toolset files 1" in listed.stdout and "policy 1" in listed.stdout, listed.stderr
    out = tmp_path / "replay.jsonl"
    replay = _latch(stack, "replay", "--from-beginning", "--to-file", str(out),
                    "--no-progress")
    assert replay.returncode == 0, replay.stderr
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    replayed = [line["value"] for line in lines if line["topic"] in ("committed", "errors")]
    assert _outcomes(replayed) == live
    markers = _events_keys(stack).count(POLICY_MARKER)
    assert markers >= 1  # one per owned partition, perhaps again after a rebalance


def _events_keys(stack: Stack) -> list[bytes | None]:
    return _keys(stack, "events", stack.partitions)


def _keys(stack: Stack, role: str, partitions: int) -> list[bytes | None]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "registry-it",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    keys: list[bytes | None] = []
    try:
        consumer.assign([TopicPartition(stack.topic(role), p, 0)
                         for p in range(partitions)])
        ends = 0
        while ends < partitions:
            msg = consumer.poll(5)
            if msg is None:
                break
            if msg.error() is not None:
                ends += 1
                continue
            keys.append(msg.key())
    finally:
        consumer.close()
    return keys


# -- a mid-stream policy change, live and in replay (real Cedar, enforce) -----------------

PERMIT_ALL = "@id(\"all\")\npermit(principal, action, resource);\n"
#: Version 2: the same permit, and a forbid on read_file, which beats it.
FORBID_READS = PERMIT_ALL + ("@id(\"no-reads\")\nforbid(principal, action, "
                             "resource == Latch::Tool::\"read_file\");\n")


@pytest.fixture(params=ENGINES)
def enforcing(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A stack whose worker enforces the registry's policy sets (no ``policy.file``)."""
    pytest.importorskip("cedarpy")
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=request.param, registry__wait_s="2",
                    policy__mode="enforce") as made:
        yield made


def _inline(prefix: str, partitions: int) -> tuple[list[str], list[dict[str, Any]]]:
    """One read_file call per run, a run in each events partition."""
    ids = run_ids(prefix, partitions)
    envelopes: list[dict[str, Any]] = []
    for run_id in ids:
        envelopes += provider_run("openai.chat", run_id, [(f"call_{run_id}", "read_file",
                                                           '{"path": "/srv/a"}')])
    return ids, envelopes


def _markers(stack: Stack) -> dict[int, list[int]]:
    """The policy versions the markers in each events partition name, in log order
    (read_committed: a kafka-engine marker counts once its transaction commits)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "registry-it",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    found: dict[int, list[int]] = {p: [] for p in range(stack.partitions)}
    try:
        consumer.assign([TopicPartition(stack.topic("events"), p, 0)
                         for p in range(stack.partitions)])
        ends: set[int] = set()
        deadline = time.monotonic() + 30
        while len(ends) < stack.partitions and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    ends.add(msg.partition())
                continue
            if msg.key() == POLICY_MARKER:
                version = marker_version(msg.value() or b"")
                if version is not None:
                    found[msg.partition()].append(version)
    finally:
        consumer.close()
    return found


def _wait_for_marker(stack: Stack, version: int, timeout: float = 60) -> None:
    """Until every events partition holds a committed marker putting ``version`` in force."""
    deadline = time.monotonic() + timeout
    while True:
        found = _markers(stack)
        if all(versions and versions[-1] == version for versions in found.values()):
            return
        assert time.monotonic() < deadline, f"no marker for version {version}: {found}"
        time.sleep(0.5)


def _read_topics(stack: Stack, names: dict[str, str]) -> list[dict[str, Any]]:
    """Every record of the topics ``names`` (topic -> role), read_committed, to their ends."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "registry-it",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    values: list[dict[str, Any]] = []
    try:
        meta = consumer.list_topics(timeout=10).topics
        wanted = [TopicPartition(t, p, 0) for t in names for p in meta[t].partitions]
        consumer.assign(wanted)
        ends: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 30
        while len(ends) < len(wanted) and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    ends.add((msg.topic(), msg.partition()))
                continue
            values.append(orjson.loads(msg.value()))
        assert len(ends) == len(wanted), "replayed topics not read to their ends"
    finally:
        consumer.close()
    return values


def _put_policy(stack: Stack, tmp_path: Path, version: int, text: str) -> None:
    path = tmp_path / f"policy-{version}.cedar"
    path.write_text(text, encoding="utf-8")
    put = _latch(stack, "registry", "put", "policy", "--version", str(version), "--file",
                 str(path))
    assert put.returncode == 0, put.stderr


def test_a_mid_stream_policy_change_decides_the_same_live_and_in_replay(
        enforcing: Stack, tmp_path: Path) -> None:
    """enforce, no ``policy.file``, real Cedar: with no policy set version in the registry
    every call is ``policy_denied`` (fail closed, "no policy set version is in force");
    version 1 (permit all) registered and marked in every events partition: the next runs
    commit; version 2 (a forbid on read_file) registered mid-stream and marked: the runs
    after it are ``policy_denied`` naming ``no-reads``; ``latch replay --from-beginning
    --to-topics`` into fresh topics gives exactly the same outcome per tool_call_id."""
    stack = enforcing
    phases: dict[str, list[str]] = {}
    with running_worker(stack, tmp_path / "worker.log"):
        reader = Reader(stack)  # (once the worker is ready: the topics' metadata is known)
        try:
            ids, envelopes = _inline("none", stack.partitions)
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            reader.collect(finished(ids), timeout=90)
            phases["none"] = ids
            for version, text, phase in ((1, PERMIT_ALL, "v1"), (2, FORBID_READS, "v2")):
                _put_policy(stack, tmp_path, version, text)
                _wait_for_marker(stack, version)
                ids, envelopes = _inline(phase, stack.partitions)
                publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
                reader.collect(finished(ids), timeout=90)
                phases[phase] = ids
        finally:
            reader.close()
    committed = {o.value["call_id"] for o in reader.of("committed")}
    errors = {o.value["tool_call_id"]: o.value for o in reader.of("errors")}
    live = _outcomes([o.value for o in reader.of("committed") + reader.of("errors")])
    calls = {phase: {f"call_{r}" for r in ids} for phase, ids in phases.items()}
    assert committed == calls["v1"]
    assert set(errors) == calls["none"] | calls["v2"]
    assert {e["reason"] for e in errors.values()} == {"policy_denied"}
    assert all("no policy set version is in force" in errors[c]["content"]
               for c in calls["none"])
    assert all("no-reads" in errors[c]["content"] for c in calls["v2"])
    prefix = f"replay-{uuid.uuid4().hex[:6]}."
    replay = _latch(stack, "replay", "--from-beginning", "--to-topics", prefix,
                    "--no-progress")
    try:
        assert replay.returncode == 0, replay.stderr
        replayed = _read_topics(stack, {prefix + stack.topic(role): role
                                        for role in ("committed", "errors")})
    finally:
        _delete(stack, [prefix + stack.topic(role) for role in TOPIC_ROLES])
    assert _outcomes(replayed) == live


def _delete(stack: Stack, topics: list[str]) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": stack.bootstrap})
    for future in client.delete_topics(topics, operation_timeout=30).values():
        with contextlib.suppress(KafkaException):  # not made by the replay
            future.result(timeout=60)


def _until_held(stack: Stack, worker: Any) -> None:
    """Return once the worker holds a run for the registry: while an answer is awaited, its
    registry reader writes a ``fence`` tombstone into the registry topic (registry_io.py)."""
    deadline = time.monotonic() + 60
    while FENCE not in _keys(stack, "registry", 1):
        assert time.monotonic() < deadline, (
            "the worker never waited for the registry:\n" + worker.log()[-3000:])
        time.sleep(0.2)


def _until_a_transaction_times_out(bootstrap: str, topic: str, timeout_ms: int) -> None:
    """Open a transaction of ``timeout_ms`` on ``topic``, leave it open, and return once the
    broker has aborted it (its partition's last stable offset reached the end): any
    transaction of that timeout opened before this one is aborted by then too."""
    from confluent_kafka import IsolationLevel, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"witness-{uuid.uuid4().hex}",
                         "transaction.timeout.ms": timeout_ms})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"witness")
    assert producer.flush(30) == 0
    admin, partition = AdminClient({"bootstrap.servers": bootstrap}), TopicPartition(topic, 0)

    def end(level: IsolationLevel) -> int:
        found = admin.list_offsets({partition: OffsetSpec.latest()}, isolation_level=level)
        return int(found[partition].result(timeout=30).offset)

    deadline = time.monotonic() + 60
    while end(IsolationLevel.READ_COMMITTED) < end(IsolationLevel.READ_UNCOMMITTED):
        assert time.monotonic() < deadline, "the broker never aborted a timed-out transaction"
        time.sleep(0.2)
    assert end(IsolationLevel.READ_COMMITTED) >= 2  # the record and the abort marker


@pytest.fixture
def slow_registry(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A kafka-engine stack whose hold (``registry.wait_s`` 25) far outlasts its transaction
    timeout (1 s; the test broker sweeps for timed-out transactions every 0.5 s)."""
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine="kafka", registry__wait_s="25",
                    worker__transaction_timeout_s="1") as made:
        yield made


def test_a_hold_commits_the_kafka_engines_open_transaction_first(
        slow_registry: Stack, make_topic: Any, tmp_path: Path) -> None:
    """The kafka engine consumes, in one batch, a run whose call it commits and then a
    run.start naming toolset version 1 before anyone registered it; the version is put once the
    worker holds the run and a transaction of the same 1 s timeout, opened after the hold
    began, was aborted by the broker (so any transaction open through the hold would be too).
    No transaction stays open through the hold (the run's records wait in the driver, decision
    0014; before issue 32 the engine committed its open transaction before a blocking hold), so
    nothing is aborted: both calls are committed, the log has no aborted transaction and the
    worker stops cleanly (before issue 25's fix, the transaction stayed open through the hold,
    the broker timed it out and fenced the producer: the worker stopped with
    "This instance has been fenced" and nothing was committed)."""
    stack = slow_registry
    first = provider_run("openai.chat", "first", [("call_first", "read_file",
                                                   '{"path": "/srv/a"}')])
    with running_worker(stack, tmp_path / "worker.log") as worker:
        reader = Reader(stack)
        try:
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              first + _by_reference("late", 1))
            _until_held(stack, worker)
            _until_a_transaction_times_out(stack.bootstrap, make_topic("witness"), 1000)
            registry_io.put(stack.config(), TOOLSET, "files", 1,
                            tools("openai.chat", ["read_file"]))
            reader.collect(finished(["first", "late"]), timeout=90)
        finally:
            reader.close()
        assert "transaction aborted" not in worker.log()
    assert _outcomes([o.value for o in reader.of("committed") + reader.of("errors")]) == [
        ("first", "call_first", None), ("late", "call_late", None)]


@pytest.fixture
def slow_faust_registry(kafka_bootstrap: str, request: pytest.FixtureRequest
                        ) -> Iterator[Stack]:
    """A faust-engine stack whose hold (``registry.wait_s`` 25) would outlast its consumer's
    session were the event loop held."""
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine="faust", registry__wait_s="25") as made:
        yield made


def test_the_faust_engine_waits_for_a_toolset_off_its_event_loop(
        slow_faust_registry: Stack, tmp_path: Path) -> None:
    """A run.start naming toolset version 1 before anyone registered it: while the faust
    engine waits for the registry's answer, its event loop goes on: a cancel sent to the control
    topic meanwhile is forwarded into the events topic before the version is put (with the
    wait inside the loop, as before, nothing moved for up to ``registry.wait_s``); once put, the
    run's call commits."""
    stack = slow_faust_registry
    with running_worker(stack, tmp_path / "worker.log") as worker:
        reader = Reader(stack)
        try:
            publish_envelopes(stack.bootstrap, stack.topic("events"), _by_reference("late", 1))
            _until_held(stack, worker)
            publish_envelopes(stack.bootstrap, stack.topic("control"),
                              [cancel("elsewhere")])
            deadline = time.monotonic() + 15
            while b"elsewhere" not in _events_keys(stack):
                assert time.monotonic() < deadline, (
                    "the cancel was not forwarded during the wait:\n" + worker.log()[-3000:])
                time.sleep(0.5)
            registry_io.put(stack.config(), TOOLSET, "files", 1,
                            tools("openai.chat", ["read_file"]))
            reader.collect(finished(["late"]), timeout=90)
        finally:
            reader.close()
    assert _outcomes([o.value for o in reader.of("committed") + reader.of("errors")]) == [
        ("late", "call_late", None)]
