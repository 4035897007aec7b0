"""Cedar policies (runtime/governance/policy.py) and the latch's policy step, without a broker:
the JSON -> Cedar mapping, forbid beats permit, deny by default, evaluation errors deny,
log_only commits and records a would-deny, parse errors with line and column (issue 25)."""

from __future__ import annotations

import orjson
import pytest
from builders import CHAT, PATH_SCHEMA, chat_calls, chat_run, tools_for

from worker.core import Assembler, AssembleSettings
from worker.core.policy import ENFORCE, LOG_ONLY, PolicyRequest
from worker.runtime.governance.policy import (
    CedarPolicy,
    PolicyFileError,
    cedar_schema,
    cedar_value,
    check,
)

POLICIES = """\
@id("srv-reads")
permit(principal == Latch::Tenant::"acme", action, resource == Latch::Tool::"read_file")
when { context.arguments has path && context.arguments.path like "/srv/*" };

@id("everything")
permit(principal == Latch::Tenant::"ops", action, resource);

@id("no-destructive")
forbid(principal, action, resource)
when { resource.annotations has destructiveHint && resource.annotations.destructiveHint };
"""


def request(tenant: str | None, arguments: object, tool: str = "read_file",
            attributes: dict[str, object] | None = None) -> PolicyRequest:
    return PolicyRequest(tenant, tool, attributes or {}, arguments, "openai.chat", "r1")


def test_the_mapping_of_json_to_cedar() -> None:
    """Floats become decimals when Cedar holds them exactly; null, out-of-range integers,
    floats with more than 4 decimals and Cedar's escape keys are left out."""
    assert cedar_value({"a": 1.5, "b": 1e-5, "c": None, "d": 2**64, "e": [1, None, "x"],
                        "f": 2.0, "__entity": {"type": "Latch::Tenant", "id": "ops"},
                        "g": True, "h": -(2**63)}) == {
        "a": {"__extn": {"fn": "decimal", "arg": "1.5"}}, "e": [1, "x"],
        "f": {"__extn": {"fn": "decimal", "arg": "2.0"}}, "g": True, "h": -(2**63)}


def test_an_argument_cannot_forge_an_entity() -> None:
    """An argument object spelled as Cedar's ``__entity`` escape stays data: a policy
    comparing it to an entity does not match."""
    policy = CedarPolicy('@id("p") permit(principal, action, resource) when '
                         '{ context.arguments has who && context.arguments.who == '
                         'Latch::Tenant::"ops" };')
    forged = {"who": {"__entity": {"type": "Latch::Tenant", "id": "ops"}}}
    assert not policy.decide(request("acme", forged)).allow


def test_permit_forbid_and_deny_by_default() -> None:
    """A permit allows and is named; a forbid beats a broad permit; a call no policy permits
    is denied with no determining policy; a run without a tenant is the anonymous
    principal, which no tenant's permit covers."""
    policy = CedarPolicy(POLICIES)
    allowed = policy.decide(request("acme", {"path": "/srv/a"}))
    assert allowed.allow and allowed.policies == ("srv-reads",)
    forbidden = policy.decide(request("ops", {}, "rm", {"annotations": {"destructiveHint": True}}))
    assert not forbidden.allow and forbidden.policies == ("no-destructive",)
    nothing = policy.decide(request("acme", {"path": "/etc/passwd"}))
    assert not nothing.allow and nothing.policies == () and nothing.errors == ()
    assert not policy.decide(request(None, {"path": "/srv/a"})).allow


def test_an_empty_policy_set_denies_everything() -> None:
    """Deny by default: no policy at all permits nothing."""
    assert not CedarPolicy("").decide(request("acme", {"path": "/srv/a"})).allow


def test_an_evaluation_error_denies_and_names_the_policy_only() -> None:
    """A forbid that errors (a missing attribute) would be skipped by Cedar; here the call is
    denied, and the error names the policy and the kind, never the value."""
    policy = CedarPolicy('@id("all") permit(principal, action, resource);\n'
                         '@id("big") forbid(principal, action, resource) '
                         'when { context.arguments.amount > 10 };')
    decision = policy.decide(request("acme", {"path": "/srv/SECRET"}))
    assert not decision.allow and decision.errors == ("big: missing_attribute",)
    assert "SECRET" not in repr(decision)


@pytest.mark.parametrize(("source", "line", "column"), [
    ("permit(principal, action, resource);\n\nforbid(principal,\n   action resource);", 4, 11),
    ('permit(principal, action, resource);\npermit(principal, action, resource) '
     'when { foo(1) };', 2, 44),
    ('permit(principal, action, resource) when { "abc };', 1, 44),
])
def test_a_parse_error_has_line_and_column(source: str, line: int, column: int) -> None:
    """A file Cedar cannot parse raises PolicyFileError at the offending token."""
    with pytest.raises(PolicyFileError) as caught:
        CedarPolicy(source, path="p.cedar")
    assert (caught.value.line, caught.value.column) == (line, column)
    assert str(caught.value).startswith(f"p.cedar:{line}:{column}: ")


def test_validation_against_the_generated_schema() -> None:
    """The worked policies validate against the schema generated from MCP tools; a policy
    reading an argument no tool has is reported at its line."""
    tools = [{"name": "read_file", "inputSchema": PATH_SCHEMA,
              "annotations": {"readOnlyHint": True}}]
    schema = cedar_schema(tools)
    assert check(POLICIES, "p.cedar", schema) == []
    bad = POLICIES + '\npermit(principal, action, resource) when { context.arguments.size > 1 };'
    [problem] = check(bad, "p.cedar", schema)
    assert problem.line == 12 and "arguments.size" in problem.message


def _run(policy: CedarPolicy | None) -> tuple[list[str], list[str], Assembler]:
    asm = Assembler(AssembleSettings())
    asm.policy = policy
    emits = []
    for env in chat_run("r1", tools_for(CHAT, {"read_file": PATH_SCHEMA}),
                        chat_calls([("c1", "read_file", '{"path": "/etc/SECRET"}')])):
        emits += asm.feed_record(None, orjson.dumps(env))
    committed = [e.value["call_id"] for e in emits if e.topic.value == "committed"]
    errors = [e.value["content"] for e in emits if e.topic.value == "errors"]
    return committed, errors, asm


def test_enforce_denies_and_log_only_commits() -> None:
    """The latch asks the assembler's policy: in enforce the call no policy permits fails
    policy_denied (no argument text); in log_only the same call commits."""
    committed, errors, _ = _run(CedarPolicy(POLICIES, ENFORCE))
    assert committed == [] and len(errors) == 1
    assert errors[0].startswith("policy_denied: no policy permits") and "SECRET" not in errors[0]
    committed, errors, _ = _run(CedarPolicy(POLICIES, LOG_ONLY))
    assert committed == ["c1"] and errors == []


def test_determining_policies_and_errors_come_in_file_order() -> None:
    """Cedar lists the determining policies in a hash set's order, which differs between
    processes (a replay, a worker that takes over); a decision lists them, and its errors, in
    the file's order, so the error result and the audit record are the same bytes."""
    names = [f"f{n}" for n in range(8)]
    source = "".join(f'@id("{n}") forbid(principal, action, resource);\n' for n in names)
    source += "".join(f'@id("e{n}") forbid(principal, action, resource) when '
                      "{ context.arguments.nope == 1 };\n" for n in range(4))
    decision = CedarPolicy(source).decide(request("acme", {}))
    assert not decision.allow and decision.policies == tuple(names)
    assert decision.errors == tuple(f"e{n}: missing_attribute" for n in range(4))
