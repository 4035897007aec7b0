"""A real MCP server for the tests (the ``mcp`` SDK's own ``MCPServer``, FastMCP's name in
``mcp`` 2, over streamable HTTP under uvicorn on 127.0.0.1), in a process of its own so that its
logs are not the runner's and it can be killed and started again on the same port.

``python mcp_server.py [PORT]`` serves :data:`SERVER` (its ``tools/list`` in pages of two, so a
client must follow the cursor) and prints ``port N`` once uvicorn listens.
:class:`McpServerProcess` starts it and waits for that line (no sleep).
"""

# (no ``from __future__ import annotations``: MCPServer reads the tools' annotations at run
# time, and the types they name must be the module's own)
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

HERE = Path(__file__).resolve().parent
#: The tools/list page size of the test server.
PAGE = 2


class Weather(BaseModel):
    """The weather tool's structured result."""

    city: str
    celsius: float


def _server() -> Any:
    class PagedServer(MCPServer):
        """MCPServer with its tools/list in pages of :data:`PAGE` (the cursor: an index)."""

        async def _handle_list_tools(self, ctx: Any, params: Any) -> Any:
            tools = await self.list_tools()
            start = int(params.cursor) if params is not None and params.cursor else 0
            end = start + PAGE
            return types.ListToolsResult(tools=tools[start:end],
                                         next_cursor=str(end) if end < len(tools) else None)

    server = PagedServer("latch-test")

    @server.tool(description="Echo the text.", structured_output=False)
    def echo(text: str) -> str:
        return text

    @server.tool(description="The weather in a city.",
                 annotations=types.ToolAnnotations(readOnlyHint=True, openWorldHint=False))
    def weather(city: str) -> Weather:
        return Weather(city=city, celsius=21.5)

    @server.tool(description="Fails with the text.", structured_output=False,
                 annotations=types.ToolAnnotations(destructiveHint=True))
    def fail(text: str) -> str:
        raise ToolError(f"refused: {text}")

    @server.tool(description="The idempotency key the request's _meta carried.",
                 structured_output=False)
    def key(ctx: Context) -> str:
        meta = ctx.request_context.meta or {}
        return str(meta.get("latch/idempotency_key"))

    executions: dict[str, int] = {}

    @server.tool(description="Counts an execution under the text; its count.",
                 structured_output=False)
    def record(text: str) -> str:
        executions[text] = executions.get(text, 0) + 1
        return str(executions[text])

    @server.tool(description="The executions counted by record.")
    def executed() -> dict[str, int]:
        return dict(executions)

    @server.tool(description="n bytes of text.", structured_output=False)
    def big(n: int) -> str:
        return "x" * n

    @server.tool(description="Sleeps s seconds.", structured_output=False)
    def slow(s: float) -> str:
        time.sleep(s)
        return "slept"

    return server


def serve(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(_server().streamable_http_app(), log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            sys.exit(1)
        time.sleep(0.02)
    print(f"port {sock.getsockname()[1]}", flush=True)
    thread.join()


class McpServerProcess:
    """The test server in a subprocess: :meth:`start` returns once it listens."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, port: int = 0, timeout: float = 60.0) -> "McpServerProcess":
        self.proc = subprocess.Popen([sys.executable, __file__, str(port)], text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env={**os.environ, "PYTHONPATH": str(HERE)})
        line = _line(self.proc.stdout, timeout)
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the MCP test server did not start ({line!r})")
        self.port = int(line.split()[1])
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _line(stream: IO[str] | None, timeout: float) -> str:
    """The first line of ``stream``, waited for up to ``timeout`` seconds ("" if none)."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline() if stream else ""),
                              daemon=True)
    reader.start()
    reader.join(timeout)
    return got[0].strip() if got else ""


def free_port() -> int:
    """A port nothing listens on now (for a server that is down)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
