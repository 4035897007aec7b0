"""``latch broker start|stop|status|kill``: a real Apache Kafka broker for development.

The broker is one JVM running a combined KRaft broker+controller on loopback; ``start
--nodes 3`` runs a cluster of such nodes instead (a static quorum of three voters, replication
factor 3, ``min.insync.replicas`` 2), whose nodes can be killed and started one at a time
(``kill --node I``, ``start --node I``) to test failover. Its jars are
resolved once with Maven into a cache folder (``~/.cache/latch/kafka-<version>/``, or
``LATCH_KAFKA_HOME``); its data, logs, configuration and pid file live in
``~/.cache/latch/broker/`` (or ``LATCH_BROKER_DIR``). The settings are tuned for tests: one
partition per topic by default, replication factor 1, few partitions for internal topics and
no initial rebalance delay. Nothing here listens on anything but 127.0.0.1.

Exit codes: 0 ok; 1 the broker failed (the message says why); 2 ``java`` or ``mvn`` is
missing; 3 (``status`` only) the broker is not running.
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

#: The pinned Apache Kafka release (also the ``apache/kafka`` image tag in docker-compose.yml).
KAFKA_VERSION = "4.1.2"
SCALA_VERSION = "2.13"
#: Kafka 4.x logs through SLF4J 1.7 to Log4j 2 (the distribution ships log4j-slf4j-impl).
LOG4J_VERSION = "2.25.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

HOST = "127.0.0.1"
DEFAULT_PORT = 9092
DEFAULT_BOOTSTRAP = f"{HOST}:{DEFAULT_PORT}"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
HEAP_OPTS = ("-Xms256m", "-Xmx512m")
MIN_JAVA = 17

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_MISSING_TOOL = 2
EXIT_NOT_RUNNING = 3

INSTALL_HINT = (
    "install a JDK 17+ and Maven (e.g. `apt-get install openjdk-17-jre-headless maven`), "
    "or run Kafka in a container instead: `docker compose up kafka`"
)


class BrokerError(Exception):
    """The broker could not be prepared, started or stopped; the message says why."""

    exit_code = EXIT_FAILED


class MissingToolError(BrokerError):
    """``java`` or ``mvn`` is not installed."""

    exit_code = EXIT_MISSING_TOOL


# --------------------------------------------------------------------------- paths


@dataclass(frozen=True)
class Paths:
    """Where the jars and the broker's state live, as absolute paths: the broker runs in
    its data directory, so a relative path would name another place there."""

    home: Path
    data: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "home", Path(self.home).expanduser().absolute())
        object.__setattr__(self, "data", Path(self.data).expanduser().absolute())

    @classmethod
    def from_env(cls) -> Paths:
        cache = Path.home() / ".cache" / "latch"
        home = os.environ.get("LATCH_KAFKA_HOME") or cache / f"kafka-{KAFKA_VERSION}"
        data = os.environ.get("LATCH_BROKER_DIR") or cache / "broker"
        return cls(home=Path(home).expanduser(), data=Path(data).expanduser())

    @property
    def libs(self) -> Path:
        return self.home / "libs"

    @property
    def pid_file(self) -> Path:
        return self.data / "broker.pid"

    @property
    def state_file(self) -> Path:
        return self.data / "broker.json"

    @property
    def log_file(self) -> Path:
        return self.data / "broker.log"

    @property
    def properties(self) -> Path:
        return self.data / "server.properties"

    @property
    def log4j_config(self) -> Path:
        return self.data / "log4j2.properties"

    @property
    def kraft_dir(self) -> Path:
        return self.data / "kraft-logs"

    @property
    def lock_file(self) -> Path:
        return self.data.with_name(self.data.name + ".lock")


@dataclass(frozen=True)
class Quorum:
    """A node of a multi-node KRaft cluster: its id and every voter's (id, controller port).
    Replication follows the cluster's size: factor ``min(3, size)``, and one replica fewer
    in sync than that (2 of 3), so a cluster of three survives the loss of any one node."""

    node_id: int
    voters: tuple[tuple[int, int], ...]

    @property
    def replication(self) -> int:
        return min(3, len(self.voters))

    @property
    def min_insync(self) -> int:
        return max(1, self.replication - 1)

    def voters_text(self) -> str:
        return ",".join(f"{node}@{HOST}:{port}" for node, port in self.voters)


@dataclass(frozen=True)
class Ports:
    """The client (PLAINTEXT) and controller listener ports on 127.0.0.1."""

    broker: int
    controller: int

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.broker}"


def _say(message: str) -> None:
    print(f"latch broker: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise concurrent ``start``/``stop`` calls (and jar downloads) on one machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- tools


def find_java() -> str:
    """The ``java`` to run (``$JAVA_HOME/bin/java`` first), checked to be 17 or newer."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home, "bin", "java") if java_home else None
    java = str(candidate) if candidate and candidate.is_file() else shutil.which("java")
    if java is None:
        raise MissingToolError(f"`java` was not found on PATH: {INSTALL_HINT}")
    major = _java_major(java)
    if major < MIN_JAVA:
        raise MissingToolError(
            f"Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+, found {major}: {INSTALL_HINT}"
        )
    return java


def _java_major(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return 0
    first = int(match.group(1))
    return int(match.group(2) or 0) if first == 1 else first


def find_mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingToolError(
            f"`mvn` was not found on PATH (needed once to download Kafka): {INSTALL_HINT}"
        )
    return mvn


# --------------------------------------------------------------------------- jars


def _pom() -> str:
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ]
    dependencies = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by worker/tools/broker.py: resolves the jars of a local Kafka broker. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.latch</groupId>
  <artifactId>latch-kafka-broker</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""


def jars_present(paths: Paths) -> bool:
    return (paths.libs / ".complete").is_file()


def ensure_jars(paths: Paths) -> None:
    """Resolve Kafka and a Log4j 2 binding into ``<home>/libs`` once (Maven, ``~/.m2``)."""
    if jars_present(paths):
        return
    with _locked(paths.home / ".lock"):
        if jars_present(paths):
            return
        mvn = find_mvn()
        partial = paths.home / "libs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        (paths.home / "pom.xml").write_text(_pom())
        _say(
            f"downloading Apache Kafka {KAFKA_VERSION} with Maven into {paths.libs} "
            "(first time only; this takes a while)"
        )
        started = time.monotonic()
        _run_maven(mvn, paths.home, partial)
        count = len(list(partial.glob("*.jar")))
        (partial / ".complete").write_text(f"{KAFKA_VERSION}\n")
        shutil.rmtree(paths.libs, ignore_errors=True)
        partial.rename(paths.libs)
        _say(f"resolved {count} jars in {time.monotonic() - started:.0f}s")


def _run_maven(mvn: str, home: Path, output: Path) -> None:
    cmd = [
        mvn,
        "-B",
        "-f",
        str(home / "pom.xml"),
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={output}",
    ]
    tail: collections.deque[str] = collections.deque(maxlen=40)
    downloaded = 0
    with subprocess.Popen(
        cmd,
        cwd=home,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            if "Downloaded from " in line:
                downloaded += 1
                if downloaded % 25 == 0:
                    _say(f"maven: {downloaded} files downloaded ...")
    if proc.returncode != 0:
        raise BrokerError(
            f"Maven could not resolve Kafka (exit {proc.returncode}):\n" + "\n".join(tail)
        )


# --------------------------------------------------------------------------- config


def server_properties(paths: Paths, ports: Ports, quorum: Quorum | None = None) -> str:
    """A combined broker+controller on loopback with test-friendly settings; with a
    ``quorum``, one node of a cluster (static voters, replicated internal topics)."""
    listeners = f"PLAINTEXT://{HOST}:{ports.broker},CONTROLLER://{HOST}:{ports.controller}"
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": listeners,
        # CONTROLLER is advertised too, as in Kafka 4's own sample config: with a dynamic
        # (--standalone) quorum, the controller publishes its endpoint to the voters.
        "advertised.listeners": listeners,
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.bootstrap.servers": f"{HOST}:{ports.controller}",
        "log.dirs": str(paths.kraft_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "3",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "3",
        "group.initial.rebalance.delay.ms": "0",
        # The coordinator sweeps for timed-out transactions every 0.5 s (default 10 s), so a
        # test that lets a transaction time out waits for its abort, not for the sweep.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.hours": "24",
    }
    if quorum is not None:
        del settings["controller.quorum.bootstrap.servers"]
        factor, isr = str(quorum.replication), str(quorum.min_insync)
        settings |= {
            "node.id": str(quorum.node_id),
            "controller.quorum.voters": quorum.voters_text(),
            "default.replication.factor": factor, "min.insync.replicas": isr,
            "offsets.topic.replication.factor": factor,
            "transaction.state.log.replication.factor": factor,
            "transaction.state.log.min.isr": isr,
            "share.coordinator.state.topic.replication.factor": factor,
            "share.coordinator.state.topic.min.isr": isr,
        }
    lines = [f"{key}={value}" for key, value in settings.items()]
    return "# Generated by worker/tools/broker.py on every start; edits are overwritten.\n" + (
        "\n".join(lines) + "\n"
    )


LOG4J2_PROPERTIES = """\
# Generated by worker/tools/broker.py: Kafka logs to stdout, which goes to broker.log.
status = warn
# Keep logging through Kafka's own shutdown hook (Log4j's hook would stop it first).
shutdownHook = disable
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
# The full configuration dumps are long; server.properties holds what was set.
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""


def _random_cluster_id() -> str:
    """A Kafka ``Uuid`` string: 16 random bytes, URL-safe base64 without padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _read_state(paths: Paths) -> dict[str, int | str]:
    try:
        state: dict[str, int | str] = json.loads(paths.state_file.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return state


def _formatted_ports(paths: Paths) -> Ports | None:
    state = _read_state(paths)
    if not (paths.kraft_dir / "meta.properties").is_file() or "port" not in state:
        return None
    return Ports(broker=int(state["port"]), controller=int(state["controller_port"]))


def _java_cmd(java: str, paths: Paths, *args: str) -> list[str]:
    return [
        java,
        *HEAP_OPTS,
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={paths.log4j_config}",
        f"-Dkafka.logs.dir={paths.data / 'logs'}",
        "-cp",
        str(paths.libs / "*"),
        *args,
    ]


def format_storage(java: str, paths: Paths, ports: Ports, quorum: Quorum | None = None,
                   cluster_id: str | None = None) -> None:
    """``kafka-storage.sh format --standalone``: a new single-voter KRaft cluster; with a
    ``quorum``, one node of a cluster whose voters the configuration names."""
    cluster_id = cluster_id or _random_cluster_id()
    cmd = _java_cmd(
        java,
        paths,
        "kafka.tools.StorageTool",
        "format",
        "--config",
        str(paths.properties),
        "--cluster-id",
        cluster_id,
        *(() if quorum is not None else ("--standalone",)),
    )
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise BrokerError(
            f"formatting KRaft storage failed (exit {out.returncode}):\n{out.stdout}{out.stderr}"
        )
    state = {"cluster_id": cluster_id, "port": ports.broker, "controller_port": ports.controller}
    paths.state_file.write_text(json.dumps(state) + "\n")


def prepare_data_dir(java: str, paths: Paths, ports: Ports, quorum: Quorum | None = None,
                     cluster_id: str | None = None) -> None:
    """Write the configuration and format the storage on first use."""
    paths.data.mkdir(parents=True, exist_ok=True)
    formatted = _formatted_ports(paths)
    if formatted is not None and formatted != ports:
        raise BrokerError(
            f"{paths.data} was formatted for ports {formatted.broker}/{formatted.controller}, "
            f"not {ports.broker}/{ports.controller}: pass --port {formatted.broker} "
            f"--controller-port {formatted.controller} "
            "or start --fresh to wipe it"
        )
    paths.properties.write_text(server_properties(paths, ports, quorum))
    paths.log4j_config.write_text(LOG4J2_PROPERTIES)
    if formatted is None:
        shutil.rmtree(paths.kraft_dir, ignore_errors=True)
        format_storage(java, paths, ports, quorum, cluster_id)


# --------------------------------------------------------------------------- processes


def _is_broker_process(pid: int) -> bool:
    """Whether ``pid`` is a live Kafka JVM (a zombie or a recycled pid is not)."""
    proc = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self").exists():
        try:
            return b"kafka.Kafka" in proc.read_bytes()
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_pid(paths: Paths) -> int | None:
    """The pid of the managed broker if it is running; a stale pid file is removed."""
    try:
        pid = int(paths.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if _is_broker_process(pid):
        return pid
    paths.pid_file.unlink(missing_ok=True)
    return None


def bootstrap_of(paths: Paths) -> str:
    state = _read_state(paths)
    return f"{HOST}:{state.get('port', DEFAULT_PORT)}"


def spawn(java: str, paths: Paths) -> int:
    """Start the broker detached (own session, reparented to init); return its pid."""
    cmd = _java_cmd(java, paths, "kafka.Kafka", str(paths.properties))
    # sh backgrounds the JVM and exits at once, so the JVM is nobody's child here: it
    # outlives this process, and never lingers as our zombie after `stop`.
    script = 'log=$1; shift; "$@" >"$log" 2>&1 </dev/null & echo $!'
    out = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(paths.log_file), *cmd],
        capture_output=True,
        text=True,
        check=True,
        cwd=paths.data,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    pid = int(out.stdout.strip())
    paths.pid_file.write_text(f"{pid}\n")
    return pid


def log_tail(paths: Paths, lines: int = 40) -> str:
    try:
        text = paths.log_file.read_text(errors="replace")
    except FileNotFoundError:
        return "(no broker log)"
    return "\n".join(text.splitlines()[-lines:])


def _split(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    return host.strip("[]") or HOST, int(port)


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive loopback ports that nothing holds now, all below
    the kernel's ephemeral range. A port the kernel hands out (``bind`` to port 0) lies in
    that range, where any outgoing connection may take it as its source port before the
    broker binds it (a 3-node cluster starting up makes such connections); below the range
    only an explicit ``bind`` can."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(10_000, max(10_001, low - count))
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    sock = held.enter_context(socket.socket())
                    sock.bind((HOST, port))
            except OSError:
                continue
        return first
    raise RuntimeError(f"no {count} consecutive free ports on {HOST} below {low}")


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_open(bootstrap: str, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(_split(bootstrap), timeout=timeout):
            return True
    except OSError:
        return False


def answers(bootstrap: str, timeout: float = 5.0) -> bool:
    """Whether a Kafka broker at ``bootstrap`` answers a metadata request."""
    if not port_open(bootstrap, timeout=min(timeout, 2.0)):
        return False
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


def wait_ready(pid: int, paths: Paths, bootstrap: str, timeout: float) -> None:
    """Wait until the broker answers; if it dies or times out, stop it and raise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _is_broker_process(pid):
            paths.pid_file.unlink(missing_ok=True)
            raise BrokerError(
                f"the broker exited during startup; log tail ({paths.log_file}):\n{log_tail(paths)}"
            )
        if answers(bootstrap, timeout=2.0):
            return
        time.sleep(0.5)
    terminate(pid)
    paths.pid_file.unlink(missing_ok=True)
    raise BrokerError(
        f"the broker did not answer at {bootstrap} within {timeout:.0f}s and was stopped; "
        f"log tail ({paths.log_file}):\n{log_tail(paths)}"
    )


def terminate(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (a clean, controlled shutdown), then SIGKILL after ``timeout`` seconds."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _is_broker_process(pid):
                return
            time.sleep(0.2)
        if sig == signal.SIGTERM:
            _say(f"pid {pid} ignored SIGTERM for {timeout:.0f}s; sending SIGKILL")
    raise BrokerError(f"pid {pid} is still alive after SIGKILL")


# --------------------------------------------------------------------------- commands


def start(ports: Ports, *, fresh: bool = False, timeout: float = START_TIMEOUT_S) -> str:
    """Start the broker (or find it running) and return its bootstrap address."""
    paths = Paths.from_env()
    java = find_java()
    ensure_jars(paths)
    with _locked(paths.lock_file):
        pid = running_pid(paths)
        if pid is not None and not fresh:
            return _already_running(paths, ports, pid, timeout)
        if pid is not None:
            _say(f"stopping pid {pid} before --fresh")
            terminate(pid)
            paths.pid_file.unlink(missing_ok=True)
        if fresh:
            cluster = Cluster.load(paths)
            if cluster is not None:
                _stop_nodes(cluster, STOP_TIMEOUT_S)
            shutil.rmtree(paths.data, ignore_errors=True)
        return _launch(java, paths, ports, timeout)


def _already_running(paths: Paths, ports: Ports, pid: int, timeout: float) -> str:
    bootstrap = bootstrap_of(paths)
    if bootstrap != ports.bootstrap:
        _say(f"already running at {bootstrap} (pid {pid}), not at {ports.bootstrap}")
    wait_ready(pid, paths, bootstrap, timeout)
    return bootstrap


def _launch(java: str, paths: Paths, ports: Ports, timeout: float) -> str:
    for port in (ports.broker, ports.controller):
        if port_open(f"{HOST}:{port}"):
            raise BrokerError(
                f"port {port} on {HOST} is already in use by another process; "
                "stop it or pick other ports with --port/--controller-port"
            )
    prepare_data_dir(java, paths, ports)
    started = time.monotonic()
    pid = spawn(java, paths)
    _say(f"started pid {pid}, waiting for {ports.bootstrap} (log: {paths.log_file})")
    wait_ready(pid, paths, ports.bootstrap, timeout)
    coordinator_ready(ports.bootstrap, max(5.0, timeout - (time.monotonic() - started)))
    _say(f"ready in {time.monotonic() - started:.1f}s")
    return ports.bootstrap


def coordinator_ready(bootstrap: str, timeout: float) -> bool:
    """Wait until a consumer group's coordinator answers (a fresh broker creates its offsets
    topic at the first such request, and until it has, group members get
    GroupCoordinatorNotAvailable, which aiokafka logs as an ERROR). Whether it answered."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            admin.describe_consumer_groups(["latch-broker-ready"], request_timeout=5)[
                "latch-broker-ready"].result(timeout=10)
            return True
        except KafkaException:  # NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE while loading
            time.sleep(0.2)
    return False


def stop(timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the broker; return whether one was running."""
    paths = Paths.from_env()
    with _locked(paths.lock_file):
        cluster = Cluster.load(paths)
        if cluster is not None:
            return _stop_nodes(cluster, timeout)
        pid = running_pid(paths)
        if pid is None:
            return False
        terminate(pid, timeout)
        paths.pid_file.unlink(missing_ok=True)
        return True


def status() -> tuple[int | None, str]:
    """The running broker's pid (or None) and its bootstrap address; for a cluster, the
    first running node's pid and every node's address."""
    paths = Paths.from_env()
    cluster = Cluster.load(paths)
    if cluster is not None:
        pids = [running_pid(cluster.paths(n)) for n in cluster.ids()]
        return next((pid for pid in pids if pid is not None), None), cluster.bootstrap
    return running_pid(paths), bootstrap_of(paths)


# --------------------------------------------------------------------------- clusters

#: The cluster's description in the data dir: {"nodes", "port", "cluster_id"}.
CLUSTER_FILE = "cluster.json"


@dataclass(frozen=True)
class Cluster:
    """N nodes under one data dir (``node-1`` ...), node I on ports ``port + 2(I-1)`` (client)
    and the next one (controller)."""

    root: Paths
    nodes: int
    port: int
    cluster_id: str

    @classmethod
    def load(cls, root: Paths) -> Cluster | None:
        """The cluster described in ``root``, or None when it holds none."""
        try:
            state = json.loads((root.data / CLUSTER_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return cls(root, int(state["nodes"]), int(state["port"]), str(state["cluster_id"]))

    def save(self) -> None:
        self.root.data.mkdir(parents=True, exist_ok=True)
        state = {"nodes": self.nodes, "port": self.port, "cluster_id": self.cluster_id}
        (self.root.data / CLUSTER_FILE).write_text(json.dumps(state) + "\n")

    def ids(self) -> range:
        return range(1, self.nodes + 1)

    def ports(self, node: int) -> Ports:
        return Ports(self.port + 2 * (node - 1), self.port + 2 * (node - 1) + 1)

    def paths(self, node: int) -> Paths:
        return Paths(home=self.root.home, data=self.root.data / f"node-{node}")

    def quorum(self, node: int) -> Quorum:
        return Quorum(node, tuple((i, self.ports(i).controller) for i in self.ids()))

    @property
    def bootstrap(self) -> str:
        return ",".join(self.ports(i).bootstrap for i in self.ids())

    def check(self, node: int) -> None:
        if node not in self.ids():
            raise BrokerError(f"the cluster in {self.root.data} has nodes 1 to {self.nodes}, "
                              f"not {node}")

    def active_controller(self) -> int | None:
        """The node that leads the KRaft quorum, from the quorum state the nodes keep on disk
        (the highest leader epoch any node has seen wins), or None before any election."""
        best: tuple[int, int] | None = None
        for node in self.ids():
            state_file = self.paths(node).kraft_dir / "__cluster_metadata-0" / "quorum-state"
            try:
                state = json.loads(state_file.read_text())
            except (OSError, ValueError):
                continue
            leader, epoch = state.get("leaderId", -1), state.get("leaderEpoch", -1)
            if isinstance(leader, int) and leader > 0 and (best is None or epoch > best[0]):
                best = (epoch, leader)
        return None if best is None else best[1]


def start_cluster(nodes: int, port: int, *, fresh: bool = False,
                  timeout: float = START_TIMEOUT_S) -> str:
    """Start every node of a cluster (creating it on first use); return its bootstrap list."""
    if nodes < 2:
        raise BrokerError("a cluster needs at least 2 nodes (1 is `latch broker start`)")
    root = Paths.from_env()
    java = find_java()
    ensure_jars(root)
    with _locked(root.lock_file):
        found = Cluster.load(root)
        if fresh:
            if found is not None:
                _stop_nodes(found, STOP_TIMEOUT_S)
            shutil.rmtree(root.data, ignore_errors=True)
            found = None
        if found is not None and (found.nodes, found.port) != (nodes, port):
            raise BrokerError(f"{root.data} holds a cluster of {found.nodes} nodes from port "
                              f"{found.port}: start it as it is, or pass --fresh to wipe it")
        cluster = found or Cluster(root, nodes, port, _random_cluster_id())
        cluster.save()
        started = [(node, _spawn_node(java, cluster, node)) for node in cluster.ids()]
        for node, pid in started:
            if pid is not None:
                wait_ready(pid, cluster.paths(node), cluster.ports(node).bootstrap, timeout)
        return cluster.bootstrap


def _spawn_node(java: str, cluster: Cluster, node: int) -> int | None:
    """Start one node unless it runs; its pid, or None when it was running already."""
    paths, ports = cluster.paths(node), cluster.ports(node)
    if running_pid(paths) is not None:
        return None
    for port in (ports.broker, ports.controller):
        if port_open(f"{HOST}:{port}"):
            raise BrokerError(f"port {port} on {HOST} (node {node}) is already in use")
    prepare_data_dir(java, paths, ports, cluster.quorum(node), cluster.cluster_id)
    pid = spawn(java, paths)
    _say(f"node {node}: started pid {pid} at {ports.bootstrap} (log: {paths.log_file})")
    return pid


def start_node(node: int, timeout: float = START_TIMEOUT_S) -> str:
    """Start one node of the cluster again, with its data; return its address."""
    cluster = _the_cluster()
    cluster.check(node)
    java = find_java()
    with _locked(cluster.root.lock_file):
        pid = _spawn_node(java, cluster, node)
    if pid is not None:
        wait_ready(pid, cluster.paths(node), cluster.ports(node).bootstrap, timeout)
    return cluster.ports(node).bootstrap


def kill_node(node: int) -> bool:
    """SIGKILL one node of the cluster (no clean shutdown); return whether it was running."""
    cluster = _the_cluster()
    cluster.check(node)
    paths = cluster.paths(node)
    pid = running_pid(paths)
    if pid is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _is_broker_process(pid):
        if time.monotonic() > deadline:
            raise BrokerError(f"node {node} (pid {pid}) is still alive after SIGKILL")
        time.sleep(0.1)
    paths.pid_file.unlink(missing_ok=True)
    return True


def _the_cluster() -> Cluster:
    cluster = Cluster.load(Paths.from_env())
    if cluster is None:
        raise BrokerError(f"no cluster in {Paths.from_env().data} (start one with --nodes N)")
    return cluster


def _stop_nodes(cluster: Cluster, timeout: float) -> bool:
    """Stop every node (SIGTERM, then SIGKILL); return whether any was running."""
    pids = [(cluster.paths(n), running_pid(cluster.paths(n))) for n in cluster.ids()]
    for _, pid in pids:  # all at once: a node left alone has no quorum to shut down with
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    for paths, pid in pids:
        if pid is not None:
            terminate(pid, timeout)
            paths.pid_file.unlink(missing_ok=True)
    return any(pid is not None for _, pid in pids)


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latch broker",
        description="Run a local single-node Apache Kafka broker (KRaft) on 127.0.0.1.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start_p = sub.add_parser("start", help="start the broker; print its bootstrap address")
    start_p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="client (PLAINTEXT) port, default %(default)s",
    )
    start_p.add_argument(
        "--controller-port", type=int, default=None, help="KRaft controller port, default PORT+1"
    )
    start_p.add_argument(
        "--nodes", type=int, default=None,
        help="start a cluster of N nodes (static KRaft quorum, replication min(3, N)) on "
             "ports PORT, PORT+2, ... (controllers on the odd ones)")
    start_p.add_argument(
        "--node", type=int, default=None,
        help="start node I of the cluster in the data dir again, with its data")
    start_p.add_argument(
        "--fresh",
        action="store_true",
        help="stop the broker if running and wipe its data dir first",
    )
    start_p.add_argument(
        "--timeout",
        type=float,
        default=START_TIMEOUT_S,
        help="seconds to wait for the broker to answer, default %(default)s",
    )
    stop_p = sub.add_parser("stop", help="stop the broker (SIGTERM, then SIGKILL)")
    stop_p.add_argument(
        "--timeout",
        type=float,
        default=STOP_TIMEOUT_S,
        help="seconds before SIGKILL, default %(default)s",
    )
    sub.add_parser("status", help="print running/stopped; exit 0 if running, 3 if not")
    kill_p = sub.add_parser("kill", help="SIGKILL one node of a cluster (to test failover)")
    kill_p.add_argument("--node", type=int, required=True, help="the node's id, 1 to N")
    return parser


def _cmd_start(args: argparse.Namespace) -> int:
    if args.node is not None:
        print(start_node(args.node, args.timeout))
        return EXIT_OK
    nodes = args.nodes
    if nodes is None and not args.fresh:
        found = Cluster.load(Paths.from_env())
        nodes = found.nodes if found is not None else None
    if nodes is not None and nodes > 1:
        print(start_cluster(nodes, args.port, fresh=args.fresh, timeout=args.timeout))
        return EXIT_OK
    controller = args.controller_port or args.port + 1
    print(start(Ports(args.port, controller), fresh=args.fresh, timeout=args.timeout))
    return EXIT_OK


def _cmd_kill(args: argparse.Namespace) -> int:
    print(f"node {args.node}: " + ("killed" if kill_node(args.node) else "was not running"))
    return EXIT_OK


def _cmd_stop(args: argparse.Namespace) -> int:
    was_running = stop(args.timeout)
    print("stopped" if was_running else "stopped (was not running)")
    return EXIT_OK


def _cmd_status(_: argparse.Namespace) -> int:
    pid, bootstrap = status()
    if pid is None:
        print(f"stopped bootstrap={bootstrap}")
        return EXIT_NOT_RUNNING
    print(f"running pid={pid} bootstrap={bootstrap}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``latch broker ...``; ``argv`` are the arguments after ``broker``."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_FAILED
    commands = {"start": _cmd_start, "stop": _cmd_stop, "status": _cmd_status,
                "kill": _cmd_kill}
    try:
        return commands[args.command](args)
    except BrokerError as exc:
        print(f"latch broker: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
