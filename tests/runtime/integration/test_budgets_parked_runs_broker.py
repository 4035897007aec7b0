"""The open-run budget ends a parked run in its place, on the real broker, with both engines
(issue 32 item 9; docs/contract.md: memory is budgeted per events partition).

One partition, ``max_open_runs`` 2: a Bedrock run parks on its held delete (its stream ended,
the gateway's ``stream.end``), a chat run starts streaming after it, then a third run starts.
The least recently active run is the parked one, so it is the one ended: its held call fails
``budget_exceeded``, its final message is ``failed``, and the streaming run goes on. The
approver's later decision is a DLQ record ``call_already_decided``. Before the fix the
streaming run was ended and the parked one kept the slot.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from builders import BEDROCK, CHAT, PATH_SCHEMA, provider_run, run_envelopes, tools_for
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


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param,
                    agent_stream_assemble__max_open_runs="2",
                    agent_stream_assemble__assemble_idle_timeout_s="300",
                    approvals__require_approval="delete_file",
                    **approver_settings("ann")) as made:
        yield made


def test_the_parked_run_is_the_one_ended(stack: Stack, tmp_path: Path) -> None:
    """The parked run (older than the streaming one) is ended ``budget_exceeded`` when a third
    run starts; the streaming run has no outcome yet; the decision that follows goes to the
    DLQ as ``call_already_decided``; no argument text in the error result."""
    parked = provider_run(BEDROCK, "parked", TOOLS, [
        ("read", "read_file", '{"path": "/srv/a"}'),
        ("del", "delete_file", orjson.dumps({"path": SECRET}).decode())])
    streaming = run_envelopes("streaming", CHAT, tools_for(CHAT, TOOLS), [
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
             {"index": 0, "id": "s-call", "type": "function",
              "function": {"name": "read_file", "arguments": '{"path": '}}]}}]}], end=False)
    third = run_envelopes("third", CHAT, tools_for(CHAT, TOOLS), [], end=False)
    with running_worker(stack, tmp_path / "w.log"):
        publish_envelopes(stack.bootstrap, stack.topic("events"), [*parked, *streaming, *third])
        reader = Reader(stack, (*OUTPUTS, "pending"))
        try:
            reader.collect(finished(["parked"]), timeout=90)
            with approver(stack, "ann") as publisher:  # (signed: it counts, docs/policies.md)
                publisher.approve("parked", "del", by="ann", reason="fine")
                publisher.flush()
            reader.collect(lambda records: any(r.role == "dlq" for r in records), timeout=90)
        finally:
            reader.close()
    assert [r.value["run_id"] for r in reader.of("pending")] == ["parked"]
    assert reader.finals()["parked"]["status"] == "failed"
    assert set(reader.finals()) == {"parked"}
    assert [r.value["call_id"] for r in reader.of("committed")] == ["read"]
    (error,) = [r.value for r in reader.of("errors")]
    assert (error["tool_call_id"], error["reason"]) == ("del", "budget_exceeded")
    assert SECRET not in orjson.dumps(error).decode()
    assert [r.value["reason"] for r in reader.of("dlq")] == ["call_already_decided"]
