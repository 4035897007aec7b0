"""Fixtures for tests against a real Kafka broker.

``kafka_bootstrap`` uses whatever answers at ``LATCH_TEST_BOOTSTRAP`` (default
127.0.0.1:9092: ``latch broker start`` or ``docker compose up kafka``); if nothing does, it
starts the managed broker with :mod:`worker.tools.broker` and stops it when the session ends
(a broker that was already running is left alone).

``make_topic`` creates uniquely named topics for one test and deletes them afterwards.
Every test in an ``integration`` folder (``tests/<layer>/integration/``) is marked
``integration`` (``pytest -m "not integration"`` skips them).

The suite runs in parallel (pytest-xdist; ``-n`` and ``--dist loadgroup`` in pyproject's
``addopts``; ``-n 0`` runs it in one process). For that:

* a test whose fixtures include a module- or class-scoped one (a module's own broker, workers
  started once for the module) is put in its module's ``xdist_group``, so that one xdist worker
  runs the whole module and sets the fixture up once (a test may name its own group);
* the slowest tests are handed out first (integration before unit, the modules of
  ``SLOW_FIRST`` first of all), so that no long test starts last;
* a broker that ``kafka_bootstrap`` starts in an xdist worker is stopped by the controller at
  the end of the session, once every worker is done with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from worker.tools import broker

LOOPBACK = {"127.0.0.1", "localhost", "::1"}

#: make_topic(suffix="", partitions=1, config=None) -> topic name
MakeTopic = Callable[..., str]


#: Modules whose tests take the longest (``pytest -m integration --durations=60``): started
#: first under xdist, so that the session does not wait for one of them at its end.
SLOW_FIRST = ("test_chaos.py", "test_bench_worker.py", "test_broker.py", "test_bench_memory.py",
              "test_cluster.py", "test_worker_changelog.py", "test_policy_in_force_broker.py",
              "test_worker_failover.py", "test_signed_approvals.py", "test_demo.py",
              "test_approvals.py", "test_replay.py", "test_runner_slow_tool_on_kafka.py")
#: Where the xdist controller learns that a worker started the managed broker (see
#: ``kafka_bootstrap``): a directory the controller makes before its workers start.
SESSION_DIR_ENV = "LATCH_TEST_SESSION_DIR"


def _shared_scope(item: pytest.Item) -> bool:
    """Whether a fixture of ``item`` lives longer than the test but not the session."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "class", "package")
               for defs in info.name2fixturedefs.values())


def _slowness(item: pytest.Item) -> tuple[int, int]:
    integration = "integration" in item.path.parent.parts
    slow = item.path.name in SLOW_FIRST
    rank = SLOW_FIRST.index(item.path.name) if slow else len(SLOW_FIRST)
    return (0 if slow else 1 if integration else 2, rank)


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in item.path.parent.parts:
            item.add_marker(pytest.mark.integration)
        if _shared_scope(item) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    if _xdist_worker(config):
        items.sort(key=_slowness)  # stable: the order within a rank stays the file order


_SHARED_FIXTURE = re.compile(r"""scope\s*=\s*["'](module|class|package)["']|xdist_group""")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` that also works on pytest 9, where xdist 3.8's worker can no
    longer append ``@group`` to a test's id: a test of a module that defines a module-, class-
    or package-scoped fixture (or names an ``xdist_group``) is scheduled with its whole
    module; any other test alone, in the (slowest-first) order the workers collected."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    shares: dict[str, bool] = {}

    def module_shares(path: str) -> bool:
        if path not in shares:
            try:
                shares[path] = bool(_SHARED_FIXTURE.search((config.rootpath / path).read_text()))
            except OSError:
                shares[path] = False
        return shares[path]

    class ModuleGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if "@" in nodeid:  # an xdist that sets the group again
                return nodeid.rsplit("@", 1)[-1]
            path = nodeid.split("::", 1)[0]
            return path if module_shares(path) else nodeid

    return ModuleGroups(config, log)


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _xdist_controller(config: pytest.Config) -> bool:
    return not _xdist_worker(config) and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xdist_group(name): run these tests in one xdist worker")
    if _xdist_controller(config) and SESSION_DIR_ENV not in os.environ:
        # the workers inherit the environment: they note a broker they started in here
        path = tempfile.mkdtemp(prefix="latch-pytest-")
        os.environ[SESSION_DIR_ENV] = path
        config.stash[_SESSION_DIR] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_SESSION_DIR, None)
    if path is None:
        return
    del os.environ[SESSION_DIR_ENV]
    try:
        if (Path(path) / "started-broker").exists() and not broker.stop():
            print("the broker this session started was no longer running")
    finally:
        shutil.rmtree(path, ignore_errors=True)


_SESSION_DIR = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """The bootstrap address of a broker that answers; starts the managed one if needed, and
    then stops it at the end of the session."""
    bootstrap = os.environ.get("LATCH_TEST_BOOTSTRAP", broker.DEFAULT_BOOTSTRAP)
    if broker.answers(bootstrap, timeout=5.0):
        yield bootstrap
        return
    host, _, port = bootstrap.rpartition(":")
    if host not in LOOPBACK:
        pytest.fail(f"no Kafka broker answers at {bootstrap} (LATCH_TEST_BOOTSTRAP)")
    if broker.main(["start", "--port", port]) != 0:
        pytest.fail(f"`latch broker start --port {port}` failed; see its error above")
    session_dir = os.environ.get(SESSION_DIR_ENV)
    if session_dir and _xdist_worker(request.config):
        # other xdist workers may use it still: the controller stops it when all are done
        (Path(session_dir) / "started-broker").touch()
        yield f"{broker.HOST}:{port}"
        return
    try:
        yield f"{broker.HOST}:{port}"
    finally:
        if not broker.stop():
            print(f"the broker this session started on port {port} was no longer running")


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka_bootstrap})


def _topic_name(test_name: str, suffix: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", test_name)[:80].strip("-")
    parts = ["latch-test", stem, suffix, uuid.uuid4().hex[:8]]
    return ".".join(part for part in parts if part)


def _wait_for_leaders(admin: AdminClient, topic: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if (
            meta is not None
            and meta.error is None
            and meta.partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} has no leader after {timeout:.0f}s")


@pytest.fixture
def make_topic(kafka_admin: AdminClient, request: pytest.FixtureRequest) -> Iterator[MakeTopic]:
    """Create uniquely named topics (``make_topic("events", partitions=3)``); delete them after."""
    created: list[str] = []

    def make(suffix: str = "", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = _topic_name(request.node.name, suffix)
        new = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        kafka_admin.create_topics([new], operation_timeout=30)[name].result(timeout=60)
        created.append(name)
        _wait_for_leaders(kafka_admin, name)
        return name

    yield make
    if created:
        for future in kafka_admin.delete_topics(created, operation_timeout=30).values():
            with contextlib.suppress(KafkaException):  # a leftover test topic is harmless
                future.result(timeout=60)
