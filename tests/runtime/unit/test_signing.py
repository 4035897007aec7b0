"""Signed committed calls without a broker: the worker's signer, the runner's verifier, key
rotation, refusals counted by reason, and the key kept out of logs, reprs and errors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from worker_harness import provider_run

from worker.client.runner import Runner
from worker.core import Assembler, Topic
from worker.runtime.config import Config, ConfigError, SigningSettings, load_config
from worker.runtime.governance import signing
from worker.runtime.governance.signing import (
    KEY_ID_HEADER,
    SIGNATURE_HEADER,
    SignCommitted,
    Signer,
    Verifier,
)
from worker.runtime.hooks import EngineHooks

OLD = b"old-key-0123456789abcdef0123456789abcdef"
NEW = b"new-key-fedcba9876543210fedcba9876543210"
SECRET_TEXT = ("old-key", "new-key", OLD.hex(), NEW.hex())


def committed(call_id: str = "c1") -> bytes:
    return orjson.dumps({
        "v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat", "call_id": call_id,
        "name": "add", "index": 0, "arguments": {"a": 1, "b": 2},
        "idempotency_key": f"r1:{call_id}"})


def runner(keys: dict[str, bytes]) -> tuple[Runner, list[Any]]:
    ran: list[Any] = []

    def add(args: Any) -> int:
        ran.append(args)
        return 3

    made = Runner(Config(), {"add": add}, consumer=object(), producer=object(),
                  verifier=Verifier(keys))
    return made, ran


def assert_no_key(text: str) -> None:
    for secret in SECRET_TEXT:
        assert secret not in text, secret


def test_a_signed_call_runs_and_rotation_accepts_the_old_key_while_listed() -> None:
    """A runner holding the old and the new key runs a call signed with either (the worker
    switched key_id mid-rotation); once the old key leaves the runner, its records are
    refused as unknown_key."""
    rotating, ran = runner({"k1": OLD, "k2": NEW})
    for call_id, signer in (("c1", Signer("k1", OLD)), ("c2", Signer("k2", NEW))):
        value = committed(call_id)
        assert rotating.handle(value, None, signer.headers(value)).status == "executed"
    assert len(ran) == 2
    rotated, ran = runner({"k2": NEW})
    value = committed()
    assert rotated.handle(value, None, Signer("k1", OLD).headers(value)).status == "rejected"
    assert ran == [] and rotated.metrics.rejected["unknown_key"] == 1


def test_unsigned_or_mis_signed_records_are_refused_counted_and_not_run(
        caplog: pytest.LogCaptureFixture) -> None:
    """An unknown key id, a changed byte of the value, a changed signature, a missing header
    (either one), and a record signed with a different key under a known id: nothing runs,
    each counts tool_execute_rejected_not_committed_total under its reason; no log record
    holds a key."""
    made, ran = runner({"k1": OLD})
    value = committed()
    good = Signer("k1", OLD).headers(value)
    signature = dict(good)[SIGNATURE_HEADER]
    flipped = value.replace(b'"a":1', b'"a":7')
    cases = [
        (value, Signer("k9", OLD).headers(value), "unknown_key"),
        (flipped, good, "bad_signature"),
        (value, [good[0], (SIGNATURE_HEADER, signature[:-1] + b"0")], "bad_signature"),
        (value, Signer("k1", NEW).headers(value), "bad_signature"),
        (value, [good[0]], "unsigned"),
        (value, [good[1]], "unsigned"),
        (value, None, "unsigned"),
    ]
    with caplog.at_level(logging.DEBUG):
        for record, headers, reason in cases:
            outcome = made.handle(record, None, headers)
            assert (outcome.status, outcome.reason) == ("rejected", reason)
    assert ran == []
    assert {k: v for k, v in made.metrics.rejected.items() if v} == {
        "unknown_key": 1, "bad_signature": 3, "unsigned": 3}
    assert made.handle(value, None, good).status == "executed"
    assert_no_key(caplog.text + repr(made.verifier) + repr(Signer("k1", OLD)))
    made.metrics.shutdown()


def test_without_keys_a_runner_checks_no_signature() -> None:
    """A runner with no signing keys runs an unsigned committed call (signing is optional)."""
    made, ran = runner({})
    assert made.handle(committed(), None, None).status == "executed" and len(ran) == 1


def test_keys_load_from_files_and_the_environment(tmp_path: Path) -> None:
    """signing.keys names a file (its bytes, surrounding whitespace removed) or a variable;
    the worker's signer reads only the active key (the old one may be the runners' alone),
    and what it signs the runners' verifier accepts."""
    (tmp_path / "k1").write_bytes(OLD + b"\n")
    (tmp_path / "latch.yaml").write_text(
        f"signing:\n  key_id: k2\n  keys: {{k1: 'file:{tmp_path / 'k1'}', k2: 'env:K2'}}\n")
    config = load_config(tmp_path / "latch.yaml", env={})
    assert signing.load_keys(config.signing, env={"K2": NEW.decode()}) == {"k1": OLD, "k2": NEW}
    worker_side = Config(signing=SigningSettings("k2", {"k1": "file:/nowhere", "k2": "env:K2"}))
    made = signing.signer(worker_side, env={"K2": NEW.decode()})
    assert made is not None and made.key_id == "k2"
    value = committed()
    assert signing.verifier(config, env={"K2": NEW.decode()}).refusal(
        value, made.headers(value)) is None
    assert signing.signer(Config()) is None and not signing.verifier(Config()).required


def test_a_bad_key_setting_is_a_config_error_that_never_shows_a_key(tmp_path: Path) -> None:
    """A missing file, an unset variable, a key shorter than 32 bytes, an active key id not
    among the keys, and a key written inline instead of file:/env: each is a ConfigError
    naming the setting; none of the messages (nor the config's repr) holds key bytes."""
    short = tmp_path / "short"
    short.write_bytes(OLD[:20])
    settings = SigningSettings(None, {"a": f"file:{tmp_path / 'missing'}", "b": "env:NOPE",
                                      "c": f"file:{short}"})
    with pytest.raises(ConfigError) as raised:
        signing.load_keys(settings, env={})
    text = str(raised.value)
    assert "signing.keys.a" in text and "NOPE" in text and "shorter than 32" in text
    assert_no_key(text)
    with pytest.raises(ConfigError, match=r"signing\.key_id: k3 is not one of signing\.keys"):
        signing.signer(Config(signing=SigningSettings("k3", {"k1": "env:K1"})), env={})
    with pytest.raises(ConfigError) as raised:
        load_config(None, env={"LATCH_SIGNING__KEYS": f"{{k1: '{OLD.decode()}'}}"})
    assert "signing.keys.k1" in str(raised.value)
    assert_no_key(str(raised.value) + repr(Config(signing=settings)))


def test_the_worker_signs_its_committed_calls_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With signing.key_id set, the signing step (``SignCommitted``: ``Driver.sign``, in the
    outgoing chain both engines send through) adds the key id and the signature of the value to a
    committed call, after its trace headers (``EngineHooks.headers``, telemetry only), and
    nothing to the run's other outputs; a runner with the key runs the call."""
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                     "LATCH_SIGNING__KEY_ID": "k1",
                                     "LATCH_SIGNING__KEYS": "{k1: 'env:LATCH_TEST_K1'}"})
    monkeypatch.setenv("LATCH_TEST_K1", OLD.decode())
    hooks = EngineHooks(config)
    sign = SignCommitted(signing.signer(config))
    made, ran = runner({"k1": OLD})
    assembler, signed = Assembler(), []
    run = provider_run("openai.chat", "r1", [("c1", "read_file", '{"path": "a"}')])
    for envelope in run:
        for emit in assembler.feed_record(b"r1", orjson.dumps(envelope)):
            value = orjson.dumps(emit.value)
            headers = sign(emit, value, hooks.headers(emit))
            names = [name for name, _ in headers or ()]
            if emit.topic is Topic.COMMITTED:
                assert names[-2:] == [KEY_ID_HEADER, SIGNATURE_HEADER]
                made.tools[emit.value["name"]] = made.tools["add"]
                signed.append(made.handle(value, None, headers).status)
            else:
                assert KEY_ID_HEADER not in names and SIGNATURE_HEADER not in names
    assert signed == ["executed"] and ran == [{"path": "a"}]  # the call ran, with its args
    hooks.stop(None)
