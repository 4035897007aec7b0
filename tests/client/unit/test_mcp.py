"""MCP servers as runners (worker/client/mcp.py, issue 36 item 7), against a real MCP server:
the SDK's own ``MCPServer`` over streamable HTTP under uvicorn on 127.0.0.1, in a process of its
own (tests/mcp_server.py), never a mock. Each call goes through ``Runner.handle``, the path a
committed record takes, so what the result record says is what the runner would publish."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp_server import PAGE, McpServerProcess, free_port

from worker.cli import main
from worker.client import mcp as bridge
from worker.client.mcp import (
    MCP_UNAVAILABLE,
    META_KEY,
    McpClient,
    McpTool,
    McpUnavailable,
    mcp_tools,
    toolset_entries,
    where,
)
from worker.client.runner import Runner
from worker.core.tools import output_schemas, tool_attributes
from worker.runtime.config import Config
from worker.runtime.governance.registry import check_toolset
from worker.runtime.schemas import validator

SECRET = "s3cr3t-argument-text"


@pytest.fixture(scope="module")
def server() -> Iterator[McpServerProcess]:
    started = McpServerProcess().start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def client(server: McpServerProcess) -> Iterator[McpClient]:
    made = McpClient(server.url, timeout_s=10)
    try:
        yield made
    finally:
        made.close()


def runner_of(client: McpClient, timeout_s: float = 10.0, **kwargs: Any) -> Runner:
    return Runner(Config(), mcp_tools(client, timeout_s), consumer=object(),
                  producer=object(), **kwargs)


def committed(name: str, arguments: Any, key: str = "run-1:call-1") -> bytes:
    return orjson.dumps({"v": 1, "run_id": "run-1", "tenant": "t",
                         "provider": "anthropic.messages", "call_id": "toolu_1", "name": name,
                         "index": 0, "arguments": arguments, "idempotency_key": key})


def answered(runner: Runner, name: str, arguments: Any, key: str = "run-1:call-1"
             ) -> dict[str, Any]:
    outcome = runner.handle(committed(name, arguments, key))
    assert outcome.status == "executed" and outcome.value is not None
    record: dict[str, Any] = orjson.loads(outcome.value)
    assert validator("tool-result").is_valid(record), record
    return record


def test_a_text_result_is_the_content_and_the_key_travels_in_meta(client: McpClient) -> None:
    """The server's tools/list (every page) is the runner's tools; a call's text content is the
    result's content, with no structured value when the tool gave none; the server sees the
    committed call's idempotency_key under _meta's latch/idempotency_key."""
    runner = runner_of(client)
    assert sorted(runner.tools) == ["big", "echo", "executed", "fail", "key", "record", "slow",
                                    "weather"]  # 8 tools: 4 pages of PAGE
    assert len(runner.tools) > 3 * PAGE  # (the listing followed the cursor)
    record = answered(runner, "echo", {"text": "hello"})
    assert (record["is_error"], record["content"]) == (False, "hello")
    assert "structured" not in record
    assert answered(runner, "key", {}, key="run-1:toolu_42")["content"] == "run-1:toolu_42"
    assert META_KEY == "latch/idempotency_key"


def test_structured_content_is_kept_beside_its_text(client: McpClient) -> None:
    """A tool with an output schema answers structuredContent: the result keeps it as
    ``structured`` (any JSON), its text the content."""
    record = answered(runner_of(client), "weather", {"city": "Oslo"})
    assert record["is_error"] is False
    assert record["structured"] == {"city": "Oslo", "celsius": 21.5}
    assert orjson.loads(record["content"]) == record["structured"]


def test_is_error_is_the_results_is_error(client: McpClient) -> None:
    """A tool that fails answers isError: the result is an error result with the server's text;
    a tool the server does not list gets the runner's own not-registered error result (the
    server is never asked)."""
    runner = runner_of(client)
    record = answered(runner, "fail", {"text": "no"})
    assert record["is_error"] is True and "refused: no" in record["content"]
    record = answered(runner, "nope", {})
    assert record["is_error"] is True
    assert record["content"] == "no tool named 'nope' is registered with this runner"


def test_arguments_that_are_not_an_object_are_an_error_result(client: McpClient) -> None:
    """tools/call takes an object of arguments: a committed call whose arguments are another
    JSON value is answered by an error result, nothing sent."""
    record = answered(runner_of(client), "echo", ["a", "list"])
    assert record["is_error"] is True and "JSON object" in record["content"]


def test_a_result_over_max_bytes_is_an_error_result_without_its_text(client: McpClient) -> None:
    """The server's result is untrusted text: over the runner's max_result_bytes it becomes an
    error result saying the bound, never quoting the text."""
    record = answered(runner_of(client, max_result_bytes=1000), "big", {"n": 5000})
    assert record["is_error"] is True
    assert record["content"] == "the tool's result is larger than 1000 bytes"
    assert "structured" not in record


def test_a_slow_call_is_answered_tool_timeout_and_the_next_call_goes_on(client: McpClient
                                                                          ) -> None:
    """A tools/call past the tool's bound is answered tool_timeout (it may have run: said so);
    the session is dropped and the next call opens a new one and is answered."""
    tool = McpTool(client, "slow", timeout_s=0.5)
    result = tool({"s": 5})
    assert result.is_error and result.content.startswith("tool_timeout: ")
    assert "may have run" in result.content
    opened = client.sessions_opened
    assert McpTool(client, "echo", 10)({"text": "after"}).content == "after"
    assert client.sessions_opened == opened + 1


def test_a_server_that_is_down_gets_a_clear_error_result() -> None:
    """No server at the URL: listing its tools raises McpUnavailable naming the URL (the
    runner does not start); a call is answered mcp_unavailable, saying it was not sent."""
    url = f"http://127.0.0.1:{free_port()}/mcp"
    client = McpClient(url, timeout_s=5)
    try:
        with pytest.raises(McpUnavailable, match="did not list its tools"):
            mcp_tools(client, 5)
        result = McpTool(client, "echo", 5)({"text": "hello"})
        assert result.is_error
        assert result.content.startswith(f"{MCP_UNAVAILABLE}: the MCP server could not be "
                                         "reached (")
        assert result.content.endswith("the call was not sent")
    finally:
        client.close()


def test_a_restarted_server_is_reached_by_a_new_session() -> None:
    """The server dies and comes back on its port: the next call opens a new session (the old
    one is found dead, or fails a ping after IDLE_PING_S) and is answered."""
    server = McpServerProcess().start()
    client = McpClient(server.url, timeout_s=10)
    try:
        tool = McpTool(client, "echo", 10)
        assert tool({"text": "one"}).content == "one"
        server.stop()
        down = tool({"text": "two"})
        assert down.is_error
        server.start(port=server.port)
        assert tool({"text": "three"}).content == "three"
        assert client.sessions_opened >= 2
    finally:
        client.close()
        server.stop()


def test_an_idle_session_is_pinged_before_a_call(client: McpClient,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """After IDLE_PING_S without an answer the session is pinged first: it answers, so the
    same session carries the call (no new one opened)."""
    tool = McpTool(client, "echo", 10)
    assert tool({"text": "a"}).content == "a"
    opened = client.sessions_opened
    monkeypatch.setattr(bridge, "IDLE_PING_S", 0.0)
    assert tool({"text": "b"}).content == "b"
    assert client.sessions_opened == opened


def test_no_argument_or_result_text_reaches_a_log(client: McpClient,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """At DEBUG, every log line of a run of calls (a result, an error result, a timeout, a
    server that is down) is free of the arguments and of the results: the SDK logs whole
    messages at DEBUG, and the bridge keeps its loggers above that."""
    caplog.set_level(logging.DEBUG)
    runner = runner_of(client)
    answered(runner, "echo", {"text": SECRET})
    answered(runner, "fail", {"text": SECRET}, key="k-2")
    McpTool(client, "slow", 0.2)({"s": 1, "tag": SECRET})
    down = McpClient(f"http://127.0.0.1:{free_port()}/mcp", timeout_s=5)
    try:
        McpTool(down, "echo", 5)({"text": SECRET})
    finally:
        down.close()
    assert caplog.records, "nothing was logged: the check would prove nothing"
    for record in caplog.records:
        text = record.getMessage() + (caplog.text if record.exc_info else "")
        assert SECRET not in text, (record.name, record.levelname)
    assert SECRET not in caplog.text


def test_tools_list_becomes_a_toolset_that_keeps_output_schema_and_annotations(
        server: McpServerProcess) -> None:
    """``--from-mcp``: every page of tools/list becomes one MCP tools/list entry per tool
    (name, description, inputSchema, outputSchema, annotations), which the registry's check
    reads in every provider's format; the core reads the output schemas
    (``output_schemas``) and the annotations' hints (``tool_attributes``) back."""
    tools = toolset_entries(server.url)
    by_name = {tool["name"]: tool for tool in tools}
    assert len(tools) == 8 and len(by_name) == 8
    weather = by_name["weather"]
    assert set(weather) == {"name", "description", "inputSchema", "outputSchema",
                            "annotations"}
    assert weather["outputSchema"]["required"] == ["city", "celsius"]
    assert weather["annotations"] == {"readOnlyHint": True, "openWorldHint": False}
    assert "outputSchema" not in by_name["echo"]
    assert len(check_toolset("mcp-test", tools)) == 5
    for provider in ("openai.chat", "google.gemini"):
        schemas = output_schemas(provider, tools)
        assert schemas["weather"] == weather["outputSchema"] and "echo" not in schemas
    hints = tool_attributes(tools)
    assert hints["weather"]["annotations"] == {"readOnlyHint": True, "openWorldHint": False}
    assert hints["fail"]["annotations"] == {"destructiveHint": True}


def test_a_url_is_shown_without_its_credentials() -> None:
    """Log lines and messages show scheme, host, port and path, never a user, a password or a
    query (which may carry a token); a URL that is not http(s) is refused at once."""
    assert where("https://u:pw@mcp.example:8443/mcp?token=abc") == "https://mcp.example:8443/mcp"
    with pytest.raises(McpUnavailable, match="not an http"):
        McpClient("file:///etc/passwd")


def test_latch_runner_needs_a_server_it_can_list(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """``latch runner`` without --mcp (or runner.mcp) is a usage error (2); with a server that
    does not answer it stops before consuming anything (1), naming the URL without its
    credentials; ``latch registry put toolset --from-mcp`` and ``--tools`` exclude each other."""
    monkeypatch.chdir(tmp_path)  # (no ./latch.yaml)
    assert main(["runner"]) == 2
    assert "give --mcp URL" in capsys.readouterr().err
    port = free_port()
    assert main(["runner", "--mcp", f"http://user:pw@127.0.0.1:{port}/mcp"]) == 1
    err = capsys.readouterr().err
    assert f"http://127.0.0.1:{port}/mcp did not list its tools" in err and "pw" not in err
    with pytest.raises(SystemExit):
        main(["registry", "put", "toolset", "t", "--version", "1", "--tools", "f.json",
              "--from-mcp", "http://127.0.0.1:1/mcp"])
    assert "not allowed with argument" in capsys.readouterr().err
