"""One reader and one acceptance rule for a Cedar policy set (issue 32 item 4), without a
broker: ``latch registry put``, ``latch policy check|test``, ``policy.file`` and the worker's
build of a registry version read a set the same way (ids and annotations from Cedar, a ``//``
comment ended by ``\\r`` as Cedar ends it); ``put`` refuses exactly the sets no worker can
build; a worker that meets a version it cannot build keeps the version in force and says so
(log line, metric, ``/readyz``), and never falls back to denying every call.

Who writes what: a policy set's text is an operator's (a file, ``latch registry put``), but a
registry record may be written by anyone with write access to the registry topic, so the
worker's build is tested with texts ``put`` refuses, as such a writer would send them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import driving
import orjson
import pytest
from builders import chat_calls, chat_run, chat_tool
from registry_fakes import FakeRegistry

from worker.core import Assembler, Topic
from worker.core.policy import ENFORCE, LOG_ONLY, PolicyRequest
from worker.runtime import step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.governance import registry, registry_io
from worker.runtime.governance.policy import (
    CedarPolicy,
    PolicyFileError,
    check,
    load_policy,
    registry_policy,
)
from worker.runtime.governance.policy_source import PolicySource
from worker.runtime.governance.registry import (
    POLICY,
    POLICY_MARKER,
    Invalid,
    RegistryState,
    marker_value,
    policy_head_key,
)
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads, PartitionState
from worker.tools import policy as policy_tool

pytest.importorskip("cedarpy")

#: A set whose lines end in a bare carriage return: its first policy asks for approval.
CR = ('// reviewed deletes\r@id("ops-delete") @approval("required")\r'
      'permit(principal == Latch::Tenant::"ops", action, resource);\r'
      '// everything else of acme\r@id("acme-all")\r'
      'permit(principal == Latch::Tenant::"acme", action, resource);\r')
GOOD = '@id("all")\npermit(principal, action, resource);\n'
#: Sets Cedar parses but no worker can build: two policies named alike; a template.
TWO_IDS = ('@id("all")\npermit(principal, action, resource);\n'
           '@id("all")\nforbid(principal, action, resource == Latch::Tool::"rm");\n')
ID_LIKE_POSITIONAL = ('permit(principal, action, resource);\n'
                      '@id("policy0")\nforbid(principal, action, resource);\n')
TEMPLATE = 'permit(principal == ?principal, action, resource);\n'
UNPARSABLE = 'permit(principal, action, resource) whn { true };\n'
TOO_BIG = GOOD + "// " + "x" * (512 * 1024) + "\n"
UNBUILDABLE = {"two policies with one @id": (TWO_IDS, "a second policy with the id 'all'"),
               "an @id that is another's positional id": (ID_LIKE_POSITIONAL,
                                                          "a second policy with the id"),
               "a template": (TEMPLATE, "templates"),
               "text Cedar cannot parse": (UNPARSABLE, "1:49: invalid policy condition"),
               "more than 512 KiB": (TOO_BIG, "more than 524288")}


def _request(tenant: str | None, tool: str = "rm") -> PolicyRequest:
    return PolicyRequest(tenant, tool, {}, {"path": "/srv/a"}, "openai.chat", "r1")


def _config(**env: str) -> Any:
    return load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                  "LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
                                  **{f"LATCH_{k.upper()}": v for k, v in env.items()}})


# -- one reader: a bare carriage return ends a comment, as in Cedar -------------------------


def test_a_carriage_return_ended_set_keeps_its_annotations_in_the_worker() -> None:
    """The worker's build of a registry version whose lines end in ``\\r`` (what ``put``
    stores: it reads the file's bytes) names each policy by its ``@id`` and holds the call the
    annotated permit allows for approval; before issue 32 its own tokenizer read the whole
    text after the first ``//`` as one comment and lost both."""
    policy = PolicySource(_config(policy__mode="enforce")).at(4, lambda _v: CR)
    assert policy is not None and policy.version == 4
    decision = policy.decide(_request("ops"))
    assert decision.allow and decision.approval and decision.policies == ("ops-delete",)
    decision = policy.decide(_request("acme"))
    assert decision.allow and not decision.approval and decision.policies == ("acme-all",)
    assert [(s.name, s.line, s.approval) for s in CedarPolicy(CR).statements] == [
        ("ops-delete", 2, True), ("acme-all", 5, False)]


def test_a_carriage_return_ended_set_reads_alike_in_policy_test_file_and_registry(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``latch policy test`` on the ``\\r`` file, on the same text as a registry version, and
    ``policy.file`` all say the call waits for approval, naming ``ops-delete``: one reader."""
    cedar = tmp_path / "cr.cedar"
    cedar.write_bytes(CR.encode())
    arguments = tmp_path / "a.json"
    arguments.write_bytes(b'{"path": "/srv/a"}')
    state = RegistryState()
    state.apply(*registry.encode(POLICY, "", 1, CR), 0, 1_000)
    common = ["--tenant", "ops", "--tool", "rm", "--arguments", str(arguments)]
    for source in (["--policy", str(cedar)], ["--policy-version", "1"]):
        code = policy_tool.main(["test", *source, *common], registry=state)
        out = capsys.readouterr().out
        assert code == 0, out
        assert "determining policies: ops-delete" in out and "approval: required" in out
    loaded = load_policy(ENFORCE, str(cedar))
    assert loaded is not None and loaded.decide(_request("ops")).approval


def test_positions_count_a_bare_carriage_return_as_a_line_end() -> None:
    """An error in a ``\\r``-ended set is reported at the line an editor shows."""
    problems = check(CR.replace("acme-all", "acme-all\")\r@id(\"again").replace(
        '"acme", action', '"acme", action resource'), "cr.cedar")
    assert len(problems) == 1 and problems[0].line == 7


# -- one acceptance rule: put refuses exactly what no worker builds -----------------------------


@pytest.mark.parametrize("what", sorted(UNBUILDABLE))
def test_registry_put_refuses_a_set_no_worker_can_build(what: str) -> None:
    """``latch registry put policy`` (before it touches Kafka) refuses each set the worker's
    build refuses, saying why; the worker's build refuses it too (so a refused set never
    becomes a newest version through ``put``)."""
    text, message = UNBUILDABLE[what]
    config = _config(policy__mode="enforce")
    with pytest.raises(Invalid, match=message):
        registry_io.put(config, POLICY, "", 7, text)
    with pytest.raises(PolicyFileError, match=message):
        registry_policy(text, ENFORCE, 7)
    source = PolicySource(config)
    kept = source.initial()
    assert source.at(7, lambda _v: text, kept) is kept and 7 in source.refused


def test_put_accepts_a_set_the_worker_builds() -> None:
    """The sets the worker builds (:func:`registry_policy`, what :class:`PolicySource` runs
    for a registry version) pass ``put``'s check, the empty set included (it denies every
    call by default, as Cedar does)."""
    for text in (GOOD, CR, ""):
        registry.check_policy(text)
        assert registry_policy(text, ENFORCE, 7).version == 7


# -- the worker keeps the version in force -----------------------------------------------------


def _driver(table: dict[bytes, Any], texts: dict[int, str | None],
            mode: str = ENFORCE) -> Driver:
    config = _config(policy__mode=mode)
    driver = Driver(config, EngineHooks(config), Heads(table, 3600))
    driver.registry = FakeRegistry(texts)
    return driver


def _marker(version: int, offset: int) -> step.Record:
    return step.record(POLICY_MARKER, marker_value(version, 0), 1_000, "ev", 0, offset)


def test_an_unbuildable_newest_version_keeps_the_version_in_force(
        caplog: pytest.LogCaptureFixture) -> None:
    """Version 1 (permit all) in force, then a marker for version 2, which no worker can
    build (two policies with one @id, written to the registry by something other than
    ``put``): version 1 stays in force (calls still allowed, by ``all``), the partition's
    policy head does not record 2 (a rebuild starts with 1), and the worker says so once: a
    log line naming the version and why, ``latch_policy_versions_refused_total`` and the
    ``/readyz`` detail (still ready: the version in force decides)."""
    table: dict[bytes, Any] = {}
    driver = _driver(table, {1: GOOD, 2: TWO_IDS})
    state = PartitionState(Assembler(), 0)
    driving.apply(driver, state, _marker(1, 5))
    with caplog.at_level(logging.ERROR, logger="latch.worker"):
        driving.apply(driver, state, _marker(2, 9))
        driving.apply(driver, state, _marker(2, 12))
    policy = state.assembler.policy
    assert policy is not None and policy.version == 1 and state.policy_version == 1
    decision = policy.decide(_request("acme"))
    assert decision.allow and decision.policies == ("all",)
    assert table[policy_head_key(0)] == {"p": 0, "policy": [[5, 1]]}
    lines = [r.getMessage() for r in caplog.records if "version 2" in r.getMessage()]
    assert len(lines) == 1 and "cannot be built" in lines[0] and "version 1" in lines[0]
    assert "a second policy with the id 'all'" in lines[0]
    assert driver.markers(state, 0) is not None  # (the newest is marked once, as before)
    assert driver.markers(state, 0) is None
    _ready, body = driver.hooks.health.ready()
    assert list(body["policy"]["refused"]) == ["2"]
    assert "a second policy with the id 'all'" in body["policy"]["refused"]["2"]
    text = driver.hooks.metrics.exposition().decode()
    assert "latch_policy_versions_refused_total 1.0" in text
    rebuild = _driver(table, {1: GOOD, 2: TWO_IDS}).takeover(0, 20)
    assert rebuild.state.policy_version == 1
    rebuild.feed(_marker(2, 9))
    assert rebuild.state.policy_version == 1
    assert rebuild.state.assembler.policy is not None
    assert rebuild.state.assembler.policy.decide(_request("acme")).allow


def test_live_and_rebuild_decide_alike_across_an_unbuildable_version() -> None:
    """A run after the unbuildable version's marker: live and a rebuild that replays the same
    records emit the same outputs (both keep version 1), and the call is committed."""
    tools = [chat_tool("get_weather", {"type": "object"})]
    records = [_marker(1, 0)]
    for n, envelope in enumerate(chat_run("r1", tools, chat_calls(
            [("c1", "get_weather", '{"city": "Oslo"}')]))):
        records.append(step.record(b"r1", orjson.dumps(envelope), 1_000, "ev", 0, n + 2))
    records.insert(1, _marker(2, 1))
    live_state = PartitionState(Assembler(), 0)
    live = _driver({}, {1: GOOD, 2: TEMPLATE})
    live_out = [e for r in records if (a := driving.apply(live, live_state, r)) is not None
                for e in a.emits if e.topic is not Topic.PROGRESS]
    rebuild = _driver({b"r1": {"p": 0, "start": 2}}, {1: GOOD, 2: TEMPLATE}).takeover(0, 100)
    for r in records:
        rebuild.feed(r)
    assert [e.value for e in rebuild.replayed] == [e.value for e in live_out]
    assert any(e.topic is Topic.COMMITTED for e in live_out)


def test_a_first_version_that_cannot_be_built_leaves_no_version_in_force() -> None:
    """Where nothing was in force yet, an unbuildable version changes nothing: still "no
    policy set version is in force yet" (fail closed, as before any version), in log_only
    too."""
    driver = _driver({}, {1: TEMPLATE}, mode=LOG_ONLY)
    state = PartitionState(Assembler(), 0)
    state.assembler.policy = driver.policies.initial()
    driving.apply(driver, state, _marker(1, 0))
    assert state.policy_version is None
    policy = state.assembler.policy
    assert policy is not None
    assert policy.decide(_request("acme")).errors == ("no policy set version is in force yet",)


# -- a text not read in time is read again ---------------------------------------------------


def test_a_version_whose_text_was_not_read_in_time_is_taken_up_once_read() -> None:
    """A marker for a version whose text the reader has not read (the hold ran out): the
    partition denies, saying so, but is not left there until the next version: once the
    reader has the text, the partition's next tick puts the version in force."""
    texts: dict[int, str | None] = {1: None}
    driver = _driver({}, texts)
    state = PartitionState(Assembler(), 0)
    driving.apply(driver, state, _marker(1, 3))
    policy = state.assembler.policy
    assert policy is not None and not policy.decide(_request("acme")).allow
    assert "was not read" in policy.decide(_request("acme")).errors[0]
    driver.markers(state, 0)
    assert not state.assembler.policy.decide(_request("acme")).allow  # (still unread)
    texts[1] = GOOD
    driver.markers(state, 0)
    policy = state.assembler.policy
    assert policy is not None and policy.version == 1 and policy.decide(_request("acme")).allow
