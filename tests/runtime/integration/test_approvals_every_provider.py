"""A held call stays held on Bedrock and Gemini, on the real broker, with both engines (issue
32 item 2; docs/policies.md, "Approvals").

A Bedrock or Gemini run reads its stop reason at the gateway's ``stream.end``: that end must
leave a call held for approval (``approvals.require_approval``) waiting on the pending topic,
so that the person's ``approve`` commits it and ``deny`` gives it one ``approval_denied``
error result. Before the fix the stream's end failed it ``stream_error``, the run ended
``failed`` and the decision went to the DLQ (``call_already_decided``). Who sends what: the
gateway the events and ``stream.end`` (the events topic), the approver the decisions (the
control topic, forwarded into the events log by the worker).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import BEDROCK, GEMINI, PATH_SCHEMA, provider_run
from worker_harness import (
    ENGINES,
    OUTPUTS,
    Reader,
    Stack,
    approver,
    approver_settings,
    finished,
    make_stack,
    publish_envelopes,
    running_worker,
)

SECRET = "/srv/SECRET-hunter2"
TOOLS = {"read_file": PATH_SCHEMA, "delete_file": PATH_SCHEMA}
#: run id -> (provider, what the test decides of its held call)
RUNS = {f"{provider.split('.')[0]}-{kind}": (provider, kind)
        for provider in (BEDROCK, GEMINI) for kind in ("approve", "deny")}


def _envelopes() -> list[dict[str, Any]]:
    envelopes: list[dict[str, Any]] = []
    for run_id, (provider, _) in RUNS.items():
        envelopes += provider_run(provider, run_id, TOOLS, [
            (f"read_{run_id}", "read_file", '{"path": "/srv/a"}'),
            (f"del_{run_id}", "delete_file", orjson.dumps({"path": SECRET}).decode())])
    return envelopes


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=request.param,
                    approvals__require_approval="delete_file",
                    **approver_settings("ann", "bob")) as made:
        yield made


def test_bedrock_and_gemini_calls_wait_past_the_stream_end(stack: Stack,
                                                           tmp_path: Path) -> None:
    """Every run's read commits and its delete waits on the pending topic, its stream ended
    (``stream.end`` published): no error result, no final message, no DLQ record yet. Then
    approve commits the delete as held, deny fails it ``approval_denied`` (never the argument
    text); each run one final message, ``completed``; no ``stream_error``, no DLQ record."""
    with running_worker(stack, tmp_path / "w.log"):
        publish_envelopes(stack.bootstrap, stack.topic("events"), _envelopes())
        reader = Reader(stack, (*OUTPUTS, "pending"))
        try:
            reader.collect(lambda records: set(RUNS) <= {
                r.value["run_id"] for r in records if r.role == "pending"}, timeout=90)
            assert reader.finals() == {} and reader.of("errors") == []
            assert reader.of("dlq") == []
            with approver(stack, "ann") as ann, approver(stack, "bob") as bob:  # (signed)
                for run_id, (_, kind) in RUNS.items():
                    if kind == "approve":
                        ann.approve(run_id, f"del_{run_id}", by="ann", reason="fine")
                    else:
                        bob.deny(run_id, f"del_{run_id}", by="bob", reason="no")
                ann.flush()
                bob.flush()
            reader.collect(finished(RUNS), timeout=90)
        finally:
            reader.close()
    committed = {r.value["call_id"]: r.value for r in reader.of("committed")}
    errors = {r.value["tool_call_id"]: r.value for r in reader.of("errors")}
    approved = [r for r, (_, kind) in RUNS.items() if kind == "approve"]
    denied = [r for r, (_, kind) in RUNS.items() if kind == "deny"]
    assert set(committed) == {f"read_{r}" for r in RUNS} | {f"del_{r}" for r in approved}
    assert all(committed[f"del_{r}"]["arguments"] == {"path": SECRET} for r in approved)
    assert {k: e["reason"] for k, e in errors.items()} == {
        f"del_{r}": "approval_denied" for r in denied}
    assert all(SECRET not in orjson.dumps(e).decode() for e in errors.values())
    assert reader.of("dlq") == []
    finals = reader.finals()
    assert len(reader.of("final")) == len(RUNS)
    assert {run: f["status"] for run, f in finals.items()} == dict.fromkeys(RUNS, "completed")
