"""Approvals by known people on the real broker, with both engines (issue 32 item 3).

Who sends what: the gateway may write the control topic (it writes cancels) and the events
topic; an approver holds a key (``approvers.keys``, owned per ``approvers.owners``) and the
policy in force says which approver may decide what (``Latch::Approver``). Here the worker
enforces the registry's policy sets; version 1 permits the calls, lets the on-call group
(alice) approve acme's deletes and anyone with a key deny; ``delete_file`` calls wait for
approval. Then, per run:

* ``unsigned``: an approve without signature, sent to the control topic as the gateway could
  send it and written straight into the events topic, does not count (two DLQ records
  ``approval_unsigned``); bob's signed deny then decides it (``approval_denied``);
* ``bob``: bob's signed approve is refused by the policy (``approver_not_allowed``); the call
  stays held until ``approval_timeout``;
* ``later``: version 2 forbids deletes; alice's signed approve, applied under it, is
  ``policy_denied``, never committed.

No delete is committed; each audit record of a decided delete names the approver.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from worker_harness import (
    ENGINES,
    OUTPUTS,
    Reader,
    Stack,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    running_worker,
)

from worker.client.publisher import Publisher
from worker.runtime.config import load_config

TIMEOUT_S = 20
RUNS = ("unsigned", "bob", "later")
CALLS = """\
@id("calls")
permit(principal is Latch::Tenant, action == Latch::Action::"call", resource);

@id("oncall-approves-acme-deletes")
permit(principal in Latch::ApproverGroup::"oncall", action == Latch::Action::"approve",
       resource == Latch::Tool::"delete_file")
when { context has tenant && context.tenant == "acme" };

@id("anyone-denies")
permit(principal is Latch::Approver, action == Latch::Action::"deny", resource);
"""
NO_DELETES = CALLS + """
@id("no-deletes")
forbid(principal, action == Latch::Action::"call", resource == Latch::Tool::"delete_file");
"""


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    pytest.importorskip("cedarpy")
    keys = tmp_path_factory.mktemp("keys")
    (keys / "alice").write_bytes(os.urandom(32).hex().encode())
    (keys / "bob").write_bytes(os.urandom(32).hex().encode())
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=request.param, registry__wait_s="2",
                    policy__mode="enforce",
                    approvals__require_approval="delete_file",
                    approvals__approval_timeout_s=str(TIMEOUT_S),
                    approvers__keys=f"{{alice-1: 'file:{keys}/alice', bob-1: 'file:{keys}/bob'}}",
                    approvers__owners="{alice-1: alice, bob-1: bob}",
                    approvers__groups="{alice: [oncall]}") as made:
        yield made


def _call(run_id: str) -> str:
    return f"call_{run_id}"


def _envelopes() -> list[dict[str, Any]]:
    envelopes = []
    for run_id in RUNS:
        run = provider_run("openai.chat", run_id, [(_call(run_id), "delete_file",
                                                    '{"path": "/srv/SECRET-x"}')])
        run[0]["tenant"] = "acme"
        envelopes += run
    return envelopes


def _latch(stack: Stack, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "worker", *args], capture_output=True,
                          text=True, timeout=120, env=os.environ | stack.env())
    assert done.returncode == 0, done.stderr


def _put_policy(stack: Stack, tmp_path: Path, version: int, text: str) -> None:
    path = tmp_path / f"policy-{version}.cedar"
    path.write_text(text, encoding="utf-8")
    _latch(stack, "registry", "put", "policy", "--version", str(version), "--file", str(path))


def _publisher(stack: Stack, key_id: str | None) -> Publisher:
    """A Publisher as an approval tool (signing with ``key_id``) or the gateway (None)."""
    env = stack.env() | ({} if key_id is None else {"LATCH_APPROVERS__KEY_ID": key_id})
    config = load_config(None, env=env)
    return Publisher(config if key_id is not None else dataclasses.replace(
        config, approvers=dataclasses.replace(config.approvers, key_id=None)))


def _with(reasons: list[str]) -> Any:
    def until(records: list[Any]) -> bool:
        return sorted(r.value["reason"] for r in records if r.role == "dlq") == sorted(reasons)
    return until


def _pending(records: list[Any]) -> bool:
    return set(RUNS) <= {r.value["run_id"] for r in records if r.role == "pending"}


def test_only_a_signed_decision_by_an_allowed_approver_counts(stack: Stack,
                                                              tmp_path: Path) -> None:
    """See the module docstring: the gateway's unsigned approve (control topic and events
    topic) and bob's not-allowed approve go to the DLQ with the call still held; a signed
    deny decides; an approve under a policy that now forbids the call is ``policy_denied``;
    the undecided call times out; nothing is committed; audit records name the approvers."""
    with running_worker(stack, tmp_path / "w.log"):
        reader = Reader(stack, (*OUTPUTS, "pending"))
        try:
            _put_policy(stack, tmp_path, 1, CALLS)
            _wait_for_marker(stack, 1)
            publish_envelopes(stack.bootstrap, stack.topic("events"), _envelopes())
            reader.collect(_pending, timeout=90)
            with _publisher(stack, None) as gateway:
                gateway.approve("unsigned", _call("unsigned"), by="alice", reason="trust me")
                gateway.flush()
            publish_envelopes(stack.bootstrap, stack.topic("events"), [
                {"v": 1, "run_id": "unsigned", "type": "approve",
                 "tool_call_id": _call("unsigned"), "by": "alice", "reason": "direct"}])
            with _publisher(stack, "bob-1") as bob:
                bob.approve("bob", _call("bob"), by="bob", reason="looks fine")
                bob.flush()
            reader.collect(_with(["approval_unsigned", "approval_unsigned",
                                  "approver_not_allowed"]), timeout=60)
            assert not reader.finals(), "a refused decision decided a call"
            with _publisher(stack, "bob-1") as bob:
                bob.deny("unsigned", _call("unsigned"), by="bob", reason="no")
                bob.flush()
            _put_policy(stack, tmp_path, 2, NO_DELETES)
            _wait_for_marker(stack, 2)
            with _publisher(stack, "alice-1") as alice:
                alice.approve("later", _call("later"), by="alice", reason="on call")
                alice.flush()
            # every run's final, and each call's audit record (sent once the call's other
            # outputs are confirmed: it may come after its run's final)
            audited = {_call("unsigned"), _call("bob"), _call("later")}
            reader.collect(lambda rs: finished(RUNS)(rs) and audited <= {
                r.value.get("tool_call_id") for r in rs if r.role == "audit"},
                timeout=TIMEOUT_S + 90)
        finally:
            reader.close()
    assert not reader.of("committed")
    errors = {r.value["tool_call_id"]: r.value["reason"] for r in reader.of("errors")}
    assert errors == {_call("unsigned"): "approval_denied", _call("bob"): "approval_timeout",
                      _call("later"): "policy_denied"}
    assert sorted(r.value["reason"] for r in reader.of("dlq")) == [
        "approval_unsigned", "approval_unsigned", "approver_not_allowed"]
    told = [r.value for r in reader.of("errors")] + [r.value["detail"] for r in reader.of("dlq")]
    assert "SECRET" not in orjson.dumps(told).decode()
    audits = {r.value["tool_call_id"]: r.value for r in reader.of("audit")}
    assert audits[_call("unsigned")]["approval"] == {"decision": "deny", "by": "bob",
                                                     "key": "bob-1"}
    assert audits[_call("later")]["approval"] == {"decision": "approve", "by": "alice",
                                                  "key": "alice-1"}
    assert "approval" not in audits[_call("bob")]


def _wait_for_marker(stack: Stack, version: int, timeout: float = 60) -> None:
    """Until every events partition holds a committed marker putting ``version`` in force."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from worker.runtime.governance.registry import POLICY_MARKER, marker_version

    deadline = time.monotonic() + timeout
    while True:
        consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "approvers-it",
                             "enable.partition.eof": True, "isolation.level": "read_committed"})
        last: dict[int, int | None] = {p: None for p in range(stack.partitions)}
        ends: set[int] = set()
        try:
            consumer.assign([TopicPartition(stack.topic("events"), p, 0)
                             for p in range(stack.partitions)])
            while len(ends) < stack.partitions and time.monotonic() < deadline:
                msg = consumer.poll(1)
                if msg is None:
                    continue
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        ends.add(msg.partition())
                    continue
                if msg.key() == POLICY_MARKER:
                    last[msg.partition()] = marker_version(msg.value() or b"")
        finally:
            consumer.close()
        if all(v == version for v in last.values()):
            return
        assert time.monotonic() < deadline, f"no marker for version {version}: {last}"
        time.sleep(0.5)
