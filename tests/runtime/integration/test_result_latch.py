"""The result latch through Kafka, on both engines (issue 36): a runner's result is read by the
worker from the results topic, paired with its committed call in the run's events partition;
a call with no result by its deadline gets the latch's ``tool_timeout`` result; the run's turn
record follows once every call has its one result; what does not pair goes to the DLQ with its
bytes and a reason, and the latch's own results are never read back as answers.

Who writes the results topic: the runners. The tests here also write what someone else could
(a result for a call that does not exist, a forged idempotency key, a second answer, a record
that is not a result, a result that claims to be the latch's): none of them pairs."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    make_stack,
    provider_run,
    publish,
    publish_envelopes,
    running_worker,
)

from worker.client.results import answer

ROLES = ("committed", "results", "turns", "dlq", "final", "audit")
DEADLINE_S = 4


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=str(request.param),
                    results__deadline_s=str(DEADLINE_S),
                    agent_stream_assemble__assemble_idle_timeout_s="300") as made:
        yield made


def _result(stack: Stack, call: dict[str, object], content: str, **changes: object) -> None:
    value = orjson.loads(answer(call, False, content, 900_000))
    value.update(changes)
    publish(stack.bootstrap, stack.topic("results"),
            [(str(call["run_id"]).encode(), orjson.dumps(value))])


def test_results_paired_timeouts_answered_and_one_turn_per_run(
        stack: Stack, tmp_path: Path) -> None:
    """Two runs of two calls: one answered whole (a second answer is result_duplicate), one
    with a call never answered (tool_timeout by the latch; its late answer result_late); a
    forged key and a non-result are DLQ records; each run gets one turn record."""
    with running_worker(stack, tmp_path / "worker.log"):
        reader = Reader(stack, ROLES)
        try:
            envelopes = [*provider_run("openai.chat", "r-done", [
                ("c1", "read_file", '{"path": "/a"}'), ("c2", "read_file", '{"path": "/b"}')]),
                *provider_run("anthropic.messages", "r-slow", [
                    ("t1", "read_file", '{"path": "/c"}'),
                    ("t2", "read_file", '{"path": "/d"}')])]
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            records = reader.collect(lambda rs: len([r for r in rs
                                                     if r.role == "committed"]) == 4, 60)
            calls = {r.value["call_id"]: r.value for r in records if r.role == "committed"}
            for call_id in ("c1", "c2", "t1"):
                _result(stack, calls[call_id], f"answer of {call_id}")
            _result(stack, calls["c1"], "a second answer")
            _result(stack, calls["t2"], "forged", idempotency_key="r-slow:forged")
            publish(stack.bootstrap, stack.topic("results"), [(b"r-slow", b"not json")])
            _result(stack, calls["t2"], "I am the latch", by="latch")
            records = reader.collect(lambda rs: len([r for r in rs if r.role == "turns"]) == 2,
                                     90)
            turns = {r.value["run_id"]: r.value for r in records if r.role == "turns"}
            assert [o["outcome"] for o in turns["r-done"]["outcomes"]] == ["answered"] * 2
            assert [m["content"] for m in turns["r-done"]["messages"]] == [
                "answer of c1", "answer of c2"]
            slow = turns["r-slow"]
            assert [o["outcome"] for o in slow["outcomes"]] == ["answered", "tool_timeout"]
            [message] = slow["messages"]  # Anthropic: one user message of tool_result blocks
            assert [b["tool_use_id"] for b in message["content"]] == ["t1", "t2"]
            latch = [r.value for r in records if r.role == "results" and r.value.get("reason")]
            assert [(v["tool_call_id"], v["reason"]) for v in latch] == [("t2", "tool_timeout")]
            _result(stack, calls["t2"], "too late")
            records = reader.collect(lambda rs: len([r for r in rs if r.role == "dlq"]) >= 4,
                                     60)
            dlq = sorted(r.value["reason"] for r in records if r.role == "dlq")
            assert dlq == ["result_duplicate", "result_late", "undecodable", "unknown_call"]
            late = next(r.value for r in records if r.role == "dlq"
                        and r.value["reason"] == "result_late")
            assert b"too late" in base64.b64decode(late["original_b64"])
            audits = [r.value for r in records if r.role == "audit" and r.value.get("result")]
            assert sorted(a["outcome"] for a in audits) == [
                "answered", "answered", "answered", "tool_timeout"]
            assert not any("answer of" in orjson.dumps(a).decode() for a in audits)
            assert len(turns) == 2 and len([r for r in records if r.role == "turns"]) == 2
        finally:
            reader.close()
