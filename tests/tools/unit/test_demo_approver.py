"""``latch demo``'s approver (worker/tools/demo_approver.py, issue 32 item 3): a worker never
counts an unsigned decision, so the demo approves with a key made for its run, which its
worker lists, and the shipped ``examples/demo.cedar`` lets that approver decide.

Who sends what: the demo is the approver (its Publisher signs); the worker learns the key
from the environment the demo gives it; a decision without that key, sent by anyone else
who can write the control topic, does not count."""

from __future__ import annotations

import os
from typing import Any

import orjson

from worker.core import Assembler, Topic
from worker.runtime.config import load_config
from worker.runtime.governance.approvers import approvers, decision_signer
from worker.runtime.governance.policy_source import assembler_policy
from worker.tools import demo
from worker.tools.demo_approver import APPROVER, KEY_ID, KEY_VAR, approver_env


def test_each_demo_run_makes_its_own_key_beside_the_configured_approvers() -> None:
    """The variables name the demo's key id and owner beside the approvers already listed,
    sign with that key, and hold a new 64-hex-character key each run; nothing is written
    into this process's environment."""
    listed = load_config(None, env={"LATCH_APPROVERS__KEYS": "{ann-1: 'env:ANN_KEY'}",
                                    "LATCH_APPROVERS__OWNERS": "{ann-1: ann}"})
    env = approver_env(listed)
    config = load_config(None, env=env)
    assert dict(config.approvers.keys) == {"ann-1": "env:ANN_KEY", KEY_ID: f"env:{KEY_VAR}"}
    assert dict(config.approvers.owners) == {"ann-1": "ann", KEY_ID: APPROVER}
    assert config.approvers.key_id == KEY_ID
    assert len(env[KEY_VAR]) == 64 and int(env[KEY_VAR], 16) >= 0
    assert approver_env(listed)[KEY_VAR] != env[KEY_VAR]
    assert KEY_VAR not in os.environ


def _demo(env: dict[str, str], decide: Any) -> list[Any]:
    """The demo's envelopes through the core as its worker runs them (the shipped policy in
    enforce, the approvers of ``env``), then ``decide(pending value)``'s decision."""
    config = load_config(None, env=env)
    assembler = Assembler(config.assemble)
    assembler.policy = assembler_policy(config)
    assembler.approvals.approvers = approvers(config, env)
    emits = [e for line in demo.example_file().read_bytes().splitlines() if line.strip()
             for e in assembler.feed_record(None, line)]
    (pending,) = [e.value for e in emits if e.topic is Topic.PENDING]
    doc = {"v": 1, "run_id": pending["run_id"], "type": "approve",
           "tool_call_id": pending["call_id"], "by": APPROVER, "reason": "shown by the demo"}
    return assembler.feed_record(None, orjson.dumps(decide(config, doc)))


def test_the_demo_approvers_signed_approve_commits_the_held_call() -> None:
    """With the demo's policy and key, its signed approve of the one held call
    (``get_stock_price``) is allowed by ``demo.cedar`` and commits it; no DLQ record."""
    policy = {"LATCH_POLICY__MODE": "enforce", "LATCH_POLICY__FILE": str(demo.example_policy())}
    env = policy | approver_env(load_config(None, env=policy))
    emits = _demo(env, lambda config, doc: decision_signer(config, env).sign(doc, 1))
    assert [e.value["name"] for e in emits if e.topic is Topic.COMMITTED] == ["get_stock_price"]
    assert not [e for e in emits if e.topic is Topic.DLQ]


def test_an_unsigned_approve_does_not_count_in_the_demo() -> None:
    """The same approve without the signature (anyone who can write the control topic) is a
    DLQ record ``approval_unsigned`` and commits nothing."""
    policy = {"LATCH_POLICY__MODE": "enforce", "LATCH_POLICY__FILE": str(demo.example_policy())}
    env = policy | approver_env(load_config(None, env=policy))
    emits = _demo(env, lambda config, doc: doc)
    assert [e.value["reason"] for e in emits if e.topic is Topic.DLQ] == ["approval_unsigned"]
    assert not [e for e in emits if e.topic is Topic.COMMITTED]
