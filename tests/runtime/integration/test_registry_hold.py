"""One run held for its toolset never stalls the others (issue 32, item 5), both engines, on
the real broker.

Who sends what: the gateway writes every run's records into the events topic (here one
partition, so that the runs share it); a tenant's ``run.start`` names ``{"toolset": "files",
"version": 1}`` before the operator registers that version (``latch registry put``). The held
run's records wait in the worker, in order; the other runs' go on; the version's arrival
(or ``registry.wait_s``) lets the held run go; a held run past the partition's bounds fails
``unknown_toolset`` at once; a takeover finds the hold again in the log."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    WorkerProcess,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    running_worker,
    tools,
)

from worker.runtime.governance import registry_io
from worker.runtime.governance.registry import TOOLSET

pytestmark = pytest.mark.integration

#: Long enough that a worker that waits for the version in its loop cannot give the other
#: runs their outcomes within :data:`OTHERS_WITHIN_S`.
WAIT_S = 40
OTHERS_WITHIN_S = 25


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, registry__wait_s=str(WAIT_S)) as made:
        yield made


@pytest.fixture(params=ENGINES)
def capped(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, registry__wait_s=str(WAIT_S),
                    registry__hold_max_records="4") as made:
        yield made


def _held(run_id: str) -> list[dict[str, Any]]:
    """A run naming toolset ``files`` version 1, with two calls (a, then b)."""
    envelopes = provider_run("openai.chat", run_id, [
        (f"call_{run_id}_a", "read_file", '{"path": "/srv/a"}'),
        (f"call_{run_id}_b", "read_file", '{"path": "/srv/b"}')])
    envelopes[0]["tools"] = {"toolset": "files", "version": 1}
    return envelopes


def _inline(run_id: str) -> list[dict[str, Any]]:
    return provider_run("openai.chat", run_id, [(f"call_{run_id}", "read_file",
                                                 '{"path": "/srv/x"}')])


def _interleaved(held: list[dict[str, Any]], others: list[str]) -> list[dict[str, Any]]:
    """The held run's ``run.start`` first, then its other records spread among the other
    runs' (each run's records in order)."""
    out = held[:1]
    rest = held[1:]
    for n, run_id in enumerate(others):
        out += _inline(run_id)
        if n % 2 == 0 and rest:
            out.append(rest.pop(0))
    return out + rest


def _calls(reader: Reader, run_id: str) -> list[tuple[str, str | None]]:
    """The outcomes of ``run_id``'s calls as the reader read them: (call id, reason)."""
    return [(o.value.get("call_id") or o.value["tool_call_id"], o.value.get("reason"))
            for o in reader.of("committed") + reader.of("errors")
            if o.value.get("run_id") == run_id]


def test_a_held_run_does_not_stall_the_others_and_keeps_its_order(
        stack: Stack, tmp_path: Path) -> None:
    """A run.start naming toolset version 1 before it is registered, then ten other runs in
    the same partition (the held run's records among them): the other runs' calls commit
    well within ``registry.wait_s`` while the held run has no outcome at all (before, the
    kafka engine's loop and the faust engine's events agent waited for the version: nothing
    came out of the partition for ``wait_s``). Once the version is put, the held run's calls
    commit, in its records' order; each call has exactly one outcome."""
    others = [f"other{n}" for n in range(10)]
    with running_worker(stack, tmp_path / "worker.log") as worker:
        reader = Reader(stack)  # (once the worker runs: its topics are known by then)
        try:
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              _interleaved(_held("held"), others))
            try:
                reader.collect(finished(others), timeout=OTHERS_WITHIN_S)
            except AssertionError as exc:
                raise AssertionError(f"{exc}: the held run stalled the others\n"
                                     + worker.tail()) from None
            assert _calls(reader, "held") == []
            assert "held" not in reader.finals()
            registry_io.put(stack.config(), TOOLSET, "files", 1,
                            tools("openai.chat", ["read_file"]))
            reader.collect(finished(["held"]), timeout=60)
        finally:
            reader.close()
    assert _calls(reader, "held") == [("call_held_a", None), ("call_held_b", None)]
    for run_id in others:
        assert _calls(reader, run_id) == [(f"call_{run_id}", None)]


def test_a_held_run_past_the_bounds_fails_unknown_toolset_at_once(
        capped: Stack, tmp_path: Path) -> None:
    """``registry.hold_max_records`` 4: a held run whose fifth record arrives before its
    version ends its hold at once: both its calls fail ``unknown_toolset`` (one error result
    each), long before ``registry.wait_s``; the other runs commit as usual; a version put
    afterwards changes nothing for it."""
    stack = capped
    others = [f"other{n}" for n in range(4)]
    with running_worker(stack, tmp_path / "worker.log") as worker:
        reader = Reader(stack)
        try:
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              _interleaved(_held("flood"), others))
            reader.collect(finished([*others, "flood"]), timeout=OTHERS_WITHIN_S)
            assert "passed the hold's bounds" in worker.log()
        finally:
            reader.close()
    assert _calls(reader, "flood") == [("call_flood_a", "unknown_toolset"),
                                       ("call_flood_b", "unknown_toolset")]
    for run_id in others:
        assert _calls(reader, run_id) == [(f"call_{run_id}", None)]


@pytest.fixture(params=ENGINES)
def patient(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """``registry.wait_s`` 120: long enough for two workers to start one after the other."""
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, registry__wait_s="120") as made:
        yield made


def test_a_takeover_finds_the_hold_in_the_log(patient: Stack, tmp_path: Path) -> None:
    """A worker holds a run (its records read, their offsets committed past: another run's
    call after them commits) and stops; the next worker takes the partition over, finds the
    hold in the run's head and parks the run's records again rather than applying them with
    their outputs thrown away; once the version is put, the held run's calls commit, exactly
    once each, in order."""
    stack = patient
    with running_worker(stack, tmp_path / "first.log"):
        reader = Reader(stack)
        try:
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              _held("held") + _inline("after"))
            reader.collect(finished(["after"]), timeout=OTHERS_WITHIN_S)
            assert _calls(reader, "held") == []
        finally:
            reader.close()
    with running_worker(stack, tmp_path / "second.log") as second:
        reader = Reader(stack)
        try:
            second.wait_for("rebuilt before offset .*; 0 runs open, 1 held for their toolset")
            registry_io.put(stack.config(), TOOLSET, "files", 1,
                            tools("openai.chat", ["read_file"]))
            reader.collect(finished(["held"]), timeout=60)
        finally:
            reader.close()
    assert _calls(reader, "held") == [("call_held_a", None), ("call_held_b", None)]
    assert _calls(reader, "after") == [("call_after", None)]


@pytest.fixture(params=ENGINES)
def killable(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    """``registry.wait_s`` 120; the kafka engine's transactions time out after 3 s (a killed
    worker's open one stops blocking ``read_committed`` readers soon)."""
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, registry__wait_s="120",
                    worker__transaction_timeout_s="3") as made:
        yield made


def _committed(stack: Stack) -> int:
    """The worker group's committed offset of the events partition."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": stack.app_id,
                         "enable.auto.commit": False})
    try:
        tp = TopicPartition(stack.topic("events"), 0)
        return int(consumer.committed([tp], timeout=10)[0].offset)
    finally:
        consumer.close()


def test_a_killed_worker_loses_no_held_record(killable: Stack, tmp_path: Path) -> None:
    """The group's committed offset moves past a held run's records (another run after them
    commits) and the worker is then killed (SIGKILL: no commit on the way out). The next
    worker finds the hold in the run's head, reads the run's records again from its start
    and, once the version is put, commits each of its calls exactly once."""
    stack = killable
    held = _held("held")
    first = WorkerProcess(stack, tmp_path / "first.log")
    second = None
    try:
        first.wait_ready()
        publish_envelopes(stack.bootstrap, stack.topic("events"), held + _inline("after"))
        deadline = time.monotonic() + OTHERS_WITHIN_S
        while _committed(stack) <= len(held):  # past the held run's and the next record
            assert time.monotonic() < deadline, "the offset did not move past the held run"
            time.sleep(0.3)
        first.kill()
        second = WorkerProcess(stack, tmp_path / "second.log")
        second.wait_ready()
        second.wait_for("rebuilt before offset .*; 0 runs open, 1 held for their toolset",
                        timeout=90)
        registry_io.put(stack.config(), TOOLSET, "files", 1,
                        tools("openai.chat", ["read_file"]))
        reader = Reader(stack)
        try:
            reader.collect(finished(["held", "after"]), timeout=90)
        finally:
            reader.close()
        assert _calls(reader, "held") == [("call_held_a", None), ("call_held_b", None)]
        assert second.stop() == 0, second.tail()
    finally:
        for proc in (first, second):
            if proc is not None and proc.proc.poll() is None:
                proc.kill()
