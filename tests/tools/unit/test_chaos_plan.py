"""``latch chaos`` with an audit key: the plan's expected audit records carry the digest the
workers write (``audit.key_id``; governance/signing.py ``with_audit_key``), so that a chaos
run of workers configured with an audit key compares like with like, never an HMAC against a
record with the size only."""

from __future__ import annotations

from worker.core import Topic
from worker.runtime.config import load_config
from worker.tools.chaos.plan import build_plan


def test_the_plans_audit_records_carry_the_workers_keyed_digest() -> None:
    """With ``audit.keys``/``audit.key_id`` set (the key from the environment, as the
    workers read it), each expected audit record's ``arguments`` has ``hmac`` and ``key_id``;
    without, the size alone."""
    env = {"LATCH_AUDIT__KEY_ID": "audit-1", "LATCH_AUDIT__KEYS": '{"audit-1": "env:AUDIT_KEY"}'}
    keyed = load_config(None, env=env)
    audits = [e.value for r in build_plan(3, 12, keyed, env={"AUDIT_KEY": "k" * 40}).runs
              for e in r.expected if e.topic is Topic.AUDIT]
    assert audits and all(a["arguments"].get("key_id") == "audit-1" and "hmac" in a["arguments"]
                          for a in audits)
    plain = [e.value for r in build_plan(3, 12, load_config(None, env={})).runs
             for e in r.expected if e.topic is Topic.AUDIT]
    assert plain and all(set(a["arguments"]) == {"bytes"} for a in plain)
