"""The kafka engine's own promises on the real broker: each outcome once at read_committed
across a SIGKILL, and heads that either engine restores from the other's changelog.
(The end-to-end outcomes of ``test_worker.py`` run against both engines there.)"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_harness import (
    Reader,
    Stack,
    WorkerProcess,
    assert_same_outcomes,
    expected,
    finished,
    make_stack,
    publish_envelopes,
    two_call_runs,
)

from worker.runtime import admin
from worker.runtime.kafka_engine import reader
from worker.runtime.kafka_engine.heads import KafkaHeadsTable

PARTITIONS = 4
KEYED = ("committed", "errors", "final", "audit")


def _runs(prefix: str, per_partition: int) -> dict[str, list[dict[str, object]]]:
    return two_call_runs(prefix, PARTITIONS, per_partition)


def _keys(reader: Reader) -> Counter[tuple[str, str]]:
    """How often each (topic role, idempotency key) was read."""
    return Counter((r.role, r.value["idempotency_key"]) for role in KEYED
                   for r in reader.of(role))


@pytest.fixture
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    # Transactions of a second: a kill lands inside one, with outputs already sent.
    with make_stack(kafka_bootstrap, request.node.name, partitions=PARTITIONS,
                    worker__engine="kafka", worker__batch_max_ms="1000",
                    worker__transaction_timeout_s="5") as made:
        yield made


def test_each_outcome_once_at_read_committed_across_a_sigkill(
        stack: Stack, tmp_path: Path) -> None:
    """Two kafka-engine workers share the partitions; one is killed with SIGKILL while runs
    stream through it. The survivor takes its partitions over (the killed worker's open
    transaction is aborted), and a read_committed reader sees every committed call, error
    result and final message exactly once, equal to the offline core's, and one audit record
    per outcome, exactly once too."""
    victim = WorkerProcess(stack, tmp_path / "a.log")
    survivor = None
    try:
        victim.wait_ready()
        survivor = WorkerProcess(stack, tmp_path / "b.log")
        survivor.wait_ready()
        victim.wait_for(r"events partitions assigned: \[\d", count=2)  # after the split
        runs = _runs("once", per_partition=30)
        ids = list(runs)
        heads = [e for run in runs.values() for e in run[: len(run) // 2]]
        publish_envelopes(stack.bootstrap, stack.topic("events"), heads)
        tails = [e for run in runs.values() for e in run[len(run) // 2:]]
        publish_envelopes(stack.bootstrap, stack.topic("events"), tails[: len(tails) // 2])
        victim.kill()  # inside a transaction of up to a second
        publish_envelopes(stack.bootstrap, stack.topic("events"), tails[len(tails) // 2:])

        reader = Reader(stack)
        reader.collect(finished(ids), timeout=90)
        assert_same_outcomes(reader, expected([e for run in runs.values() for e in run],
                                              stack.config()))
        counts = _keys(reader)
        assert {key: n for key, n in counts.items() if n != 1} == {}
        assert sum(1 for role, _ in counts if role == "final") == len(ids)
        assert {key for role, key in counts if role == "audit"} == {
            key for role, key in counts if role in ("committed", "errors")}
        assert survivor.stop() == 0
        assert survivor.problems() == []
    finally:
        for proc in (victim, survivor):
            if proc is not None and proc.proc.poll() is None:
                proc.kill()


def test_a_kafka_engine_takes_over_from_the_faust_engine(
        kafka_bootstrap: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Runs half-streamed through a faust-engine worker, which is then stopped, are finished
    by a kafka-engine worker: it reads the open heads faust wrote to the heads changelog (the
    same topic and encoding), rebuilds the buffers from the events log, and emits what the
    offline core decides; the finished runs' done heads it writes are read back as faust
    writes them."""
    # (the result latch off: done heads at the final message, as the offline core decides)
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    results__enabled="false") as stack:
        runs = _runs("switch", per_partition=2)
        heads = [e for run in runs.values() for e in run[: len(run) // 2]]
        tails = [e for run in runs.values() for e in run[len(run) // 2:]]
        faust = WorkerProcess(stack, tmp_path / "faust.log")
        try:
            faust.wait_ready()
            publish_envelopes(stack.bootstrap, stack.topic("events"), heads)
            faust.wait_for(r"events partitions assigned")
            _wait_heads(stack, open_runs=len(runs))
            assert faust.stop() == 0
        finally:
            if faust.proc.poll() is None:
                faust.kill()
        stack.settings["LATCH_WORKER__ENGINE"] = "kafka"
        kafka = WorkerProcess(stack, tmp_path / "kafka.log")
        try:
            kafka.wait_ready()
            publish_envelopes(stack.bootstrap, stack.topic("events"), tails)
            reader = Reader(stack)
            reader.collect(finished(runs), timeout=60)
            assert_same_outcomes(reader, expected(heads + tails, stack.config()))
            assert "runs open" in kafka.log() and " 0 runs open" not in _rebuilt(kafka)
            assert kafka.stop() == 0
            assert kafka.problems() == []
        finally:
            if kafka.proc.poll() is None:
                kafka.kill()
        table = _changelog(stack)
        assert {k.decode() for k, head in table.items() if head.get("done")} == set(runs)


def _rebuilt(worker: WorkerProcess) -> str:
    return "\n".join(line for line in worker.log().splitlines() if "rebuilt" in line)


def _changelog(stack: Stack) -> KafkaHeadsTable:
    table = KafkaHeadsTable()
    found = reader.read_all({"bootstrap.servers": stack.bootstrap},
                            admin.heads_changelog(stack.config()), range(stack.partitions))
    for p, records in found.items():
        table.restore(p, records)
    return table


def _wait_heads(stack: Stack, open_runs: int, timeout: float = 30) -> None:
    """Wait until the heads changelog holds ``open_runs`` open heads."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        table = _changelog(stack)
        if sum("start" in head for head in table.values()) >= open_runs:
            return
        time.sleep(0.5)
    raise AssertionError(f"open heads: {sum('start' in h for h in _changelog(stack).values())}")
