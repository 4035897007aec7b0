"""Approvals on the real broker, with both engines (issue 26 item 1): a ``delete_file`` call
(``approvals.require_approval``) is published to the pending topic instead of the committed
one; decisions sent to the control topic (the ``Publisher``'s ``approve``, ``deny``, ``edit``)
are forwarded into the events log like a cancel and decide it there; no decision in time
gives ``approval_timeout``; a decision for an unknown call goes to the DLQ with its bytes.
The approvers ann and bob sign their decisions with their test keys, which the worker lists
(``approver_settings``): with no approver keys, no decision counts (test_unsigned_default.py).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from worker_harness import (
    ENGINES,
    OUTPUTS,
    Out,
    Reader,
    Stack,
    WorkerProcess,
    approver,
    approver_settings,
    by_run,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    running_worker,
)

from worker.core import Assembler, Emit

SECRET = "/srv/SECRET-hunter2"
#: run id -> what the test decides of its held call
RUNS = ("approve", "edit_ok", "edit_bad", "deny", "timeout")
TIMEOUT_S = 20


def _call(run_id: str) -> str:
    return f"call_{run_id}"


def _envelopes() -> list[dict[str, Any]]:
    envelopes = []
    for run_id in RUNS:
        envelopes += provider_run("openai.chat", run_id, [
            (f"read_{run_id}", "read_file", '{"path": "/srv/a"}'),
            (_call(run_id), "delete_file", orjson.dumps({"path": SECRET}).decode())])
    return envelopes


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=request.param,
                    approvals__require_approval="delete_file",
                    approvals__approval_timeout_s=str(TIMEOUT_S),
                    **approver_settings("ann", "bob")) as made:
        yield made


def _pending(runs: tuple[str, ...]) -> Any:
    return lambda records: set(runs) <= {r.value["run_id"] for r in records
                                         if r.role == "pending"}


def test_approve_edit_deny_timeout_and_unknown(stack: Stack, tmp_path: Path) -> None:
    """Each run's ungated read commits at once and its delete waits on the pending topic (no
    final message yet). Then: approve commits it as it was; a valid edit commits the new
    arguments; an invalid edit fails ``invalid_json``; deny fails ``approval_denied``; the
    undecided one fails ``approval_timeout`` at a tick; a decision for an unknown call is one
    DLQ record (``unknown_call``) with the original bytes. One outcome per call id, each run
    one final message after its last decision; no argument text in errors."""
    with running_worker(stack, tmp_path / "w.log"):
        publish_envelopes(stack.bootstrap, stack.topic("events"), _envelopes())
        reader = Reader(stack, (*OUTPUTS, "pending"))
        try:
            reader.collect(_pending(RUNS), timeout=90)
            assert reader.finals() == {}
            assert sorted(r.value["call_id"] for r in reader.of("committed")) == sorted(
                f"read_{run}" for run in RUNS)
            with approver(stack, "ann") as ann, approver(stack, "bob") as bob:
                ann.approve("approve", _call("approve"), by="ann", reason="fine")
                ann.edit("edit_ok", _call("edit_ok"), {"path": "/srv/tmp/x"}, by="ann")
                ann.edit("edit_bad", _call("edit_bad"), '{"path": "/a",}', by="ann")
                bob.deny("deny", _call("deny"), by="bob", reason="no deletes today")
                bob.approve("timeout", "call_nobody", by="bob")  # (still waiting)
                ann.flush()
                bob.flush()
            reader.collect(finished(RUNS), timeout=TIMEOUT_S + 90)
        finally:
            reader.close()
    committed = {r.value["call_id"]: r.value for r in reader.of("committed")}
    errors = {r.value["tool_call_id"]: r.value for r in reader.of("errors")}
    assert committed[_call("approve")]["arguments"] == {"path": SECRET}
    assert committed[_call("edit_ok")]["arguments"] == {"path": "/srv/tmp/x"}
    assert {k: e["reason"] for k, e in errors.items()} == {
        _call("edit_bad"): "invalid_json", _call("deny"): "approval_denied",
        _call("timeout"): "approval_timeout"}
    assert "bob" in errors[_call("deny")]["content"]
    assert not set(committed) & set(errors)
    assert all(SECRET not in orjson.dumps(e).decode() for e in errors.values())
    _one_each(reader.of("committed") + reader.of("errors"))
    (record,) = [r.value for r in reader.of("dlq")]
    assert record["reason"] == "unknown_call"
    assert orjson.loads(base64.b64decode(record["original_b64"]))["tool_call_id"] == \
        "call_nobody"
    finals = reader.finals()
    assert set(finals) == set(RUNS) and len(reader.of("final")) == len(RUNS)
    assert all(f["status"] == "completed" for f in finals.values())


def _one_each(outcomes: list[Out]) -> None:
    ids = [r.value.get("call_id") or r.value["tool_call_id"] for r in outcomes]
    assert len(ids) == len(set(ids)), "a call id with two outcomes"


def test_a_worker_killed_between_pending_and_decision(stack: Stack, tmp_path: Path) -> None:
    """The worker is SIGKILLed once the calls are pending; the decisions are sent while no
    worker runs; a new worker takes the partitions over (rebuilding the waiting runs from the
    events log) and applies each decision once: one outcome per call id (a repeated record
    repeats the same bytes), one final message per run. Then replay: the events topic as
    written (provider events, forwarded decisions, ticks), fed through the core per partition
    with its record times, gives exactly the live committed calls, errors, pending records and
    final messages."""
    runs = ("approve", "edit_ok", "deny")
    envelopes = [e for e in _envelopes() if e["run_id"] in runs]
    first = WorkerProcess(stack, tmp_path / "w1.log")
    try:
        first.wait_ready()  # (then the new topics' metadata is known to every client)
        reader = Reader(stack, (*OUTPUTS, "pending"))
    except BaseException:
        first.kill()
        raise
    try:
        publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
        reader.collect(_pending(runs), timeout=90)
        first.kill()
        with approver(stack, "ann") as ann, approver(stack, "bob") as bob:
            ann.approve("approve", _call("approve"), by="ann")
            ann.edit("edit_ok", _call("edit_ok"), {"path": "/srv/tmp/x"}, by="ann")
            bob.deny("deny", _call("deny"), by="bob", reason="no")
            ann.flush()
            bob.flush()
        with running_worker(stack, tmp_path / "w2.log"):
            reader.collect(finished(runs), timeout=120)
    finally:
        reader.close()
        if first.proc.poll() is None:
            first.kill()
    outcomes: dict[str, set[bytes]] = {}
    for record in reader.of("committed") + reader.of("errors"):
        call = record.value.get("call_id") or record.value["tool_call_id"]
        outcomes.setdefault(call, set()).add(orjson.dumps(record.value))
    assert all(len(values) == 1 for values in outcomes.values()), "two outcomes for a call"
    committed = {r.value["call_id"]: r.value for r in reader.of("committed")}
    assert committed[_call("approve")]["arguments"] == {"path": SECRET}
    assert committed[_call("edit_ok")]["arguments"] == {"path": "/srv/tmp/x"}
    assert [r.value["reason"] for r in reader.of("errors")] == ["approval_denied"]
    assert {orjson.dumps(r.value) for r in reader.of("final")} and set(reader.finals()) == \
        set(runs)
    assert len({orjson.dumps(r.value) for r in reader.of("final")}) == len(runs)
    replayed = _replay(stack)
    for role in ("committed", "errors", "final", "pending"):
        live = by_run(r.value for r in reader.of(role))
        again = by_run(e.value for e in replayed if e.topic.value == role)
        assert live == again, role


def _replay(stack: Stack) -> list[Emit]:
    """The events topic read back from the beginning, each partition through its own
    assembler at its records' times (what ``latch replay`` does)."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    topic = stack.topic("events")
    parts = list(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    config = stack.config()
    assemblers = {p: Assembler(config.assemble) for p in parts}
    emits: list[Emit] = []
    ended: set[int] = set()
    while ended != set(parts):
        for msg in consumer.consume(500, timeout=1.0):
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(msg.partition())
                continue
            emits += assemblers[msg.partition()].feed_record(
                msg.key(), msg.value(), msg.timestamp()[1])
    consumer.close()
    return emits
