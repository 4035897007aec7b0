"""The audit record tells no secret (issue 32, item 10): its argument digest is keyed.

Who reads what: the audit topic is read by a wider circle than the runners that read the
arguments (auditors, a SIEM, a data lake). The argument bytes come from the model's stream
(any text the model or a prompt injection puts there, a PIN or a door code included); the
audit key comes from the operator (``audit.keys``, read by the worker, ``AuditKey`` in the
core's settings). So an audit record must let no reader without the key find or confirm the
argument text: an unkeyed SHA-256 of a 4-digit PIN is undone by hashing 10,000 guesses.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import orjson
import pytest
from builders import CHAT, PATH_SCHEMA, PROVIDERS, check_schemas, feed, provider_run, values

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.outputs import keyed_digest, refused_audit
from worker.core.settings import AuditKey

TOOLS = {"read_file": PATH_SCHEMA}
KEY_1 = AuditKey("audit-1", b"k" * 32)
KEY_2 = AuditKey("audit-2", b"\x01" * 48)


def run(text: str, provider: str = CHAT, key: AuditKey | None = None) -> list[Emit]:
    emits = feed(Assembler(AssembleSettings(audit_key=key)),
                 provider_run(provider, "r1", TOOLS, [("call_1", "read_file", text)]))
    check_schemas(emits)
    return emits


def audit_of(emits: list[Emit]) -> dict[str, Any]:
    [audit] = values(emits, Topic.AUDIT)
    return audit


def pin_call(pin: str) -> str:
    return orjson.dumps({"path": f"/door/{pin}"}).decode()


def guesses() -> dict[str, bytes]:
    """Every 4-digit PIN, as the committed record's argument bytes would carry it."""
    return {f"{n:04d}": orjson.dumps({"path": f"/door/{n:04d}"}) for n in range(10_000)}


@pytest.mark.parametrize("key", [None, KEY_1], ids=["no-key", "keyed"])
def test_a_pin_is_not_found_again_from_its_audit_record(key: AuditKey | None) -> None:
    """An attacker who reads the audit record and hashes every 4-digit PIN the way the record
    would carry it (SHA-256, SHA-256 of the text, HMAC under a key of their own) finds no
    match: without a key the record holds no digest, with one only an HMAC under a key the
    attacker does not have. (Before, ``arguments.sha256`` named the PIN after 10,000
    hashes.)"""
    record = orjson.dumps(audit_of(run(pin_call("4711"), key=key))).decode()
    for data in guesses().values():
        assert hashlib.sha256(data).hexdigest() not in record
        assert keyed_digest(b"attacker-guess-of-the-key-000000", data) not in record
    assert "4711" not in record


def test_without_a_key_the_record_carries_the_size_only() -> None:
    """No ``audit.key_id`` configured: ``arguments`` is ``{"bytes"}`` alone, for every
    provider, committed calls and errors alike (no digest at all)."""
    for provider in PROVIDERS:
        emits = run('{"path": "/srv/a"}', provider)
        [committed] = values(emits, Topic.COMMITTED)
        assert audit_of(emits)["arguments"] == {
            "bytes": len(orjson.dumps(committed["arguments"]))}
    text = '{"path": "/srv/'
    assert audit_of(run(text))["arguments"] == {"bytes": len(text)}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_with_a_key_the_holder_checks_the_digest_against_the_record(provider: str) -> None:
    """With an audit key, ``arguments`` is the size, ``hmac`` (HMAC-SHA256 under the key of
    the bytes the committed record carries) and the key's ``key_id``: the key's holder checks
    it against the committed record; for an error, against the text received."""
    emits = run('{ "path" : "/srv/a" }', provider, KEY_1)
    [committed] = values(emits, Topic.COMMITTED)
    data = orjson.dumps(committed["arguments"])
    assert audit_of(emits)["arguments"] == {
        "bytes": len(data), "key_id": "audit-1",
        "hmac": hmac.new(KEY_1.key, data, hashlib.sha256).hexdigest()}
    text = '{"path": "/srv/é'
    failed = audit_of(run(text, provider, KEY_1))
    assert failed["arguments"]["hmac"] == keyed_digest(KEY_1.key, text.encode())


def test_keys_rotate_by_id() -> None:
    """The same arguments under two keys give two digests, each record naming its key: a
    checker that keeps the old and the new key by id checks records of both (rotation), and
    neither digest checks under the other key."""
    text = pin_call("0042")
    old, new = (audit_of(run(text, key=k))["arguments"] for k in (KEY_1, KEY_2))
    assert (old["key_id"], new["key_id"]) == ("audit-1", "audit-2")
    assert old["hmac"] != new["hmac"]
    keys = {KEY_1.key_id: KEY_1.key, KEY_2.key_id: KEY_2.key}
    data = orjson.dumps(orjson.loads(text))
    for digest in (old, new):
        assert keyed_digest(keys[digest["key_id"]], data) == digest["hmac"]
    assert keyed_digest(KEY_2.key, data) != old["hmac"]


def test_the_key_never_prints() -> None:
    """The key's bytes are in no ``repr`` of the core's settings (a log line, a traceback)."""
    settings = AssembleSettings(audit_key=AuditKey("audit-1", b"sekrit-key-bytes" * 2))
    assert "sekrit" not in repr(settings) and "sekrit" not in repr(settings.audit_key)
    assert "audit-1" in repr(settings)


def test_a_refused_outcomes_audit_record_says_refused() -> None:
    """``refused_audit``: the audit record of an outcome Kafka refused says ``refused`` with
    reason ``output_refused``, what the outcome was and Kafka's error; the same key and
    idempotency key; valid against schemas/audit.schema.json. Both a committed call and an
    error result."""
    emits = run('{"path": "/srv/a"}', key=KEY_1)
    audit = next(e for e in emits if e.topic is Topic.AUDIT)
    refused = refused_audit(audit, "MSG_SIZE_TOO_LARGE")
    assert (refused.topic, refused.key) == (audit.topic, audit.key)
    assert refused.value == {**audit.value, "outcome": "refused", "reason": "output_refused",
                             "refused": {"outcome": "committed", "reason": None,
                                         "error": "MSG_SIZE_TOO_LARGE"}}
    error = next(e for e in run('{"path"') if e.topic is Topic.AUDIT)
    refused_error = refused_audit(error, "INVALID_RECORD")
    assert refused_error.value["refused"] == {"outcome": "error", "reason": "invalid_json",
                                              "error": "INVALID_RECORD"}
    check_schemas([refused, refused_error])
