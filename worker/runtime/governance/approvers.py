"""Approvers' keys: the worker's verification keys by id, and an approval tool's signing key
(docs/policies.md, *Approvals*; docs/decisions/0019-approver-identity.md).

The mechanism is :mod:`.signing`'s (HMAC-SHA256, keys by id read from ``file:`` or ``env:``,
at least 32 bytes, never shown); what is signed is :func:`worker.core.approvers.signed_bytes`
and what is checked is :meth:`worker.core.approvers.Approvers.refusal`. The worker lists
every approver's keys (``approvers.keys``) with the approver each proves
(``approvers.owners``); an approval tool signs with one key (``approvers.key_id``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.core.approvers import Approvers, mac, signed_bytes
from worker.runtime.config import Config, ConfigError, SigningSettings
from worker.runtime.governance.signing import load_keys

__all__ = ["DecisionSigner", "approvers", "decision_signer"]


def approvers(config: Config, env: Mapping[str, str] | None = None) -> Approvers:
    """The worker's approvers (``Assembler.approvals.approvers``), never None: with
    ``approvers.keys`` empty, an :class:`Approvers` that knows no key, so that no decision
    counts (each is refused ``approval_unsigned`` or ``approver_unknown_key``) and a held call
    waits for its ``approval_timeout``. There is no opt-out: counting unsigned decisions is
    the sidestep (decision 0019). Raises :class:`ConfigError` for a key that cannot be read
    or has no owner."""
    settings = config.approvers
    if not settings.keys:
        return Approvers({}, settings.groups)
    missing = [f"approvers.owners: key {k} has no owner" for k in sorted(settings.keys)
               if k not in settings.owners]
    if missing:
        raise ConfigError(config.source, missing)
    keys = load_keys(SigningSettings(None, settings.keys), config.source, env, "approvers")
    return Approvers({k: (settings.owners[k], key) for k, key in keys.items()},
                     settings.groups)


class DecisionSigner:
    """Signs an approver's decisions with one key (an approval tool's ``approvers.key_id``)."""

    __slots__ = ("_key", "key_id", "owner")

    def __init__(self, key_id: str, owner: str, key: bytes) -> None:
        self.key_id, self.owner, self._key = key_id, owner, key

    def sign(self, doc: dict[str, Any], ts: int) -> dict[str, Any]:
        """``doc`` (an ``approve``, ``deny`` or ``edit`` envelope whose ``by`` is the key's
        owner) with its ``signature`` object. Raises ValueError when ``by`` is another."""
        if doc.get("by") != self.owner:
            raise ValueError(f"approvers.key_id {self.key_id} belongs to {self.owner}, not to "
                             "the decision's by")
        message = signed_bytes(doc["run_id"], doc["tool_call_id"], doc["type"], doc["by"],
                               doc.get("reason", ""), doc.get("arguments"), self.key_id, ts)
        return {**doc, "signature": {"key": self.key_id, "ts": ts,
                                     "mac": mac(self._key, message)}}

    def __repr__(self) -> str:
        return f"DecisionSigner(key_id={self.key_id!r}, owner={self.owner!r})"


def decision_signer(config: Config, env: Mapping[str, str] | None = None
                    ) -> DecisionSigner | None:
    """An approval tool's signer (None: ``approvers.key_id`` is unset). Raises
    :class:`ConfigError`."""
    settings = config.approvers
    key_id = settings.key_id
    if key_id is None:
        return None
    problems = [f"approvers.key_id: {key_id} is not one of approvers.{name}"
                for name, known in (("keys", settings.keys), ("owners", settings.owners))
                if key_id not in known]
    if problems:
        raise ConfigError(config.source, problems)
    keys = load_keys(SigningSettings(None, {key_id: settings.keys[key_id]}), config.source,
                     env, "approvers")
    return DecisionSigner(key_id, settings.owners[key_id], keys[key_id])
