"""MCP servers as runners on the real broker (issue 36, item 7), with a real MCP server (the
SDK's own ``MCPServer`` over streamable HTTP, tests/mcp_server.py): ``latch runner --mcp URL``
consumes committed calls and writes one result per call, the journal keeping its once-only
promise across a restart; ``latch registry put toolset --from-mcp URL`` registers the server's
tools/list with their output schemas and annotations."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from conftest import MakeTopic
from mcp_server import McpServerProcess
from worker_harness import read_results as results

from worker.cli import main
from worker.client.mcp import McpClient
from worker.runtime.config import load_config
from worker.runtime.governance.registry import TOOLSET
from worker.runtime.governance.registry_io import read_whole
from worker.runtime.schemas import validator

CHECKOUT = Path(__file__).resolve().parents[3]
SECRET = "s3cr3t-argument-text"


@pytest.fixture
def server() -> Iterator[McpServerProcess]:
    started = McpServerProcess().start()
    try:
        yield started
    finally:
        started.stop()


def call(key: str, name: str, arguments: dict[str, Any]) -> bytes:
    return orjson.dumps({"v": 1, "run_id": f"run-{key}", "tenant": "t",
                         "provider": "openai.chat", "call_id": f"call_{key}", "name": name,
                         "index": 0, "arguments": arguments, "idempotency_key": key})


def publish(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, key=orjson.loads(value)["run_id"].encode(), value=value)
    assert producer.flush(30) == 0



def executions(url: str) -> dict[str, int]:
    """What the server's ``record`` tool has counted (asked through the bridge)."""
    client = McpClient(url, timeout_s=10)
    try:
        result = client.call("executed", {}, None, 10)
    finally:
        client.close()
    assert not result.is_error
    counted: dict[str, int] = result.structured
    return counted


def latch_runner(config: Path, transactional_id: str, group: str, records: int
                 ) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(
        p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run(
        [sys.executable, "-m", "worker", "runner", "--config", str(config),
         "--transactional-id", transactional_id, "--group-id", group,
         "--max-records", str(records)],
        env=env, capture_output=True, text=True, timeout=180, check=False)


def test_latch_runner_mcp_answers_each_committed_call_once(
        kafka_bootstrap: str, make_topic: MakeTopic, server: McpServerProcess,
        tmp_path: Path) -> None:
    """``latch runner --mcp`` (a process, with a journal): a call delivered twice runs once on
    the server and has one result; a structured result keeps ``structured``; an isError
    answer is an error result. A new runner process with the same transactional id, given a
    third copy of the call, reads the journal and does not run it again. Every result is valid
    against the tool-result schema, and the runner's log (at debug) holds no argument text."""
    committed, results_topic = make_topic("committed"), make_topic("results")
    journal = make_topic("journal", config={"cleanup.policy": "compact"})
    suffix = uuid.uuid4().hex[:8]
    group, transactional_id = f"latch-mcp-runner-{suffix}", f"latch-mcp-runner-{suffix}-0"
    config = tmp_path / "latch.yaml"
    config.write_text(
        f"kafka:\n  bootstrap_servers: '{kafka_bootstrap}'\n"
        f"topics:\n  committed: {committed}\n  results: {results_topic}\n  journal: {journal}\n"
        f"worker:\n  log_level: debug\n"
        f"runner:\n  mcp: '{server.url}'\n  tool_timeout_s: 20\n")
    once = call(f"k-{suffix}-1", "record", {"text": SECRET})
    publish(kafka_bootstrap, committed, [
        once, once, call(f"k-{suffix}-2", "weather", {"city": "Oslo"}),
        call(f"k-{suffix}-3", "fail", {"text": SECRET})])

    first = latch_runner(config, transactional_id, group, 4)
    assert first.returncode == 0, first.stderr[-2000:]
    assert SECRET not in first.stderr + first.stdout
    found = results(kafka_bootstrap, results_topic, want=3)
    assert sorted(r["idempotency_key"] for r in found) == [f"k-{suffix}-{n}" for n in (1, 2, 3)]
    assert all(validator("tool-result").is_valid(r) for r in found)
    by_key = {r["idempotency_key"]: r for r in found}
    assert (by_key[f"k-{suffix}-1"]["is_error"], by_key[f"k-{suffix}-1"]["content"]) == (False,
                                                                                         "1")
    assert by_key[f"k-{suffix}-2"]["structured"] == {"city": "Oslo", "celsius": 21.5}
    assert by_key[f"k-{suffix}-3"]["is_error"] is True
    assert executions(server.url) == {SECRET: 1}

    publish(kafka_bootstrap, committed, [once])
    second = latch_runner(config, transactional_id, group, 1)
    assert second.returncode == 0, second.stderr[-2000:]
    assert len(results(kafka_bootstrap, results_topic, want=4, timeout=8)) == 3
    assert executions(server.url) == {SECRET: 1}


def test_registry_put_from_mcp_registers_the_servers_tools(
        kafka_bootstrap: str, make_topic: MakeTopic, server: McpServerProcess,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``latch registry put toolset NAME --version N --from-mcp URL``: the server's tools/list
    (every page) is registered; read back, each tool carries its inputSchema, and the weather
    tool its outputSchema and annotations; the same version again is refused."""
    registry = make_topic("registry", config={"cleanup.policy": "compact",
                                              "message.timestamp.type": "LogAppendTime"})
    config = tmp_path / "latch.yaml"
    config.write_text(f"kafka:\n  bootstrap_servers: '{kafka_bootstrap}'\n"
                      f"topics:\n  registry: {registry}\n")
    argv = ["registry", "--config", str(config), "put", "toolset", "mcp-test", "--version", "1",
            "--from-mcp", server.url]
    assert main(argv) == 0
    assert "registered toolset mcp-test version 1" in capsys.readouterr().out
    entry = read_whole(load_config(config)).get(TOOLSET, "mcp-test", 1)
    assert entry is not None
    tools = {tool["name"]: tool for tool in entry.content}
    assert len(tools) == 8 and all("inputSchema" in tool for tool in tools.values())
    assert tools["weather"]["outputSchema"]["required"] == ["city", "celsius"]
    assert tools["weather"]["annotations"] == {"readOnlyHint": True, "openWorldHint": False}
    assert main(argv) == 2
    assert "exists already" in capsys.readouterr().err
