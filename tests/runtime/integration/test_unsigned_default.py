"""The default configuration cannot be walked around (issue 32 item 3), on the real broker,
with both engines: "A principal that can write cancels alone cannot make an approval count."

The worker runs with no ``approvers`` section at all, ``delete_file`` calls held for a person
and a short approval timeout (record time, at the worker's ticks). Who sends what: the gateway
may write the control topic (it writes cancels) and the events topic; it holds no approver
key. It approves the held call both ways it can: on the control topic, as ``Publisher.approve``
sends it, and straight into the events topic as a forwarded marker would be. Each is one DLQ
record ``approval_unsigned`` holding the decision's bytes; the call stays held (no outcome, no
final message) until ``approval_timeout``; nothing is committed. The worker said at start that
no decision can count.
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
from worker.runtime.driver import NO_APPROVER_KEYS

TIMEOUT_S = 15
RUN, CALL = "held", "call_delete"


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param,
                    approvals__require_approval="delete_file",
                    approvals__approval_timeout_s=str(TIMEOUT_S)) as made:
        yield made


def _dlq(count: int) -> Any:
    return lambda records: len([r for r in records if r.role == "dlq"]) >= count


def _outcomes(reader: Reader) -> list[Out]:
    return [r for r in reader.records if r.role in ("committed", "errors", "final")
            and r.value.get("run_id") == RUN]


def test_the_gateway_cannot_approve_with_the_default_configuration(
        stack: Stack, tmp_path: Path) -> None:
    """See the module docstring: two unsigned approves (control topic, events topic) are two
    DLQ records ``approval_unsigned`` with their bytes while the call stays held; then the
    call fails ``approval_timeout``, one final message, nothing committed (before: the
    control-topic approve committed the call)."""
    envelopes = provider_run("openai.chat", RUN, [(CALL, "delete_file",
                                                   '{"path": "/srv/SECRET-x"}')])
    direct = {"v": 1, "run_id": RUN, "type": "approve", "tool_call_id": CALL, "by": "gateway",
              "reason": "direct"}
    with running_worker(stack, tmp_path / "w.log") as worker:
        assert worker.log().count(NO_APPROVER_KEYS) == 1  # (once, at start)
        reader = Reader(stack, (*OUTPUTS, "pending"))
        try:
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            reader.collect(lambda records: any(r.role == "pending" for r in records),
                           timeout=90)
            with Publisher(stack.config()) as gateway:
                gateway.approve(RUN, CALL, by="gateway", reason="trust me")
                gateway.flush()
            publish_envelopes(stack.bootstrap, stack.topic("events"), [direct])
            reader.collect(_dlq(2), timeout=60)
            assert _outcomes(reader) == [], "an unsigned decision decided the call"
            reader.collect(finished([RUN]), timeout=TIMEOUT_S + 90)
        finally:
            reader.close()
    assert worker.log().count(NO_APPROVER_KEYS) == 1  # (once for the whole run)
    dlq = [r.value for r in reader.of("dlq")]
    assert [d["reason"] for d in dlq] == ["approval_unsigned", "approval_unsigned"]
    sent = [orjson.loads(base64.b64decode(d["original_b64"])) for d in dlq]
    assert {(s["type"], s["tool_call_id"], s["reason"]) for s in sent} == {
        ("approve", CALL, "trust me"), ("approve", CALL, "direct")}
    assert reader.of("committed") == []
    assert [(r.value["tool_call_id"], r.value["reason"]) for r in reader.of("errors")] == [
        (CALL, "approval_timeout")]
    assert len(reader.of("final")) == 1
    told = [r.value for r in reader.of("errors")] + [d["detail"] for d in dlq]
    assert "SECRET" not in orjson.dumps(told).decode()
