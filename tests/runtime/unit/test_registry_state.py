"""The registry (governance/registry.py, issue 25 item 3): versions are immutable (the
record read first wins, a later different one is a conflict), the toolset wait rule, a run
naming a toolset in the core, and the policy markers in the driver, live and in a rebuild."""

from __future__ import annotations

from typing import Any

import driving
import orjson
import pytest
from builders import chat_calls, chat_run, chat_tool
from registry_fakes import FakeRegistry

from worker.core import Assembler, Topic
from worker.core.envelope import RunStart, decode
from worker.core.policy import Policy
from worker.runtime import step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.governance import registry
from worker.runtime.governance.registry import (
    POLICY_MARKER,
    TOOLSET,
    Invalid,
    RegistryState,
    marker_value,
    policy_head_key,
)
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads, PartitionState

TOOLS = [chat_tool("get_weather", {"type": "object", "required": ["city"]})]
OTHER = [chat_tool("get_time", {"type": "object"})]


def _put(state: RegistryState, offset: int, time_ms: int, kind: str = TOOLSET,
         name: str = "weather", version: int = 1, content: Any = None) -> None:
    key, value = registry.encode(kind, name, version, TOOLS if content is None else content)
    state.apply(key, value, offset, time_ms)


def test_the_first_record_of_a_version_wins_and_a_different_later_one_is_a_conflict() -> None:
    """Per (kind, name, version) the record read first (lowest offset) is in force; a later
    record with other content is kept aside as a conflict; the same content again is not."""
    state = RegistryState()
    _put(state, 0, 100)
    _put(state, 1, 200, content=OTHER)
    _put(state, 2, 300)
    assert state.get(TOOLSET, "weather", 1).content == TOOLS  # type: ignore[union-attr]
    assert [(c.offset, c.content) for c in state.conflicts] == [(1, OTHER)]
    assert state.toolset("weather", 1, 100, 0) == TOOLS


def test_a_record_whose_key_does_not_match_its_content_is_invalid_and_ignored() -> None:
    """The key carries the content's digest: a record whose key lies about it (or that is
    not a registry record) is reported and changes nothing."""
    state = RegistryState()
    _, value = registry.encode(TOOLSET, "weather", 1, TOOLS)
    state.apply(b"toolset/weather/1/000000000000", value, 0, 1)
    state.apply(b"x", b"not json", 1, 2)
    assert state.entries == {} and [o for o, _ in state.invalid] == [0, 1]
    assert state.next_offset == 2 and state.read_ms == 2


def test_the_wait_rule_counts_a_version_appended_within_wait_of_the_run_start() -> None:
    """A version counts for a run.start at record time T iff its record's append time is at
    most T + wait; the answer is final (settled) once the version or a record appended after
    T + wait (a fence tombstone) is read, and not before."""
    state = RegistryState()
    assert not state.settled("weather", 1, 1_000, 500)
    state.apply(registry.FENCE, None, 0, 1_400)  # a fence: the clock moves, nothing else
    assert not state.settled("weather", 1, 1_000, 500)
    _put(state, 1, 1_500)
    assert state.settled("weather", 1, 1_000, 500)
    assert state.toolset("weather", 1, 1_000, 500) == TOOLS  # appended at T + wait: counts
    assert state.toolset("weather", 1, 999, 500) is None  # appended after T + wait
    assert state.settled("weather", 2, 900, 500)  # read past 1400: version 2 never came
    assert state.toolset("weather", 2, 900, 500) is None


def test_put_checks_the_tools_through_the_run_start_parsers_and_the_cedar_parser() -> None:
    """``check_toolset`` says which provider formats read the tools and refuses tools that
    no format reads, or with a schema the worker cannot use; ``check_policy`` refuses Cedar
    text that does not parse, with the parser's message."""
    assert registry.check_toolset("weather", TOOLS) == ["openai.chat"]
    with pytest.raises(Invalid, match="no entry"):
        registry.check_toolset("weather", [{"nothing": 1}])
    with pytest.raises(Invalid, match="not usable"):
        registry.check_toolset("weather", [chat_tool("t", {"type": "no-such-type"})])
    with pytest.raises(Invalid, match="name"):
        registry.check_toolset("a/b", TOOLS)
    pytest.importorskip("cedarpy")
    registry.check_policy("permit(principal, action, resource);")
    with pytest.raises(Invalid, match="does not parse"):
        registry.check_policy("permit(principal, action, resource) whn { true };")


def test_run_start_may_name_a_toolset_by_reference() -> None:
    """``tools: {"toolset", "version"}`` decodes to a reference; any other object is
    ``invalid_envelope``."""
    start = {"v": 1, "run_id": "r", "seq": 0, "type": "run.start", "provider": "openai.chat",
             "tools": {"toolset": "weather", "version": 3}}
    envelope = decode(b"r", orjson.dumps(start))
    assert isinstance(envelope, RunStart) and envelope.toolset == ("weather", 3)
    for bad in ({"toolset": "weather"}, {"toolset": "", "version": 1},
                {"toolset": "w", "version": 0}, {"toolset": "w", "version": 1, "x": 1}):
        rejected = decode(b"r", orjson.dumps(start | {"tools": bad}))
        assert not isinstance(rejected, RunStart)


def _by_reference(run_id: str, version: int = 1) -> list[dict[str, Any]]:
    envelopes = chat_run(run_id, [], chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))
    envelopes[0]["tools"] = {"toolset": "weather", "version": version}
    return envelopes


def _feed(assembler: Assembler, envelopes: list[dict[str, Any]], time_ms: int) -> list[Any]:
    emits = []
    for n, envelope in enumerate(envelopes):
        emits += assembler.feed_record(envelope["run_id"].encode(), orjson.dumps(envelope),
                                       time_ms + n)
    return emits


def test_the_core_takes_a_referenced_toolsets_tools_from_its_lookup() -> None:
    """A run naming a toolset gets its tools from ``Assembler.toolsets`` at its run.start's
    record time: a known version commits the call; an unknown one (or no lookup at all)
    fails every call ``unknown_toolset``, one error result per call id."""
    state = RegistryState()
    _put(state, 0, 1_000)
    assembler = Assembler()
    assembler.toolsets = lambda name, version, at: state.toolset(name, version, at, 0)
    emits = _feed(assembler, _by_reference("r1"), 1_000)
    assert [e.topic for e in emits if e.topic is not Topic.FINAL] == [Topic.COMMITTED, Topic.AUDIT]
    for lookup in (assembler.toolsets, None):
        assembler.toolsets = lookup
        emits = _feed(assembler, _by_reference(f"r2{lookup is None}", version=2), 1_000)
        errors = [e.value for e in emits if e.topic is Topic.ERRORS]
        assert [(e["tool_call_id"], e["reason"]) for e in errors] == [("c1", "unknown_toolset")]


def test_a_policy_sees_the_toolset_a_tool_came_from() -> None:
    """A tool of a run that named a registry toolset has the attribute ``toolset`` (its name,
    docs/policies.md, *Policies*): a permit conditioned on it commits that run's call, while the
    same call with its tools inline (no ``toolset``) is denied, with no evaluation error."""
    from worker.runtime.governance.policy import CedarPolicy

    state = RegistryState()
    _put(state, 0, 1_000)
    assembler = Assembler()
    assembler.toolsets = lambda name, version, at: state.toolset(name, version, at, 0)
    assembler.policy = CedarPolicy('@id("weather-only")\npermit(principal, action, resource) '
                                   'when { resource has toolset && '
                                   'resource.toolset == "weather" };')
    emits = _feed(assembler, _by_reference("r1"), 1_000)
    assert [e.topic for e in emits if e.topic is not Topic.FINAL] == [Topic.COMMITTED, Topic.AUDIT]
    inline = chat_run("r2", TOOLS, chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))
    errors = [e.value for e in _feed(assembler, inline, 1_000) if e.topic is Topic.ERRORS]
    assert [e["reason"] for e in errors] == ["policy_denied"]
    audit = next(e.value for e in emits if e.topic is Topic.AUDIT)
    assert audit["policy"]["allow"] and audit["policy"]["policies"] == ["weather-only"]


def _driver(table: dict[bytes, Any]) -> Driver:
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                    "LATCH_POLICY__MODE": "log_only"})  # no file: the registry
    driver = Driver(config, EngineHooks(config), Heads(table, 3600))
    driver.registry = FakeRegistry(latest=2)
    return driver


def _marker(version: int, offset: int) -> step.Record:
    return step.record(POLICY_MARKER, marker_value(version, 0), 1_000, "ev", 0, offset)


def test_a_policy_marker_puts_its_version_in_force_and_records_it_in_the_heads() -> None:
    """Applying a marker sets the assembler's policy from the registry's version and records
    [offset, version] in the partition's policy head; a repeat (a successor's second marker)
    changes nothing; the driver asks for a marker only while the latest version is not in
    force and not yet marked."""
    table: dict[bytes, Any] = {}
    driver = _driver(table)
    state = PartitionState(Assembler(), 0)
    assert driver.markers(state, 0) is not None and driver.markers(state, 0) is None
    assert driving.apply(driver, state, _marker(1, 5)) is None
    policy: Policy | None = state.assembler.policy
    assert policy is not None and policy.version == 1
    driving.apply(driver, state, _marker(2, 9))
    driving.apply(driver, state, _marker(2, 12))
    assert table[policy_head_key(0)] == {"p": 0, "policy": [[5, 1], [9, 2]]}
    assert state.assembler.policy is not None and state.assembler.policy.version == 2


def test_a_rebuild_starts_with_the_version_in_force_at_its_first_record() -> None:
    """A takeover's state starts with the policy version of the latest marker before the
    first record it replays (not the newest), and the markers in the replayed range change
    it at the same position as live; markers never go to the core."""
    table: dict[bytes, Any] = {policy_head_key(0): {"p": 0, "policy": [[5, 1], [9, 2]]},
                               b"r1": {"p": 0, "start": 7}}
    driver = _driver(table)
    takeover = driver.takeover(0, 20)
    assert takeover.start == 7 and takeover.state.policy_version == 1
    takeover.feed(_marker(2, 9))
    assert takeover.state.policy_version == 2
    assert takeover.replayed == []
    none_open = _driver({policy_head_key(0): {"p": 0, "policy": [[5, 1], [9, 2]]}})
    assert none_open.takeover(0, 20).state.policy_version == 2


def test_the_replay_of_a_partition_decides_the_same_across_a_policy_change() -> None:
    """Live and a rebuild that replays the same records (markers included) end with the same
    policy version and emit the same outputs for the runs after the marker."""
    records = [_marker(1, 0)]
    for n, envelope in enumerate(chat_run("r1", TOOLS, chat_calls(
            [("c1", "get_weather", '{"city": "Oslo"}')]))):
        records.append(step.record(b"r1", orjson.dumps(envelope), 1_000, "ev", 0, n + 1))
    records.insert(3, _marker(2, 3))
    live_state = PartitionState(Assembler(), 0)
    live = _driver({})
    live_out = [a.emits for r in records if (a := driving.apply(live, live_state, r)) is not None]
    rebuild = _driver({b"r1": {"p": 0, "start": 1}}).takeover(0, 100)
    for r in records:
        rebuild.feed(r)
    assert rebuild.state.policy_version == live_state.policy_version == 2
    assert [e.value for e in rebuild.replayed] == [e.value for out in live_out for e in out
                                                   if e.topic is not Topic.PROGRESS]


def test_latch_assemble_without_a_registry_fails_a_referenced_run_saying_why(
        tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``latch assemble`` reads no registry unless given ``--registry``: a run naming a
    toolset fails every call ``unknown_toolset`` with a message that says no registry is
    read and how to read one (before: the registry "holds no toolset", which was not so)."""
    from worker import cli

    monkeypatch.chdir(tmp_path)  # (no latch.yaml here)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in _by_reference("r1")))
    assert cli.main(["assemble", str(path)]) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    errors = [line["value"] for line in lines if line["topic"] == "errors"]
    assert [(e["tool_call_id"], e["reason"]) for e in errors] == [("c1", "unknown_toolset")]
    assert "no registry is read here" in errors[0]["content"]
    assert "latch assemble --registry" in errors[0]["content"]


def test_put_bounds_an_mcp_tools_output_schema_and_keeps_its_annotations() -> None:
    """An MCP tools/list entry registers in every format with its ``outputSchema`` and
    ``annotations`` kept as given (the operator's word); an output schema is held to the input
    schemas' bounds (not a schema, or over ``max_tool_schema_bytes``: refused, naming the tool),
    and annotations that are not an object are refused."""
    entry = {"name": "weather", "description": "d", "inputSchema": {"type": "object"},
             "outputSchema": {"type": "object", "required": ["celsius"]},
             "annotations": {"readOnlyHint": True}}
    assert len(registry.check_toolset("w", [entry])) == 5
    key, value = registry.encode(TOOLSET, "w", 1, [entry])
    assert registry.decode(key, value)[3] == [entry]
    with pytest.raises(Invalid, match="'weather': its outputSchema is not usable"):
        registry.check_toolset("w", [entry | {"outputSchema": {"type": "no-such-type"}}])
    huge = {"type": "object", "description": "x" * 140_000}
    with pytest.raises(Invalid, match=r"outputSchema is not usable \(more than"):
        registry.check_toolset("w", [entry | {"outputSchema": huge}])
    with pytest.raises(Invalid, match="annotations are not an object"):
        registry.check_toolset("w", [entry | {"annotations": ["readOnlyHint"]}])
