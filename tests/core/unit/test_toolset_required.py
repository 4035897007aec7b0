"""Who said what (issue 32, item 11): an operator can require registered toolsets of a tenant.

The authors of what a run's calls are decided by:

* ``tenant``: the gateway writes it in the ``run.start`` (the events topic is the gateway's
  alone: ACLs, docs/operations.md); Latch takes it as the gateway's word.
* inline ``tools`` of a ``run.start``, and the MCP annotations in them (``destructiveHint``
  ...): the tenant's own claim, passed on by the gateway. A tenant that leaves
  ``destructiveHint`` out escapes ``approvals.destructive`` and any Cedar forbid on it.
* a registered toolset (``{"toolset", "version"}``): the operator's (``latch registry put``).

With ``require_toolsets_for`` (``registry.require_toolsets_for``) listing a tenant (or ``*``),
that tenant's runs get tools only from the registry: a ``run.start`` with inline tools gets
none, and every call fails ``toolset_required``. These tests send the same calls from each
author and show that only the operator's annotations decide holds and forbids.
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import (
    CHAT,
    PATH_SCHEMA,
    PROVIDERS,
    chat_calls,
    chat_run,
    check_outputs,
    check_schemas,
    feed,
    provider_run,
    reasons,
    tools_for,
    values,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.policy import ENFORCE, PolicyDecision, PolicyRequest
from worker.core.settings import ApprovalSettings

ARGS = '{"path": "/srv/a"}'
#: The tenant's inline MCP tools: ``rm`` claimed harmless (no destructiveHint).
CLAIMED = [{"name": "rm", "inputSchema": PATH_SCHEMA, "annotations": {"readOnlyHint": True}}]
#: The operator's registered toolset: ``rm`` is destructive.
REGISTERED = [{"name": "rm", "inputSchema": PATH_SCHEMA,
               "annotations": {"destructiveHint": True}}]
TOOLSET = {"toolset": "files", "version": 1}


def assembler(required: tuple[str, ...], **settings: Any) -> Assembler:
    a = Assembler(AssembleSettings(require_toolsets_for=required, **settings))
    a.toolsets = lambda name, version, at: REGISTERED if (name, version) == ("files", 1) else None
    return a


def rm_run(tools: Any, tenant: str | None = "acme", run_id: str = "r1") -> list[dict[str, Any]]:
    return chat_run(run_id, tools, chat_calls([("c1", "rm", ARGS), ("c2", "rm", ARGS)]),
                    tenant=tenant)


def run(a: Assembler, envelopes: list[dict[str, Any]]) -> list[Emit]:
    emits = feed(a, envelopes)
    check_outputs(emits)
    check_schemas(emits)
    return emits


def test_inline_tools_are_refused_for_a_listed_tenant() -> None:
    """A listed tenant's run.start with inline tools: every call fails ``toolset_required``
    (one error result per call id, audited), the run completes, nothing commits."""
    emits = run(assembler(("acme",)), rm_run(CLAIMED))
    assert reasons(emits) == ["toolset_required", "toolset_required"]
    assert not values(emits, Topic.COMMITTED)
    [error, _] = values(emits, Topic.ERRORS)
    assert error["content"].startswith("toolset_required: ")
    assert "registry.require_toolsets_for" in error["content"]
    assert [a["reason"] for a in values(emits, Topic.AUDIT)] == ["toolset_required"] * 2
    assert values(emits, Topic.FINAL)[0]["status"] == "completed"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_provider_refuses_inline_tools_of_a_listed_tenant(provider: str) -> None:
    """The refusal is the provider-neutral core's: each provider's call fails the same way,
    and the same run of another tenant commits."""
    envs = provider_run(provider, "r1", {"read_file": PATH_SCHEMA},
                        [("call_1", "read_file", ARGS)], tenant="acme")
    assert reasons(run(assembler(("acme",)), envs)) == ["toolset_required"]
    other = provider_run(provider, "r2", {"read_file": PATH_SCHEMA},
                         [("call_1", "read_file", ARGS)], tenant="globex")
    assert len(values(run(assembler(("acme",)), other), Topic.COMMITTED)) == 1


def test_other_tenants_keep_their_inline_tools() -> None:
    """A tenant not listed (and a run without a tenant) still registers tools inline."""
    for tenant in ("globex", None):
        emits = run(assembler(("acme",)), rm_run(CLAIMED, tenant))
        assert len(values(emits, Topic.COMMITTED)) == 2, tenant


def test_a_star_requires_toolsets_of_every_run() -> None:
    """``*`` lists every tenant, and runs that name none: no run may bring its own tools."""
    for tenant in ("acme", "globex", None):
        assert reasons(run(assembler(("*",)), rm_run(CLAIMED, tenant))) == [
            "toolset_required"] * 2, tenant


def test_a_listed_tenant_naming_a_registered_toolset_gets_its_tools() -> None:
    """The listed tenant's run that names a registered toolset gets the operator's tools; a
    version the registry does not hold still fails ``unknown_toolset``."""
    emits = run(assembler(("acme",)), rm_run(TOOLSET))
    assert len(values(emits, Topic.COMMITTED)) == 2
    missing = run(assembler(("acme",)), rm_run({"toolset": "files", "version": 9}))
    assert reasons(missing) == ["unknown_toolset"] * 2


def test_registered_annotations_decide_holds() -> None:
    """With ``approvals.destructive``, the operator's ``destructiveHint`` holds the calls of a
    listed tenant's run (pending, ``required_by: destructive``); the tenant cannot claim it
    away inline: its inline tools are refused instead of committing unheld. Without the
    requirement, the tenant's claim would commit them (what this closes)."""
    destructive = ApprovalSettings(destructive=True)
    held = run(assembler(("acme",), approvals=destructive), rm_run(TOOLSET))
    assert [p["approval"]["required_by"] for p in values(held, Topic.PENDING)] == [
        ["destructive"], ["destructive"]]
    refused = run(assembler(("acme",), approvals=destructive), rm_run(CLAIMED))
    assert reasons(refused) == ["toolset_required"] * 2
    assert not values(refused, Topic.PENDING)
    claimed = run(assembler((), approvals=destructive), rm_run(CLAIMED))
    assert len(values(claimed, Topic.COMMITTED)) == 2  # the tenant's word, unrequired


class ForbidsDestructive:
    """A policy in ``enforce`` that forbids a tool annotated ``destructiveHint``, as the
    docs/policies.md's ``no-destructive`` Cedar policy does (and permits anything else)."""

    mode, version = ENFORCE, None

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def decide(self, request: PolicyRequest) -> PolicyDecision:
        self.seen.append(request.attributes)
        destructive = request.attributes.get("annotations", {}).get("destructiveHint") is True
        return PolicyDecision(ENFORCE, not destructive,
                              ("no-destructive",) if destructive else ("permit-all",))


def test_registered_annotations_decide_forbids() -> None:
    """The policy sees the operator's annotations (and the toolset's name) for a listed
    tenant's run, and forbids; the tenant's inline claim never reaches the policy."""
    policy = ForbidsDestructive()
    a = assembler(("acme",))
    a.policy = policy
    denied = run(a, rm_run(TOOLSET))
    assert reasons(denied) == ["policy_denied"] * 2
    assert policy.seen[0]["annotations"] == {"destructiveHint": True}
    policy.seen.clear()
    assert reasons(run(a, rm_run(CLAIMED, run_id="r2"))) == ["toolset_required"] * 2
    assert policy.seen == []


def test_the_tenant_field_decides_and_comes_from_the_gateway() -> None:
    """The requirement follows the run.start's ``tenant`` as the gateway wrote it: the same
    inline tools under another tenant's name pass. So the gateway must set ``tenant`` from
    its own authentication, never from the caller's request (docs/policies.md, "Who said what"); the
    events topic must be writable by the gateway alone."""
    a = assembler(("acme",))
    assert reasons(run(a, rm_run(CLAIMED, "acme", "r1"))) == ["toolset_required"] * 2
    assert len(values(run(a, rm_run(CLAIMED, "globex", "r2")), Topic.COMMITTED)) == 2


def test_inline_tools_of_a_listed_tenant_cost_nothing() -> None:
    """The refused inline tools are not kept: the run holds no schema bytes for them."""
    schemas = {f"t{n}": {"type": "object", "description": "x" * 1000} for n in range(20)}
    a = assembler(("acme",))
    feed(a, [chat_run("r1", tools_for(CHAT, schemas), [], tenant="acme", end=False)[0]])
    assert a.is_open("r1") and a.buffered_bytes == 0
