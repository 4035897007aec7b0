"""MCP servers as runners (issue 36, item 7), with the official ``mcp`` SDK over streamable
HTTP.

* ``latch runner --mcp URL`` (:func:`runner_main`; ``runner.mcp`` in ``latch.yaml``): a
  :class:`~worker.client.runner.Runner` whose tools are the server's ``tools/list``, each an
  :class:`McpTool`: an ordinary runner tool, so the journal (once-only with
  ``--transactional-id``), deduplication, ``tool_timeout_s`` and ``max_result_bytes`` apply
  to it exactly as to a Python function. A call is one ``tools/call`` with the committed
  ``arguments`` and the call's ``idempotency_key`` in the request's ``_meta``
  (:data:`META_KEY`); the answer's ``isError`` is the result's ``is_error``, its text content
  blocks (joined by a newline) its ``content``, its ``structuredContent`` its ``structured``.
  A name the server did not list is the runner's own "not registered" error result.
* ``latch registry put toolset NAME --version N --from-mcp URL`` (:func:`registry_main`,
  :func:`toolset_entries`): the server's ``tools/list`` (every page) registered as a toolset
  of MCP ``tools/list`` entries (``name``, ``description``, ``inputSchema``, ``outputSchema``,
  ``annotations``), the format every provider reads (``worker.core.tools``).

**The bridge** (:class:`McpClient`). The runner is threads; the SDK is asyncio (anyio). One
daemon thread runs one event loop holding one ``ClientSession``; the runner's tool threads
submit coroutines to it (``asyncio.run_coroutine_threadsafe``) and wait for them, bounded. The
session is opened at the first use, kept, pinged before a call when it has been idle for
:data:`IDLE_PING_S` (a server that forgot it, or restarted, is found before a call is sent),
and dropped after any failure: the next call opens a new one. A ``tools/call`` is never sent
twice by the bridge (it may have run): a call whose session could not be opened is answered
``mcp_unavailable`` (it was not sent), one sent without an answer ``mcp_error`` (it may have
run), one past its time ``tool_timeout``.

Who sends what: the server is the operator's (its ``tools/list`` is registered as the
operator's word), but what a tool returns is untrusted text: bounded by the runner's
``max_result_bytes`` (and each SSE event by :data:`MAX_EVENT_BYTES` while it is read), never
logged. The SDK logs whole messages at DEBUG (arguments and results), so the bridge holds the
``mcp`` loggers at CRITICAL and ``httpx2``'s at WARNING; its own log lines name the tool, the
run and an exception's type only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Coroutine, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import orjson
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from worker.client import execution
from worker.client.results import MAX_RESULT_BYTES, ToolResult

__all__ = ["IDLE_PING_S", "MAX_EVENT_BYTES", "MAX_PAGES", "META_KEY", "McpClient", "McpTool",
           "McpUnavailable", "mcp_tools", "registry_main", "runner_main", "toolset_entries"]

log = logging.getLogger("latch.runner")

#: The ``_meta`` key of a ``tools/call`` request that carries the committed call's
#: ``idempotency_key`` (a server that keeps its own record deduplicates on it).
META_KEY = "latch/idempotency_key"
#: A session idle this long is pinged before a call is sent on it.
IDLE_PING_S = 30.0
#: The most bytes one SSE event of the server's may hold while the SDK reads it (a result and
#: its structured copy, JSON-escaped, with room to spare); the record is bounded exactly by the
#: runner's ``max_result_bytes``.
MAX_EVENT_BYTES = 4 * MAX_RESULT_BYTES
#: The most ``tools/list`` pages read (a server whose cursor never ends is refused).
MAX_PAGES = 100
#: The first word of a call's error result when the server could not be reached (the call
#: was not sent), and when a sent call got no answer (it may have run).
MCP_UNAVAILABLE, MCP_ERROR = "mcp_unavailable", "mcp_error"

T = TypeVar("T")


class McpUnavailable(RuntimeError):
    """The MCP server cannot be reached, or did not answer within the bound (one line, with
    no argument or result text)."""


def where(url: str) -> str:
    """``url`` as log lines and messages show it: scheme, host, port and path (never a user,
    password or query, which may carry a token)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _quiet_sdk() -> None:
    """The SDK's loggers held where they log no message content (module doc)."""
    logging.getLogger("mcp").setLevel(logging.CRITICAL)
    for name in ("httpx2", "httpcore2"):
        logging.getLogger(name).setLevel(logging.WARNING)


class McpClient:
    """One MCP server's session, held by a background event loop thread (module doc). Its
    methods are called from any thread and are bounded in time."""

    def __init__(self, url: str, *, timeout_s: float = 30.0,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        if urlsplit(url).scheme not in ("http", "https"):
            raise McpUnavailable(f"{where(url)!r} is not an http(s) URL of an MCP server")
        _quiet_sdk()
        self.url = url
        #: The bound of opening a session (connect, initialize), a ping and each list page.
        self.timeout_s = timeout_s
        self.max_event_bytes = max_event_bytes
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="latch-mcp",
                                        daemon=True)
        self._thread.start()
        self._lock = asyncio.Lock()
        self._session: ClientSession | None = None
        self._close: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None
        #: When the session last answered (``time.monotonic()``).
        self._used = 0.0
        #: How many sessions were opened (the tests' view of reconnects).
        self.sessions_opened = 0

    # -- from the runner's threads ----------------------------------------------------

    def list_tools(self) -> list[dict[str, Any]]:
        """The server's ``tools/list``, every page, as the MCP JSON entries (camelCase).
        Raises :class:`McpUnavailable`."""
        bound = self.timeout_s * (MAX_PAGES + 1)
        try:
            return self._wait(self._list_all(), bound)
        except McpUnavailable:
            raise
        except Exception as exc:
            raise McpUnavailable(f"the MCP server at {where(self.url)} did not list its tools "
                                 f"({_kind(exc)})") from None

    def call(self, name: str, arguments: dict[str, Any], key: str | None,
             timeout_s: float) -> ToolResult:
        """One ``tools/call``, answered as a :class:`ToolResult` whatever happens (module doc):
        the server's answer, or an error result that says whether the call was sent."""
        try:
            result = self._wait(self._call(name, arguments, key, timeout_s),
                                timeout_s + self.timeout_s + 5)
        except _NotSent as exc:
            log.warning("MCP tool %s: the server at %s could not be reached (%s); the call "
                        "was not sent", name, where(self.url), exc.kind)
            return ToolResult(f"{MCP_UNAVAILABLE}: the MCP server could not be reached "
                              f"({exc.kind}); the call was not sent", is_error=True)
        except (TimeoutError, FutureTimeout, McpUnavailable):
            log.warning("MCP tool %s: no answer within %g s", name, timeout_s)
            return ToolResult(f"{execution.TOOL_TIMEOUT}: the MCP server did not answer "
                              f"within {timeout_s:g} s; the call may have run", is_error=True)
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                log.warning("MCP tool %s: no answer within %g s", name, timeout_s)
                return ToolResult(f"{execution.TOOL_TIMEOUT}: the MCP server did not answer "
                                  f"within {timeout_s:g} s; the call may have run",
                                  is_error=True)
            if exc.code == types.CONNECTION_CLOSED:
                log.warning("MCP tool %s: the connection closed before an answer", name)
                return ToolResult(f"{MCP_ERROR}: the connection to the MCP server closed "
                                  "before it answered; the call may have run", is_error=True)
            # a JSON-RPC error the server answered with: its message is the server's answer
            # (result text: in the content, never in a log line)
            log.warning("MCP tool %s: the server answered error %d", name, exc.code)
            return ToolResult(f"{MCP_ERROR}: the MCP server answered error {exc.code}: "
                              f"{exc.message}"[:2000], is_error=True)
        except Exception as exc:  # a transport failure, an answer that is not a tool result
            log.warning("MCP tool %s: no result (%s)", name, _kind(exc))
            return ToolResult(f"{MCP_ERROR}: the MCP server gave no tool result "
                              f"({_kind(exc)}); the call may have run", is_error=True)
        return _result(result)

    def close(self) -> None:
        """Close the session (politely, bounded) and stop the loop thread."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._wait(self._drop(), 5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()

    def _wait(self, coro: Coroutine[Any, Any, T], bound: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(bound)
        except FutureTimeout:
            future.cancel()
            raise McpUnavailable(f"the MCP server at {where(self.url)} did not answer within "
                                 f"{bound:g} s") from None

    # -- on the loop ------------------------------------------------------------------

    async def _list_all(self) -> list[dict[str, Any]]:
        session = await self._session_now()
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        try:
            for _ in range(MAX_PAGES):
                params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
                page = await asyncio.wait_for(session.list_tools(params=params), self.timeout_s)
                tools += [t.model_dump(by_alias=True, mode="json", exclude_none=True)
                          for t in page.tools]
                cursor = page.next_cursor
                if cursor is None:
                    self._used = time.monotonic()
                    return tools
        except BaseException:
            await self._drop()
            raise
        raise McpUnavailable(f"the MCP server at {where(self.url)} listed more than "
                             f"{MAX_PAGES} pages of tools")

    async def _call(self, name: str, arguments: dict[str, Any], key: str | None,
                    timeout_s: float) -> types.CallToolResult:
        try:
            session = await self._session_now()
        except Exception as exc:
            raise _NotSent(_kind(exc)) from None
        # The SDK's ClientSession.call_tool takes ``meta`` too, but it also checks the
        # structured content against the output schema it cached, raising with a message
        # that quotes the value: the request is sent as call_tool builds it, and the result
        # passed on as the server gave it (the worker checks outputSchema: issue 36, item 4).
        meta = cast(types.RequestParamsMeta, {META_KEY: key}) if key else None
        request = types.CallToolRequest(params=types.CallToolRequestParams(
            name=name, arguments=arguments, _meta=meta))
        try:
            result = await session.send_request(request, types.CallToolResult,
                                                request_read_timeout_seconds=timeout_s)
        except BaseException as exc:
            if not (isinstance(exc, MCPError) and exc.code not in (
                    types.REQUEST_TIMEOUT, types.CONNECTION_CLOSED)):
                await self._drop()  # (a JSON-RPC error answer leaves the session usable)
            raise
        self._used = time.monotonic()
        return result

    async def _session_now(self) -> ClientSession:
        """The session, opened (or opened again) when there is none or it does not answer a
        ping after :data:`IDLE_PING_S` idle."""
        async with self._lock:
            session = self._session
            if session is not None and time.monotonic() - self._used > IDLE_PING_S:
                try:
                    await asyncio.wait_for(session.send_ping(), self.timeout_s)
                    self._used = time.monotonic()
                except Exception as exc:
                    log.info("MCP server at %s: the session did not answer a ping (%s); "
                             "opening a new one", where(self.url), _kind(exc))
                    await self._drop_locked()
                    session = None
            if session is None:
                session = await self._open()
            return session

    async def _open(self) -> ClientSession:
        ready: asyncio.Future[ClientSession] = self._loop.create_future()
        close = asyncio.Event()
        holder = self._loop.create_task(self._hold(ready, close))
        try:
            session = await asyncio.wait_for(asyncio.shield(ready), self.timeout_s)
        except BaseException:
            close.set()
            holder.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(holder, 5.0)
            raise
        self._session, self._close, self._holder = session, close, holder
        self._used = time.monotonic()
        self.sessions_opened += 1
        return session

    async def _hold(self, ready: asyncio.Future[ClientSession], close: asyncio.Event) -> None:
        """Hold one session open until ``close`` (its context managers are anyio's: entered
        and left in this one task)."""
        try:
            async with streamable_http_client(
                    self.url, max_sse_event_size=self.max_event_bytes) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                ready.set_result(session)
                await close.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception)
                                    else McpUnavailable("the session was cancelled"))
            if not isinstance(exc, Exception):
                raise
        finally:
            if self._holder is asyncio.current_task():
                self._session = self._close = self._holder = None

    async def _drop(self) -> None:
        async with self._lock:
            await self._drop_locked()

    async def _drop_locked(self) -> None:
        close, holder = self._close, self._holder
        self._session = self._close = self._holder = None
        if close is not None:
            close.set()
        if holder is not None:
            try:
                await asyncio.wait_for(holder, 5.0)
            except BaseException:  # (timed out: cancelled by wait_for) the session is gone
                holder.cancel()


class _NotSent(Exception):
    """No session could be opened: the call was not sent."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _kind(exc: BaseException) -> str:
    """An exception as a log line or an error result may name it: its type (an exception
    group by its first leaf's), never its message (which may quote a value)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return type(exc).__name__


def _result(result: types.CallToolResult) -> ToolResult:
    """A ``tools/call`` answer as the runner's result: ``isError``, the text blocks joined by
    a newline (the structured value's JSON when there is no text), ``structuredContent``."""
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    structured = result.structured_content
    content = "\n".join(texts)
    if not texts and structured is not None:
        try:
            content = orjson.dumps(structured).decode()
        except TypeError:
            content = ""  # answer() refuses the structured value with a reason
    return ToolResult(content, is_error=bool(result.is_error), structured=structured)


class McpTool:
    """A runner tool that calls the MCP tool ``name`` (:meth:`McpClient.call`), bounded by
    ``timeout_s``, with the committed call's ``idempotency_key`` in ``_meta``."""

    def __init__(self, client: McpClient, name: str, timeout_s: float) -> None:
        self.client, self.name, self.timeout_s = client, name, timeout_s

    def __call__(self, arguments: Any) -> ToolResult:
        call = execution.current_call()
        key = call.get("idempotency_key") if call is not None else None
        if not isinstance(arguments, dict):
            return ToolResult("an MCP tool takes a JSON object of arguments; this call's "
                              "arguments are not one", is_error=True)
        return self.client.call(self.name, arguments, key if isinstance(key, str) else None,
                                self.timeout_s)


def mcp_tools(client: McpClient, timeout_s: float) -> dict[str, McpTool]:
    """The runner's tools: one :class:`McpTool` per tool the server lists now (raises
    :class:`McpUnavailable`)."""
    names = [entry.get("name") for entry in client.list_tools()]
    return {name: McpTool(client, name, timeout_s) for name in names
            if isinstance(name, str) and name}


#: The members of a ``tools/list`` entry a registered toolset keeps.
REGISTERED_KEYS = ("name", "title", "description", "inputSchema", "outputSchema",
                   "annotations")


def toolset_entries(url: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The server's ``tools/list`` (every page) as a toolset's tools: each entry's
    :data:`REGISTERED_KEYS` (its ``_meta``, ``icons`` and ``execution`` are not kept).
    Raises :class:`McpUnavailable`."""
    client = McpClient(url, timeout_s=timeout_s)
    try:
        listed = client.list_tools()
    finally:
        client.close()
    return [{key: entry[key] for key in REGISTERED_KEYS if key in entry} for entry in listed]


# -- the commands -----------------------------------------------------------------------


def _runner_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latch runner",
        description="Execute committed calls on an MCP server (streamable HTTP): docs/runner.md, "
                    "MCP servers as runners.")
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    parser.add_argument("--mcp", metavar="URL",
                        help="the MCP server's streamable HTTP endpoint (default: runner.mcp)")
    parser.add_argument("--group-id", default=None,
                        help="the consumer group (default: runner.group_id)")
    parser.add_argument("--transactional-id", default=None, metavar="ID", help=(
        "the journal's transactional id, stable per runner instance (default: "
        "runner.transactional_id; none: plain mode, docs/runner.md)"))
    parser.add_argument("--max-records", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def runner_main(argv: Sequence[str] | None = None) -> int:
    """``latch runner --mcp URL``: list the server's tools, then run committed calls on it
    until SIGTERM."""
    from worker.client.runner import Runner
    from worker.runtime.config import ConfigError, load_config

    args = _runner_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"latch runner: {exc}", file=sys.stderr)
        return 2
    settings = config.runner
    url = args.mcp or settings.mcp
    if not url:
        print("latch runner: give --mcp URL (or runner.mcp in latch.yaml)", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, config.worker.log_level.upper(), logging.INFO),
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        client = McpClient(url, timeout_s=settings.mcp_timeout_s)
    except McpUnavailable as exc:
        print(f"latch runner: {exc}", file=sys.stderr)
        return 2
    try:
        tools = mcp_tools(client, settings.tool_timeout_s)
    except McpUnavailable as exc:
        client.close()
        print(f"latch runner: {exc}", file=sys.stderr)
        return 1
    log.info("MCP server at %s: %d tools", where(url), len(tools))
    try:
        runner = Runner(config, tools, group_id=args.group_id or settings.group_id,
                        transactional_id=args.transactional_id or settings.transactional_id,
                        # the bridge answers a slow call first (tool_timeout: ...)
                        tool_timeout_s=settings.tool_timeout_s + settings.mcp_timeout_s + 10)
        if args.max_records is not None:  # (tests: a bounded run)
            print("started", flush=True)
            runner.run(max_records=args.max_records)
            runner.close()
        else:
            runner.serve()
    finally:
        client.close()
    return 0


def registry_main(argv: Sequence[str] | None = None) -> int:
    """``latch registry``, with ``put toolset NAME --version N --from-mcp URL``."""
    from worker.runtime.governance.registry_io import main

    return main(argv, from_mcp=_from_mcp)


def _from_mcp(url: str, config: Any) -> Any:
    """``--from-mcp URL``: the server's tools as a toolset (raises ``Invalid``, one line)."""
    from worker.runtime.governance.registry import Invalid

    try:
        return toolset_entries(url, config.runner.mcp_timeout_s)
    except McpUnavailable as exc:
        raise Invalid(str(exc)) from None
