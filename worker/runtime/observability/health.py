"""Health, readiness, and the worker's one HTTP port (``/metrics``, ``/healthz``, ``/readyz``).

Engine-independent. An engine keeps a :class:`Health` up to date:

* :meth:`Health.assigned` when the group gives it its events and control partitions (it is
  then a member), :meth:`Health.revoked` when a rebalance takes them away (not a member until
  the next assignment);
* :meth:`Health.forwarding` once an owned control partition is forwarded up to its log end as
  the engine learnt it after the assignment (a cancel acknowledged after that is forwarded
  live, within the bound of README's Guarantees);
* :meth:`Health.rebuilding` around each takeover's rebuild (not ready meanwhile), after which
  the partition counts as rebuilt;
* :meth:`Health.heartbeat` is what ``/healthz`` asks: by default, that the engine's asyncio
  event loop runs a no-op within :data:`LOOP_TIMEOUT_S` (a loop blocked by a long step, or
  dead, makes the worker unhealthy).

Ready means: a member of the group, no rebuild running, every owned events partition
rebuilt, every owned control partition forwarding (issue 33: the kafka engine said ready
before it had read its control backlog), and every report in :attr:`Health.reports` ok (the
partition driver adds the registry's: its reader follows the registry; the policy's: never
unready, it lists the registry policy set versions this worker could not build, which it
keeps out of force; and the approvers': never unready, it says whether a decision can
count, i.e. keys are listed).
A partition is rebuilt when its first record after the assignment arrives; the worker's
own tick (``worker.tick_interval_s``) puts a record into every partition it owns, so each is
rebuilt within a tick interval of the assignment even when no gateway writes to it. A control
partition is forwarding once every record up to its end, as the engine learnt that end after
the assignment, is forwarded into the events log (the faust engine: delivered, at its control
repair, each tick interval; the kafka engine: committed, at the first turn of its loop with no
transaction open). A worker that owns no partition (more workers than partitions) is ready.

The server is the standard library's threaded HTTP server on its own thread: a scrape never
waits for the event loop, and a blocked loop still gets a clear 503 from ``/healthz``. It binds
``worker.http_host`` (default 127.0.0.1; set 0.0.0.0 in a container) on ``worker.http_port``
(default 9464, the usual OpenTelemetry Prometheus port; 0 turns the server off).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LOOP_TIMEOUT_S", "Health", "HttpServer", "loop_heartbeat"]

log = logging.getLogger("latch.worker")

#: How long ``/healthz`` waits for the event loop to answer.
LOOP_TIMEOUT_S = 2.0


def loop_heartbeat(loop: asyncio.AbstractEventLoop,
                   timeout: float = LOOP_TIMEOUT_S) -> Callable[[], bool]:
    """A check that ``loop`` runs a callback within ``timeout`` seconds (from another thread)."""
    def check() -> bool:
        if loop.is_closed() or not loop.is_running():
            return False
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # closed in between
            return False
        return answered.wait(timeout)
    return check


class Health:
    """Membership, rebuilds and liveness of one worker, as the endpoints report them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.member = False
        self.owned: frozenset[int] = frozenset()
        self.rebuilt: set[int] = set()
        self.rebuilds_running = 0
        #: The control partitions owned, and those forwarded up to their end (as the engine
        #: learnt it) since they were assigned.
        self.control: frozenset[int] = frozenset()
        self.forwarded: set[int] = set()
        #: Revocations so far: a rebuild that a revocation overtook rebuilt nothing.
        self.revocations = 0
        self.heartbeat: Callable[[], bool] = lambda: True
        #: Further parts of ``/readyz`` by name: each says whether it is ok and its detail
        #: (called on the HTTP thread: reads only).
        self.reports: dict[str, Callable[[], tuple[bool, dict[str, Any]]]] = {}

    def assigned(self, partitions: Collection[int], control: Collection[int] = ()) -> None:
        """The group assigned these events and control partitions (the whole assignment)."""
        with self._lock:
            self.member = True
            self.owned = frozenset(partitions)
            self.rebuilt &= self.owned
            self.control = frozenset(control)
            self.forwarded &= self.control

    def revoked(self, partitions: Collection[int], control: Collection[int] = ()) -> None:
        """A rebalance revoked these events and control partitions: not ready until
        reassigned (and, for a control partition, forwarding again)."""
        with self._lock:
            self.member = False
            self.revocations += 1
            self.rebuilt -= set(partitions)
            self.owned -= set(partitions)
            self.forwarded -= set(control)
            self.control -= set(control)

    def forwarding(self, partitions: Collection[int]) -> None:
        """These owned control partitions are forwarded up to their log end as the engine
        learnt it after their assignment."""
        with self._lock:
            self.forwarded |= self.control & set(partitions)

    def left(self) -> None:
        """The worker is stopping: not a member any more."""
        with self._lock:
            self.member = False

    @contextlib.contextmanager
    def rebuilding(self, partition: int) -> Iterator[None]:
        """Around a takeover's rebuild of ``partition``: not ready meanwhile."""
        with self._lock:
            self.rebuilds_running += 1
            self.rebuilt.discard(partition)
            revocations = self.revocations
        try:
            yield
            with self._lock:
                if revocations == self.revocations:  # else the engine drops what it built
                    self.rebuilt.add(partition)
        finally:
            with self._lock:
                self.rebuilds_running -= 1

    def waiting_control(self) -> bool:
        """Whether an owned control partition is not forwarding yet."""
        with self._lock:
            return bool(self.control - self.forwarded)

    def live(self) -> tuple[bool, dict[str, Any]]:
        alive = self.heartbeat()
        return alive, {"status": "ok" if alive else "event loop not answering"}

    def ready(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            member, owned, rebuilt = self.member, self.owned, set(self.rebuilt)
            running = self.rebuilds_running
            behind = sorted(self.control - self.forwarded)
        waiting = sorted(owned - rebuilt)
        ok = member and not running and not waiting and not behind
        reports = {}
        for name, report in list(self.reports.items()):
            fine, reports[name] = report()
            ok = ok and fine
        return ok, {"status": "ready" if ok else "not ready", "member": member,
                    "rebuilding": running, "owned": sorted(owned), "not_rebuilt": waiting,
                    "control_not_forwarding": behind, **reports}


class HttpServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one port, on a daemon thread."""

    def __init__(self, host: str, port: int, health: Health,
                 exposition: Callable[[], bytes]) -> None:
        handler = _handler(health, exposition)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="latch-http",
                                       daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> HttpServer:
        self.thread.start()
        log.info("serving /metrics, /healthz and /readyz on %s:%d",
                 self.server.server_address[0], self.port)
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(health: Health, exposition: Callable[[], bytes]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, exposition(), "text/plain; version=0.0.4; charset=utf-8")
            elif path in ("/healthz", "/readyz"):
                ok, body = health.live() if path == "/healthz" else health.ready()
                self._send(200 if ok else 503, json.dumps(body).encode(), "application/json")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
            return
    return Handler
