"""``latch demo`` as a user runs it: a subprocess, a real broker, a real worker.

The demo gets its own topic names and worker ``app_id`` (so its consumer group and changelog
are fresh), provisions them itself, and must print the documented outcomes of
``examples/demo.jsonl``: five committed calls (one of them Gemini's), a cancelled call, a
``stream_error`` and an ``invalid_json`` error, Bedrock's ``glob_search`` denied by the shipped
``examples/demo.cedar`` in ``enforce`` (``policy_denied``), one final message per run; and the
result latch (issue 36): four committed calls answered by the demo playing the runner, the
Anthropic run's left to the latch, which answers it ``tool_timeout``, one turn record per run,
the messages of the Anthropic and a chat run shown, and ``latch results`` reading the turn
record back. The topics are deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from worker.tools import broker

TOPICS = ("events", "control", "committed", "errors", "final", "progress", "dlq", "audit",
          "results", "journal", "pending", "registry", "run_ended", "turns")


def latch_demo(config: Path, *args: str, env: dict[str, str] | None = None,
               timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "demo", "--config", str(config), *args],
        cwd=config.parent, text=True, capture_output=True, timeout=timeout, check=False,
        env=env,
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.is_file() and "State:\tZ" in status.read_text())


def write_config(path: Path, bootstrap: str, partitions: int = 3) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    topics: dict[str, Any] = {name: f"latch-test.demo.{tag}.{name}" for name in TOPICS}
    topics["partitions"] = partitions
    settings = {
        "kafka": {"bootstrap_servers": bootstrap},
        "topics": topics,
        # no fixed port: demos of parallel tests (pytest-xdist) would race for 9464
        "worker": {"app_id": f"latch-test-demo-{tag}", "web_port": 0, "http_port": 0},
    }
    path.write_text(yaml.safe_dump(settings))
    return settings


def delete_topics(admin: AdminClient, settings: dict[str, Any]) -> None:
    names = [settings["topics"][t] for t in TOPICS]
    names.append(f"{settings['worker']['app_id']}-heads-changelog")
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [n for n in names if n in existing]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            with contextlib.suppress(KafkaException):
                future.result(timeout=60)


@pytest.fixture
def demo_config(kafka_bootstrap: str, kafka_admin: AdminClient,
                tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "latch.yaml"
    settings = write_config(path, kafka_bootstrap)
    yield path
    delete_topics(kafka_admin, settings)


def check_outcomes(out: str) -> str:
    """Assert the demo's documented outcomes; return the run id prefix it used."""
    prefix = re.search(r"run ids under (demo-[0-9a-f]{6}/)", out)
    assert prefix, out
    p = re.escape(prefix.group(1))
    expected = [
        rf"committed {p}chat-parallel call_\w+ GetWeatherArgs "
        r'\{"city": "Edinburgh", "country": "GB", "units": "c"\}',
        rf'committed {p}chat-parallel call_\w+ get_stock_price \{{"ticker": "AAPL"',
        rf'committed {p}anthropic-tool-use toolu_\w+ get_weather \{{"location": "Paris"\}}',
        rf'committed {p}responses-call call_kL0PCQV7M2WMoVX8V8OtYSAL get_capital',
        rf"errors {p}bedrock-kimi-tool-use functions\.glob_search:0 glob_search failed "
        r"policy_denied: forbidden by policy glob-only-under-srv",
        rf'committed {p}gemini-partial-args latch-0-0-{p}gemini-partial-args writeItems '
        r'\{"operations": \[\{"action": "add"',
        rf"errors {p}chat-cancelled call_\w+ get_weather cancelled cancelled: user_stop",
        rf"errors {p}anthropic-broken-stream toolu_\w+ updateIssueList failed stream_error",
        rf"errors {p}chat-invalid-json call_\w+ GetWeatherArgs failed invalid_json: ",
        rf"final {p}chat-parallel completed 2 calls \(2 committed\)",
        rf"final {p}chat-cancelled cancelled 1 call \(1 cancelled\)",
        rf"final {p}anthropic-broken-stream failed 1 call",
        rf"final {p}bedrock-kimi-tool-use completed 1 call \(1 failed\)",
        rf"final {p}gemini-partial-args completed 1 call \(1 committed\)",
    ]
    for pattern in expected:
        assert re.search(pattern, out), f"{pattern!r} not in:\n{out}"
    assert len(re.findall(rf" final {p}", out)) == 8, out
    assert len(re.findall(r" committed demo-", out)) == 5, out
    assert not re.search(rf"committed {p}bedrock-kimi-tool-use", out), out
    assert re.search(r"done in [\d.]+s: 8 runs, 5 committed calls, 4 error results "
                     r"\(1 cancelled, 1 invalid_json, 1 policy_denied, 1 stream_error\), "
                     r"0 dead letters", out), out
    assert "policy enforce: 1 call denied (policy_denied), not committed" in out
    # one call waits for a person (demo.cedar's @approval), the demo approves it, it commits
    pending = re.search(rf"pending {p}chat-parallel (call_\w+) get_stock_price waits for "
                        r"approval", out)
    assert pending, out
    approved = out.index(f"(approved {prefix.group(1)}chat-parallel {pending.group(1)}")
    committed = out.index(f"committed {prefix.group(1)}chat-parallel {pending.group(1)}")
    assert out.index(pending.group(0)) < approved < committed, out
    assert ("approvals: 1 call waited for a person (tool.calls.pending) and was approved, "
            "then committed") in out
    check_result_latch(out, prefix.group(1))
    return prefix.group(1)


def check_result_latch(out: str, prefix: str) -> None:
    """The result latch in the demo's output: the Anthropic run's call left to the latch and
    answered ``tool_timeout`` (its result line before its turn record, after its final), every
    other committed call answered by the demo's runner, one turn record per run (two
    providers' messages shown) and the summary line."""
    p = re.escape(prefix)
    left = re.search(rf"\(the demo's runner leaves {p}anthropic-tool-use (toolu_\w+) unanswered "
                     r"on purpose: the latch answers it tool_timeout after results\.deadline_s, "
                     r"5s\)", out)
    assert left, out
    timeout = re.search(rf" results {p}anthropic-tool-use {left.group(1)} get_weather error "
                        r"tool_timeout by latch: tool_timeout: no result within the call's "
                        r"deadline \(5 s\)", out)
    assert timeout, out
    turn = out.index(f" turns {prefix}anthropic-tool-use anthropic.messages 1 call "
                     "(tool_timeout), 1 message")
    assert out.index(f" final {prefix}anthropic-tool-use") < timeout.start() < turn
    assert len(re.findall(rf"\(the demo's runner answered {p}", out)) == 4, out
    expected = [
        rf"turns {p}chat-parallel openai\.chat 2 calls \(answered, answered\), 2 messages",
        rf"turns {p}responses-call openai\.responses 1 call \(answered\), 1 message",
        rf"turns {p}gemini-partial-args google\.gemini 1 call \(answered\), 1 message",
        rf"turns {p}bedrock-kimi-tool-use bedrock\.converse 1 call \(failed policy_denied\)",
        rf"turns {p}chat-cancelled openai\.chat 1 call \(failed cancelled\)",
        rf"turns {p}anthropic-broken-stream anthropic\.messages 1 call \(failed stream_error\)",
        rf"turns {p}chat-invalid-json openai\.chat 1 call \(failed invalid_json\)",
        # the messages of two runs of two providers, ready to append
        rf"{p}anthropic-tool-use \(anthropic\.messages\): the next request is its history \+ "
        r"the final message \+ this\n +\{\"role\":\"user\",\"content\":\[\{\"type\":"
        r"\"tool_result\",\"tool_use_id\":\"toolu_\w+\",\"content\":\"tool_timeout: [^\n]*"
        r"\"is_error\":true\}\]\}",
        rf"{p}chat-parallel \(openai\.chat\): the next request is its history \+ the final "
        r"message \+ these\n +\{\"role\":\"tool\",\"tool_call_id\":\"call_\w+\",\"content\":"
        r"\"made-up result of GetWeatherArgs \(latch demo\)\"\}",
    ]
    for pattern in expected:
        assert re.search(pattern, out), f"{pattern!r} not in:\n{out}"
    assert len(re.findall(rf" turns {p}", out)) == 8, out
    assert ("results: 4 answered by the demo's runner, 1 tool_timeout (answered by the latch), "
            "8 turn records") in out
    assert f"a run's next turn: latch results {prefix}anthropic-tool-use" in out


def worker_pid(out: str) -> int:
    found = re.search(r"\[3/5\] worker \.\.\. ok \(pid (\d+)", out)
    assert found, out
    return int(found.group(1))


def test_demo_prints_every_outcome_and_stops_its_worker(demo_config: Path) -> None:
    """``latch demo`` on the test broker prints every documented outcome, holds the cancelled
    run's later envelopes until the cancel is applied and stops its worker; a second run
    reuses the topics. The first runs the default engine (kafka, issue 34), the second
    ``--engine faust`` on the same topics and group, as CI runs them (one deployment that
    switches engines)."""
    first = latch_demo(demo_config, "--timeout", "120")
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    assert ", engine kafka, " in out
    assert "[1/5] broker ... ok (using the cluster at" in out
    assert re.search(r"\[2/5\] topics \.\.\. ok \(15 topics, 3 partitions each \(the registry "
                     r"1\); 15 created", out)
    assert "rdkafka" not in out + first.stderr  # librdkafka's lines go through logging
    assert "[4/5] publish ... ok (133 envelopes for 8 runs; 7 after a cancel held back" in out
    prefix = check_outcomes(out)
    # The envelopes after the cancel go out once the cancel has been applied; nothing follows.
    cancelled_final = out.index(f"final {prefix}chat-cancelled")
    assert out.index(f"(sent the 7 envelopes of {prefix}chat-cancelled") > cancelled_final
    assert "stopping the worker ... exit status 0" in out
    assert "stopping the broker" not in out  # it was running before the demo
    assert not pid_alive(worker_pid(out))
    # the agent loop's next turn, read back: the Anthropic run's turn record
    read = subprocess.run(
        [sys.executable, "-m", "worker", "results", "--config", str(demo_config),
         f"{prefix}anthropic-tool-use", "--no-progress"],
        text=True, capture_output=True, timeout=120, check=False)
    assert read.returncode == 0, read.stderr
    [record] = [orjson.loads(line) for line in read.stdout.splitlines()]
    assert record["provider"] == "anthropic.messages"
    assert [o["outcome"] for o in record["outcomes"]] == ["tool_timeout"]
    assert record["messages"][0]["content"][0]["is_error"] is True

    # Again, on the same topics and group: a new prefix, the same outcomes, no collision.
    second = latch_demo(demo_config, "--timeout", "120", "--engine", "faust")
    assert second.returncode == 0, second.stdout + second.stderr
    assert ", engine faust, " in second.stdout
    # faust's leader topic is the one topic the faust engine adds (made with the others)
    assert ("16 topics, 3 partitions each (the registry and faust's leader topic 1); "
            "1 created, 15 already there") in second.stdout
    assert check_outcomes(second.stdout) != prefix
    assert not pid_alive(worker_pid(second.stdout))


def test_demo_explains_an_unreachable_cluster(tmp_path: Path) -> None:
    """``latch demo`` against an address where no broker answers fails at step 1 naming the address
    and the setting, exit 1, and goes no further."""
    path = tmp_path / "latch.yaml"
    write_config(path, "192.0.2.1:9092")  # TEST-NET-1: never a broker
    result = latch_demo(path, timeout=120)
    assert result.returncode == 1
    assert ("[1/5] broker ... FAILED: no Kafka cluster answers at 192.0.2.1:9092 "
            "(kafka.bootstrap_servers)") in result.stdout
    assert "[2/5]" not in result.stdout


@pytest.fixture
def own_broker_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A broker data directory of this test's own; a broker left there is stopped after."""
    path = tmp_path / "broker"
    monkeypatch.setenv("LATCH_BROKER_DIR", str(path))
    yield path
    if broker.status()[0] is not None:  # the demo failed to stop it
        broker.stop()


def test_demo_starts_and_stops_a_local_broker_when_none_answers(
    kafka_bootstrap: str, tmp_path: Path, own_broker_dir: Path
) -> None:
    """With nothing at a loopback address, the demo runs its own broker there (its own data
    directory, so the session's broker is untouched) and stops it at the end."""
    port = broker.free_ports(2)
    path = tmp_path / "latch.yaml"
    write_config(path, f"127.0.0.1:{port}", partitions=2)
    result = latch_demo(path, "--timeout", "120", env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"[1/5] broker ... ok (started the local broker, 127.0.0.1:{port})" in result.stdout
    check_outcomes(result.stdout)
    assert "stopping the broker ... ok" in result.stdout
    assert not broker.port_open(f"127.0.0.1:{port}")
    assert not (own_broker_dir / "broker.pid").exists()
    assert broker.answers(kafka_bootstrap)  # the session's broker still runs
