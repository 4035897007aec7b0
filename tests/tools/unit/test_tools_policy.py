"""``latch policy check|test|schema`` (worker/tools/policy.py), with the registry given as a
RegistryState built in memory (no broker): tools and policy sets by reference
(``--toolset NAME@VERSION``, ``--policy-version N``) decide and validate as files do, and each
way of getting them wrong is a one-line error with exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from worker.runtime.governance import registry_io
from worker.runtime.governance.registry import POLICY, TOOLSET, RegistryState, encode
from worker.tools import policy as tool

PATH = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
MCP_TOOLS = [
    {"name": "read_file", "inputSchema": PATH, "annotations": {"readOnlyHint": True}},
    {"name": "delete_file", "inputSchema": PATH, "annotations": {"destructiveHint": True}},
]
ANTHROPIC_TOOLS = [{"name": "read_file", "description": "", "input_schema": PATH}]
POLICIES = """\
@id("srv-reads")
permit(principal == Latch::Tenant::"acme", action, resource == Latch::Tool::"read_file")
when { context.arguments has path && context.arguments.path like "/srv/*" };

@id("ops-all")
permit(principal == Latch::Tenant::"ops", action, resource);

@id("no-destructive")
forbid(principal, action, resource)
when { resource.annotations has destructiveHint && resource.annotations.destructiveHint };
"""
APPROVAL = """\
@id("ops-delete") @approval("required")
permit(principal == Latch::Tenant::"ops", action, resource == Latch::Tool::"delete_file");
"""
#: Reads an argument no tool of MCP_TOOLS has: does not validate against their schema.
UNKNOWN_ARGUMENT = 'permit(principal, action, resource)\nwhen { context.arguments.size > 1 };\n'


def _state(*versions: tuple[str, str, int, Any]) -> RegistryState:
    state = RegistryState()
    for offset, (kind, name, version, content) in enumerate(versions):
        key, value = encode(kind, name, version, content)
        state.apply(key, value, offset, 1_000 + offset)
    return state


REGISTRY = _state((TOOLSET, "files", 1, ANTHROPIC_TOOLS), (TOOLSET, "files", 2, MCP_TOOLS),
                  (POLICY, "", 1, POLICIES), (POLICY, "", 2, UNKNOWN_ARGUMENT),
                  (POLICY, "", 3, APPROVAL))


def _run(capsys: pytest.CaptureFixture[str], *argv: str,
         registry: RegistryState | None = REGISTRY) -> tuple[int, str, str]:
    code = tool.main(list(argv), registry=registry)
    out, err = capsys.readouterr()
    return code, out, err


def _file(tmp_path: Path, name: str, content: Any) -> str:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else orjson.dumps(content))
    return str(path)


def test_schema_of_a_toolset_is_the_schema_of_its_tools(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``schema --toolset files@2`` prints what ``schema --tools`` prints for the same tools;
    a toolset in Anthropic's format is read in that format without ``--provider``."""
    code, by_reference, _ = _run(capsys, "schema", "--toolset", "files@2")
    assert code == 0
    code, by_file, _ = _run(capsys, "schema", "--tools", _file(tmp_path, "t.json", MCP_TOOLS))
    assert code == 0 and by_reference == by_file
    code, out, _ = _run(capsys, "schema", "--toolset", "files@1")
    arguments = orjson.loads(out)["Latch"]["actions"]["call"]["appliesTo"]["context"][
        "attributes"]["arguments"]["attributes"]
    assert code == 0 and arguments == {"path": {"type": "String", "required": False}}


def test_check_a_registry_policy_set_against_a_toolset(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``check --policy-version 1 --toolset files@2`` validates; version 2 reads an argument
    the toolset does not have and is reported at its line, named by its registry place."""
    code, out, _ = _run(capsys, "check", "--policy-version", "1", "--toolset", "files@2")
    assert code == 0
    assert out.strip() == "registry:policy/1: ok against the schema of toolset files@2"
    code, out, _ = _run(capsys, "check", "--policy-version", "2", "--toolset", "files@2")
    assert code == 1
    assert out.startswith("registry:policy/2:1:1: ") and "arguments.size" in out


def test_check_a_file_against_a_toolset(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    """A policy file is validated against a toolset from the registry."""
    path = _file(tmp_path, "p.cedar", UNKNOWN_ARGUMENT)
    code, out, _ = _run(capsys, "check", path, "--toolset", "files@2")
    assert code == 1 and out.startswith(f"{path}:1:1: ")


def test_test_decides_with_a_toolset_and_a_policy_version(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``test`` takes the tool's MCP annotations from the toolset (the forbid on destructive
    tools beats ops' broad permit) and the policy set from the registry; a permit annotated
    ``@approval("required")`` says the call waits for a person."""
    args = _file(tmp_path, "a.json", {"path": "/srv/a"})
    common = ("--policy-version", "1", "--toolset", "files@2", "--arguments", args)
    code, out, _ = _run(capsys, "test", *common, "--tenant", "acme", "--tool", "read_file")
    assert code == 0 and "decision: allow (enforce)" in out and "srv-reads" in out
    code, out, _ = _run(capsys, "test", *common, "--tenant", "ops", "--tool", "delete_file")
    assert code == 1 and "decision: deny" in out and "no-destructive" in out
    code, out, _ = _run(capsys, "test", "--policy-version", "3", "--toolset", "files@2",
                        "--arguments", args, "--tenant", "ops", "--tool", "delete_file")
    assert code == 0 and "ops-delete" in out and "approval: required" in out


@pytest.mark.parametrize(("argv", "message"), [
    (("schema", "--toolset", "files"), "--toolset wants NAME@VERSION"),
    (("schema", "--toolset", "files@0"), "--toolset wants NAME@VERSION"),
    (("schema", "--toolset", "@2"), "--toolset wants NAME@VERSION"),
    (("schema", "--toolset", "files@v2"), "--toolset wants NAME@VERSION"),
    (("schema", "--toolset", "nope@1"), "holds no toolset 'nope'"),
    (("schema", "--toolset", "files@9"), "holds no toolset 'files' version 9 (its versions: 1, 2)"),
    (("check", "--policy-version", "7"), "holds no policy set version 7 (its versions: 1, 2, 3)"),
])
def test_bad_references_are_usage_errors(capsys: pytest.CaptureFixture[str],
                                         argv: tuple[str, ...], message: str) -> None:
    """A malformed NAME@VERSION, a toolset or a version the registry does not hold: exit 2,
    one line saying which."""
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == "" and message in err
    assert err.startswith("latch policy: ") and err.count("\n") == 1


def test_no_policy_set_in_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    """An empty registry names no versions at all."""
    code, _, err = _run(capsys, "check", "--policy-version", "1", registry=RegistryState())
    assert code == 2 and "holds no policy set version 1 (its versions: none)" in err


def test_an_unreadable_registry_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """When the registry topic cannot be read the command says so (exit 2), naming no more
    than the reader's own one-line error; files alone never read it."""
    def unreadable(config: Any) -> RegistryState:
        raise registry_io.RegistryError("cannot read topic t: Unknown topic")

    monkeypatch.setattr(registry_io, "read_whole", unreadable)
    code, _, err = _run(capsys, "schema", "--toolset", "files@1", registry=None)
    assert code == 2
    assert err == "latch policy: cannot read the registry: cannot read topic t: Unknown topic\n"


def test_files_alone_never_read_the_registry(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Without --toolset or --policy-version no configuration or registry is read."""
    def unread(config: Any) -> RegistryState:
        raise AssertionError("the registry was read")

    monkeypatch.setattr(registry_io, "read_whole", unread)
    code, out, _ = _run(capsys, "check", _file(tmp_path, "p.cedar", POLICIES), "--tools",
                        _file(tmp_path, "t.json", MCP_TOOLS), registry=None)
    assert code == 0 and "ok against the schema of" in out


@pytest.mark.parametrize("argv", [
    ("schema",),
    ("schema", "--tools", "t.json", "--toolset", "files@1"),
    ("check",),
    ("check", "p.cedar", "--policy-version", "1"),
    ("test", "--policy", "p.cedar", "--policy-version", "1", "--tool", "x", "--arguments", "a"),
])
def test_sources_are_one_or_the_other(argv: tuple[str, ...]) -> None:
    """Tools come from a file or a toolset, a policy set from a file or a version: both, or
    neither where one is required, is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        tool.main(list(argv), registry=REGISTRY)
    assert exited.value.code == 2
