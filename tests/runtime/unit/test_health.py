"""/healthz, /readyz and /metrics on one port, and the readiness rules behind them."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

from worker.runtime.observability.health import Health, HttpServer, loop_heartbeat


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_ready_only_as_a_member_with_every_owned_partition_rebuilt() -> None:
    """Not ready before an assignment, during a rebuild, or with an owned partition not
    rebuilt yet; ready once all are; not ready again after a revocation until the partition
    is reassigned and rebuilt again; a member that owns nothing is ready."""
    health = Health()
    assert not health.ready()[0]
    health.assigned([0, 1])
    assert not health.ready()[0]
    with health.rebuilding(0):
        assert not health.ready()[0]
    assert health.ready()[1]["not_rebuilt"] == [1]
    with health.rebuilding(1):
        assert not health.ready()[0]
    assert health.ready()[0]
    health.revoked([1])
    assert not health.ready()[0]
    health.assigned([0, 1])
    assert not health.ready()[0] and health.ready()[1]["not_rebuilt"] == [1]
    health.assigned([0])
    assert health.ready()[0]
    health.assigned([])  # more workers than partitions: a member that owns nothing
    assert health.ready()[0]


def test_a_failed_rebuild_leaves_the_partition_not_rebuilt() -> None:
    """An exception inside rebuilding() does not mark the partition rebuilt."""
    health = Health()
    health.assigned([0])
    try:
        with health.rebuilding(0):
            raise RuntimeError("read failed")
    except RuntimeError:
        pass
    assert not health.ready()[0] and health.rebuilds_running == 0


def test_a_rebuild_overtaken_by_a_revocation_rebuilt_nothing() -> None:
    """A revocation during a rebuild (the engine then drops the state it built) leaves the
    partition not rebuilt, even when it is assigned again."""
    health = Health()
    health.assigned([0])
    with health.rebuilding(0):
        health.revoked([0])
        health.assigned([0])
    assert not health.ready()[0] and health.ready()[1]["not_rebuilt"] == [0]


def test_endpoints_answer_on_one_port() -> None:
    """/metrics serves the exposition, /readyz 503 then 200, /healthz follows the event
    loop: 200 while it runs, 503 once it is blocked; unknown paths are 404."""
    health = Health()
    server = HttpServer("127.0.0.1", 0, health, lambda: b"latch_runs_open 0\n").start()
    loop = asyncio.new_event_loop()
    release = threading.Event()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        health.heartbeat = loop_heartbeat(loop, timeout=0.5)
        assert get(server.port, "/metrics") == (200, b"latch_runs_open 0\n")
        status, body = get(server.port, "/readyz")
        assert status == 503 and json.loads(body)["member"] is False
        health.assigned([])
        assert get(server.port, "/readyz")[0] == 200
        assert get(server.port, "/healthz")[0] == 200
        loop.call_soon_threadsafe(release.wait)  # the loop is stuck in a callback
        assert get(server.port, "/healthz")[0] == 503
        assert get(server.port, "/nope")[0] == 404
    finally:
        release.set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        server.stop()


def test_ready_only_with_every_owned_control_partition_forwarding() -> None:
    """Issue 33: an owned control partition keeps the worker not ready until it is forwarded
    up to its end as the engine learnt it; a revocation makes it not ready again until the
    reassigned partition forwards again; a control partition owned by no one else counts
    only while owned."""
    health = Health()
    health.assigned([], [0, 1])
    assert not health.ready()[0] and health.ready()[1]["control_not_forwarding"] == [0, 1]
    assert health.waiting_control()
    health.forwarding([0, 5])  # 5: not owned
    assert health.ready()[1]["control_not_forwarding"] == [1]
    health.forwarding([1])
    assert health.ready()[0] and not health.waiting_control()
    health.revoked([], [0, 1])
    health.assigned([], [1])
    assert not health.ready()[0] and health.ready()[1]["control_not_forwarding"] == [1]
    health.forwarding([1])
    assert health.ready()[0]
    health.assigned([], [])  # more workers than partitions
    assert health.ready()[0]
