"""The policy set version in force, whatever the history (issue 32 item 6), on the real
broker: ``latch replay --from-time`` / ``--from-offset`` starts each partition with the
version the live worker had in force there (read back from the events log, or from the
policy head where retention removed it); a takeover after more rollouts than the policy head
remembers (17) re-decides nothing of a call that waits for approval; a successor whose
registry reader lags puts no older version in force. Each on a log written by each engine.

Who writes what: the policy texts are an operator's (the registry, written here as
``latch registry put`` writes them), the markers the worker's, the runs the gateway's
(``publish_envelopes``), the approval an approver's (``Publisher.approve``, signed with ann's
test key, which the worker lists: ``approver_settings``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from worker_harness import (
    ENGINES,
    OUTPUTS,
    Reader,
    Stack,
    WorkerProcess,
    approver,
    approver_settings,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    running_worker,
)

from worker.core.envelope import TICK_KEY
from worker.runtime.governance import registry
from worker.runtime.governance.registry import POLICY, POLICY_HISTORY, POLICY_MARKER

PERMIT_ALL = '@id("all")\npermit(principal, action, resource);\n'
#: The same permit, and a forbid on read_file, which beats it.
FORBID_READS = PERMIT_ALL + ('@id("no-reads")\nforbid(principal, action, '
                             'resource == Latch::Tool::"read_file");\n')


def _put_policy(stack: Stack, version: int, text: str) -> None:
    """Register policy set ``version``: the record ``latch registry put`` writes."""
    key, value = registry.encode(POLICY, "", version, text)
    producer = Producer({"bootstrap.servers": stack.bootstrap})
    producer.produce(stack.topic("registry"), key=key, value=value, partition=0)
    assert producer.flush(30) == 0


def _markers(stack: Stack) -> list[tuple[int, int]]:
    """(offset, version) of every committed marker in events partition 0, in log order."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "policy-in-force",
                         "enable.partition.eof": True, "isolation.level": "read_committed"})
    found: list[tuple[int, int]] = []
    try:
        consumer.assign([TopicPartition(stack.topic("events"), 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    break
                continue
            if msg.key() == POLICY_MARKER:
                found.append((msg.offset(), orjson.loads(msg.value())["version"]))
    finally:
        consumer.close()
    return found


def _roll_out(stack: Stack, version: int, text: str, timeout: float = 60) -> int:
    """Register ``version`` and wait until the worker marked it; return the marker's offset."""
    _put_policy(stack, version, text)
    deadline = time.monotonic() + timeout
    while True:
        marked = [at for at, named in _markers(stack) if named == version]
        if marked:
            return marked[0]
        assert time.monotonic() < deadline, f"no marker for version {version}"
        time.sleep(0.3)


def _end(stack: Stack) -> int:
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "policy-in-force"})
    try:
        return int(consumer.get_watermark_offsets(
            TopicPartition(stack.topic("events"), 0), timeout=10, cached=False)[1])
    finally:
        consumer.close()


def _reads(prefix: str, count: int) -> tuple[list[str], list[dict[str, Any]]]:
    ids = [f"{prefix}-{n}" for n in range(count)]
    envelopes: list[dict[str, Any]] = []
    for run_id in ids:
        envelopes += provider_run("openai.chat", run_id, [(f"call_{run_id}", "read_file",
                                                           '{"path": "/srv/a"}')])
    return ids, envelopes


def _outcomes(values: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    return sorted((v["run_id"], v.get("call_id") or v["tool_call_id"], v.get("reason"))
                  for v in values)


def _replay(stack: Stack, out: Path, *start: str) -> tuple[list[dict[str, Any]], str]:
    """``latch replay START --to-file OUT``: the committed calls and errors, and stderr."""
    done = subprocess.run([sys.executable, "-m", "worker", "replay", *start, "--to-file",
                           str(out), "--no-progress"], capture_output=True, text=True,
                          timeout=180, env=os.environ | stack.env())
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    return [line["value"] for line in lines if line["topic"] in ("committed", "errors")], \
        done.stderr


@pytest.fixture(params=ENGINES)
def enforcing(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """One events partition, the registry's policy sets enforced (no ``policy.file``); the
    replay tool is one for both engines, each engine writes the log it reads once."""
    pytest.importorskip("cedarpy")
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, registry__wait_s="2",
                    policy__mode="enforce") as made:
        yield made


def test_a_replay_from_a_time_or_an_offset_decides_with_the_version_then_in_force(
        enforcing: Stack, tmp_path: Path) -> None:
    """v1 (permit all) is marked, runs commit, v2 (no reads) is marked, runs are denied. A
    replay from the first committed run's time, and one from its offset, give exactly the
    live outcomes of the runs in range: the committed ones commit (before: every one was
    ``policy_denied``, "no policy set version is in force", the replay starting with none)."""
    stack = enforcing
    with running_worker(stack, tmp_path / "worker.log"):
        reader = Reader(stack)
        try:
            _roll_out(stack, 1, PERMIT_ALL)
            start_offset, start_ms = _end(stack), int(time.time() * 1000)
            ids, envelopes = _reads("v1", 3)
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            reader.collect(finished(ids), timeout=90)
            _roll_out(stack, 2, FORBID_READS)
            later, envelopes = _reads("v2", 2)
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            reader.collect(finished(ids + later), timeout=90)
        finally:
            reader.close()
    live = _outcomes([o.value for o in reader.of("committed") + reader.of("errors")])
    assert [reason for _, _, reason in live] == [None] * 3 + ["policy_denied"] * 2
    for n, start in enumerate((("--from-time", str(start_ms)),
                               ("--from-offset", str(start_offset)))):
        replayed, stderr = _replay(stack, tmp_path / f"out{n}.jsonl", *start)
        assert _outcomes(replayed) == live, stderr


def test_a_replay_of_a_log_whose_marker_retention_removed_asks_the_policy_head(
        enforcing: Stack, tmp_path: Path) -> None:
    """v1 is marked, runs commit; then the records before them (the marker among them) are
    deleted, as retention does. ``latch replay --from-beginning`` takes the version from the
    partition's policy head in the heads changelog: the runs commit as live (before: no
    policy set version in force, every call ``policy_denied``)."""
    stack = enforcing
    with running_worker(stack, tmp_path / "worker.log"):
        reader = Reader(stack)
        try:
            _roll_out(stack, 1, PERMIT_ALL)
            start_offset = _end(stack)
            ids, envelopes = _reads("v1", 2)
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            reader.collect(finished(ids), timeout=90)
        finally:
            reader.close()
    live = _outcomes([o.value for o in reader.of("committed") + reader.of("errors")])
    assert [reason for _, _, reason in live] == [None] * 2
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    for future in admin.delete_records(
            [TopicPartition(stack.topic("events"), 0, start_offset)]).values():
        future.result(timeout=30)
    replayed, stderr = _replay(stack, tmp_path / "out.jsonl", "--from-beginning")
    assert _outcomes(replayed) == live, stderr


@pytest.fixture(params=ENGINES)
def gated(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """One events partition, registry policies enforced, ``delete_file`` gated."""
    pytest.importorskip("cedarpy")
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, registry__wait_s="2",
                    policy__mode="enforce", approvals__require_approval="delete_file",
                    approvals__approval_timeout_s="600",
                    **approver_settings("ann")) as made:
        yield made


def test_a_takeover_after_17_rollouts_re_decides_no_call_waiting_for_approval(
        gated: Stack, tmp_path: Path) -> None:
    """v1 is marked; a run's read commits and its delete waits for approval; 17 more versions
    (all permitting) are rolled out, each marked, so the policy head no longer remembers v1.
    The worker is killed, the call approved, a new worker takes the partition over: the
    rebuild starts with v1 in force (the run's head names it) and re-decides nothing (before:
    no policy set, the held call ``policy_denied``, an error, an audit record and a final
    message the live worker never wrote). The approved call commits with its arguments, the
    run has one final message, and no error is published."""
    stack = gated
    run_id, delete = "held", "call_delete"
    envelopes = provider_run("openai.chat", run_id, [
        ("call_read", "read_file", '{"path": "/srv/a"}'),
        (delete, "delete_file", '{"path": "/srv/tmp/x"}')])
    first = WorkerProcess(stack, tmp_path / "w1.log")
    try:
        first.wait_ready()
        reader = Reader(stack, (*OUTPUTS, "pending"))
    except BaseException:
        first.kill()
        raise
    try:
        _roll_out(stack, 1, PERMIT_ALL)
        publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
        reader.collect(lambda records: any(r.role == "pending" for r in records), timeout=90)
        for version in range(2, POLICY_HISTORY + 3):  # 17 rollouts after the run started
            _roll_out(stack, version,
                      f'@id("v{version}")\npermit(principal, action, resource);\n')
        first.kill()
        with approver(stack, "ann") as publisher:
            publisher.approve(run_id, delete, by="ann", reason="fine")
            publisher.flush()
        with running_worker(stack, tmp_path / "w2.log"):
            reader.collect(finished([run_id]), timeout=120)
    finally:
        reader.close()
        if first.proc.poll() is None:
            first.kill()
    assert reader.of("errors") == []
    assert sorted(r.value["call_id"] for r in reader.of("committed")) == sorted([
        "call_read", delete])
    assert [r.value["status"] for r in reader.of("final")] == ["completed"]


#: A successor whose registry reader lags: it has read only the registry's first record (v1)
#: and reads no more; a policy text it has not read is given up after 1 s past the wait.
LAGGING_READER = """
import worker.runtime.governance.registry_io as registry_io
registry_io.HOLD_MAX_S = 1.0
registry_io._end = lambda consumer, topic: 1
registry_io.RegistryReader._follow = lambda self: None
"""


def _ticks_after(stack: Stack, offset: int) -> int:
    """How many committed ticks events partition 0 holds from ``offset`` on."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "policy-in-force",
                         "enable.partition.eof": True, "isolation.level": "read_committed"})
    count = 0
    try:
        consumer.assign([TopicPartition(stack.topic("events"), 0, offset)])
        while (msg := consumer.poll(5)) is not None:
            if msg.error() is not None:
                break
            count += msg.key() == TICK_KEY.encode()
    finally:
        consumer.close()
    return count


def test_a_successor_whose_registry_reader_lags_puts_no_older_version_in_force(
        enforcing: Stack, tmp_path: Path) -> None:
    """v1 (permit all), then v2 (no reads) are marked; the worker is killed; its successor's
    reader has read only v1. It takes over with v2 in force (its text unread: every call is
    denied, fail closed) and writes no marker for v1 (before: a marker naming v1 at its first
    tick, which put the permissive older version back in force, and a read that v2 forbids
    committed). A read run published after three of its ticks is ``policy_denied``."""
    stack = enforcing
    first = WorkerProcess(stack, tmp_path / "w1.log")
    try:
        first.wait_ready()
        _roll_out(stack, 1, PERMIT_ALL)
        _roll_out(stack, 2, FORBID_READS)
    finally:
        first.kill()
    taken_from = _end(stack)
    second = WorkerProcess(stack, tmp_path / "w2.log", prelude=LAGGING_READER)
    reader = Reader(stack)
    try:
        second.wait_ready()
        deadline = time.monotonic() + 90
        while _ticks_after(stack, taken_from) < 3:
            assert time.monotonic() < deadline, "the successor wrote no ticks"
            time.sleep(0.5)
        ids, envelopes = _reads("after", 1)
        publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
        reader.collect(finished(ids), timeout=90)
    finally:
        reader.close()
        second.kill()
    assert [r.value["call_id"] for r in reader.of("committed")] == []
    assert [r.value["reason"] for r in reader.of("errors")] == ["policy_denied"]
    assert [version for _, version in _markers(stack)] == [1, 2]
