"""One tool identity everywhere (issue 32, item 1; worker/core/identity.py).

Whatever type a run declares a tool as, the policy's resource ``Latch::Tool::"<name>"``, the
approval lists, the committed, error and audit records and the runner see one name: the name
the committed record carries. The resource also has the tool's ``kind``. Two tools of one run
that would share a name (or a lookup key) are an ambiguity: their calls fail
``ambiguous_tool``, never a guess; the run's other tools are not touched.

Who sends what: the tools come from the run's ``run.start`` (the gateway, for its tenant) or
the operator's registry; a call's name and kind come from the model's stream. The tests below
send the same name from each side (a declaration of another type, a call of another kind) and
show that neither changes what the other name means.
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    PATH_SCHEMA,
    RESPONSES,
    apply_patch_call,
    committed,
    errors,
    feed,
    item_events,
    provider_calls,
    responses_head,
    responses_run,
    responses_tail,
    responses_tool,
    run_envelopes,
    shell_call,
    tools_for,
    values,
)

from worker.core import Assembler, AssembleSettings
from worker.core.model import Topic
from worker.core.policy import ENFORCE, PolicyDecision, PolicyRequest
from worker.core.settings import ApprovalSettings
from worker.runtime.governance.policy import CedarPolicy

# -- the four Responses items a client answers, each with its declaration ---------------------




def custom_events(index: int, call_id: str, name: str, text: str) -> list[dict[str, Any]]:
    """A ``custom_tool_call`` streamed as the Responses API does."""
    item = {"type": "custom_tool_call", "id": f"ctc_{index}", "call_id": call_id,
            "name": name, "input": ""}
    where = {"item_id": f"ctc_{index}", "output_index": index}
    return [{"type": "response.output_item.added", "output_index": index, "item": item},
            {"type": "response.custom_tool_call_input.delta", **where, "delta": text},
            {"type": "response.custom_tool_call_input.done", **where, "input": text},
            {"type": "response.output_item.done", "output_index": index,
             "item": {**item, "input": text, "status": "completed"}}]


COMPUTER = {"type": "computer_call", "id": "cu_1", "call_id": "call_cu",
            "action": {"type": "click", "button": "left", "x": 1, "y": 2},
            "pending_safety_checks": [], "status": "completed"}
SHELL = {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_sh",
         "action": {"type": "exec", "command": ["ls"], "env": {}}, "status": "completed"}
APPROVAL = {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "gh",
            "name": "delete_repo", "arguments": '{"repo": "x"}'}

#: (declaration, events, the name every reader sees, the resource's kind, the call id).
KINDS = {
    "custom": ({"type": "custom", "name": "shell"}, custom_events(0, "call_c", "shell", "ls -la"),
               "shell", "custom", "call_c"),
    "computer": ({"type": "computer_use_preview", "display_width": 8, "display_height": 8,
                  "environment": "browser"}, item_events(0, COMPUTER), "computer", "computer",
                 "call_cu"),
    "computer (GA)": ({"type": "computer"}, item_events(0, COMPUTER), "computer", "computer",
                      "call_cu"),
    "local_shell": ({"type": "local_shell"}, item_events(0, SHELL), "local_shell",
                    "local_shell", "call_sh"),
    "mcp approval": ({"type": "mcp", "server_label": "gh", "require_approval": "always"},
                     item_events(0, APPROVAL), "delete_repo", "mcp", "mcpr_1"),
    "shell": ({"type": "shell"}, item_events(0, shell_call("call_shc", ["ls"])), "shell",
              "shell", "call_shc"),
    "apply_patch": ({"type": "apply_patch"}, item_events(0, apply_patch_call(
        "call_ap", {"type": "delete_file", "path": "a.txt"})), "apply_patch", "apply_patch",
                    "call_ap"),
}


def responses(tools: list[Any], events: list[dict[str, Any]], policy: Any = None,
              settings: AssembleSettings | None = None) -> list[Any]:
    asm = Assembler(settings or AssembleSettings())
    asm.policy = policy
    return feed(asm, responses_run("r1", tools, [*responses_head(), *events, responses_tail()]))


class Spy:
    """A policy that allows every call and keeps each request it was asked."""

    mode = ENFORCE
    version = None

    def __init__(self) -> None:
        self.requests: list[PolicyRequest] = []

    def decide(self, request: PolicyRequest) -> PolicyDecision:
        self.requests.append(request)
        return PolicyDecision(ENFORCE, True, ("spy",))


def forbid(name: str) -> CedarPolicy:
    return CedarPolicy('@id("all") permit(principal, action, resource);\n'
                       f'@id("no-{name}") forbid(principal, action, '
                       f'resource == Latch::Tool::"{name}");', ENFORCE)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_forbid_on_the_name_denies_each_responses_kind(kind: str) -> None:
    """A ``forbid`` on ``Latch::Tool::"<name>"``, the name the committed record would carry,
    denies the call whatever type the run declared the tool as; its error and audit record
    carry that name."""
    tool, events, name, _, call_id = KINDS[kind]
    emits = responses([tool], events, forbid(name))
    assert committed(emits) == []
    [error] = errors(emits)
    assert (error["name"], error["tool_call_id"], error["reason"]) == (
        name, call_id, "policy_denied")
    assert error["content"] == f"policy_denied: forbidden by policy no-{name}"
    [audit] = values(emits, Topic.AUDIT)
    assert (audit["name"], audit["policy"]["policies"]) == (name, [f"no-{name}"])


@pytest.mark.parametrize("kind", list(KINDS))
def test_require_approval_by_name_holds_each_responses_kind(kind: str) -> None:
    """``approvals.require_approval: [<name>]`` holds the call under the name its pending
    and committed records carry."""
    tool, events, name, _, call_id = KINDS[kind]
    settings = AssembleSettings(approvals=ApprovalSettings(require_approval=(name,)))
    emits = responses([tool], events, settings=settings)
    assert committed(emits) == [] and errors(emits) == []
    [pending] = values(emits, Topic.PENDING)
    assert (pending["name"], pending["call_id"], pending["approval"]["required_by"]) == (
        name, call_id, ["require_approval"])


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_policy_sees_the_committed_name_and_the_tool_kind(kind: str) -> None:
    """The request's tool is the committed record's ``name``, its attributes the tool's
    ``kind`` (and, for an MCP server's approval request, its ``server_label``)."""
    tool, events, name, tool_kind, _ = KINDS[kind]
    spy = Spy()
    emits = responses([tool], events, spy)
    [call] = committed(emits)
    [request] = spy.requests
    assert request.tool == call["name"] == name
    assert request.attributes["kind"] == tool_kind
    assert request.attributes.get("server_label") == (
        "gh" if tool_kind == "mcp" else None)


@pytest.mark.parametrize("provider", [CHAT, ANTHROPIC, RESPONSES, BEDROCK, GEMINI])
def test_function_tools_of_every_provider_are_kind_function(provider: str) -> None:
    """A function tool in each provider's own format is asked about by its name, kind
    ``function``."""
    spy = Spy()
    asm = Assembler(AssembleSettings())
    asm.policy = spy
    calls = provider_calls(provider, [("c1", "read_file", '{"path": "/srv/a"}')])
    emits = feed(asm, run_envelopes("r1", provider, tools_for(
        provider, {"read_file": PATH_SCHEMA}), calls))
    assert [c["name"] for c in committed(emits)] == ["read_file"]
    assert [(r.tool, r.attributes["kind"]) for r in spy.requests] == [("read_file", "function")]


def test_anthropic_client_tools_and_mcp_entries_have_their_kind() -> None:
    """Anthropic's dated client tools have their type without the date as kind (``bash``,
    ``text_editor``); an MCP ``tools/list`` entry is kind ``mcp``, beside its hints."""
    from builders import anthropic_calls

    tools = [{"type": "bash_20250124", "name": "bash"},
             {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
             {"name": "lookup", "inputSchema": {"type": "object"},
              "annotations": {"readOnlyHint": True}}]
    spy = Spy()
    asm = Assembler(AssembleSettings())
    asm.policy = spy
    feed(asm, run_envelopes("r1", ANTHROPIC, tools, anthropic_calls([
        ("c1", "bash", '{"command": "ls"}'), ("c2", "str_replace_based_edit_tool", "{}"),
        ("c3", "lookup", "{}")])))
    assert [(r.tool, r.attributes["kind"]) for r in spy.requests] == [
        ("bash", "bash"), ("str_replace_based_edit_tool", "text_editor"), ("lookup", "mcp")]
    assert spy.requests[2].attributes["annotations"] == {"readOnlyHint": True}


def test_a_policy_can_target_a_kind() -> None:
    """``resource.kind`` lets a policy forbid every custom tool; the run's function tool,
    decided by the same policy set, commits."""
    policy = CedarPolicy('@id("all") permit(principal, action, resource);\n'
                         '@id("no-custom") forbid(principal, action, resource) '
                         'when { resource.kind == "custom" };', ENFORCE)
    events = [*custom_events(0, "call_c", "shell", "ls"),
              *responses_fn(1, "call_f", "read_file", '{"path": "/srv/a"}')]
    emits = responses([{"type": "custom", "name": "shell"},
                       responses_tool("read_file", PATH_SCHEMA)], events, policy)
    assert [c["name"] for c in committed(emits)] == ["read_file"]
    assert [(e["name"], e["content"]) for e in errors(emits)] == [
        ("shell", "policy_denied: forbidden by policy no-custom")]


def responses_fn(index: int, call_id: str, name: str, text: str) -> list[dict[str, Any]]:
    item = {"type": "function_call", "id": f"fc_{index}", "call_id": call_id, "name": name,
            "arguments": ""}
    return [{"type": "response.output_item.added", "output_index": index, "item": item},
            {"type": "response.function_call_arguments.delta", "output_index": index,
             "item_id": f"fc_{index}", "delta": text},
            {"type": "response.output_item.done", "output_index": index,
             "item": {**item, "arguments": text, "status": "completed"}}]


# -- two tools of one run that would share a name -------------------------------------------


def test_a_function_and_a_custom_tool_of_one_name_are_refused() -> None:
    """A run declaring ``shell`` as a function and as a custom tool: neither call guesses
    which was meant, both fail ``ambiguous_tool``; the run's other tool commits."""
    tools = [responses_tool("shell", {"type": "object"}), {"type": "custom", "name": "shell"},
             responses_tool("read_file", PATH_SCHEMA)]
    events = [*custom_events(0, "call_c", "shell", "ls"),
              *responses_fn(1, "call_f", "shell", "{}"),
              *responses_fn(2, "call_r", "read_file", '{"path": "/srv/a"}')]
    emits = responses(tools, events)
    assert [c["call_id"] for c in committed(emits)] == ["call_r"]
    assert [(e["tool_call_id"], e["name"], e["reason"]) for e in errors(emits)] == [
        ("call_c", "shell", "ambiguous_tool"), ("call_f", "shell", "ambiguous_tool")]


@pytest.mark.parametrize("provider", [CHAT, ANTHROPIC, RESPONSES, BEDROCK, GEMINI])
def test_two_declarations_of_one_function_name_are_refused(provider: str) -> None:
    """Two function tools of one name (any provider's format, or one of them an MCP entry):
    the first one is not taken on trust; its calls fail ``ambiguous_tool``."""
    for second in (tools_for(provider, {"dup": {"type": "array"}}),
                   [{"name": "dup", "inputSchema": {"type": "object"}}]):
        tools = tools_for(provider, {"dup": {"type": "object"}}) + second
        calls = provider_calls(provider, [("c1", "dup", "{}")])
        emits = feed(Assembler(AssembleSettings()), run_envelopes("r1", provider, tools, calls))
        assert committed(emits) == []
        assert [e["reason"] for e in errors(emits)] == ["ambiguous_tool"]


def test_a_declared_name_an_mcp_approval_request_also_uses_is_refused() -> None:
    """An MCP server's approval request whose tool name is also a declared function's: the
    request fails ``ambiguous_tool`` (a runner acting on the name could run the function);
    the function's own call still commits."""
    tools = [{"type": "mcp", "server_label": "gh"}, responses_tool("delete_repo", {})]
    events = [*item_events(0, APPROVAL), *responses_fn(1, "call_f", "delete_repo", "{}")]
    emits = responses(tools, events)
    assert [c["call_id"] for c in committed(emits)] == ["call_f"]
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("mcpr_1", "ambiguous_tool")]


def test_a_function_named_like_a_custom_key_is_refused() -> None:
    """A function tool named ``custom:shell`` (OpenAI refuses the name; a run.start may still
    send it) beside a custom tool ``shell``: both would be found under one key, so neither is."""
    tools = [responses_tool("custom:shell", {}), {"type": "custom", "name": "shell"}]
    emits = responses(tools, [*custom_events(0, "call_c", "shell", "ls"),
                              *responses_fn(1, "call_f", "custom:shell", "{}")])
    assert committed(emits) == []
    assert [e["reason"] for e in errors(emits)] == ["ambiguous_tool", "ambiguous_tool"]


def test_a_call_of_another_kind_never_finds_a_tool() -> None:
    """The name alone does not find a tool: a function call named ``shell`` in a run that
    declared only a custom ``shell`` fails ``unknown_tool``, and the reverse."""
    fn = responses_fn(0, "call_f", "shell", "{}")
    assert [e["reason"] for e in errors(responses([{"type": "custom", "name": "shell"}], fn))
            ] == ["unknown_tool"]
    custom = custom_events(0, "call_c", "shell", "ls")
    assert [e["reason"] for e in errors(responses([responses_tool("shell", {})], custom))
            ] == ["unknown_tool"]


def test_a_key_never_finds_a_tool_declared_as_another_kind() -> None:
    """A call finds a tool only when the tool was declared as the call's kind: a function
    call named ``custom:shell`` does not find the custom tool ``shell`` registered under that
    key, and a custom call ``shell`` does not find an MCP entry (or a function) named
    ``custom:shell``; each fails ``unknown_tool``."""
    fn = responses_fn(0, "call_f", "custom:shell", "{}")
    assert [e["reason"] for e in errors(responses([{"type": "custom", "name": "shell"}], fn))
            ] == ["unknown_tool"]
    custom = custom_events(0, "call_c", "shell", "ls")
    for declared in ({"name": "custom:shell", "inputSchema": {}},
                     responses_tool("custom:shell", {})):
        emits = responses([declared], custom)
        assert committed(emits) == [] and [e["reason"] for e in errors(emits)] == [
            "unknown_tool"]


def test_every_responses_client_tool_type_has_its_identity() -> None:
    """Each Responses tool type that ``tools.client_tools`` registers has its row in
    ``identity``: a name that is no key, and a kind that is not ``function``."""
    from worker.core.identity import identity
    from worker.core.tools import RESPONSES_CLIENT_TOOLS, client_tools

    for kind in RESPONSES_CLIENT_TOOLS:
        [key] = client_tools(RESPONSES, [{"type": kind}])
        found = identity(RESPONSES, key, {"type": kind})
        assert found.name != key and found.kind not in ("function", kind + "_call")


def test_a_declaration_cannot_choose_its_own_kind_or_server() -> None:
    """The kind comes from the declaration's type, never from a member it adds: an MCP entry
    with a top-level ``kind`` and a ``kind`` annotation is kind ``mcp`` with no such
    annotation, and a custom tool with a ``server_label`` has none."""
    spy = Spy()
    tools = [{"name": "lookup", "inputSchema": {}, "kind": "function",
              "server_label": "gh", "annotations": {"kind": "function", "readOnlyHint": True}},
             {"type": "custom", "name": "shell", "kind": "function", "server_label": "gh"}]
    events = [*responses_fn(0, "call_l", "lookup", "{}"),
              *custom_events(1, "call_c", "shell", "ls")]
    emits = responses(tools, events, spy)
    assert [c["name"] for c in committed(emits)] == ["lookup", "shell"]
    assert [r.attributes for r in spy.requests] == [
        {"annotations": {"readOnlyHint": True}, "kind": "mcp"}, {"kind": "custom"}]
