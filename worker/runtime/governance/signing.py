"""Signed committed calls: only what the worker committed runs.

Any principal that may write ``tool.calls.committed`` could otherwise make a runner execute a
tool. With ``signing.key_id`` set, the worker signs each committed record; a
:class:`~worker.client.runner.Runner` given keys refuses a record that is unsigned or not
signed by one of them (``tool_execute_rejected_not_committed_total{reason}``). ACLs keep
other writers off the topic (docs/operations.md); the signature holds even when they fail.

The signature, in two headers of the committed record (schemas/README.md)::

    latch-signature-key   the key id, UTF-8 (``signing.key_id``)
    latch-signature       hex(HMAC-SHA256(key, the record's value bytes)), 64 characters

It proves the worker made the value; it says nothing of freshness (a copy of a signed record
is the same call: runners deduplicate on ``idempotency_key``). Keys rotate by id: runners
list the old and the new key, the worker switches ``key_id``, and the old key leaves the
runners once no record signed with it is left to consume (docs/runner.md). A runner that
reaches a record signed under an id it does not hold stops there, never committing past it
(``worker.client.runner.SigningKeyError``): the record may be the worker's, ahead of the
runner's keys.

Keys are read from files or environment variables (``file:PATH``, ``env:NAME``), at least
:data:`MIN_KEY_BYTES` bytes each; no ``repr``, log line or error message holds one. The audit
records' argument digests are keyed the same way (``audit.keys``, ``audit.key_id``:
:func:`audit_key`, :func:`with_audit_key`); the key's bytes reach the core in
``AssembleSettings.audit_key``, never the configuration file.

:class:`SignCommitted` is the one place a record is signed: a step of the driver's outgoing
chain (:meth:`worker.runtime.driver.Driver.outgoing`, trace headers, signature, size check),
so the telemetry hooks carry no security control (tests/test_architecture.py: the role
``signs a record``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from worker.core import Emit, Topic
from worker.core.settings import AuditKey
from worker.runtime.config import AuditSettings, Config, ConfigError, SigningSettings

__all__ = ["KEY_ID_HEADER", "MIN_KEY_BYTES", "SIGNATURE_HEADER", "Signer", "Verifier",
           "audit_key", "load_keys", "signer", "verifier", "with_audit_key"]

#: The header holding the id of the key that signed the record.
KEY_ID_HEADER = "latch-signature-key"
#: The header holding the signature: lowercase hex of HMAC-SHA256 over the record's value.
SIGNATURE_HEADER = "latch-signature"
#: The shortest key accepted (HMAC-SHA256's own output size).
MIN_KEY_BYTES = 32

#: Why a runner refuses a record by its signature (``REJECT_REASONS`` in metrics.py).
UNSIGNED, UNKNOWN_KEY, BAD_SIGNATURE = "unsigned", "unknown_key", "bad_signature"


#: A record's headers, as the Kafka clients take them.
Headers = list[tuple[str, bytes]]


def _mac(key: bytes, value: bytes) -> bytes:
    return hmac.new(key, value, hashlib.sha256).hexdigest().encode("ascii")


class Signer:
    """Signs record values with one key (the worker's ``signing.key_id``)."""

    __slots__ = ("_key", "_prefix", "key_id")

    def __init__(self, key_id: str, key: bytes) -> None:
        self.key_id = key_id
        self._key = key
        self._prefix = (KEY_ID_HEADER, key_id.encode("utf-8"))

    def headers(self, value: bytes) -> list[tuple[str, bytes]]:
        """The signature headers of a record whose value is ``value``."""
        return [self._prefix, (SIGNATURE_HEADER, _mac(self._key, value))]

    def __repr__(self) -> str:
        return f"Signer(key_id={self.key_id!r})"


class SignCommitted:
    """The outgoing chain's signing step: a committed call's record gets the signature of
    its value after the headers it has (its run's trace); every other record, and every
    record while ``signing.key_id`` is unset (``signer`` None), passes as it is."""

    __slots__ = ("signer",)

    def __init__(self, signer: Signer | None) -> None:
        self.signer = signer

    def __call__(self, emit: Emit, value: bytes, headers: Headers | None) -> Headers | None:
        if self.signer is None or emit.topic is not Topic.COMMITTED:
            return headers
        return [*(headers or ()), *self.signer.headers(value)]


class Verifier:
    """Checks a record's signature against a set of keys by id (the runner's
    ``signing.keys``). With no keys it requires nothing (:attr:`required` is False)."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._keys = dict(keys)

    @property
    def required(self) -> bool:
        """Whether records must be signed (some key is configured)."""
        return bool(self._keys)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys))

    def refusal(self, value: bytes | None,
                headers: Iterable[tuple[str, bytes | str | None]] | None) -> str | None:
        """Why the record is refused (``unsigned``, ``unknown_key``, ``bad_signature``), or
        None when it is signed by a known key (or nothing is required)."""
        if not self._keys:
            return None
        key_id = signature = None
        for name, data in headers or ():
            if name == KEY_ID_HEADER:
                key_id = data
            elif name == SIGNATURE_HEADER:
                signature = data
        if key_id is None or signature is None:
            return UNSIGNED
        if isinstance(key_id, bytes):
            key_id = key_id.decode("utf-8", "replace")
        key = self._keys.get(key_id)
        if key is None:
            return UNKNOWN_KEY
        if isinstance(signature, str):
            signature = signature.encode("utf-8", "replace")
        if not hmac.compare_digest(_mac(key, value or b""), signature):
            return BAD_SIGNATURE
        return None

    def __repr__(self) -> str:
        return f"Verifier(key_ids={list(self.key_ids)!r})"


def load_keys(settings: SigningSettings | AuditSettings, source: Path | None = None,
              env: Mapping[str, str] | None = None, section: str = "signing"
              ) -> dict[str, bytes]:
    """Every key of ``settings.keys`` (of the config's ``section``), read from its file or
    variable. Raises :class:`ConfigError` naming the key id and where it was looked for, never
    its bytes."""
    env = os.environ if env is None else env
    keys: dict[str, bytes] = {}
    problems: list[str] = []
    for key_id, where in settings.keys.items():
        kind, _, name = where.partition(":")
        at = f"{section}.keys.{key_id}"
        if kind == "file":
            try:
                key = Path(name).read_bytes().strip()
            except OSError as exc:
                problems.append(f"{at}: cannot read {name} ({type(exc).__name__})")
                continue
        elif kind == "env":
            if name not in env:
                problems.append(f"{at}: the variable {name} is not set")
                continue
            key = env[name].strip().encode("utf-8", "surrogateescape")
        else:
            problems.append(f"{at}: expected file:PATH or env:NAME")
            continue
        if len(key) < MIN_KEY_BYTES:
            problems.append(f"{at}: the key is shorter than {MIN_KEY_BYTES} bytes")
            continue
        keys[key_id] = key
    if problems:
        raise ConfigError(source, problems)
    return keys


def signer(config: Config, env: Mapping[str, str] | None = None) -> Signer | None:
    """The worker's signer (None: ``signing.key_id`` is unset). Raises :class:`ConfigError`."""
    settings = config.signing
    key_id = settings.key_id
    if key_id is None:
        return None
    if key_id not in settings.keys:
        raise ConfigError(config.source, [f"signing.key_id: {key_id} is not one of "
                                          "signing.keys"])
    # Only the active key: the others may be the runners' alone (a rotation's old key).
    keys = load_keys(SigningSettings(key_id, {key_id: settings.keys[key_id]}), config.source,
                     env)
    return Signer(key_id, keys[key_id])


def verifier(config: Config, env: Mapping[str, str] | None = None) -> Verifier:
    """A runner's verifier: every key of ``signing.keys`` (none: nothing is required).
    Raises :class:`ConfigError`."""
    return Verifier(load_keys(config.signing, config.source, env))


def audit_key(config: Config, env: Mapping[str, str] | None = None) -> AuditKey | None:
    """The key of the audit records' argument digests (None: ``audit.key_id`` is unset, the
    records carry the size only). Only the active key is read. Raises :class:`ConfigError`."""
    settings = config.audit
    key_id = settings.key_id
    if key_id is None:
        return None
    if key_id not in settings.keys:
        raise ConfigError(config.source, [f"audit.key_id: {key_id} is not one of audit.keys"])
    keys = load_keys(AuditSettings(key_id, {key_id: settings.keys[key_id]}), config.source,
                     env, "audit")
    return AuditKey(key_id, keys[key_id])


def with_audit_key(config: Config, env: Mapping[str, str] | None = None) -> Config:
    """``config`` with the audit key in its core settings (``assemble.audit_key``:
    :func:`audit_key`): what every assembler that publishes or compares audit records is made
    from (the worker's, ``latch replay``'s, ``latch assemble``'s), so that they write the same
    digests. Raises :class:`ConfigError`."""
    key = audit_key(config, env)
    return config if key is None else replace(
        config, assemble=replace(config.assemble, audit_key=key))
