"""Runs held for a registry toolset version (worker/runtime/hold.py, issue 32 item 5): the
driver parks the held run's records and applies the other runs' as they come; once the
registry's answer is final the parked records are applied, in order; past the partition's
bounds the largest held run fails ``unknown_toolset``; a takeover parks a held run's records
again; a ``run.start`` from anyone naming a missing version for a run that exists holds
nothing."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from builders import chat_calls, chat_run, chat_tool
from driving import Applied

from worker.core import Topic
from worker.runtime import step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver, tick_value
from worker.runtime.hold import Holds, toolset_of
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import TICK, Heads, PartitionState
from worker.runtime.step import Record

TOOLS = [chat_tool("get_weather", {"type": "object"})]


class Registry:
    """A registry view whose toolset ``files`` 1 is unread until :meth:`put`; its lookup
    fails if asked before the answer is final (a real one would block the engine's loop)."""

    def __init__(self) -> None:
        self.known = False
        self.lookups: list[tuple[str, int, int]] = []

    def put(self) -> None:
        self.known = True

    def toolsets(self, name: str, version: int, at_ms: int) -> Any:
        assert self.known, "the lookup would block the engine's loop"
        self.lookups.append((name, version, at_ms))
        return TOOLS

    def unsettled(self, value: bytes, at_ms: int | None) -> tuple[str, int, int] | None:
        named = toolset_of(value)
        if named is None or at_ms is None or self.known:
            return None
        return (*named, at_ms)

    def ready(self, name: str, version: int, at_ms: int) -> bool:
        return self.known

    def policy_text(self, version: int) -> str | None:
        return None

    def latest_policy(self) -> int | None:
        return None


def _driver(table: dict[bytes, Any], **env: str) -> tuple[Driver, Registry]:
    # (the result latch off: a run's done head at its final message)
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                    "LATCH_RESULTS__ENABLED": "false", **env})
    driver = Driver(config, EngineHooks(config), Heads(table, 3600))
    registry = Registry()
    driver.registry = registry
    return driver, registry


def _run(run_id: str, by_reference: bool, calls: int = 1, end: bool = True
         ) -> list[dict[str, Any]]:
    envelopes = chat_run(run_id, TOOLS, chat_calls(
        [(f"{run_id}_c{n}", "get_weather", '{"city": "Oslo"}') for n in range(calls)]),
        end=end)
    if by_reference:
        envelopes[0]["tools"] = {"toolset": "files", "version": 1}
    return envelopes


def _records(envelopes: Iterable[dict[str, Any]], first: int = 0) -> list[Record]:
    return [step.record(e["run_id"].encode() if "run_id" in e else TICK, orjson.dumps(e),
                        1_000 + n, "ev", 0, first + n) for n, e in enumerate(envelopes)]


def _tick(offset: int) -> Record:
    return step.record(TICK, tick_value(2_000 + offset), 2_000 + offset, "ev", 0, offset)


def _apply(driver: Driver, state: PartitionState, records: list[Record]
           ) -> Iterator[tuple[Record, Applied | None]]:
    """The kafka engine's use of ``apply_all``: the batch's outputs, as one result (its
    heads written by the driver into the table)."""
    work = driver.apply_all({0: state}, records)
    yield records[-1], Applied([out.emit for out in work.out], [], False)


def _calls(results: Iterable[tuple[Record, Applied | None]]) -> list[tuple[str, str]]:
    """(call id, topic) of each committed call and error result, in order."""
    return [(str(e.value.get("call_id") or e.value.get("tool_call_id")), e.topic.value)
            for _, applied in results if applied is not None for e in applied.emits
            if e.topic in (Topic.COMMITTED, Topic.ERRORS)]


def _interleave(held: list[dict[str, Any]], others: list[list[dict[str, Any]]]
                ) -> list[dict[str, Any]]:
    out, rest = held[:1], held[1:]
    for run in others:
        out += run
        if rest:
            out.append(rest.pop(0))
    return out + rest


def test_a_held_run_is_parked_while_the_others_go_on_then_applied_in_order() -> None:
    """A run.start naming toolset ``files`` 1, unread, then two other runs in the same
    partition with the held run's records among theirs: the others' calls commit as their
    records come, the held run's lookup is never asked (before, the driver asked it at once:
    the engine's loop waited) and its head says it is held; every offset moves on. Once the
    version is read, the next record (a tick) first applies the held run's records, in
    order: its two calls commit, its run finishes and its head is ``done``."""
    table: dict[bytes, Any] = {}
    driver, registry = _driver(table)
    state = driver.takeover(0, 0).state
    envelopes = _interleave(_run("held", True, calls=2), [_run("a", False), _run("b", False)])
    records = _records(envelopes)
    results = list(_apply(driver, state, records))
    assert _calls(results) == [("a_c0", "committed"), ("b_c0", "committed")]
    assert registry.lookups == [] and table[b"held"] == {"p": 0, "start": 0, "hold": "wait"}
    assert state.next_offset == len(records) and len(state.holds.runs[b"held"].records) == len(
        _run("held", True, calls=2))
    registry.put()
    later = list(_apply(driver, state, [_tick(len(records))]))
    assert _calls(later) == [("held_c0", "committed"), ("held_c1", "committed")]
    assert [r.key for r, _ in later][-1] == TICK  # the held records came before the tick
    assert registry.lookups == [("files", 1, 1_000)] and state.holds.runs == {}
    assert table[b"held"]["done"] and state.holds.records == state.holds.bytes == 0
    assert state.next_offset == len(records) + 1


def test_a_held_run_past_the_bounds_fails_unknown_toolset_and_its_head_says_so() -> None:
    """``registry.hold_max_records`` 3: the held run's fourth record ends its hold: its call
    fails ``unknown_toolset`` (the lookup is not asked: it would have waited), other held
    runs stay held, and while it is open its head says ``"hold": "refused"``, so that a
    takeover decides the same (its rebuild answers "unknown" although the version came since).
    """
    table: dict[bytes, Any] = {}
    driver, registry = _driver(table, LATCH_REGISTRY__HOLD_MAX_RECORDS="3")
    state = driver.takeover(0, 0).state
    quiet = _run("quiet", True, end=False)[:1]
    records = _records(quiet + _run("flood", True, calls=1))
    first = list(_apply(driver, state, records[:4]))  # the fourth passes the bound
    assert _calls(first) == [] and registry.lookups == [] and list(state.holds.runs) == [
        b"quiet"]
    assert table[b"flood"] == {"p": 0, "start": 1, "hold": "refused"}
    rest = list(_apply(driver, state, records[4:]))
    errors = [e for _, a in rest if a is not None for e in a.emits if e.topic is Topic.ERRORS]
    assert [(e.value["tool_call_id"], e.value["reason"]) for e in errors] == [
        ("flood_c0", "unknown_toolset")]
    # a takeover at offset 4, after the version came: the refused run is still refused (its
    # rebuild does not ask the registry), the quiet one still held
    registry.put()
    table[b"flood"] = {"p": 0, "start": 1, "hold": "refused"}  # (its head at offset 4)
    takeover = driver.takeover(0, 4)
    for record in records[:4]:
        takeover.feed(record)
    assert driver.rebuilt(takeover, "ev") == []
    rebuilt = takeover.state
    assert list(rebuilt.holds.runs) == [b"quiet"] and registry.lookups == []
    again = list(_apply(driver, rebuilt, records[4:]))
    assert [(e.value["tool_call_id"], e.value["reason"]) for _, a in again if a is not None
            for e in a.emits if e.topic is Topic.ERRORS] == [("flood_c0", "unknown_toolset")]


def test_a_takeover_parks_a_held_runs_records_again_and_publishes_them_once() -> None:
    """The previous owner committed offsets past a held run's records, its head
    ``"hold": "wait"``: the rebuild parks the run's records (their outputs were never made)
    rather than applying and discarding them; once the version is read the new owner
    applies them and publishes the run's call, once."""
    envelopes = _run("held", True, calls=1)
    records = _records(envelopes)
    table: dict[bytes, Any] = {b"held": {"p": 0, "start": 0, "hold": "wait"}}
    driver, registry = _driver(table)
    takeover = driver.takeover(0, resume=len(records))
    assert takeover.start == 0
    for record in records:
        takeover.feed(record)
    assert driver.rebuilt(takeover, "ev") == [] and registry.lookups == []
    state = takeover.state
    assert len(state.holds.runs[b"held"].records) == len(records)
    assert state.holds.runs[b"held"].toolset == ("files", 1, 1_000)
    assert _calls(_apply(driver, state, [_tick(len(records))])) == []  # not read yet
    registry.put()
    assert _calls(_apply(driver, state, [_tick(len(records) + 1)])) == [
        ("held_c0", "committed")]
    assert table[b"held"]["done"]


def test_a_run_start_for_a_run_that_exists_holds_nothing() -> None:
    """Anyone may write a ``run.start`` naming a missing toolset version under a run id that
    is open already (or finished): it opens no hold, so the run's own records go on at once
    (the duplicate start is the core's to refuse)."""
    table: dict[bytes, Any] = {}
    driver, registry = _driver(table)
    state = driver.takeover(0, 0).state
    victim = _run("victim", False)
    forged = _run("victim", True)[:1]
    records = _records(victim[:2] + forged + victim[2:])
    results = list(_apply(driver, state, records))
    assert state.holds.runs == {} and ("victim_c0", "committed") in _calls(results)
    assert registry.lookups == []


def test_only_a_run_starts_tools_name_a_toolset() -> None:
    """``toolset_of`` reads the envelope as JSON: a model's text that says ``"toolset"``
    (escaped inside a JSON string) or a provider event naming one opens no hold."""
    start = orjson.dumps({"v": 1, "type": "run.start", "run_id": "r",
                          "tools": {"toolset": "files", "version": 2}})
    assert toolset_of(start) == ("files", 2)
    text = orjson.dumps({"v": 1, "type": "provider.event", "run_id": "r",
                         "event": {"text": '{"toolset": "files", "version": 2}'}})
    assert b'"toolset"' not in text and toolset_of(text) is None
    event = orjson.dumps({"v": 1, "type": "provider.event", "run_id": "r",
                          "tools": {"toolset": "files", "version": 2}})
    assert toolset_of(event) is None
    assert toolset_of(b"{not json") is None


def test_holds_count_what_they_park_and_pick_the_largest_run() -> None:
    """The bounds count every parked record and byte; releasing a run gives them back; the
    largest run (by bytes) is the one a bound ends."""
    holds = Holds(max_records=3, max_bytes=10_000)
    small, big = _records(_run("s", True)[:1]), _records(_run("b", True, calls=3))
    for key, records in ((b"s", small), (b"b", big[:3])):
        holds.hold(key, None)
        for record in records:
            holds.park(key, record, None, None, None)
    assert holds.records == 4 and holds.over() and holds.largest() == b"b"
    assert holds.runs[b"s"].toolset == ("files", 1, 1_000)
    run = holds.release(b"b")
    assert len(run.records) == 3 and holds.records == 1 and not holds.over()
    assert holds.bytes == holds.runs[b"s"].size


class CountingRegistry(Registry):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def ready(self, name: str, version: int, at_ms: int) -> bool:
        self.asked += 1
        return super().ready(name, version, at_ms)


def test_a_held_runs_own_records_ask_for_its_own_run_only() -> None:
    """Many held runs and a flood of one held run's records (all at one record time, no
    tick): each of its records asks the registry about its own run only, so the work per
    record stays O(1) whatever the number of held runs (asking about every held run at each
    record made a flood of n records against n held runs cost n * n lookups)."""
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0"})
    driver = Driver(config, EngineHooks(config), Heads({}, 3600))
    registry = CountingRegistry()
    driver.registry = registry
    state = driver.takeover(0, 0).state
    starts = [_run(f"h{n}", True, end=False)[0] for n in range(200)]
    flood = _run("h0", True, calls=60, end=False)[1:]
    records = [step.record(e["run_id"].encode(), orjson.dumps(e), 1_000, "ev", 0, n)
               for n, e in enumerate(starts + flood)]
    list(_apply(driver, state, records))
    assert len(state.holds.runs) == 200 and registry.asked <= len(records) + 200


def test_the_largest_held_run_follows_its_growth() -> None:
    """:meth:`Holds.largest` is the run with the most bytes now, not when it was first seen."""
    holds = Holds()
    a, b = _records(_run("a", True, calls=2)), _records(_run("b", True, calls=2))
    holds.hold(b"a", None)
    holds.hold(b"b", None)
    for record in a[:3]:
        holds.park(b"a", record, None, None, None)
    holds.park(b"b", b[0], None, None, None)
    assert holds.largest() == b"a"
    for record in b[1:6]:
        holds.park(b"b", record, None, None, None)
    assert holds.largest() == b"b"
    holds.release(b"b")
    assert holds.largest() == b"a"


class Fixed:
    """A policy set that allows every call, or none (enforce)."""

    def __init__(self, version: int, allow: bool) -> None:
        self.version, self.allow, self.mode = version, allow, "enforce"

    def decide(self, request: Any) -> Any:
        from worker.core.policy import PolicyDecision
        return PolicyDecision("enforce", self.allow, (f"v{self.version}",), (), self.version)


def test_a_parked_record_is_decided_by_the_policy_in_force_at_its_position() -> None:
    """A held run's call whose records came while policy set version 1 (allow) was in force
    is decided by version 1 when it is released after a marker put version 2 (deny) in
    force, as replay (the log in order) decides it; a run after the marker is denied; the
    partition's policy afterwards is still version 2."""
    table: dict[bytes, Any] = {}
    driver, registry = _driver(table)
    state = driver.takeover(0, 0).state
    allow, deny = Fixed(1, True), Fixed(2, False)
    state.policy_version, state.assembler.policy = 1, allow
    held = _records(_run("held", True))
    list(_apply(driver, state, held))
    state.policy_version, state.assembler.policy = 2, deny  # (what a marker does)
    after = _records(_run("after", False), first=len(held))
    registry.put()
    results = list(_apply(driver, state, [*after, _tick(len(held) + len(after))]))
    assert _calls(results) == [("after_c0", "errors"), ("held_c0", "committed")]
    assert (state.policy_version, state.assembler.policy) == (2, deny)


def test_the_byte_bound_counts_keys_values_and_overhead() -> None:
    """``registry.hold_max_bytes``: one run's records past it pass the bound."""
    holds = Holds(max_records=1_000, max_bytes=2_000)
    records = _records(_run("b", True, calls=3))
    holds.hold(b"b", None)
    total = 0
    for record in records:
        holds.park(b"b", record, None, None, None)
        total += len(record.value) + 1 + 200
        assert holds.bytes == total and holds.over() == (total > 2_000)
    assert holds.over()


def test_a_cancel_of_a_held_run_waits_with_its_records_and_keeps_its_place() -> None:
    """A cancel forwarded into the events log for a held run (the gateway's or an operator's)
    is parked behind the run's earlier records: at the release the run starts, then is
    cancelled at that place, so its call (whose records came after the cancel) never
    commits, as in replay."""
    from builders import cancel

    table: dict[bytes, Any] = {}
    driver, registry = _driver(table)
    state = driver.takeover(0, 0).state
    run = _run("held", True)
    records = _records([run[0], cancel("held"), *run[1:]])
    assert _calls(_apply(driver, state, records)) == []
    assert len(state.holds.runs[b"held"].records) == len(records)
    registry.put()
    results = list(_apply(driver, state, [_tick(len(records))]))
    finals = [e.value for _, a in results if a is not None for e in a.emits
              if e.topic is Topic.FINAL]
    assert [f["status"] for f in finals] == ["cancelled"]
    assert ("held_c0", "committed") not in _calls(results)


def test_the_reader_gives_an_answer_up_once_past_the_bound(monkeypatch: Any) -> None:
    """``RegistryReader.ready`` never blocks: False while the answer is awaited (the reader
    fences meanwhile), True once ``registry.wait_s`` plus ``HOLD_MAX_S`` passed since it
    was first asked (given up, logged); the core's lookup of a given-up answer then answers
    at once (None: ``unknown_toolset``) instead of holding the loop again."""
    import time

    from worker.runtime.governance import registry_io

    monkeypatch.setattr(registry_io, "HOLD_MAX_S", 0.2)
    reader = registry_io.RegistryReader(load_config(None, env={"LATCH_REGISTRY__WAIT_S": "0"}))
    began = time.monotonic()
    assert reader.ready("files", 1, 1_000) is False and reader._awaiting()
    while not reader.ready("files", 1, 1_000):
        assert time.monotonic() - began < 5
    assert time.monotonic() - began >= 0.2
    assert reader.unsettled(orjson.dumps({"v": 1, "type": "run.start", "tools": {
        "toolset": "files", "version": 1}}), 1_000) is None
    began = time.monotonic()
    assert reader.toolsets("files", 1, 1_000) is None and time.monotonic() - began < 0.1
