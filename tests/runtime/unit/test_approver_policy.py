"""Approvers judged by Cedar (issue 32 item 3): principal ``Latch::Approver::"<id>"`` (a
member of its ``approvers.groups``), action ``approve``/``deny``/``edit``, resource the call's
tool, context the run's tenant and the call's arguments. "Only the on-call group may approve
deletes for tenant acme" is one policy. (The worker's keys and signer, read from the
``approvers`` section: test_governance_approvers.py.)"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import CHAT, PATH_SCHEMA, decision, dlq, errors, feed, provider_run, values

from worker.core import Assembler, AssembleSettings, Topic
from worker.core.approvers import ApproverRequest, Approvers
from worker.core.settings import ApprovalSettings
from worker.runtime.governance.policy import CedarPolicy

POLICIES = """\
@id("calls")
permit(principal is Latch::Tenant, action == Latch::Action::"call", resource);

@id("oncall-approves-acme-deletes")
permit(principal in Latch::ApproverGroup::"oncall", action == Latch::Action::"approve",
       resource == Latch::Tool::"delete_file")
when { context has tenant && context.tenant == "acme" };

@id("anyone-denies")
permit(principal is Latch::Approver, action == Latch::Action::"deny", resource);

@id("no-root")
forbid(principal, action == Latch::Action::"approve", resource)
when { context.arguments has path && context.arguments.path == "/" };
"""
KEYS = {"alice-1": ("alice", b"a" * 32), "bob-1": ("bob", b"b" * 32)}
GROUPS = {"alice": ("oncall",)}


def request(approver: str = "alice", action: str = "approve", tenant: str | None = "acme",
            tool: str = "delete_file", path: str = "/srv/x") -> ApproverRequest:
    return ApproverRequest(approver, GROUPS.get(approver, ()), action, tenant, tool, {},
                           {"path": path}, CHAT, "r1")


@pytest.mark.parametrize(("kw", "allowed"), [
    ({}, True),
    ({"approver": "bob"}, False),  # not on call
    ({"tenant": "globex"}, False),  # another tenant
    ({"tenant": None}, False),  # a run naming no tenant: context has no tenant
    ({"tool": "read_file"}, False),  # the policy names deletes only
    ({"action": "edit"}, False),  # approve only
    ({"approver": "bob", "action": "deny"}, True),
    ({"path": "/"}, False),  # a forbid on the arguments
])
def test_one_policy_says_who_may_approve(kw: dict[str, Any], allowed: bool) -> None:
    """The on-call group may approve acme's deletes; nobody else, for no other tenant, tool
    or action; anyone may deny; a forbid on the arguments wins."""
    decided = CedarPolicy(POLICIES).decide_approver(request(**kw))
    assert decided.allow is allowed, decided


def test_an_approver_id_cannot_smuggle_an_entity() -> None:
    """Ids are entity ids, never parsed as Cedar text: an approver named like a group,
    or with quotes, is just that approver (not on call)."""
    for who in ('oncall', 'Latch::ApproverGroup::"oncall"', 'x" || true || "'):
        assert not CedarPolicy(POLICIES).decide_approver(request(approver=who)).allow


def _held(policy: CedarPolicy) -> tuple[Assembler, list[Any]]:
    a = Assembler(AssembleSettings(approvals=ApprovalSettings(
        require_approval=("delete_file",))))
    a.policy, a.approvals.approvers = policy, Approvers(KEYS, GROUPS)
    emits = feed(a, provider_run(CHAT, "r1", {"delete_file": PATH_SCHEMA},
                                 [("c2", "delete_file", '{"path": "/srv/x"}')],
                                 tenant="acme"))
    return a, emits


def _signed(env: dict[str, Any], key_id: str) -> dict[str, Any]:
    from worker.runtime.governance.approvers import DecisionSigner

    owner, key = KEYS[key_id]
    return DecisionSigner(key_id, owner, key).sign(env, 1)


def test_a_signed_approve_by_an_approver_the_policy_forbids_does_not_count() -> None:
    """bob signs a valid approve, but the policy lets only the on-call group approve: one
    DLQ record ``approver_not_allowed`` naming no argument text, the call still held;
    alice's signed approve commits it."""
    a, _ = _held(CedarPolicy(POLICIES))
    refused = feed(a, [_signed(decision("r1", "approve", "c2", by="bob"), "bob-1")])
    (record,) = dlq(refused)
    assert record["reason"] == "approver_not_allowed" and "/srv/x" not in record["detail"]
    assert a.waiting_runs == 1 and not values(refused, Topic.COMMITTED)
    done = feed(a, [_signed(decision("r1", "approve", "c2", by="alice"), "alice-1")])
    assert [c["call_id"] for c in values(done, Topic.COMMITTED)] == ["c2"]
    (audit,) = values(done, Topic.AUDIT)
    assert audit["approval"] == {"decision": "approve", "by": "alice", "key": "alice-1"}


def test_an_approve_of_a_call_the_new_policy_forbids_is_denied() -> None:
    """The policy in force when the approve is applied no longer permits the call: it fails
    ``policy_denied`` and is never committed, though alice may approve."""
    a, _ = _held(CedarPolicy(POLICIES))
    a.policy = CedarPolicy(POLICIES.replace('@id("calls")', '@id("calls")\n'
                                            'forbid(principal, action == Latch::Action::"call",'
                                            ' resource == Latch::Tool::"delete_file");\n'
                                            '@id("calls-too")'))
    done = feed(a, [_signed(decision("r1", "approve", "c2", by="alice"), "alice-1")])
    assert not values(done, Topic.COMMITTED)
    assert [e["reason"] for e in errors(done)] == ["policy_denied"]


def test_the_forward_carries_the_signature_and_it_still_verifies() -> None:
    """The worker forwards a signed decision from the control topic into the events log with
    its ``signature`` unchanged (checked where it is applied, not here); the forwarded marker
    verifies against the approvers' keys, and a malformed signature is an
    ``invalid_envelope`` DLQ record at the forward, never a decision."""
    from worker.core.envelope import Source, decode
    from worker.runtime.control import route
    from worker.runtime.step import Record

    source = Source("llm.stream.control", 0, 9)
    env = _signed(decision("r1", "approve", "c2", by="alice"), "alice-1")
    key, value = route(Record(b"r1", orjson.dumps(env), None, source))  # type: ignore[misc]
    forwarded = decode(key, value)
    assert Approvers(KEYS, GROUPS).refusal(forwarded) is None  # type: ignore[arg-type]
    bad = {**env, "signature": {**env["signature"], "mac": "X" * 64}}
    refused = route(Record(b"r1", orjson.dumps(bad), None, source))
    assert refused.value["reason"] == "invalid_envelope"  # type: ignore[union-attr]
