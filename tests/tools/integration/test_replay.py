"""``latch replay`` on the real broker: a live worker decides a mixed set of runs, then the
events topic is replayed from the beginning to a file and to shadow topics, and the replayed
outcomes are the live ones (guarantee 4, "replay decides the same")."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from worker_harness import (
    ENGINES,
    OUTPUTS,
    PROVIDERS,
    Reader,
    Stack,
    WorkerProcess,
    expected,
    finished,
    make_stack,
    provider_run,
    publish,
    publish_envelopes,
    run_ids,
)

#: The outputs compared, the turn records too (the result latch: replay decides them alike).
ROLES = (*OUTPUTS, "turns")

PREFIX = "replay."


@dataclass(frozen=True)
class Raw:
    """One output record as bytes: its logical topic, partition, key and value."""

    role: str
    partition: int
    key: bytes | None
    value: bytes

    @property
    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = orjson.loads(self.value)
        return doc


def read_all(bootstrap: str, topics: Mapping[str, str]) -> list[Raw]:
    """Every record of ``topics`` (Kafka name -> role) up to their ends as they are now."""
    # read_committed, to the end the consumer reports: the kafka engine's transaction markers
    # take offsets that are never delivered.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    try:
        meta = consumer.list_topics(timeout=10).topics
        tps = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=10)[1]
                for tp in tps}
        consumer.assign(tps)
        positions = dict.fromkeys(ends, 0)
        records: list[Raw] = []
        deadline = time.monotonic() + 30
        while any(positions[tp] < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, f"cannot read {topics} to the end"
            for msg in consumer.consume(500, timeout=0.2):
                if msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                    where = (msg.topic(), msg.partition())
                    positions[where] = max(positions[where], msg.offset())
                elif msg.error() is None:
                    positions[(msg.topic(), msg.partition())] = msg.offset() + 1
                    records.append(Raw(topics[msg.topic()], msg.partition(), msg.key(),
                                       msg.value()))
        return records
    finally:
        consumer.close()


def from_file(path: Path) -> list[Raw]:
    """The replay's JSON lines as records (the value re-encoded as the worker encodes it)."""
    records = []
    for line in path.read_bytes().splitlines():
        doc = orjson.loads(line)
        key = None if doc["key"] is None else doc["key"].encode()
        records.append(Raw(doc["topic"], -1, key, orjson.dumps(doc["value"])))
    return records


def per_run(records: Sequence[Raw]) -> dict[tuple[str, str], list[bytes]]:
    """Each run's values per output topic, in order, a repeated value (at least once) dropped."""
    runs: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    for record in records:
        if record.role != "dlq":
            values = runs[(record.role, record.doc["run_id"])]
            if record.value not in values:
                values.append(record.value)
    return dict(runs)


def dlq_by_source(records: Sequence[Raw]) -> dict[tuple[int, int], tuple[bytes | None, bytes]]:
    """DLQ records by the events record they are about: its key and the DLQ value."""
    found: dict[tuple[int, int], tuple[bytes | None, bytes]] = {}
    for record in records:
        if record.role == "dlq":
            source = record.doc["source"]
            where = (source["partition"], source["offset"])
            assert found.setdefault(where, (record.key, record.value)) == (record.key,
                                                                           record.value)
    return found


def deduplicated(records: Sequence[Raw]) -> Counter[tuple[str, bytes | None, bytes]]:
    """The records as a multiset of (topic, key, value), a repeated idempotency key dropped
    (what a runner that deduplicates sees)."""
    seen: set[tuple[str, str]] = set()
    kept: Counter[tuple[str, bytes | None, bytes]] = Counter()
    for record in records:
        key = record.doc.get("idempotency_key")
        if key is not None:
            if (record.role, key) in seen:
                continue
            seen.add((record.role, key))
        kept[(record.role, record.key, record.value)] += 1
    return kept


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    """The group's committed offset of each partition (-1001: none). Reading them does not
    join the group."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                   timeout=10)
        return [tp.offset for tp in sorted(found, key=lambda tp: tp.partition)]
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)]
    finally:
        consumer.close()


def run_replay(stack: Stack, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``latch replay argv`` against the stack (``env``: more LATCH_ variables)."""
    return subprocess.run([sys.executable, "-m", "worker", "replay", *argv],
                          env=os.environ | stack.env() | env, capture_output=True, text=True,
                          timeout=120)


def latch_replay(stack: Stack, *argv: str) -> tuple[str, float]:
    """Run ``latch replay argv``, which must succeed; return its stderr and its duration."""
    started = time.monotonic()
    proc = run_replay(stack, *argv)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    return proc.stderr, elapsed


def summary_counts(stderr: str) -> dict[str, int]:
    """The numbers of the replay's summary line, by name."""
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("latch replay: "), stderr
    counts = {name: int(n) for n, name in re.findall(
        r"(\d+) (records read|runs finished|unknown_run)", line)}
    return counts | {name: int(n) for name, n in re.findall(
        r"\b(committed|errors|final|progress|dlq) (\d+)", line)}


# -- the live run -------------------------------------------------------------------------------


@dataclass
class Live:
    """What the live worker decided, and the run ids by kind."""

    records: list[Raw]
    runs: dict[str, list[str]]
    group_offsets: list[int]


def mixed_runs(stack: Stack) -> dict[str, tuple[list[str], list[tuple[bytes | None, bytes]]]]:
    """Run ids and events records of each kind of run: completed runs of the three providers
    (valid and invalid calls), a stream error, an idle run, and bad records."""
    calls = [("call_ok", "read_file", '{"path": "/etc/hosts"}'),
             ("call_bad", "read_file", '{"path": 7}')]
    done = run_ids("done", stack.partitions, per_partition=2)
    broken, idle = run_ids("broken", 1)[0], run_ids("idle", 1)[0]

    def records(envelopes: list[dict[str, Any]]) -> list[tuple[bytes | None, bytes]]:
        return [(e["run_id"].encode(), orjson.dumps(e)) for e in envelopes]

    completed = [provider_run(PROVIDERS[n % 3], run_id, calls, size=4)
                 for n, run_id in enumerate(done)]
    head = provider_run("openai.chat", broken, calls, size=4)[:5]
    error = [*head, {"v": 1, "run_id": broken, "seq": 5, "type": "stream.error",
                     "error": "connection reset"}]
    bad: list[tuple[bytes | None, bytes]] = [
        (b"junk", b"\xff\xfe not json"),
        (None, orjson.dumps({"v": 1, "run_id": "nokey", "seq": 0, "type": "stream.end"})),
        (b"ghost", orjson.dumps({"v": 1, "run_id": "ghost", "seq": 3, "type": "stream.end"}))]
    return {"completed": (done, [r for run in completed for r in records(run)]),
            "stream_error": ([broken], records(error)),
            "idle": ([idle], records(provider_run("openai.responses", idle, calls)[:3])),
            "bad": ([], bad)}


def _until_consumed(stack: Stack, ends: list[int]) -> None:
    """Wait until the worker's group has committed each events partition up to ``ends``: the
    worker has read every record published before (the faust engine commits every 0.5 s, the
    kafka engine with each batch)."""
    deadline = time.monotonic() + 60
    while True:
        committed = committed_offsets(stack.bootstrap, stack.app_id, stack.topic("events"),
                                      stack.partitions)
        if all(c >= e for c, e in zip(committed, ends, strict=True)):
            return
        assert time.monotonic() < deadline, f"committed {committed}, ends {ends}"
        time.sleep(0.2)


def run_live(stack: Stack, log_path: Path) -> Live:
    """The worker decides the mixed runs and a cancel sent through the control topic; it is
    stopped, and its outputs and its group's committed offsets are read."""
    worker = WorkerProcess(stack, log_path)
    try:
        worker.wait_ready()
        kinds = mixed_runs(stack)
        for _, records in kinds.values():
            publish(stack.bootstrap, stack.topic("events"), records)
        cancelled = run_ids("cancel", 1)[0]
        cancel_calls = [("call_c", "read_file", '{"path": "/secret"}')]
        run = provider_run("anthropic.messages", cancelled, cancel_calls)
        publish_envelopes(stack.bootstrap, stack.topic("events"), run[:4])
        publish_envelopes(stack.bootstrap, stack.topic("control"), [
            {"v": 1, "run_id": cancelled, "type": "cancel", "reason": "user_stop"}])
        runs = {kind: ids for kind, (ids, _) in kinds.items()} | {"cancelled": [cancelled]}
        every = [run_id for ids in runs.values() for run_id in ids]
        reader = Reader(stack)
        try:
            reader.collect(lambda rs: finished(every)(rs) and len(reader.of("dlq")) >= 3,
                           timeout=60)
        finally:
            reader.close()
        # the rest of the cancelled run: ignored, live and in the replay
        publish_envelopes(stack.bootstrap, stack.topic("events"), run[4:])
        _until_consumed(stack, end_offsets(stack.bootstrap, stack.topic("events"),
                                           stack.partitions))
        assert worker.stop() == 0, f"unclean exit on SIGTERM:\n{worker.tools.tail()}"
        assert worker.problems() == []
    finally:
        if worker.proc.poll() is None:
            worker.kill()
    records = read_all(stack.bootstrap, {stack.topic(role): role for role in ROLES})
    offsets = committed_offsets(stack.bootstrap, stack.app_id, stack.topic("events"),
                                stack.partitions)
    return Live(records, runs, offsets)


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """A stack for each engine: replay decides as either live engine does."""
    with make_stack(kafka_bootstrap, request.node.name, partitions=3,
                    worker__engine=request.param,
                    agent_stream_assemble__assemble_idle_timeout_s="2",
                    agent_stream_assemble__emit_progress="true") as made:
        try:
            yield made
        finally:
            client = AdminClient({"bootstrap.servers": kafka_bootstrap})
            shadows = [PREFIX + made.topic(role) for role in ROLES]
            for future in client.delete_topics(shadows, operation_timeout=30).values():
                with contextlib.suppress(KafkaException):  # never created
                    future.result(timeout=60)
            delete_replay_groups(made)


def replay_groups(stack: Stack) -> list[str]:
    """The consumer groups the stack's replays left (``<app_id>-replay-...``)."""
    client = AdminClient({"bootstrap.servers": stack.bootstrap})
    return [g.group_id for g in client.list_consumer_groups().result(timeout=30).valid
            if g.group_id.startswith(f"{stack.app_id}-replay-")]


def delete_replay_groups(stack: Stack) -> None:
    """Delete the replays' groups and the live worker's."""
    groups = [*replay_groups(stack), stack.app_id]
    if groups:
        client = AdminClient({"bootstrap.servers": stack.bootstrap})
        for future in client.delete_consumer_groups(groups).values():
            with contextlib.suppress(KafkaException):
                future.result(timeout=30)


# -- the test -----------------------------------------------------------------------------------


def test_replay_decides_as_the_live_worker(stack: Stack, tmp_path: Path) -> None:
    """Runs of the three providers (committed and schema-invalid calls), a cancel through the
    control topic, a stream error, a run expired by the recorded ticks and bad records: the
    live worker decides them; ``latch replay --from-beginning`` to a file and to shadow topics
    reproduces every run's values byte for byte and in order, the DLQ records, and the whole
    set as a multiset once at-least-once duplicates are dropped by idempotency_key. The replay
    commits only into its own groups, never into the live one."""
    live = run_live(stack, tmp_path / "worker.log")
    statuses = {r.doc["status"] for r in live.records if r.role == "final"}
    reasons = {r.doc["reason"] for r in live.records if r.role in ("errors", "dlq")}
    assert {"completed", "cancelled", "idle_timeout"} <= statuses
    assert {"schema_invalid", "stream_error", "cancelled", "assemble_idle_timeout",
            "undecodable", "key_mismatch", "unknown_run"} <= reasons
    assert any(r.role == "progress" for r in live.records)
    events, partitions = stack.topic("events"), stack.partitions
    ends = end_offsets(stack.bootstrap, events, partitions)
    assert all(offset >= 0 for offset in live.group_offsets)

    out = tmp_path / "replay.jsonl"
    file_err, file_s = latch_replay(stack, "--from-beginning", "--to-file", str(out))
    topics_group = f"{stack.app_id}-replay-topics"
    topics_err, topics_s = latch_replay(stack, "--from-beginning", "--to-topics", PREFIX,
                                        "--group-id", topics_group)
    print(f"replay to a file: {file_s:.1f} s; to shadow topics: {topics_s:.1f} s")
    print(file_err.strip().splitlines()[-1])

    by_file = from_file(out)
    by_topics = read_all(stack.bootstrap, {PREFIX + stack.topic(role): role
                                           for role in ROLES})
    live_runs = per_run(live.records)
    every = {run_id for ids in live.runs.values() for run_id in ids}
    assert {run_id for _, run_id in live_runs} == every
    for name, replayed in (("file", by_file), ("topics", by_topics)):
        assert per_run(replayed) == live_runs, f"--to-{name}: a run's values differ"
        assert dlq_by_source(replayed) == dlq_by_source(live.records), f"--to-{name}: DLQ"
        assert deduplicated(replayed) == deduplicated(live.records), f"--to-{name}: the set"
        assert sum(deduplicated(replayed).values()) == len(replayed), f"--to-{name}: repeats"
    # the shadow topics: the worker's partitions, for every keyed record
    assert ({(r.role, r.key, r.value, r.partition) for r in by_topics if r.key is not None}
            <= {(r.role, r.key, r.value, r.partition) for r in live.records})

    counts = summary_counts(file_err)
    # every record of the events topic that committed (transaction markers are not records)
    assert counts["records read"] == len(read_all(stack.bootstrap, {events: "events"}))
    assert counts["runs finished"] == counts["final"] == len(every)
    assert counts["dlq"] == sum(r.role == "dlq" for r in by_file)
    assert counts["unknown_run"] == 1  # "ghost": a stream.end for a run that never started
    assert summary_counts(topics_err) == counts

    # never into the live group; the replay's own groups hold where they stopped
    assert committed_offsets(stack.bootstrap, stack.app_id, events, partitions) == (
        live.group_offsets)
    assert committed_offsets(stack.bootstrap, topics_group, events, partitions) == ends
    [default] = [g for g in replay_groups(stack) if re.fullmatch(
        rf"{re.escape(stack.app_id)}-replay-\d{{8}}T\d{{6}}\.\d{{3}}Z", g)]
    assert committed_offsets(stack.bootstrap, default, events, partitions) == ends


def test_a_range_that_starts_inside_a_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The caveat, on the broker and without a worker: a range that starts after a run's
    run.start sends that run's records to the DLQ as unknown_run, while a run that starts
    inside the range is decided as the offline core decides it; a range that starts between
    runs has no unknown_run at all. --from-time and --to-time resolve through the broker's
    offsets_for_times; an unknown partition or topic is one line and exit 2."""
    with make_stack(kafka_bootstrap, "replay-range", partitions=2) as stack:
        try:
            check_ranges(stack, tmp_path / "range.jsonl")
        finally:
            delete_replay_groups(stack)


def check_ranges(stack: Stack, out: Path) -> None:
    """The body of test_a_range_that_starts_inside_a_run."""
    first, second = run_ids("range", 2, per_partition=2)[:2]  # both in partition 0
    calls = [("call_1", "read_file", '{"path": "/a"}')]
    run_a = provider_run("openai.chat", first, calls)
    run_b = provider_run("anthropic.messages", second, calls)
    before = int(time.time() * 1000) - 1
    publish_envelopes(stack.bootstrap, stack.topic("events"), run_a + run_b)

    def replayed(*argv: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
        stderr, _ = latch_replay(stack, "--partitions", "0", *argv, "--to-file", str(out))
        lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
        for line in lines:  # (the offline core knows no events record: its audits say null)
            if line["topic"] == "audit":
                assert line["value"]["source"]["topic"] == stack.topic("events")
                line["value"]["source"] = None
        return lines, summary_counts(stderr)

    config = stack.config()
    want_b = [e.as_line() for e in expected(run_b, config)]
    lines, counts = replayed("--from-offset", "1")
    assert counts["records read"] == len(run_a) + len(run_b) - 1
    assert [(x["topic"], x["value"]["reason"]) for x in lines if x["key"] == first] == (
        [("dlq", "unknown_run")] * (len(run_a) - 1))
    assert [x for x in lines if x["key"] == second] == want_b
    assert counts["unknown_run"] == len(run_a) - 1

    lines, counts = replayed("--from-offset", str(len(run_a)),
                             "--to-offset", str(len(run_a) + len(run_b)))
    assert lines == want_b and "unknown_run" not in counts

    lines, counts = replayed("--from-time", str(before))
    assert counts["records read"] == len(run_a) + len(run_b)
    assert lines == [e.as_line() for e in expected(run_a + run_b, config)]
    lines, counts = replayed("--from-beginning", "--to-time", str(before))
    assert (lines, counts["records read"]) == ([], 0)
    lines, counts = replayed("--from-time", "2999-01-01T00:00:00Z")
    assert (lines, counts["records read"]) == ([], 0)

    for argv, env, words in (
            (["--partitions", "5"], {}, "has partitions 0-1; no partition 5"),
            ([], {"LATCH_TOPICS__EVENTS": f"{stack.app_id}.nope"}, "does not exist")):
        proc = run_replay(stack, "--from-beginning", *argv, "--to-file", str(out), **env)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert words in proc.stderr
