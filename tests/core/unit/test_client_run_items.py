"""Responses items a client runs (issue 33, item 3): ``shell_call`` and ``apply_patch_call``.

Each gets exactly one outcome: committed (``kind`` ``shell_call`` / ``apply_patch_call``, the
name ``shell`` / ``apply_patch``, the item's ``action`` / ``operation`` as its arguments, its
``call_id``) when the run declared the tool (``{"type": "shell"}`` without a container
``environment``, ``{"type": "apply_patch"}``), else failed ``unknown_tool``. A ``shell_call``
that ran in a container at OpenAI (its ``environment`` a ``container_reference``) is a hosted
item, as ``web_search_call`` is: no outcome. The policy and the approvals see the one name and
the kind (tests/core/unit/test_identity.py's ``KINDS`` rows).
"""

from __future__ import annotations

from typing import Any

from builders import (
    apply_patch_call,
    checked_run,
    committed,
    errors,
    finals,
    item_events,
    responses_head,
    responses_run,
    responses_tail,
    responses_tool,
    shell_call,
    values,
)

from worker.core import Topic
from worker.core.settings import ApprovalSettings

SHELL = shell_call("call_sh", ["ls -la", "cat README.md"])
PATCH = apply_patch_call("call_ap", {"type": "update_file", "path": "src/a.py",
                                     "diff": "@@\n-print('a')\n+print('b')\n"})
CLIENT = [{"type": "shell"}, {"type": "apply_patch"}]
CONTAINER = {"type": "container_reference", "container_id": "cntr_1"}


def run(tools: list[Any], events: list[dict[str, Any]], **settings: Any) -> list[Any]:
    return checked_run(responses_run("r1", tools, [*responses_head(), *events,
                                                   responses_tail()]), **settings)


def test_shell_and_apply_patch_calls_commit_with_their_kind() -> None:
    """Both items, their tools declared: committed with ``kind``, the one name, the
    ``call_id``, and as arguments only ``{"action"}`` / ``{"operation"}`` (not ``environment``,
    ``created_by``); the final message keeps the items as OpenAI sent them."""
    emits = run(CLIENT, [*item_events(0, SHELL), *item_events(1, PATCH)])
    assert [(c["kind"], c["name"], c["call_id"], c["arguments"]) for c in committed(emits)] == [
        ("shell_call", "shell", "call_sh", {"action": SHELL["action"]}),
        ("apply_patch_call", "apply_patch", "call_ap", {"operation": PATCH["operation"]})]
    [final] = finals(emits)
    assert final["message"]["output"] == [SHELL, PATCH]
    assert [(o["kind"], o["tool_call_id"]) for o in final["outcomes"]] == [
        ("shell_call", "call_sh"), ("apply_patch_call", "call_ap")]


def test_a_local_environment_is_the_clients() -> None:
    """A shell declared and called with ``environment: {"type": "local"}`` is the client's."""
    item = shell_call("call_sh", ["pwd"], environment={"type": "local"})
    emits = run([{"type": "shell", "environment": {"type": "local"}}], item_events(0, item))
    assert [c["call_id"] for c in committed(emits)] == ["call_sh"]


def test_without_their_tools_they_fail_unknown_tool() -> None:
    """A run that declared neither (a function named ``shell``, a hosted shell in a container,
    a ``local_shell``): each item fails ``unknown_tool``, once, with its kind; nothing
    commits, and no error quotes the commands or the diff."""
    tools = [responses_tool("shell", {}), responses_tool("apply_patch", {}),
             {"type": "shell", "environment": {"type": "container_auto"}},
             {"type": "local_shell"}]
    emits = run(tools, [*item_events(0, SHELL), *item_events(1, PATCH)])
    assert committed(emits) == []
    assert [(e["kind"], e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("shell_call", "call_sh", "unknown_tool"), ("apply_patch_call", "call_ap",
                                                    "unknown_tool")]
    assert not any("README" in e["content"] or "print" in e["content"] for e in errors(emits))


def test_held_for_approval_by_the_name() -> None:
    """``require_approval: [shell]`` holds the shell call (its pending record has its
    arguments); the patch call, not listed, commits."""
    emits = run(CLIENT, [*item_events(0, SHELL), *item_events(1, PATCH)],
                approvals=ApprovalSettings(require_approval=("shell",)))
    [pending] = values(emits, Topic.PENDING)
    assert (pending["kind"], pending["name"], pending["arguments"]) == (
        "shell_call", "shell", {"action": SHELL["action"]})
    assert [c["call_id"] for c in committed(emits)] == ["call_ap"]


def test_hosted_items_have_no_outcome() -> None:
    """A shell that ran in a container at OpenAI (``shell_call`` with a
    ``container_reference`` environment, then OpenAI's ``shell_call_output``), a
    ``web_search_call``: kept in the final message, no call, no outcome, even in a run that
    declared a client shell."""
    hosted = shell_call("call_h", ["ls"], environment=CONTAINER)
    output = {"type": "shell_call_output", "id": "sho_1", "call_id": "call_h",
              "output": [{"stdout": "a\n", "stderr": "", "outcome": {"type": "exit",
                                                                     "exit_code": 0}}],
              "status": "completed"}
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed",
              "action": {"type": "search", "query": "x"}}
    events = [*item_events(0, hosted),
              {"type": "response.shell_call_command.added", "output_index": 0,
               "command_index": 0, "command": "ls"},
              *item_events(1, output), *item_events(2, search)]
    emits = run([{"type": "shell"}], events)
    assert committed(emits) == [] and errors(emits) == []
    [final] = finals(emits)
    assert final["outcomes"] == []
    assert final["message"]["output"] == [hosted, output, search]


def test_shell_command_events_are_not_its_text() -> None:
    """``response.shell_call_command.*`` events between added and done do not change the
    committed action: the finished item's is the call's text."""
    events = [item_events(0, SHELL)[0],
              {"type": "response.shell_call_command.added", "output_index": 0,
               "command_index": 0, "command": "rm"},
              {"type": "response.shell_call_command.delta", "output_index": 0,
               "command_index": 0, "delta": " -rf /"},
              item_events(0, SHELL)[1]]
    [call] = committed(run(CLIENT, events))
    assert call["arguments"] == {"action": SHELL["action"]}


def test_an_item_that_changes_environment_breaks_the_protocol() -> None:
    """Added as the client's shell, done as a container's: a protocol break; the call opened
    at ``added`` still gets its one outcome (an error), nothing commits."""
    hosted = shell_call("call_sh", ["ls"], environment=CONTAINER)
    emits = run(CLIENT, [item_events(0, SHELL)[0], item_events(0, hosted)[1]])
    assert committed(emits) == []
    assert [e["tool_call_id"] for e in errors(emits)] == ["call_sh"]


def test_the_completed_response_listing_the_items_agrees() -> None:
    """``response.completed``'s ``output`` lists the items as streamed (as OpenAI sends it):
    it is checked against them, agrees, and both commit; one that changes a command is a
    protocol break, and the call still has its one outcome."""
    hosted = shell_call("call_h", ["ls"], item_id="sh_h", environment=CONTAINER)
    events = [*responses_head(), *item_events(0, SHELL), *item_events(1, PATCH),
              *item_events(2, hosted)]
    emits = checked_run(responses_run("r1", CLIENT, [
        *events, responses_tail(output=[SHELL, PATCH, hosted])]))
    assert [c["call_id"] for c in committed(emits)] == ["call_sh", "call_ap"]
    changed = {**SHELL, "action": {**SHELL["action"], "commands": ["rm -rf /"]}}
    emits = checked_run(responses_run("r1", CLIENT, [
        *events, responses_tail(output=[changed, PATCH, hosted])]))
    assert committed(emits) == []
    assert sorted((e["tool_call_id"], e["reason"]) for e in errors(emits)) == [
        ("call_ap", "protocol_error"), ("call_sh", "protocol_error")]
