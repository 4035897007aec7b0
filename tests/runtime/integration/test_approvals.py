"""Approvals on the real broker, with both engines (issue 26 item 1): a ``delete_file`` call
(``approvals.require_approval``) is published to the pending topic instead of the committed
one; decisions sent to the control topic (the ``Publisher``'s ``approve``, ``deny``, ``edit``)
are forwarded into the events log like a cancel and decide it there; no decision in time
gives ``approval_timeout``; a decision for an unknown call goes to the DLQ with its bytes.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from worker_harness import (
    ENGINES,
    OUTPUTS,
    Out,
    Reader,
    Stack,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    running_worker,
)

from worker.client.publisher import Publisher

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
                    approvals__approval_timeout_s=str(TIMEOUT_S)) as made:
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
            with Publisher(stack.config()) as publisher:
                publisher.approve("approve", _call("approve"), by="ann", reason="fine")
                publisher.edit("edit_ok", _call("edit_ok"), {"path": "/srv/tmp/x"}, by="ann")
                publisher.edit("edit_bad", _call("edit_bad"), '{"path": "/a",}', by="ann")
                publisher.deny("deny", _call("deny"), by="bob", reason="no deletes today")
                publisher.approve("timeout", "call_nobody", by="bob")  # (still waiting)
                publisher.flush()
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
