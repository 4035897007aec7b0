"""``latch policy test`` decides what the worker decides (issue 32, item 1): the resource is
the tool's name as its committed record carries it, with the worker's attributes (``kind``,
the toolset's name, an MCP server's ``server_label``); a name two tools share is denied, as
the worker refuses its calls (``ambiguous_tool``). The same tools and policy are run through
the assembler beside the command, so the two cannot drift apart unseen.

Who sends what: the operator runs the command with the tools and policy the worker will have;
``--tool`` is the name the operator expects in the records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import RESPONSES, errors, feed, responses_head, responses_run, responses_tail

from worker.core import Assembler, AssembleSettings
from worker.core.policy import ENFORCE
from worker.runtime.governance.policy import CedarPolicy
from worker.runtime.governance.registry import TOOLSET, RegistryState, encode
from worker.tools import policy as tool

NO_SHELL = ('@id("all") permit(principal, action, resource);\n'
            '@id("no-shell") forbid(principal, action, resource == Latch::Tool::"shell");\n')
NO_CUSTOM = ('@id("all") permit(principal, action, resource);\n'
             '@id("no-custom") forbid(principal, action, resource) '
             'when { resource.kind == "custom" };\n')
CUSTOM_SHELL = [{"type": "custom", "name": "shell"}]
FUNCTION_SHELL = [{"type": "function", "name": "shell", "parameters": {}}]


def _file(tmp_path: Path, name: str, content: Any) -> str:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else orjson.dumps(content))
    return str(path)


def policy_test(capsys: pytest.CaptureFixture[str], tmp_path: Path, policy: str,
                tools: list[Any], *argv: str, registry: RegistryState | None = None
                ) -> tuple[int, str]:
    common = ["test", "--policy", _file(tmp_path, "p.cedar", policy), "--arguments",
              _file(tmp_path, "a.json", {}), "--provider", RESPONSES, *argv]
    if "--toolset" not in argv:
        common += ["--tools", _file(tmp_path, "tools.json", tools)]
    code = tool.main(common, registry=registry)
    return code, capsys.readouterr().out


def worker_decides(policy: str, tools: list[Any]) -> list[str]:
    """The reasons the worker's errors give for a custom call ``shell`` (empty: committed)."""
    item = {"type": "custom_tool_call", "id": "ctc_0", "call_id": "call_c", "name": "shell",
            "input": "ls"}
    events = [*responses_head(),
              {"type": "response.output_item.added", "output_index": 0, "item": item},
              {"type": "response.output_item.done", "output_index": 0, "item": item},
              responses_tail()]
    asm = Assembler(AssembleSettings())
    asm.policy = CedarPolicy(policy, ENFORCE)
    return [e["reason"] for e in errors(feed(asm, responses_run("r1", tools, events)))]


@pytest.mark.parametrize(("policy", "tools", "denied"), [
    (NO_SHELL, CUSTOM_SHELL, True), (NO_CUSTOM, CUSTOM_SHELL, True),
    (NO_CUSTOM, FUNCTION_SHELL, False)])
def test_a_custom_tool_is_decided_by_its_name_and_kind(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, policy: str, tools: list[Any],
        denied: bool) -> None:
    """A forbid on ``Latch::Tool::"shell"`` denies the custom tool ``shell``, as does one on
    ``resource.kind == "custom"``; the latter leaves a function ``shell`` allowed. The worker
    decides a custom call of the same tools the same way."""
    code, out = policy_test(capsys, tmp_path, policy, tools, "--tool", "shell")
    assert (code, out.splitlines()[0]) == (
        (1, "decision: deny (enforce)") if denied else (0, "decision: allow (enforce)"))
    if tools is CUSTOM_SHELL:
        assert worker_decides(policy, tools) == (["policy_denied"] if denied else [])


def test_a_name_two_tools_share_is_denied_as_the_worker_refuses_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A function and a custom tool both ``shell``: the command denies, naming
    ``ambiguous_tool``, even under a policy that permits everything; so does the worker."""
    tools = FUNCTION_SHELL + CUSTOM_SHELL
    allow_all = '@id("all") permit(principal, action, resource);\n'
    code, out = policy_test(capsys, tmp_path, allow_all, tools, "--tool", "shell")
    assert code == 1 and "ambiguous_tool" in out
    assert worker_decides(allow_all, tools) == ["ambiguous_tool"]


def test_an_mcp_servers_approval_request_has_its_server_label(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``--server-label gh`` decides an approval request of the Responses MCP server ``gh``
    as the worker does: kind ``mcp``, ``server_label`` ``gh``."""
    policy = ('@id("all") permit(principal, action, resource);\n'
              '@id("no-gh") forbid(principal, action, resource) when '
              '{ resource.kind == "mcp" && resource has server_label && '
              'resource.server_label == "gh" };\n')
    tools = [{"type": "mcp", "server_label": "gh"}]
    code, out = policy_test(capsys, tmp_path, policy, tools, "--tool", "delete_repo",
                            "--server-label", "gh")
    assert code == 1 and "no-gh" in out
    code, out = policy_test(capsys, tmp_path, policy, tools, "--tool", "delete_repo",
                            "--server-label", "other")
    assert code == 0


def test_a_toolsets_tool_has_the_toolsets_name(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A tool of ``--toolset files@1`` has ``toolset: "files"``, as the worker gives a run that
    names that toolset (``tools.tool_attributes``)."""
    state = RegistryState()
    key, value = encode(TOOLSET, "files", 1, CUSTOM_SHELL)
    state.apply(key, value, 0, 1_000)
    policy = ('@id("all") permit(principal, action, resource);\n'
              '@id("no-files") forbid(principal, action, resource) when '
              '{ resource has toolset && resource.toolset == "files" };\n')
    code, out = policy_test(capsys, tmp_path, policy, [], "--tool", "shell", "--toolset",
                            "files@1", registry=state)
    assert code == 1 and "no-files" in out
