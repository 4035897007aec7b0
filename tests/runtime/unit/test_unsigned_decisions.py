"""With no approver keys, no decision counts (issue 32 item 3, docs/policies.md, "Approvals",
decision 0019): the default configuration cannot be walked around.

Who sends what: a decision (``approve``, ``deny``, ``edit``) reaches a run from whoever may
write the control topic (the gateway, which writes cancels) or the events topic (the
gateway); neither says which person decided. Only a signature by a key the worker lists
(``approvers.keys``) does. So a worker, ``latch assemble``, ``latch replay`` and a takeover
with no keys listed must refuse every decision ``approval_unsigned`` (a DLQ record with its
bytes) and keep the call held until ``approval_timeout``; none may leave the core's
``Waiting.approvers`` at None (the core's "no check", for pure unit tests only).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import logging
import sys
from pathlib import Path
from typing import Any

import driving
import orjson
import pytest
from builders import (
    approver_env,
    chat_calls,
    chat_run,
    chat_tool,
    decision,
    signed_decision,
    tick,
)

from worker.core import Topic
from worker.core.approvers import Approvers
from worker.core.envelope import TICK_KEY, decode
from worker.core.settings import ApprovalSettings
from worker.runtime import step
from worker.runtime.config import Config, load_config
from worker.runtime.driver import Driver
from worker.runtime.governance.approvers import approvers
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads

NO_KEYS = "no approver keys: no decision can count; held calls time out"
TIMEOUT_S = 5


def _config(**env: str) -> Config:
    return load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0", **env})


def _keyed(monkeypatch: pytest.MonkeyPatch) -> Config:
    """A configuration listing the test approver's key (its variable set in this process, as
    a worker's environment holds it)."""
    env = approver_env()
    for name, value in env.items():
        if not name.startswith("LATCH_APPROVERS__"):
            monkeypatch.setenv(name, value)
    return _config(**env)


def _gated(config: Config) -> Config:
    """``config`` with ``get_weather`` calls held for a person, timing out after 5 s."""
    approvals = ApprovalSettings(require_approval=("get_weather",),
                                 approval_timeout_s=TIMEOUT_S)
    return dataclasses.replace(config, assemble=dataclasses.replace(
        config.assemble, approvals=approvals))


def _run() -> list[dict[str, Any]]:
    tools = [chat_tool("get_weather", {"type": "object"})]
    return chat_run("r1", tools, chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))


def _records(envelopes: list[dict[str, Any]]) -> list[step.Record]:
    return [step.record(e["run_id"].encode(), orjson.dumps(e), 1_000 + n, "ev", 0, n)
            for n, e in enumerate(envelopes)]


def test_no_approver_keys_gives_approvers_with_no_key_not_none() -> None:
    """The default configuration (no ``approvers`` section): an :class:`Approvers` that knows
    no key, so an unsigned decision is refused ``approval_unsigned`` and a signed one
    ``approver_unknown_key`` (before: None, and every decision counted)."""
    keys = approvers(_config())
    assert isinstance(keys, Approvers)
    unsigned = decode(b"r1", orjson.dumps({**decision("r1", "approve", "c1"), "control": [0, 1]}))
    signed = decode(b"r1", orjson.dumps(signed_decision("r1", "approve", "c1")))
    assert keys.refusal(unsigned)[0] == "approval_unsigned"  # type: ignore[arg-type,index]
    assert keys.refusal(signed)[0] == "approver_unknown_key"  # type: ignore[arg-type,index]


def test_the_drivers_assembler_always_has_approvers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every assembler the driver builds (a takeover's: the live one too) holds an
    :class:`Approvers`, with keys configured or not: nothing in the runtime leaves the
    core's "no check" in place."""
    for config in (_config(), _keyed(monkeypatch)):
        driver = Driver(config, EngineHooks(config), Heads({}, 3600))
        assembler = driver.takeover(0, resume=0).state.assembler
        assert isinstance(assembler.approvals.approvers, Approvers)


def test_replays_assemblers_always_have_approvers() -> None:
    """``latch replay``'s assemblers (``assemblers_for``) hold an :class:`Approvers` with no
    approver keys configured, as the live worker's do."""
    from worker.runtime.governance.policy_source import PolicySource
    from worker.runtime.governance.registry import RegistryState
    from worker.tools.replay_policy import assemblers_for

    config = _config()
    built = assemblers_for(config, PolicySource(config), RegistryState(), [0, 1], {})
    assert all(isinstance(a.approvals.approvers, Approvers) for a in built.values())


def test_chaos_plans_offline_core_counts_no_unsigned_decision() -> None:
    """The chaos plan's offline core decides as the workers do: gated calls with no approver
    keys configured (so the approver cannot sign) cannot get the outcomes the driver means
    for them, and ``build_plan`` says so (``PlanError``); ``latch chaos --approvals`` gives
    its workers and its approver a key (before: the plan counted the unsigned decisions)."""
    from worker.tools.chaos.plan import PlanError, build_plan

    config = _config(LATCH_APPROVALS__REQUIRE_APPROVAL="delete_file",
                     LATCH_APPROVALS__APPROVAL_TIMEOUT_S="7")
    with pytest.raises(PlanError, match="meant"):
        build_plan(seed=7, runs=160, config=config)


def test_a_takeover_refuses_an_unsigned_approve_and_the_call_times_out() -> None:
    """Default configuration, a gated call held: the gateway's unsigned approve, applied by
    a driver's assembler, is one DLQ record ``approval_unsigned`` holding the decision's
    bytes, no outcome; the call stays held, and a tick past the approval timeout fails it
    ``approval_timeout`` (before: the approve committed the call)."""
    config = _gated(_config())
    driver = Driver(config, EngineHooks(config), Heads({}, 3600))
    state = driver.takeover(0, resume=0).state
    approve = decision("r1", "approve", "c1")
    records = _records([*_run(), approve])
    emits = [e for r in records if (a := driving.apply(driver, state, r)) is not None
             for e in a.emits]
    assert [e.value["call_id"] for e in emits if e.topic is Topic.PENDING] == ["c1"]
    assert not [e for e in emits if e.topic in (Topic.COMMITTED, Topic.ERRORS, Topic.FINAL)]
    (dlq,) = [e.value for e in emits if e.topic is Topic.DLQ]
    assert dlq["reason"] == "approval_unsigned"
    assert orjson.loads(base64.b64decode(dlq["original_b64"])) == approve
    late = 1_000 + TIMEOUT_S * 1000 + 100
    applied = driving.apply(driver, state, step.record(
        TICK_KEY.encode(), orjson.dumps(tick(late)), late, "ev", 0, len(records)))
    assert applied is not None
    errors = [e.value for e in applied.emits if e.topic is Topic.ERRORS]
    assert [(e["tool_call_id"], e["reason"]) for e in errors] == [("c1", "approval_timeout")]


def test_a_signed_approve_by_a_listed_key_still_counts(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """With the approver's key listed (``approvers.keys``/``owners``), the same approve,
    signed, commits the held call: refusing unsigned decisions takes nothing from a keyed
    setup."""
    config = _gated(_keyed(monkeypatch))
    driver = Driver(config, EngineHooks(config), Heads({}, 3600))
    state = driver.takeover(0, resume=0).state
    records = _records([*_run(), signed_decision("r1", "approve", "c1")])
    emits = [e for r in records if (a := driving.apply(driver, state, r)) is not None
             for e in a.emits]
    assert not [e for e in emits if e.topic is Topic.DLQ]
    assert [e.value["call_id"] for e in emits if e.topic is Topic.COMMITTED] == ["c1"]


@pytest.mark.parametrize("held", ["require_approval", "destructive", "enforce"])
def test_the_worker_warns_once_at_start_when_calls_can_be_held_without_keys(
        held: str, caplog: pytest.LogCaptureFixture) -> None:
    """A worker whose calls can be held (approvals configured, or a policy in force that may
    hold one) but that lists no approver key logs one clear warning at start: no decision
    can count, held calls time out."""
    config = _config()
    config = {
        "require_approval": dataclasses.replace(config, approvals=dataclasses.replace(
            config.approvals, require_approval=("delete_file",))),
        "destructive": dataclasses.replace(config, approvals=dataclasses.replace(
            config.approvals, destructive=True)),
        # (enforce with no policy file: the registry's policy sets may hold calls)
        "enforce": dataclasses.replace(config, policy=dataclasses.replace(
            config.policy, mode="enforce")),
    }[held]
    with caplog.at_level(logging.WARNING):
        Driver(config, EngineHooks(config), Heads({}, 3600))
    warned = [r.getMessage() for r in caplog.records if "approver" in r.getMessage()]
    assert len(warned) == 1 and NO_KEYS in warned[0]


def test_no_warning_when_no_call_can_be_held_or_keys_are_listed(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """No holds configured, or approver keys listed: no warning about approver keys."""
    with caplog.at_level(logging.WARNING):
        keyed = _keyed(monkeypatch)
        for config in (_config(), dataclasses.replace(keyed, approvals=dataclasses.replace(
                keyed.approvals, require_approval=("delete_file",)))):
            Driver(config, EngineHooks(config), Heads({}, 3600))
    assert not [r for r in caplog.records if "approver" in r.getMessage()]


def test_readyz_says_when_no_decision_can_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """``/readyz``'s ``approvers`` detail: how many approver keys the worker lists, and, with
    none, that no decision can count (ready all the same: holding is fail-closed)."""
    none = _config(LATCH_APPROVALS__REQUIRE_APPROVAL="delete_file")
    hooks = EngineHooks(none)
    Driver(none, hooks, Heads({}, 3600))
    _, detail = hooks.health.ready()
    assert detail["approvers"] == {"keys": 0, "counts": False, "detail": NO_KEYS}
    keyed = _keyed(monkeypatch)
    hooks = EngineHooks(keyed)
    Driver(keyed, hooks, Heads({}, 3600))
    assert hooks.health.ready()[1]["approvers"] == {"keys": 1, "counts": True}


def test_latch_assemble_refuses_an_unsigned_decision(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``latch assemble`` decides as the worker does: with no approver keys, an unsigned
    approve of a held call is a DLQ record ``approval_unsigned`` and nothing commits."""
    from worker import cli

    lines = b"".join(orjson.dumps(e) + b"\n" for e in [*_run(), decision("r1", "approve", "c1")])
    config = tmp_path / "latch.yaml"
    config.write_text("approvals:\n  require_approval: [get_weather]\n", encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines)))
    out = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out))
    assert cli.main(["assemble", "--config", str(config), "-"]) == 0
    sys.stdout.flush()
    emitted = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert [e["value"]["reason"] for e in emitted if e["topic"] == "dlq"] == [
        "approval_unsigned"]
    assert not [e for e in emitted if e["topic"] == "committed"]
