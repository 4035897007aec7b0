"""Which policy is in force (worker/runtime/governance/policy_source.py): none with
``policy.mode: off``; the ``policy.file``'s for every call and every marker when one is set;
otherwise the registry version a marker put in force, denying (fail closed) where none is yet
or its text was not read, and keeping the version in force when a version cannot be built."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from worker.core.policy import ENFORCE, LOG_ONLY, PolicyDecision, PolicyRequest
from worker.runtime.config import load_config
from worker.runtime.governance.policy_source import NoPolicySet, PolicySource, assembler_policy

pytest.importorskip("cedarpy")

GOOD = '@id("all")\npermit(principal, action, resource);\n'
TWO_IDS = GOOD + '@id("all")\nforbid(principal, action, resource);\n'
REQUEST = PolicyRequest("acme", "rm", {}, {"path": "/srv/a"}, "openai.chat", "r1")


def _config(**env: str) -> Any:
    return load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                  **{f"LATCH_{k.upper()}": v for k, v in env.items()}})


def test_a_policy_file_that_does_not_parse_stops_with_file_line_and_column(
        tmp_path: Path) -> None:
    """policy.mode enforce with a .cedar file Cedar cannot parse: the configuration is plain
    data (load_config reads no Cedar), and the governance package's build of it, which the
    worker, ``latch assemble`` and ``latch replay`` run first, refuses it naming the file,
    line and column; an unquoted YAML `off` is the mode off."""
    bad = tmp_path / "p.cedar"
    bad.write_text("permit(principal, action, resource);\nforbid(principal,\n action resource);")
    config = load_config(env={"LATCH_POLICY__MODE": "enforce", "LATCH_POLICY__FILE": str(bad)})
    with pytest.raises(ValueError, match=rf"{bad}:3:9: unexpected token"):
        assembler_policy(config)
    path = tmp_path / "latch.yaml"
    path.write_text("policy:\n  mode: off\n")
    assert load_config(path, env={}).policy.mode == "off"


def test_with_the_mode_off_no_policy_is_ever_in_force() -> None:
    """``policy.mode: off``: no assembler policy, the registry decides nothing, and a marker
    changes nothing (its text is never asked for)."""
    config = _config(policy__mode="off")
    assert assembler_policy(config) is None
    source = PolicySource(config)
    assert source.file is None and not source.registry and source.initial() is None
    assert source.at(3, lambda _v: pytest.fail("the text was asked for")) is None


def test_a_policy_file_decides_every_call_whatever_the_markers(tmp_path: Path) -> None:
    """``policy.file`` set: that file's policy (no version) is in force from the start and
    after any marker; the registry's texts are never asked for."""
    path = tmp_path / "p.cedar"
    path.write_text(GOOD)
    config = _config(policy__mode="enforce", policy__file=str(path))
    source = PolicySource(config)
    assert not source.registry and source.file is not None and source.file.version is None
    assert source.initial() is source.file
    assert source.at(3, lambda _v: pytest.fail("the text was asked for")) is source.file
    assert source.file.decide(REQUEST).allow


@pytest.mark.parametrize("mode", [ENFORCE, LOG_ONLY])
def test_without_a_version_in_force_or_read_every_call_is_denied(mode: str) -> None:
    """Where the registry decides: before any marker, and for a version whose text was not
    read (no registry, or not yet), the policy denies every call in the configured mode,
    saying which; the unread one is not kept, so a text read later is built."""
    source = PolicySource(_config(policy__mode=mode))
    assert source.registry and source.file is None
    initial = source.initial()
    assert isinstance(initial, NoPolicySet) and not initial.unread
    assert initial.mode == mode and initial.version is None
    assert initial.decide(REQUEST) == PolicyDecision(
        mode, False, (), ("no policy set version is in force yet",), None)
    for text in (None, lambda _v: None):
        unread = source.at(2, text)
        assert isinstance(unread, NoPolicySet) and unread.unread and unread.version == 2
        decision = unread.decide(REQUEST)
        assert not decision.allow
        assert decision.errors == ("policy set version 2 was not read from the registry",)
    built = source.at(2, lambda _v: GOOD)
    assert not isinstance(built, NoPolicySet) and built is not None and built.version == 2
    assert built.decide(REQUEST).allow and built.mode == mode
    assert source.at(2, lambda _v: pytest.fail("built twice")) is built


def test_a_version_that_cannot_be_built_never_goes_into_force(
        caplog: pytest.LogCaptureFixture) -> None:
    """A version whose text cannot be built is refused once (logged as an error, kept in
    ``refused`` with why): the policy in force stays, or with none the initial denial; its
    text is not built again, and another version still goes into force."""
    source = PolicySource(_config(policy__mode="enforce"))
    current = source.at(1, lambda _v: GOOD)
    with caplog.at_level(logging.ERROR, logger="latch.worker"):
        assert source.at(5, lambda _v: TWO_IDS, current) is current
    assert "policy set version 5 cannot be built" in caplog.text
    assert "the version in force stays (version 1)" in caplog.text
    assert "a second policy with the id 'all'" in source.refused[5]
    caplog.clear()
    assert source.at(5, lambda _v: pytest.fail("built again"), current) is current
    assert not caplog.text
    assert isinstance(source.at(5, lambda _v: TWO_IDS), NoPolicySet)
    built = source.at(6, lambda _v: GOOD, current)
    assert built is not None and built.version == 6 and list(source.refused) == [5]
