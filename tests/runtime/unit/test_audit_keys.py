"""The audit key and the refused outcome's audit record, around the core (issue 32, item 10).

Authors: the ``audit`` section is the operator's (latch.yaml, ``LATCH_AUDIT__*``); the key's
bytes are the operator's secret, in a file or variable, never in the configuration, a log line
or an error message. Which outputs Kafka refuses is the broker's answer; the driver turns a
refused outcome's audit record into ``refused`` for both engines (``Driver.outgoing``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import driving
import orjson
import pytest
from builders import chat_calls, chat_run, chat_tool

from worker.core import Topic
from worker.core.outputs import keyed_digest
from worker.runtime import step
from worker.runtime.config import ConfigError, load_config
from worker.runtime.driver import Driver
from worker.runtime.governance.signing import audit_key, with_audit_key
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads
from worker.runtime.step import Record

KEY = "audit-key-bytes-" * 3
_NAMES = {topic: f"t.{topic.value}" for topic in Topic}


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty directory (no stray latch.yaml); the worker's variable holds the audit key."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUDIT_KEY", KEY)


def keyed_env(**more: str) -> dict[str, str]:
    return {"LATCH_AUDIT__KEY_ID": "a2", "LATCH_WORKER__HTTP_PORT": "0",
            "LATCH_AUDIT__KEYS": '{"a1": "env:OLD_AUDIT_KEY", "a2": "env:AUDIT_KEY"}',
            "AUDIT_KEY": KEY, **more}


def test_the_audit_section_names_keys_by_id_and_the_key_is_read_only_where_used() -> None:
    """``audit.key_id`` and ``audit.keys`` load like ``signing``'s; loading the configuration
    reads no key (a tool that never digests needs none), :func:`audit_key` reads only the
    active key (the old one may be gone from this host), and the core's settings get it from
    :func:`with_audit_key`."""
    config = load_config(env=keyed_env())
    assert config.audit.key_id == "a2" and dict(config.audit.keys) == {
        "a1": "env:OLD_AUDIT_KEY", "a2": "env:AUDIT_KEY"}
    assert config.assemble.audit_key is None
    key = audit_key(config, keyed_env())
    assert key is not None and (key.key_id, key.key) == ("a2", KEY.encode())
    assert with_audit_key(config, keyed_env()).assemble.audit_key == key
    assert audit_key(load_config(env={}), {}) is None
    assert with_audit_key(load_config(env={}), {}) == load_config(env={})


def test_a_key_from_a_file(tmp_path: Path) -> None:
    """``file:PATH``: the file's bytes, surrounding whitespace removed."""
    (tmp_path / "audit.key").write_bytes(KEY.encode() + b"\n")
    config = load_config(env={"LATCH_AUDIT__KEY_ID": "f",
                              "LATCH_AUDIT__KEYS": f'{{"f": "file:{tmp_path / "audit.key"}"}}'})
    key = audit_key(config, {})
    assert key is not None and key.key == KEY.encode()


@pytest.mark.parametrize(("env", "problem"), [
    ({"AUDIT_KEY": ""}, "audit.keys.a2: the variable AUDIT_KEY is not set"),
    ({"AUDIT_KEY": "short-but-secret"}, "audit.keys.a2: the key is shorter than 32 bytes"),
    ({"LATCH_AUDIT__KEY_ID": "a9"}, "audit.key_id: a9 is not one of audit.keys"),
])
def test_an_unusable_key_is_a_config_error_that_never_shows_it(
        env: dict[str, str], problem: str) -> None:
    """A missing variable, a key shorter than 32 bytes, or an active id not listed stops the
    worker with the key's id and where it was looked for, never the key's bytes."""
    environ = {k: v for k, v in keyed_env(**env).items() if v}
    with pytest.raises(ConfigError) as caught:
        audit_key(load_config(env=environ), environ)
    assert problem in str(caught.value)
    assert "short-but-secret" not in str(caught.value)


def test_an_inline_key_written_by_mistake_is_never_echoed() -> None:
    """A key pasted into ``audit.keys`` instead of ``file:``/``env:`` fails validation
    without the value in the message."""
    with pytest.raises(ConfigError) as caught:
        load_config(env={"LATCH_AUDIT__KEYS": '{"a1": "hunter2hunter2hunter2hunter2hunter2"}'})
    assert "hunter2" not in str(caught.value) and "audit.keys.a1" in str(caught.value)


def test_the_worker_digests_with_the_key_and_never_prints_it() -> None:
    """The driver's assemblers (every partition it takes over) digest with the key: an audit
    record's ``hmac`` checks under it; neither the driver's settings nor the config print
    it."""
    driver, state = keyed_driver()
    emits = applied(driver, state)
    [committed] = [e.value for e in emits if e.topic is Topic.COMMITTED]
    audit = next(e.value for e in emits if e.topic is Topic.AUDIT)
    data = orjson.dumps(committed["arguments"])
    assert audit["arguments"] == {"bytes": len(data), "hmac": keyed_digest(KEY.encode(), data),
                                  "key_id": "a2"}
    assert KEY not in repr(driver.assemble) and KEY not in repr(driver.config)


def test_registry_require_toolsets_for_reaches_the_core() -> None:
    """``registry.require_toolsets_for`` is read (a list, or ``*``) and the core's settings
    carry it, so every assembler the worker, replay or assemble makes refuses the same runs."""
    config = load_config(env={"LATCH_REGISTRY__REQUIRE_TOOLSETS_FOR": "acme,globex"})
    assert config.registry.require_toolsets_for == ("acme", "globex")
    assert config.assemble.require_toolsets_for == ("acme", "globex")
    star = load_config(env={"LATCH_REGISTRY__REQUIRE_TOOLSETS_FOR": "*"})
    assert star.assemble.require_toolsets_for == ("*",)


# -- a refused outcome's audit record ---------------------------------------------------------


def keyed_driver() -> tuple[Driver, Any]:
    """A driver configured with audit key ``a2`` (read from the process's ``AUDIT_KEY``, as
    the worker reads it), and the state of a partition it took over."""
    config = load_config(env=keyed_env())
    driver = Driver(config, EngineHooks(config), Heads({}, 3600))
    return driver, driver.takeover(0, 0).state


def records(run_id: str, first: int = 0) -> Iterator[Record]:
    tools = [chat_tool("get_weather", {"type": "object"})]
    envelopes = chat_run(run_id, tools, chat_calls([("c1", "get_weather", '{"city": "Oslo"}'),
                                                    ("c2", "get_weather", '{"city": ')]))
    for n, envelope in enumerate(envelopes):
        yield step.record(run_id.encode(), orjson.dumps(envelope), 1_000 + n, "ev", 0, first + n)


def applied(driver: Driver, state: Any, run_id: str = "r1", first: int = 0) -> list[Any]:
    return [e for r in records(run_id, first) if (a := driving.apply(driver, state, r))
            for e in a.emits]


def test_an_audit_record_after_its_outcome_refused_for_size_says_refused() -> None:
    """The committed topic takes less than the committed call: the call goes to the DLQ as
    ``output_refused`` (as before) and its audit record, sent after it, says ``refused``,
    ``output_refused``, what the outcome was and Kafka's error, with the same idempotency key;
    the other call's error result and audit record are unchanged. (Before: ``committed``.)"""
    driver, state = keyed_driver()
    emits = applied(driver, state)
    committed = next(e for e in emits if e.topic is Topic.COMMITTED)
    driver.limits.update({_NAMES[Topic.COMMITTED]: 200})
    sent = list(driver.outgoing(b"r1", emits, _NAMES, step.Source("ev", 0, 9)))
    audits = [orjson.loads(o.value) for o in sent if o.topic is Topic.AUDIT]
    assert [o.topic for o in sent][:2] == [Topic.DLQ, Topic.AUDIT]
    first, second = audits
    assert (first["outcome"], first["reason"]) == ("refused", "output_refused")
    assert first["refused"] == {"outcome": "committed", "reason": None,
                                "error": "MSG_SIZE_TOO_LARGE"}
    assert first["idempotency_key"] == committed.value["idempotency_key"]
    assert first["arguments"]["key_id"] == "a2"
    assert (second["outcome"], second["reason"]) == ("error", "invalid_json")
    assert "refused" not in second


def test_a_refusal_the_engine_learns_later_rewrites_the_audit_record_sent_after() -> None:
    """An engine that learns of a refusal from the broker (the faust engine at the send's
    future, the kafka engine on the aborted transaction's next try) replaces the outcome with
    :meth:`Driver.refused`; the audit record it sends afterwards says ``refused``, with
    Kafka's error. Only that outcome's: another run's audit record with the same call id is
    untouched, and a second pass of the same audit (already sent) is not refused again."""
    driver, state = keyed_driver()
    emits = applied(driver, state)
    other = applied(driver, state, "r2", 100)
    committed = next(e for e in emits if e.topic is Topic.COMMITTED)
    audit = next(e for e in emits if e.topic is Topic.AUDIT)
    other_audit = next(e for e in other if e.topic is Topic.AUDIT)
    driver.refused(committed, _NAMES[Topic.COMMITTED], b"r1", 5_000, "INVALID_RECORD", b"r1",
                   None)
    [other_sent] = driver.outgoing(b"r2", [other_audit], _NAMES)
    assert orjson.loads(other_sent.value)["outcome"] == "committed"
    [sent] = driver.outgoing(b"r1", [audit], _NAMES)
    value = orjson.loads(sent.value)
    assert (value["outcome"], value["refused"]["error"]) == ("refused", "INVALID_RECORD")
    [again] = driver.outgoing(b"r1", [audit], _NAMES)
    assert orjson.loads(again.value)["outcome"] == "committed"


def test_the_refusals_a_driver_remembers_are_bounded() -> None:
    """Refused outcomes whose audit records never pass (a list filtered by its caller) are
    not kept without bound."""
    driver, state = keyed_driver()
    committed = next(e for e in applied(driver, state) if e.topic is Topic.COMMITTED)
    for n in range(5_000):
        emit = type(committed)(committed.topic, f"r{n}", committed.value)
        driver.refused(emit, "t", None, 10, "INVALID_RECORD", None, None)
    assert len(driver._refused) <= 1024


def test_latch_assemble_digests_as_the_worker_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``latch assemble`` reads the audit key as the worker does (its audit records are the
    worker's), and stops with the key's id, not a traceback, when the key is missing."""
    from worker import cli

    for name, value in keyed_env().items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in chat_run(
        "r1", [chat_tool("get_weather", {"type": "object"})],
        chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))))
    assert cli.main(["assemble", str(path)]) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    [audit] = [line["value"] for line in lines if line["topic"] == "audit"]
    data = orjson.dumps({"city": "Oslo"})
    assert audit["arguments"] == {"bytes": len(data), "hmac": keyed_digest(KEY.encode(), data),
                                  "key_id": "a2"}
    monkeypatch.delenv("AUDIT_KEY")
    assert cli.main(["assemble", str(path)]) == 2
    assert "audit.keys.a2: the variable AUDIT_KEY is not set" in capsys.readouterr().err


def test_an_outcome_sent_again_and_not_refused_is_audited_as_it_is() -> None:
    """A refusal noted in a try that did not end (the kafka engine's transaction aborted for
    another reason before the audit record went) does not stick: when the outcome is sent
    again (the retry) and its topic takes it, its audit record says ``committed``."""
    driver, state = keyed_driver()
    emits = applied(driver, state)
    committed = next(e for e in emits if e.topic is Topic.COMMITTED)
    driver.refused(committed, _NAMES[Topic.COMMITTED], b"r1", 5_000, "MSG_SIZE_TOO_LARGE",
                   b"r1", None)  # the first try, aborted before its audit record
    sent = list(driver.outgoing(b"r1", emits, _NAMES))  # the retry: the topic takes it
    audit = orjson.loads(next(o.value for o in sent if o.topic is Topic.AUDIT))
    assert (audit["outcome"], audit["reason"]) == ("committed", None)
