"""Policy markers are trusted for no more than the worker would do itself (issue 32: governance
that cannot be walked around). The owning worker writes a ``__latch_policy__`` marker into
its events partition for a newer version its registry reader has read; the gateway, which may
write the events topic, can write a record with that key too. Such a record must not put an
older, more permissive version back in force, nor a version the registry did not hold by the
marker's time (which would deny every call of the partition), live, in a rebuild or in
``latch replay`` (registry.py ``marker_refusal``)."""

from __future__ import annotations

import logging
from typing import Any

import driving
import pytest

from worker.core import Assembler
from worker.core.policy import ENFORCE, PolicyRequest
from worker.runtime import step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.governance import registry
from worker.runtime.governance.policy_source import PolicySource
from worker.runtime.governance.registry import (
    POLICY,
    POLICY_MARKER,
    RegistryState,
    marker_refusal,
    marker_value,
)
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads, PartitionState
from worker.tools.replay_policy import Markers

pytest.importorskip("cedarpy")

#: Version 1 lets everything through; version 2 forbids ``rm``.
PERMISSIVE = '@id("all")\npermit(principal, action, resource);\n'
STRICT = PERMISSIVE + '@id("no-rm")\nforbid(principal, action, resource == Latch::Tool::"rm");\n'


def _state() -> RegistryState:
    """The registry: version 1 appended at 1,000 ms, version 2 at 5,000 ms, read to 60,000."""
    state = RegistryState()
    for version, text, at in ((1, PERMISSIVE, 1_000), (2, STRICT, 5_000)):
        key, value = registry.encode(POLICY, "", version, text)
        state.apply(key, value, version, at)
    state.apply(registry.FENCE, None, 3, 60_000)
    return state


class _View:
    """A worker's registry reader over a :class:`RegistryState` read whole."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state

    def toolsets(self, name: str, version: int, at_ms: int) -> Any:
        return None

    def policy_text(self, version: int) -> str | None:
        return self.state.policy_text(version)

    def policy_read(self, version: int) -> str | None:
        return self.state.policy_text(version)

    def policy_registered(self, version: int, at_ms: int) -> bool | None:
        return self.state.policy_registered(version, at_ms)

    def latest_policy(self) -> int | None:
        return self.state.latest_policy()

    failure: str | None = None


def _driver(table: dict[bytes, Any]) -> Driver:
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                    "LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
                                    "LATCH_POLICY__MODE": ENFORCE})
    driver = Driver(config, EngineHooks(config), Heads(table, 3600))
    driver.registry = _View(_state())
    return driver


def _marker(version: int, offset: int, at_ms: int) -> step.Record:
    return step.record(POLICY_MARKER, marker_value(version, 0), at_ms, "ev", 0, offset)


def _rm_allowed(assembler: Assembler) -> bool:
    policy = assembler.policy
    assert policy is not None
    return policy.decide(PolicyRequest("acme", "rm", {}, {}, "openai.chat", "r1")).allow


def test_the_rule() -> None:
    """An older version, or one not registered by the marker's time, is refused; a newer
    registered one, or one the registry cannot answer for yet, goes in force."""
    state = _state()
    assert state.policy_registered(2, 6_000) is True
    assert state.policy_registered(2, 3_500) is True  # within the brokers' clock skew
    assert state.policy_registered(2, 2_000) is False  # registered after the marker
    assert state.policy_registered(9, 6_000) is False  # read past 8,000: final
    assert state.policy_registered(9, 59_000) is None  # not read far enough yet
    assert marker_refusal(1, 2, True) is not None
    assert marker_refusal(9, 2, False) is not None
    assert marker_refusal(3, 2, True) is None and marker_refusal(3, 2, None) is None
    assert marker_refusal(1, None, True) is None


@pytest.mark.parametrize(("forged", "why"), [
    (1, "older than version 2"),  # a permissive old set back in force
    (9, "held no policy set version 9"),  # a version nobody registered: deny all
])
def test_a_forged_marker_changes_nothing_live_or_in_a_rebuild(
        forged: int, why: str, caplog: pytest.LogCaptureFixture) -> None:
    """Version 2 (no ``rm``) in force by the worker's own markers; the gateway then writes a
    marker naming ``forged``: ``rm`` stays forbidden, the policy head keeps 1 and 2 only, one
    warning says why (no argument text), and a rebuild over the same records agrees."""
    table: dict[bytes, Any] = {}
    driver = _driver(table)
    state = PartitionState(Assembler(), 0)
    records = [_marker(1, 0, 2_000), _marker(2, 1, 6_000), _marker(forged, 2, 7_000)]
    with caplog.at_level(logging.WARNING, logger="latch.worker"):
        for r in records:
            driving.apply(driver, state, r)
    assert state.policy_version == 2 and not _rm_allowed(state.assembler)
    assert table[registry.policy_head_key(0)]["policy"] == [[0, 1], [1, 2]]
    assert [m for r in caplog.records if why in (m := r.getMessage())]
    rebuild = _driver({b"r1": {"p": 0, "start": 0}}).takeover(0, 10)
    for r in records:
        rebuild.feed(r)
    assert rebuild.state.policy_version == 2 and not _rm_allowed(rebuild.state.assembler)


@pytest.mark.parametrize("forged", [1, 9])
def test_replay_refuses_what_the_live_worker_refuses(forged: int) -> None:
    """``latch replay``'s markers (replay_policy.Markers) apply the same rule."""
    config = load_config(None, env={"LATCH_POLICY__MODE": ENFORCE})
    assembler = Assembler()
    assembler.policy = PolicySource(config).initial()
    markers = Markers(PolicySource(config), _state(), {0: assembler}, {})
    for version, at in ((1, 2_000), (2, 6_000), (forged, 7_000)):
        markers.apply(0, marker_value(version, 0), at)
    assert markers.versions[0] == 2 and not _rm_allowed(assembler)
