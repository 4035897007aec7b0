"""The policy set version in force at any offset of an events partition (issue 32 item 6):
a rebuild starts with the version in force at its first record however many rollouts ago it
was (the run's head names it, :meth:`Heads.opened`), and a successor whose registry reader
lags never marks an older version than the one in force (:meth:`Driver.markers`).

Who writes what is read here: the policy markers and the run records are in the events log
(markers by the partition's owner; run records by the gateway), the heads by the worker that
owned the partition (the heads changelog), the policy texts by an operator (the registry)."""

from __future__ import annotations

from typing import Any

import driving
import orjson
from builders import chat_calls, chat_run, chat_tool
from registry_fakes import FakeRegistry

from worker.core import Assembler, Topic
from worker.runtime import step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.governance.registry import (
    POLICY_HISTORY,
    POLICY_MARKER,
    marker_value,
    marker_version,
    policy_head_key,
)
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads, PartitionState, pack_head, unpack_head

TOOLS = [chat_tool("get_weather", {"type": "object", "required": ["city"]})]


def _driver(table: dict[bytes, Any], latest: int | None = None, **env: str) -> Driver:
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                    "LATCH_POLICY__MODE": "enforce", **env})
    driver = Driver(config, EngineHooks(config), Heads(table, 3600))
    driver.registry = FakeRegistry(latest=latest)
    return driver


def _marker(version: int, offset: int) -> step.Record:
    return step.record(POLICY_MARKER, marker_value(version, 0), 1_000, "ev", 0, offset)


def _log(rollouts: int) -> list[step.Record]:
    """Marker v1, a run whose get_weather call waits for approval, then ``rollouts`` more
    markers (v2, v3, ...)."""
    records = [_marker(1, 0)]
    for envelope in chat_run("r1", TOOLS, chat_calls([("c1", "get_weather",
                                                       '{"city": "Oslo"}')])):
        records.append(step.record(b"r1", orjson.dumps(envelope), 1_000, "ev", 0,
                                   len(records)))
    for version in range(2, rollouts + 2):
        records.append(_marker(version, len(records)))
    return records


def test_a_rebuild_after_more_rollouts_than_the_policy_head_keeps_decides_nothing_again(
) -> None:
    """A call waits for approval; then 17 more policy versions are rolled out (more than the
    policy head's 16 markers). A takeover starts its rebuild at the run's start with the
    version in force there (v1, named by the run's head), not "no policy set": the rebuild
    re-emits exactly what live did (the pending call), no ``policy_denied`` error and no final
    message, and ends with the newest version in force."""
    table: dict[bytes, Any] = {}
    live = _driver(table, LATCH_APPROVALS__REQUIRE_APPROVAL="get_weather")
    state = PartitionState(Assembler(live.config.assemble), 0)
    records = _log(POLICY_HISTORY + 1)
    live_out = [e for r in records if (a := driving.apply(live, state, r)) is not None
                for e in a.emits if e.topic is not Topic.PROGRESS]
    assert [e.topic for e in live_out] == [Topic.PENDING]
    assert len(table[policy_head_key(0)]["policy"]) == POLICY_HISTORY  # v1 is forgotten there

    successor = _driver(dict(table), LATCH_APPROVALS__REQUIRE_APPROVAL="get_weather")
    takeover = successor.takeover(0, len(records))
    assert takeover.start == 1 and takeover.state.policy_version == 1
    for record in records[takeover.start:]:
        takeover.feed(record)
    assert [e.value for e in takeover.replayed] == [e.value for e in live_out]
    assert successor.rebuilt(takeover, "ev") == []
    assert takeover.state.policy_version == POLICY_HISTORY + 2


def test_an_open_runs_head_names_the_version_in_force_at_its_start_and_packs_small() -> None:
    """The head written when a run opens carries the version in force (``"pv"``); the tables
    keep it as a 3-tuple and read it back as the same dict; with no version in force the
    head is the 2-key one it always was."""
    table: dict[bytes, Any] = {}
    heads = Heads(table, 3600)
    heads.opened(b"r1", 0, 7, policy=4)
    heads.opened(b"r2", 0, 8)
    assert table[b"r1"] == {"p": 0, "start": 7, "pv": 4}
    assert table[b"r2"] == {"p": 0, "start": 8}
    assert pack_head(table[b"r1"]) == (0, 7, 4)
    assert unpack_head(pack_head(table[b"r1"])) == table[b"r1"]
    assert unpack_head(pack_head(table[b"r2"])) == table[b"r2"]


def test_a_head_without_a_version_falls_back_on_the_policy_head() -> None:
    """A head written before heads named their version (or one whose ``"pv"`` is not a
    version: not written by Latch) is ignored for the version; the policy head's markers
    decide, as before."""
    table: dict[bytes, Any] = {policy_head_key(0): {"p": 0, "policy": [[5, 1], [9, 2]]},
                               b"r1": {"p": 0, "start": 7, "pv": "x"}}
    assert _driver(table).takeover(0, 20).state.policy_version == 1


def test_a_successor_whose_registry_reader_lags_marks_no_older_version() -> None:
    """The heads say version 5 is in force; the successor's reader has read only up to 4
    (it lags): it writes no marker (before: a marker naming 4, which put the older version
    in force). Once its reader reads 6 it marks 6; a reader at 5 marks nothing."""
    table: dict[bytes, Any] = {policy_head_key(0): {"p": 0, "policy": [[3, 5]]}}
    lagging = _driver(table, latest=4)
    state = lagging.takeover(0, 10).state
    assert state.policy_version == 5
    assert lagging.markers(state, 0) is None
    assert _driver(table, latest=5).markers(_driver(table, 5).takeover(0, 10).state, 0) is None
    ahead = _driver(table, latest=6)
    marker = ahead.markers(ahead.takeover(0, 10).state, 0)
    assert marker is not None and marker_version(marker) == 6


def test_a_policy_head_with_entries_that_are_no_markers_is_read_without_a_crash() -> None:
    """A policy head whose history holds entries Latch never writes (a number, a triple, a
    string version, a version 0) is read past them (each skipped), not with an exception:
    the takeover starts with the version of the last well-formed marker before its start."""
    table: dict[bytes, Any] = {policy_head_key(0): {"p": 0, "policy": [
        [2, 1], 5, [3, 2, 9], [4, "3"], [5, 0], [30, 4]]}}
    assert _driver(table).takeover(0, 20).state.policy_version == 1
