"""Scope pruning of Cedar policy sets (governance/policy_scope.py): for every policy file
we ship and one written to exercise every scope form, the decision of the policies a request's
scope may match equals the decision of the whole set (allow, determining policies, errors),
and the subsets are smaller than the whole (issue 25's cost per decision)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from worker.core.policy import PolicyRequest
from worker.runtime.governance.policy import CedarPolicy

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = [ROOT / "bench" / "policies20.cedar", ROOT / "examples" / "demo.cedar",
           ROOT / "worker" / "tools" / "chaos" / "chaos.cedar"]

#: Every scope form Cedar has, and conditions that fail with an evaluation error.
FORMS = """\
@id("eq") permit(principal == Latch::Tenant::"acme", action == Latch::Action::"call",
                 resource == Latch::Tool::"read_file");
@id("is") permit(principal is Latch::Tenant, action, resource == Latch::Tool::"pay")
  when { context.arguments.amount < 500 };
@id("is-in") forbid(principal is Latch::Tenant in Latch::Tenant::"acme", action, resource);
@id("in") permit(principal in Latch::Tenant::"ops", action, resource);
@id("anon") forbid(principal is Latch::Anonymous, action, resource is Latch::Tool);
@id("actions") permit(principal, action in [Latch::Action::"call", Latch::Action::"read"],
                      resource == Latch::Tool::"write_file");
@id("other-action") permit(principal, action == Latch::Action::"read", resource);
@id("resource-in") forbid(principal, action, resource in Latch::Tool::"run_shell")
  when { context.arguments.cmd like "rm *" };
@id("errors") forbid(principal == Latch::Tenant::"t2", action, resource)
  when { context.arguments.missing == 1 };
permit(principal, action, resource) when { context.provider == "gemini" };
"""

TENANTS = [None, "acme", "ops", "t1", "t2", "t3", "t4", "chaos", "nobody", ""]
TOOLS = ["read_file", "write_file", "pay", "refund", "run_shell", "glob_search",
         "get_weather", "writeItems", "unknown_tool"]
ARGUMENTS = [{}, {"path": "/srv/a", "content": "x"}, {"path": "/tmp/out-1.md", "content": "y"},
             {"path": "/etc/passwd"}, {"amount": 20}, {"amount": 20000}, {"cmd": "rm -rf /"},
             {"pattern": "/srv/*.py"}, {"currency": "EUR"}, {"path": "/denied/x"}]
ATTRIBUTES = [{}, {"annotations": {"readOnlyHint": True}},
              {"annotations": {"destructiveHint": True}, "toolset": "files"}]


def requests() -> list[PolicyRequest]:
    return [PolicyRequest(tenant, tool, attributes, arguments, provider, run_id)
            for tenant, tool, attributes, arguments, (provider, run_id) in itertools.product(
                TENANTS, TOOLS, ATTRIBUTES, ARGUMENTS,
                [("openai.chat", "r1"), ("gemini", "blocked-1")])]


def same_decisions(policy: CedarPolicy) -> int:
    """Compare every request's pruned decision with the whole set's; return how many allow."""
    allowed = 0
    for request in requests():
        policy.scoped.pruned = True
        pruned = policy.decide(request)
        policy.scoped.pruned = False
        whole = policy.decide(request)
        assert pruned == whole, request
        allowed += pruned.allow
    policy.scoped.pruned = True
    return allowed


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_policy_file_decides_alike_pruned_and_whole(path: Path) -> None:
    """Every request over tenants, tools, annotations, arguments and providers gets the same
    decision from its subset as from the whole file, and both answers occur."""
    allowed = same_decisions(CedarPolicy(path.read_text(), path=str(path)))
    assert 0 < allowed < len(requests())  # both answers occur: the comparison means something


def test_every_scope_form_decides_alike_pruned_and_whole() -> None:
    """``==``, ``is``, ``is ... in``, ``in``, action lists, another action, an unscoped
    policy and conditions that fail: pruned and whole decide alike, and the subsets are the
    ones the scope rules give."""
    policy = CedarPolicy(FORMS)
    assert 0 < same_decisions(policy) < len(requests())
    ids = policy.scoped.ids
    # == prunes, is prunes by type, in and slots keep, another action never applies
    names = {policy.name(i) for i in ids(("Latch::Tenant", "t1"), ("Latch::Tool", "pay"))}
    assert names == {"is", "is-in", "in", "resource-in", "policy9"}
    names = {policy.name(i) for i in ids(("Latch::Anonymous", "anonymous"),
                                         ("Latch::Tool", "write_file"))}
    assert names == {"in", "anon", "actions", "resource-in", "policy9"}


def test_the_bench_set_evaluates_a_fraction_of_its_policies() -> None:
    """bench/policies20.cedar's backlog calls (tenant t1, write_file) meet 9 of 20 policies."""
    policy = CedarPolicy(SHIPPED[0].read_text())
    ids = policy.scoped.ids(("Latch::Tenant", "t1"), ("Latch::Tool", "write_file"))
    assert len(policy.statements) == 20
    assert {policy.name(i) for i in ids} == {
        "srv-or-tmp-writes", "read-only-tools", "no-destructive", "no-etc", "no-dotdot",
        "no-ssh-keys", "no-secrets-in-content", "no-run-prefix"}


def test_a_wrong_subset_is_caught() -> None:
    """The comparison can fail: a subset that drops a policy whose scope matches (here the
    forbid ``no-destructive``) changes a decision."""
    policy = CedarPolicy(SHIPPED[0].read_text())
    keep = policy.scoped.ids
    policy.scoped.ids = lambda p, r: frozenset(  # type: ignore[method-assign]
        i for i in keep(p, r) if policy.name(i) != "no-destructive")
    with pytest.raises(AssertionError):
        same_decisions(policy)


def test_subsets_are_shared_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tenants no policy names share one subset; past MAX_SUBSETS the whole set is used."""
    from worker.runtime.governance import policy_scope

    policy = CedarPolicy(SHIPPED[0].read_text())
    scoped = policy.scoped
    first = scoped.policies(("Latch::Tenant", "x1"), ("Latch::Tool", "write_file"))
    assert scoped.policies(("Latch::Tenant", "x2"), ("Latch::Tool", "write_file")) is first
    monkeypatch.setattr(policy_scope, "MAX_SUBSETS", 1)
    assert scoped.policies(("Latch::Tenant", "t1"), ("Latch::Tool", "read_file")) \
        is scoped.whole
