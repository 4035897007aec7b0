"""Approvers' keys (worker/runtime/governance/approvers.py): the worker's verification keys by
id, each with the approver it proves, and an approval tool's signer, read from the
``approvers`` section as ``signing`` reads its keys (``file:`` or ``env:``, never shown); a
key that cannot be read, or has no owner, and a ``key_id`` the section does not list, are
configuration errors."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from builders import decision

from worker.core.approvers import Approvers
from worker.core.envelope import decode
from worker.runtime.config import ConfigError, load_config
from worker.runtime.governance.approvers import DecisionSigner, approvers, decision_signer


def test_the_approvers_section_gives_keys_owners_and_a_signer(tmp_path: Path) -> None:
    """Keys are read from files or variables (never printed); every key needs an owner; an
    approval tool's signer signs only decisions by its key's owner, and the worker's
    approvers accept what it signs."""
    (tmp_path / "k").write_bytes(b"k" * 40)
    path = tmp_path / "latch.yaml"
    path.write_text(f"approvers:\n  key_id: alice-1\n  keys: {{alice-1: 'file:{tmp_path}/k', "
                    "bob-1: 'env:BOB_KEY'}\n  owners: {alice-1: alice, bob-1: bob}\n"
                    "  groups: {alice: [oncall]}\n")
    config = load_config(path)
    worker = approvers(config, {"BOB_KEY": "b" * 40})
    assert worker is not None and worker.groups == {"alice": ("oncall",)}
    assert "k" * 40 not in repr(worker)
    signer = decision_signer(config)
    assert signer is not None
    env = signer.sign(decision("r1", "approve", "c2", by="alice"), 5)
    from worker.core.envelope import decode
    assert worker.refusal(decode(b"r1", orjson.dumps(env))) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="belongs to alice"):
        signer.sign(decision("r1", "approve", "c2", by="bob"), 5)
    path.write_text("approvers:\n  keys: {x-1: 'env:X'}\n")
    with pytest.raises(ConfigError, match="x-1 has no owner"):
        approvers(load_config(path), {"X": "x" * 40})


def test_without_keys_no_decision_counts_and_no_signer() -> None:
    """With ``approvers.keys`` empty the worker still has approvers (never None): they know
    no key, so a signed decision is refused ``approver_unknown_key`` and an unsigned one
    ``approval_unsigned``; an approval tool without ``approvers.key_id`` has no signer."""
    config = load_config(None, env={})
    worker = approvers(config, {})
    assert isinstance(worker, Approvers)
    signed = DecisionSigner("k-1", "ann", b"k" * 32).sign(decision("r1", "approve", "c1",
                                                                   by="ann"), 5)
    assert worker.refusal(decode(b"r1", orjson.dumps(signed)))[0] == \
        "approver_unknown_key"  # type: ignore[arg-type,index]
    assert worker.refusal(decode(b"r1", orjson.dumps(
        decision("r1", "approve", "c1", by="ann"))))[0] == \
        "approval_unsigned"  # type: ignore[arg-type,index]
    assert decision_signer(config) is None


def test_a_key_that_cannot_be_read_or_a_key_id_not_listed_is_refused(tmp_path: Path) -> None:
    """A key whose variable is unset, or shorter than 32 bytes, stops the configuration with
    a message naming the ``approvers`` key and never its value; a ``key_id`` that is not
    among the keys and owners is named too."""
    path = tmp_path / "latch.yaml"
    path.write_text("approvers:\n  keys: {a-1: 'env:A_KEY'}\n  owners: {a-1: ann}\n")
    with pytest.raises(ConfigError, match="A_KEY"):
        approvers(load_config(path), {})
    with pytest.raises(ConfigError) as short:
        approvers(load_config(path), {"A_KEY": "s3cr3t"})
    assert "s3cr3t" not in str(short.value) and "a-1" in str(short.value)
    path.write_text("approvers:\n  key_id: b-1\n  keys: {a-1: 'env:A_KEY'}\n"
                    "  owners: {a-1: ann}\n")
    with pytest.raises(ConfigError, match=r"b-1 is not one of approvers\.keys") as unknown:
        decision_signer(load_config(path), {"A_KEY": "a" * 40})
    assert "approvers.owners" in str(unknown.value)


def test_a_signer_signs_as_its_owner_and_never_shows_its_key() -> None:
    """``DecisionSigner.sign``: the decision with its ``signature`` (key id, time, a MAC that
    changes with the key); the decision otherwise unchanged; its repr names the key id and
    owner only."""
    doc = decision("r1", "deny", "c1", by="ann")
    one = DecisionSigner("k-1", "ann", b"k" * 32).sign(doc, 7)
    other = DecisionSigner("k-1", "ann", b"j" * 32).sign(doc, 7)
    assert {k: v for k, v in one.items() if k != "signature"} == doc and "signature" not in doc
    assert one["signature"]["key"] == "k-1" and one["signature"]["ts"] == 7
    assert one["signature"]["mac"] != other["signature"]["mac"]
    assert repr(DecisionSigner("k-1", "ann", b"k" * 32)) == \
        "DecisionSigner(key_id='k-1', owner='ann')"
