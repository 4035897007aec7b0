"""The approver's request sees the tool as the call's own request does (issue 32 items 1 and
3): its one name (``shell``, ``computer``, ``local_shell``, the MCP tool's name), never the
core's internal key (``custom:shell``, ``computer_call:``), and its ``kind``. So a policy
"nobody approves shell" holds whatever type a run declared ``shell`` as."""

from __future__ import annotations

from typing import Any

import pytest
from builders import decision, dlq, feed, responses_head, responses_run, responses_tail, values
from test_identity import KINDS

from worker.core import Assembler, AssembleSettings, Topic
from worker.core.approvers import Approvers
from worker.core.settings import ApprovalSettings
from worker.runtime.governance.approvers import DecisionSigner
from worker.runtime.governance.policy import CedarPolicy

KEY = ("alice", b"a" * 32)


def held(kind: str, policy: str) -> tuple[Assembler, str, str]:
    """A Responses run whose one call of ``kind`` is held for approval (by its one name)."""
    declaration, events, name, _kind, call_id = KINDS[kind]
    a = Assembler(AssembleSettings(approvals=ApprovalSettings(require_approval=(name,))))
    a.policy = CedarPolicy(policy)
    a.approvals.approvers = Approvers({"alice-1": KEY})
    emits = feed(a, responses_run("r1", [declaration],
                                  [*responses_head(), *events, responses_tail()]))
    assert values(emits, Topic.PENDING), f"{kind}: not held"
    return a, name, call_id


def approve(a: Assembler, call_id: str) -> list[Any]:
    env = DecisionSigner("alice-1", *KEY).sign(decision("r1", "approve", call_id, by="alice"), 1)
    return feed(a, [env])


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_forbid_on_approving_the_name_holds_for_every_kind(kind: str) -> None:
    """``forbid`` approving ``Latch::Tool::"<name>"``: alice's signed approve does not count
    (``approver_not_allowed``) for a custom, computer, local shell or MCP-approval call."""
    name = KINDS[kind][2]
    a, _, call_id = held(kind, '@id("all") permit(principal, action, resource);\n'
                               f'@id("no") forbid(principal, action == Latch::Action::"approve",'
                               f' resource == Latch::Tool::"{name}");')
    emits = approve(a, call_id)
    assert [r["reason"] for r in dlq(emits)] == ["approver_not_allowed"]
    assert not values(emits, Topic.COMMITTED)


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_approver_policy_can_target_the_kind(kind: str) -> None:
    """``resource.kind`` is the call's kind in the approver's request too: a policy that lets
    alice approve only that kind commits the call."""
    tool_kind = KINDS[kind][3]
    a, name, call_id = held(kind, '@id("calls") permit(principal is Latch::Tenant, action, '
                                  'resource);\n'
                                  '@id("kind") permit(principal == Latch::Approver::"alice", '
                                  'action == Latch::Action::"approve", resource) '
                                  f'when {{ resource.kind == "{tool_kind}" }};')
    emits = approve(a, call_id)
    assert not dlq(emits), dlq(emits)
    assert [c["name"] for c in values(emits, Topic.COMMITTED)] == [name]
