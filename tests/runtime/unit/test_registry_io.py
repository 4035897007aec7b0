"""The registry topic on Kafka (worker/runtime/governance/registry_io.py): ``latch registry
put|list|show``, its arguments, what it refuses before it writes and its messages and exit
codes (no broker: the registry read and the producer are fakes), and the reader's follower.

The registry reader's follower thread (issue 32): a Kafka error
that ends its consumer is reported (a log line, ``/readyz`` not ready with the error,
``latch_registry_following`` 0) and a new consumer resumes at the next offset; before issue 32
the thread ended on the error and nothing in health said so. No broker: the consumers are
fakes that fail or deliver the way confluent-kafka's do."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import chat_tool
from confluent_kafka import KafkaError, KafkaException

from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.governance import registry, registry_io
from worker.runtime.governance.registry import POLICY, TOOLSET, RegistryState
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads

GOOD = '@id("all")\npermit(principal, action, resource);\n'


class _Message:
    def __init__(self, key: bytes, value: bytes, offset: int) -> None:
        self._key, self._value, self._offset = key, value, offset

    def error(self) -> None:
        return None

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 2, 1_000


class _Fatal:
    """A message carrying a fatal error, as ``poll`` returns one."""

    def error(self) -> KafkaError:
        return KafkaError(KafkaError._FATAL, "fatal: the consumer is unusable", fatal=True)


class _Consumer:
    """``poll`` answers from ``script`` (a message, an exception to raise, or None), then
    None; records what it was assigned and whether it was closed."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.assigned, self.closed = list(script), [], False

    def poll(self, timeout: float) -> Any:
        if self.closed:
            raise RuntimeError("Consumer closed")
        if not self.script:
            time.sleep(min(timeout, 0.01))
            return None
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def assign(self, partitions: list[Any]) -> None:
        self.assigned.append([(p.topic, p.partition, p.offset) for p in partitions])

    def close(self) -> None:
        self.closed = True


def _wait(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def fast_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_io, "RESUME_AFTER_S", 0.05)


@pytest.mark.parametrize("failure", [
    KafkaException(KafkaError(KafkaError._TRANSPORT, "broker gone")),
    _Fatal(),
], ids=["poll raises", "fatal error"])
def test_a_kafka_error_is_reported_and_a_new_consumer_resumes(
        failure: Any, fast_resume: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The first consumer reads policy version 1 at offset 0, then fails; while it is
    broken ``/readyz`` is not ready and says why, and ``latch_registry_following`` is 0; a
    new consumer is assigned at offset 1 (nothing read twice, nothing skipped), reads version
    2, and the reader reports following again."""
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0",
                                    "LATCH_POLICY__MODE": "enforce"})
    hooks = EngineHooks(config)
    driver = Driver(config, hooks, Heads({}, 3600))
    reader = registry_io.RegistryReader(config)
    driver.registry = reader
    first = _Consumer([_Message(*registry.encode(POLICY, "", 1, GOOD), 0), failure])
    gate = threading.Event()
    second = _Consumer([])

    def make(_config: Any) -> _Consumer:
        gate.wait(10)  # (the test looks at the broken state before the new consumer reads)
        second.script.append(_Message(*registry.encode(POLICY, "", 2, GOOD + " "), 1))
        return second

    monkeypatch.setattr(registry_io, "_consumer", make)
    reader._consumer = first
    with caplog.at_level(logging.ERROR, logger="latch.worker"):
        reader._thread.start()
        try:
            _wait(lambda: reader.failure is not None)
            assert reader.latest_policy() == 1 and first.closed
            ready, body = hooks.health.ready()
            assert not ready and body["registry"]["following"] is False
            assert body["registry"]["error"] == reader.failure
            assert "latch_registry_following 0.0" in hooks.metrics.exposition().decode()
            gate.set()
            _wait(lambda: reader.latest_policy() == 2)
            _wait(lambda: reader.failure is None)
            assert second.assigned == [[(config.topics.registry, 0, 1)]]
            assert hooks.health.ready()[1]["registry"] == {"following": True, "error": None}
            assert "latch_registry_following 1.0" in hooks.metrics.exposition().decode()
        finally:
            gate.set()
            reader.stop()
    assert not reader._thread.is_alive()
    assert [r for r in caplog.records if "registry reader" in r.getMessage()]


# -- latch registry ---------------------------------------------------------------------------


def _registry_state() -> RegistryState:
    """A registry holding toolset files 1, a conflicting second files 1, policy set 2 and a
    record that is not JSON."""
    state = RegistryState()
    for offset, (kind, name, version, content) in enumerate([
            (TOOLSET, "files", 1, [chat_tool("read_file")]),
            (TOOLSET, "files", 1, [chat_tool("write_file")]),
            (POLICY, "", 2, GOOD)]):
        state.apply(*registry.encode(kind, name, version, content), offset, 1_000 + offset)
    state.apply(b"toolset/x/1", b"nope", 3, 1_003)
    return state


class _Producer:
    """Delivers each record (``error``: fails it with that message), keeping what it got."""

    def __init__(self, error: str | None = None) -> None:
        self.error, self.records = error, list[tuple[str, bytes, bytes, int]]()

    def produce(self, topic: str, key: bytes, value: bytes, partition: int,
                on_delivery: Callable[[Any, Any], None]) -> None:
        self.records.append((topic, key, value, partition))
        on_delivery(None if self.error is None else KafkaError(KafkaError._MSG_TIMED_OUT,
                                                               self.error), None)

    def flush(self, timeout: float) -> int:
        return 0


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str, str]]:
    """``latch registry`` with a configuration file, the registry read as
    :func:`_registry_state` and a producer that delivers (``cli.producer``); returns the exit
    code, stdout and stderr. No broker."""
    config = tmp_path / "latch.yaml"
    config.write_text("topics:\n  registry: reg.topic\n")
    producer = _Producer()
    monkeypatch.setattr(registry_io, "read_whole", lambda _config: _registry_state())
    monkeypatch.setattr(registry_io, "Producer", lambda _settings: producer)

    def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
        code = registry_io.main(["--config", str(config), *argv])
        out, err = capsys.readouterr()
        return code, out, err

    run.producer = producer  # type: ignore[attr-defined]
    return run


@pytest.mark.parametrize("argv", [
    [], ["drop"], ["put"], ["put", "toolset", "files", "--tools", "t.json"],
    ["put", "policy", "--version", "one", "--file", "p.cedar"], ["show", "prompt", "1"],
    ["show", "policy"],
], ids=["no_action", "unknown_action", "no_kind", "no_version", "version_not_int",
        "unknown_kind", "nothing_to_show"])
def test_registry_arguments_that_do_not_parse_are_a_usage_error(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``latch registry`` without an action or a kind, ``put`` without ``--version`` (or
    with one that is no integer), ``show`` of another kind or of nothing: argparse's usage
    error (exit 2, ``usage: latch registry``), before any configuration is read."""
    with pytest.raises(SystemExit) as exited:
        registry_io.main(argv)
    assert exited.value.code == 2
    assert "usage: latch registry" in capsys.readouterr().err


def test_registry_put_refuses_what_it_cannot_read_before_kafka(
        tmp_path: Path, cli: Callable[..., tuple[int, str, str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """``put`` refuses, with exit 2 and one line naming the file or the flag, a version below
    1, a tools file that is missing or not JSON (line and column), and a policy file that is
    not UTF-8; nothing is written."""
    missing = tmp_path / "missing.json"
    not_json = tmp_path / "tools.json"
    not_json.write_text('[{"type": "function",\n oops}]')
    latin = tmp_path / "p.cedar"
    latin.write_bytes(b"// caf\xe9\n" + GOOD.encode())
    tools = tmp_path / "good.json"
    tools.write_bytes(orjson.dumps([chat_tool("read_file")]))
    for argv, message in [
            (["put", "toolset", "files", "--version", "0", "--tools", str(tools)],
             "--version must be a positive integer"),
            (["put", "toolset", "files", "--version", "3", "--tools", str(missing)],
             f"cannot read {missing}: No such file or directory"),
            (["put", "toolset", "files", "--version", "3", "--tools", str(not_json)],
             f"{not_json} is not JSON: "),
            (["put", "policy", "--version", "3", "--file", str(latin)],
             f"{latin} is not UTF-8 text")]:
        code, out, err = cli(*argv, capsys=capsys)
        assert (code, out) == (registry_io.EXIT_USAGE, ""), argv
        assert err.startswith("latch registry: ") and message in err, err
    assert "(line 2, column 2)" in cli("put", "toolset", "files", "--version", "3", "--tools",
                                       str(not_json), capsys=capsys)[2]
    assert cli.producer.records == []  # type: ignore[attr-defined]


def test_registry_put_writes_a_new_version_and_refuses_an_existing_one(
        tmp_path: Path, cli: Callable[..., tuple[int, str, str]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """``put`` of a version the registry holds is refused (exit 2) with its offset and
    digest and the next version to register; a new one is written to the registry topic's
    partition 0 under its key and said so (exit 0)."""
    tools = tmp_path / "tools.json"
    tools.write_bytes(orjson.dumps([chat_tool("read_file")]))
    code, out, err = cli("put", "toolset", "files", "--version", "1", "--tools", str(tools),
                         capsys=capsys)
    assert code == registry_io.EXIT_USAGE and out == ""
    assert "toolset files version 1 exists already (offset 0, digest" in err
    assert "versions are immutable: register version 2" in err
    code, out, err = cli("put", "toolset", "files", "--version", "2", "--tools", str(tools),
                         capsys=capsys)
    assert code == registry_io.EXIT_OK and err == ""
    assert out.startswith("registered toolset files version 2 (") and " as toolset/files/2/" \
        in out
    [(topic, key, value, partition)] = cli.producer.records  # type: ignore[attr-defined]
    assert (topic, partition) == ("reg.topic", 0) and key.startswith(b"toolset/files/2/")
    assert orjson.loads(value)["tools"] == [chat_tool("read_file")]


def test_registry_put_reports_a_failed_delivery_or_an_unreadable_registry(
        tmp_path: Path, cli: Callable[..., tuple[int, str, str]],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A record the producer could not deliver, or a registry that cannot be read: exit 1
    with one line saying so."""
    policy = tmp_path / "p.cedar"
    policy.write_text(GOOD)
    cli.producer.error = "timed out"  # type: ignore[attr-defined]
    code, _, err = cli("put", "policy", "--version", "3", "--file", str(policy), capsys=capsys)
    assert code == registry_io.EXIT_KAFKA and "latch registry: not registered: " in err

    def unreadable(_config: Any) -> RegistryState:
        raise registry_io.RegistryError("cannot read topic reg.topic: broker down")

    monkeypatch.setattr(registry_io, "read_whole", unreadable)
    code, _, err = cli("list", capsys=capsys)
    assert (code, err) == (registry_io.EXIT_KAFKA,
                           "latch registry: cannot read topic reg.topic: broker down\n")


def test_registry_list_and_show(cli: Callable[..., tuple[int, str, str]],
                                capsys: pytest.CaptureFixture[str]) -> None:
    """``list``: every version with its digest, offset and size, then each conflict and each
    invalid record; ``show`` prints a toolset's tools as JSON and a policy set's text; a
    version not held, or a ``show`` of the wrong shape, is a usage error naming it."""
    code, out, _ = cli("list", capsys=capsys)
    lines = out.splitlines()
    assert code == registry_io.EXIT_OK and len(lines) == 4
    assert lines[0].startswith("policy 2  digest ") and lines[0].endswith(
        f"offset 2  {len(GOOD)} bytes")
    assert lines[1].startswith("toolset files 1  digest ") and lines[1].endswith(
        "offset 0  1 tools")
    assert lines[2].startswith("CONFLICT toolset files 1: offset 1 (digest ")
    assert lines[3].startswith("INVALID record at offset 3: not JSON")
    code, out, _ = cli("show", "toolset", "files", "1", capsys=capsys)
    assert code == registry_io.EXIT_OK and orjson.loads(out) == [chat_tool("read_file")]
    assert cli("show", "policy", "2", capsys=capsys)[:2] == (registry_io.EXIT_OK, GOOD)
    for argv, message in [(["show", "toolset", "files", "9"], "no toolset files version 9"),
                          (["show", "policy", "9"], "no policy version 9"),
                          (["show", "toolset", "1"], "show toolset NAME VERSION"),
                          (["show", "policy", "two"], "show policy VERSION")]:
        code, out, err = cli(*argv, capsys=capsys)
        assert (code, out) == (registry_io.EXIT_USAGE, "") and message in err, argv


def test_registry_with_a_configuration_that_does_not_load_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A configuration file that cannot be used stops ``latch registry`` with exit 2 and the
    configuration's message, before Kafka."""
    config = tmp_path / "latch.yaml"
    config.write_text("registry:\n  wait_s: soon\n")
    assert registry_io.main(["--config", str(config), "list"]) == registry_io.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("latch registry: ") and "registry.wait_s" in err
