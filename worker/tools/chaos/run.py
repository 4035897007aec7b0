"""``python -m worker.tools.chaos.run`` (``latch chaos``): Latch's promises under faults.

Modelled on Kafka Streams' EOS system test (``streams_eos_test.py``: a driver, ``kill -9``
and a verifier that reads only what was written), with Latch's own promises
(``guarantees.md``) as the properties to verify:

* **driver**: a seeded plan (:mod:`worker.tools.chaos.plan`) of M runs across the three providers,
  each with the outcome the offline core (:class:`~worker.core.Assembler`, the code path of
  ``latch assemble``) gives the very bytes that are published: parallel calls, large
  arguments in small fragments, calls without arguments, invalid JSON, unknown tools, schema
  violations, broken streams, cancelled runs (events without an end, then a cancel on the
  control topic), idle runs (no end, no cancel: the ticks expire them) and a few bad input
  records whose bytes must reach the DLQ. :class:`Driver` publishes the runs interleaved,
  keyed by ``run_id``, at a steady rate, with :class:`~worker.client.publisher.Publisher`; a run's
  cancel goes out once its envelopes are acknowledged, or at once for a cancel raced against
  its ``run.start`` (so cancels are also in flight while kills move partitions). The workers
  run with block-level early commit for the ``lookup`` tool (``plan.EARLY_SETTINGS``).
* **faults**, while the driver publishes: N worker processes, K of them killed with SIGKILL at
  random moments and restarted after a short random delay; R broker restarts (SIGTERM through
  ``latch broker stop`` and SIGKILL of the broker's pid, alternately) with the broker's data
  kept, in their own thread so that kills go on meanwhile. A worker that exits on its own is
  restarted too (the supervisor a deployment has, systemd or Kubernetes): those restarts are
  counted and reported as ``respawns``. With ``--policy-rollouts N`` the workers take the
  ``--policy`` from the registry, and N new versions of it are registered meanwhile
  (:mod:`worker.tools.chaos.rollout`).
* **verifier** (:mod:`worker.tools.chaos.verify`), once every run has its final message and the
  worker group has committed past every input record: reads every output topic from the
  beginning and counts ``missing`` outcomes, ``contradictions`` (two outcomes for a call, or
  two different records under one idempotency key, or a final message that disagrees) and
  ``mismatched`` records (not what the offline core emits, committed arguments included; or
  in the DLQ without being a bad input).

The idle timeout must be longer than the longest broker outage: while the broker is away
the publisher buffers the runs' events, and the first tick a worker writes after the restart
can land in a partition before them, so a run that straddles the outage has, in its log, a
gap as long as the outage, and expires by design. ``--idle-timeout`` defaults to 45 s (an
outage here lasts 15 to 25 s); the notes name every outage.

One summary line goes to stdout (exit 0 on PASS, 1 on FAIL, 2 when the chaos could not be
set up); progress, the first failures and details go to stderr. Without ``--bootstrap`` the
chaos starts its own broker (``latch broker`` in the work directory, on free ports) and stops
it at the end; broker restarts need that broker, or ``--broker-dir`` for a managed one.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import itertools
import logging
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from worker.client.publisher import PublishError
from worker.runtime.config import Config, load_config
from worker.runtime.observability import logs
from worker.tools import broker as broker_tool
from worker.tools.chaos import rollout
from worker.tools.chaos.plan import (
    APPROVER,
    APPROVER_GROUP,
    APPROVER_KEY_ID,
    APPROVER_KEY_VAR,
    EARLY_SETTINGS,
    GATED,
    HANG,
    Misbehaviour,
    Plan,
    PlanError,
    RunPlan,
    build_plan,
)
from worker.tools.chaos.verify import (
    Latch,
    OutRecord,
    Rollout,
    RunnerVerdict,
    Verdict,
    markers,
    verify,
    verify_runners,
)

OUTPUT_ROLES = ("committed", "errors", "final", "dlq", "audit", "pending", "run_ended")
#: With ``--runners``, the result latch's topics too: the runners' and the latch's results,
#: and the turn records.
LATCH_ROLES = ("results", "turns")
#: librdkafka settings that do the same for the kafka engine.
FAST_KAFKA = {"LATCH_KAFKA__SESSION_TIMEOUT_MS": "6000",
              "LATCH_KAFKA__HEARTBEAT_INTERVAL_MS": "1000"}
#: What each engine logs once it is consuming.
READY = ("[^Worker]: Ready", "kafka engine ready")
#: faust timings that make rebalances and failover quick on a local broker (the broker's
#: minimum session timeout is 6 s), as ``tests/worker_harness.py`` uses them.
FAST_FAUST = {
    "broker_session_timeout": 6,
    "broker_heartbeat_interval": 1,
    "broker_rebalance_timeout": 20,
    "broker_commit_interval": 0.5,
}
#: Seconds the broker stays up between two restarts, so that the publisher and the workers
#: catch up (restarts back to back would add up to one long outage).
MIN_BROKER_UP_S = 20.0
EXIT_PASS, EXIT_FAIL, EXIT_SETUP = 0, 1, 2


def _say(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


# =========================================================================================
# Kafka: topics, reading, waiting
# =========================================================================================


@dataclass(frozen=True, slots=True)
class Stack:
    """One chaos run's app id and topics; ``env()`` points a worker or ``load_config`` there."""

    bootstrap: str
    app_id: str
    partitions: int
    idle_timeout_s: float
    tick_interval_s: float
    engine: str = "kafka"
    #: The topics' replication factor (3 on a cluster of three nodes).
    replication: int = 1
    #: A .cedar file the workers (and the plan's offline core) enforce, or None: no policy.
    policy: str | None = None
    #: ``--policy-rollouts``: the workers take the policy from the registry (versions of
    #: ``policy``'s text, rollout.py), not from the file.
    policy_registry: bool = False
    #: Approvals (``--approvals``): calls of the plan's gated tool wait this long (record
    #: time) for a decision; None: approvals off.
    approval_timeout_s: float | None = None
    #: The chaos approver's key (hex), which signs its decisions (``--approvals``).
    approver_key: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    #: ``results.deadline_s`` of the workers (``--results-deadline``); None: the default.
    results_deadline_s: float | None = None

    def topic(self, role: str) -> str:
        return f"{self.app_id}.{role}"

    def env(self) -> dict[str, str]:
        roles = ("events", "control", "committed", "errors", "final", "progress", "dlq", "audit",
                 "results", "pending", "run_ended", "journal", "registry", "turns")
        env = {f"LATCH_TOPICS__{role.upper()}": self.topic(role) for role in roles}
        return env | {
            "LATCH_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            "LATCH_TOPICS__PARTITIONS": str(self.partitions),
            "LATCH_TOPICS__REPLICATION_FACTOR": str(self.replication),
            "LATCH_WORKER__APP_ID": self.app_id,
            "LATCH_WORKER__WEB_PORT": "0", "LATCH_WORKER__HTTP_PORT": "0",
            "LATCH_WORKER__TICK_INTERVAL_S": str(self.tick_interval_s),
            "LATCH_AGENT_STREAM_ASSEMBLE__ASSEMBLE_IDLE_TIMEOUT_S": str(self.idle_timeout_s),
            "LATCH_WORKER__ENGINE": self.engine,
        } | {f"LATCH_AGENT_STREAM_ASSEMBLE__{k.upper()}": v for k, v in EARLY_SETTINGS.items()
             } | ({"LATCH_POLICY__MODE": "enforce"} if self.policy else {}
             ) | ({"LATCH_POLICY__FILE": self.policy}
                  if self.policy and not self.policy_registry else {}
             ) | ({"LATCH_APPROVALS__REQUIRE_APPROVAL": GATED,
                   "LATCH_APPROVALS__APPROVAL_TIMEOUT_S": str(self.approval_timeout_s),
                   **self._approvers()}
                  if self.approval_timeout_s is not None else {}
             ) | ({"LATCH_RESULTS__DEADLINE_S": str(self.results_deadline_s)}
                  if self.results_deadline_s is not None else {})

    def _approvers(self) -> dict[str, str]:
        """The chaos approver's key and identity (workers verify, the driver signs)."""
        return {"LATCH_APPROVERS__KEYS": f"{{{APPROVER_KEY_ID}: 'env:{APPROVER_KEY_VAR}'}}",
                "LATCH_APPROVERS__OWNERS": f"{{{APPROVER_KEY_ID}: {APPROVER}}}",
                "LATCH_APPROVERS__GROUPS": f"{{{APPROVER}: [{APPROVER_GROUP}]}}",
                "LATCH_APPROVERS__KEY_ID": APPROVER_KEY_ID,
                APPROVER_KEY_VAR: self.approver_key}

    def config(self, **kafka: str) -> Config:
        extra = {f"LATCH_KAFKA__{k.upper()}": v for k, v in kafka.items()}
        return load_config(None, env=self.env() | extra)

    def create_topics(self) -> None:
        from confluent_kafka.admin import AdminClient

        from worker.runtime import admin

        client = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create(client, admin.specs(self.config()))


def read_outputs(stack: Stack, roles: Sequence[str] = OUTPUT_ROLES,
                 timeout: float = 120.0) -> list[OutRecord]:
    """Every record of the output topics, from the beginning to their end as of now."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    topics = {stack.topic(role): role for role in roles}
    # read_committed (the kafka engine's aborted transactions are not seen), to the end the
    # consumer reports: a transaction's marker takes the last offset and is never delivered.
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "chaos-verifier",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    try:
        meta = consumer.list_topics(timeout=30).topics
        tps = [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta[t].partitions]
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=30)[1]
                for tp in tps}
        left = {tp for tp, end in ends.items() if end > 0}
        consumer.assign(tps)
        records: list[OutRecord] = []
        deadline = time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the outputs: {len(left)} partitions unfinished")
            for msg in consumer.consume(1000, timeout=0.5):
                topic, partition = msg.topic() or "", msg.partition() or 0
                offset, where = msg.offset() or 0, (topic, partition)
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and offset >= ends[where]:
                        left.discard(where)
                    continue
                if offset < ends[where]:
                    records.append(OutRecord(topics[topic], partition, offset, msg.key(),
                                             msg.value() or b"", msg.timestamp()[1]))
                if offset + 1 >= ends[where]:
                    left.discard(where)
        return records
    finally:
        consumer.close()


def wait_for_finals(stack: Stack, run_ids: Iterable[str], timeout: float,
                    on_tick: Callable[[], None] = lambda: None) -> set[str]:
    """Wait until every run has a final message; return the runs still without one."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from tqdm import tqdm

    wanted = set(run_ids)
    topic = stack.topic("final")
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "chaos-finals",
                         "enable.auto.commit": False})
    bar = tqdm(total=len(wanted), desc="finals", unit="run", file=sys.stderr, leave=False)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                         for p in range(stack.partitions)])
        seen: set[str] = set()
        deadline = time.monotonic() + timeout
        while seen < wanted and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is None:
                    run_id = (msg.key() or b"").decode("utf-8", "replace")
                    if run_id in wanted and run_id not in seen:
                        seen.add(run_id)
                        bar.update(1)
            on_tick()
        return wanted - seen
    finally:
        bar.close()
        consumer.close()


def wait_committed(stack: Stack, timeout: float, on_tick: Callable[[], None] = lambda: None
                   ) -> list[str]:
    """Wait until the worker group has committed past every record that is now in the events
    and control topics: every output of those records is then delivered (faust flushes its
    producer before it commits). Return the partitions that lag behind after ``timeout``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": stack.app_id,
                         "enable.auto.commit": False})
    try:
        tps = [TopicPartition(stack.topic(role), p) for role in ("events", "control")
               for p in range(stack.partitions)]
        ends = [consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in tps]
        deadline = time.monotonic() + timeout
        lagging = ["no answer from the group coordinator"]
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the broker may be restarting
                done = [tp.offset for tp in consumer.committed(tps, timeout=10)]
                lagging = [f"{tp.topic}[{tp.partition}] committed {c}, end {e}"
                           for tp, c, e in zip(tps, done, ends, strict=True) if e and c < e]
                if not lagging:
                    return []
            on_tick()
            time.sleep(0.5)
        return lagging
    finally:
        consumer.close()


# =========================================================================================
# Processes: the broker and the workers
# =========================================================================================


class Broker:
    """A broker that ``latch broker`` manages in ``data_dir``: start, stop (SIGTERM), kill."""

    def __init__(self, data_dir: Path, port: int, controller_port: int) -> None:
        self.data_dir = data_dir
        self.port, self.controller_port = port, controller_port
        self.bootstrap = f"127.0.0.1:{port}"
        #: (how, began, ended) of each restart, in monotonic seconds.
        self.outages: list[tuple[str, float, float]] = []

    @classmethod
    def own(cls, work_dir: Path) -> Broker:
        port = broker_tool.free_ports(2)
        return cls(work_dir / "broker", port, port + 1)

    @classmethod
    def managed(cls, data_dir: Path) -> Broker:
        state = orjson.loads((data_dir / "broker.json").read_bytes())
        return cls(data_dir, int(state["port"]), int(state["controller_port"]))

    def _cli(self, *args: str) -> None:
        env = os.environ | {"LATCH_BROKER_DIR": str(self.data_dir)}
        out = subprocess.run([sys.executable, "-m", "worker.tools.broker", *args], env=env,
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"latch broker {' '.join(args)} failed: {out.stderr.strip()}")

    def start(self) -> None:
        self._cli("start", "--port", str(self.port), "--controller-port",
                  str(self.controller_port), "--timeout", "120")

    def stop(self) -> None:
        self._cli("stop")

    def pid(self) -> int | None:
        try:
            return int((self.data_dir / "broker.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        """SIGKILL the broker's JVM and wait until it is gone."""
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        cmdline = Path(f"/proc/{pid}/cmdline")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if b"kafka.Kafka" not in cmdline.read_bytes():
                    return
            except OSError:
                return
            time.sleep(0.1)

    def restart(self, how: str, down_s: float) -> float:
        """Stop the broker (``how``: ``sigterm`` or ``sigkill``), wait ``down_s``, start it
        again with its data; return how long it did not answer."""
        began = time.monotonic()
        if how == "sigterm":
            self.stop()
        else:
            self.kill()
        time.sleep(down_s)
        self.start()
        ended = time.monotonic()
        self.outages.append((how, began, ended))
        return ended - began

    def longest_outage(self, between: float = MIN_BROKER_UP_S) -> float:
        """The longest time without a usable broker: outages less than ``between`` seconds
        apart count as one (the clients had no time to catch up in between)."""
        longest, current = 0.0, None
        for _, began, ended in sorted(self.outages, key=lambda o: o[1]):
            if current is not None and began - current[1] < between:
                current = (current[0], ended)
            else:
                current = (began, ended)
            longest = max(longest, current[1] - current[0])
        return longest


class ClusterBroker(Broker):
    """A cluster of nodes that ``latch broker start --nodes N`` manages in ``data_dir``. Its
    faults kill one node at a time with SIGKILL: the leader of a partition of
    :attr:`watch_topic` (``how`` = ``sigterm`` in the schedule's alternation) or the active
    KRaft controller (``sigkill``), then start that node again with its data. The cluster
    stays available throughout (replication 3, ``min.insync.replicas`` 2)."""

    def __init__(self, data_dir: Path, port: int, nodes: int) -> None:
        super().__init__(data_dir, port, port + 1)
        self.nodes = nodes
        self.bootstrap = ",".join(f"127.0.0.1:{port + 2 * n}" for n in range(nodes))
        self.watch_topic: str | None = None
        self.rng = random.Random(nodes)

    @classmethod
    def own_cluster(cls, work_dir: Path, nodes: int) -> ClusterBroker:
        """A cluster on a free block of 2N ports."""
        return cls(work_dir / "cluster", broker_tool.free_ports(2 * nodes), nodes)

    def start(self) -> None:
        self._cli("start", "--nodes", str(self.nodes), "--port", str(self.port),
                  "--timeout", "180")

    def restart(self, how: str, down_s: float) -> float:
        """SIGKILL the chosen node, wait ``down_s``, start it again; return how long it was
        away (the cluster itself answers throughout)."""
        node, role = (self._leader(), "partition leader") if how == "sigterm" else (
            self._controller(), "active controller")
        began = time.monotonic()
        self._cli("kill", "--node", str(node))
        time.sleep(down_s)
        self._cli("start", "--node", str(node), "--timeout", "180")
        ended = time.monotonic()
        self.outages.append((f"SIGKILL of node {node}, the {role},", began, ended))
        return ended - began

    def _leader(self) -> int:
        """The node leading a random partition of the watched topic (any node without one)."""
        from confluent_kafka.admin import AdminClient

        if self.watch_topic is not None:
            meta = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(
                self.watch_topic, timeout=10).topics.get(self.watch_topic)
            leaders = [p.leader for p in (meta.partitions.values() if meta else [])
                       if p.leader > 0]
            if leaders:
                return int(self.rng.choice(leaders))
        return self.rng.randint(1, self.nodes)

    def _controller(self) -> int:
        cluster = broker_tool.Cluster.load(broker_tool.Paths(Path("."), self.data_dir))
        found = cluster.active_controller() if cluster is not None else None
        return found if found is not None else self.rng.randint(1, self.nodes)

    def longest_outage(self, between: float = MIN_BROKER_UP_S) -> float:
        """A cluster never goes away: only the leader elections cost time, not the outage."""
        return 0.0


class Workers:
    """N worker processes (``python -m worker worker``), each slot restartable."""

    def __init__(self, stack: Stack, count: int, log_dir: Path,
                 faust: dict[str, str] | None = None) -> None:
        self.stack, self.log_dir = stack, log_dir
        self.faust = {k: str(v) for k, v in FAST_FAUST.items()} | (faust or {})
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self.logs: list[Path] = [log_dir / "none"] * count
        self.generation = itertools.count()
        self.exits: list[str] = []

    def spawn(self, slot: int) -> None:
        args = [f"--faust-setting={k}={v}" for k, v in self.faust.items()]
        env = os.environ | self.stack.env() | {"PYTHONUNBUFFERED": "1"}
        if self.stack.engine == "kafka":
            # a respawned slot keeps its transactional.id: it aborts its predecessor's
            # open transaction at once
            args, env = [], FAST_KAFKA | env | {"LATCH_WORKER__INSTANCE_ID": f"slot-{slot}"}
        self.logs[slot] = self.log_dir / f"worker-{slot}.{next(self.generation)}.log"
        with open(self.logs[slot], "wb") as log:
            self.procs[slot] = subprocess.Popen(
                [sys.executable, "-m", "worker", "worker", *args], env=env, cwd=self.log_dir,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def kill(self, slot: int) -> None:
        proc = self.procs[slot]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def dead(self) -> list[int]:
        """Slots whose process exited on its own since the last call (and forget them)."""
        found = []
        for slot, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is not None:
                self.exits.append(f"{self.logs[slot].name} exited {proc.returncode}: "
                                  f"{_last_error(self.logs[slot])}")
                self.procs[slot] = None
                found.append(slot)
        return found

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        pending = set(range(len(self.procs)))
        while pending and time.monotonic() < deadline:
            for slot in list(pending):
                text = self.logs[slot].read_text(errors="replace")
                if any(ready in text for ready in READY):
                    pending.discard(slot)
                elif (proc := self.procs[slot]) is not None and proc.poll() is not None:
                    raise RuntimeError(f"worker {slot} exited {proc.returncode} at start: "
                                       f"{_last_error(self.logs[slot])}")
            time.sleep(0.2)
        if pending:
            raise RuntimeError(f"workers {sorted(pending)} not ready after {timeout:.0f}s")

    def stop_all(self, timeout: float = 30.0) -> list[str]:
        """SIGTERM every worker; return a line for each that did not exit cleanly."""
        problems = []
        live = [(s, p) for s, p in enumerate(self.procs) if p is not None and p.poll() is None]
        for _, proc in live:
            proc.send_signal(signal.SIGTERM)
        for slot, proc in live:
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = -9
            if code != 0:
                problems.append(f"{self.logs[slot].name} exited {code} on SIGTERM")
            self.procs[slot] = None
        return problems

    def takeovers(self) -> str:
        """What the worker logs say about partition takeovers (rebuilds from the log)."""
        rebuilt = refinished = 0
        open_runs: list[int] = []
        for path in self.log_dir.glob("worker-*.log"):
            text = path.read_text(errors="replace")
            found = re.findall(r"partition \d+: rebuilt before offset \d+ from \d+ records; "
                               r"(\d+) runs open", text)
            rebuilt += len(found)
            open_runs += [int(n) for n in found if int(n) > 0]
            refinished += len(re.findall(r"finished during the rebuild", text))
        return (f"takeovers: {rebuilt} partition rebuilds, {len(open_runs)} of them with open "
                f"runs ({sum(open_runs)} runs rebuilt from the log); {refinished} re-finalized "
                "runs without a done head")

    def log_problems(self) -> Counter[str]:
        """Counts of ERROR/CRITICAL/WARNING messages over every worker log (numbers masked)."""
        found: Counter[str] = Counter()
        for path in self.log_dir.glob("worker-*.log"):
            for line in path.read_text(errors="replace").splitlines():
                match = re.search(r"\[(ERROR|CRITICAL|WARNING)\] (.*)", line)
                if match:
                    found[f"{match.group(1)} {re.sub(r'[0-9]+', 'N', match.group(2))[:120]}"] += 1
        return found


class Runners(threading.Thread):
    """``--runners N``: N transactional runners (:mod:`worker.tools.chaos.runner_child`), each
    with a stable transactional id; ``kills`` SIGKILLs at random moments over ``span`` seconds,
    each runner restarted at once, but for ``deaths`` of them, chosen at random, after which the
    runner stays dead (never the last one alive: the group's others take its partitions over);
    a runner that exits on its own is restarted too. ``misbehaviour``: the calls the runners
    hang on or answer twice (``runner_child``)."""

    def __init__(self, stack: Stack, count: int, log_dir: Path, rng: random.Random,
                 kills: int, span: float, deaths: int = 0,
                 misbehaviour: Misbehaviour | None = None) -> None:
        super().__init__(name="chaos-runners", daemon=True)
        self.stack, self.log_dir, self.rng = stack, log_dir, rng
        self.exec_log = log_dir / "executions.log"
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * count
        self.generation = itertools.count()
        self.kill_at = schedule(rng, span, kills, 0.05, 0.95)
        self.die_at = set(rng.sample(range(kills), min(deaths, kills)))
        self.misbehaviour = misbehaviour or Misbehaviour()
        self.kills = self.respawns = self.deaths = 0
        self.dead: set[int] = set()
        self.scheduled = itertools.count()
        self.exits: list[str] = []
        self.stopping = threading.Event()
        self.began = time.monotonic()

    def spawn(self, slot: int) -> None:
        log = self.log_dir / f"runner-{slot}.{next(self.generation)}.log"
        args = [self.stack.bootstrap, self.stack.topic("committed"), self.stack.topic("results"),
                self.stack.topic("journal"), f"{self.stack.app_id}-runners",
                f"{self.stack.app_id}-runner-{slot}", str(self.exec_log)]
        bad = self.misbehaviour
        if bad.hang_rate or bad.twice_rate:
            args += [str(bad.seed), repr(bad.hang_rate), repr(bad.twice_rate)]
        with open(log, "wb") as out:
            self.procs[slot] = subprocess.Popen(
                [sys.executable, "-m", "worker.tools.chaos.runner_child", *args],
                env=os.environ | {"PYTHONUNBUFFERED": "1"}, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            now = time.monotonic() - self.began
            while self.kill_at and self.kill_at[0] <= now:
                self.kill_at.pop(0)
                alive = [s for s in range(len(self.procs)) if s not in self.dead]
                slot = self.rng.choice(alive)
                proc = self.procs[slot]
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    self.kills += 1
                if next(self.scheduled) in self.die_at and len(alive) > 1:
                    self.procs[slot] = None  # it stays dead
                    self.dead.add(slot)
                    self.deaths += 1
                    continue
                self.spawn(slot)
                self.respawns += 1
            for slot, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None:
                    self.exits.append(f"runner {slot} exited {proc.returncode}")
                    self.spawn(slot)
                    self.respawns += 1

    def stop_all(self) -> None:
        self.stopping.set()
        self.join(10)
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _last_error(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines()
             if re.search(r"ERROR|CRITICAL|Error|Exception", line)]
    return lines[-1][-200:] if lines else "(no error in its log)"


# =========================================================================================
# Faults: kills, broker restarts, and the supervisor
# =========================================================================================


class Faults(threading.Thread):
    """Runs the fault schedule against the workers and the broker, and restarts any worker
    that died on its own (the deployment's supervisor)."""

    def __init__(self, workers: Workers, broker: Broker | None, rng: random.Random,
                 kills: Sequence[float], restarts: Sequence[float]) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.workers, self.broker, self.rng = workers, broker, rng
        self.t0 = time.monotonic()
        self.queue: list[tuple[float, int, str, int]] = []
        self.order = itertools.count()
        for at in kills:
            self._at(at, "kill")
        for n, at in enumerate(restarts):
            self._at(at, "sigterm" if n % 2 == 0 else "sigkill")
        self.kills = self.broker_restarts = self.respawns = 0
        self.down: set[int] = set()
        self.log: list[str] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.broker_lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def _at(self, at: float, action: str, slot: int = -1) -> None:
        heapq.heappush(self.queue, (at, next(self.order), action, slot))

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> None:
        try:
            while not (self.stopping.is_set() and not self.queue):
                while self.queue and self.queue[0][0] <= self.now():
                    _, _, action, slot = heapq.heappop(self.queue)
                    self._do(action, slot)
                self.supervise()
                time.sleep(0.2)
        except Exception as exc:  # reported by the driver
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _do(self, action: str, slot: int) -> None:
        if action == "kill":
            alive = self.workers.alive()
            if not alive:
                return
            victim = self.rng.choice(alive)
            with self.lock:
                self.workers.kill(victim)
                self.down.add(victim)
            self.kills += 1
            delay = self.rng.uniform(0.5, 5.0)
            self.log.append(f"{self.now():7.1f}s SIGKILL worker {victim}; restart in {delay:.1f}s")
            self._at(self.now() + delay, "restart", victim)
        elif action == "restart":
            with self.lock:
                self.workers.spawn(slot)
                self.down.discard(slot)
            self.log.append(f"{self.now():7.1f}s restarted worker {slot}")
        elif self.broker is not None:
            down = self.rng.uniform(1.0, 3.0)
            thread = threading.Thread(target=self._restart_broker, args=(action, down),
                                      name=f"chaos-broker-{action}", daemon=True)
            self.threads.append(thread)
            thread.start()

    def _restart_broker(self, how: str, down: float) -> None:
        """In its own thread, so that kills go on while the broker is away."""
        assert self.broker is not None
        with self.broker_lock:
            if self.broker.outages:  # let the clients catch up after the previous restart
                time.sleep(max(0.0, self.broker.outages[-1][2] + MIN_BROKER_UP_S
                               - time.monotonic()))
            self.log.append(f"{self.now():7.1f}s broker {how} (down {down:.1f}s, then start)")
            try:
                outage = self.broker.restart(how, down)
            except Exception as exc:
                self.errors.append(f"broker {how} restart failed: {exc}")
                return
            self.broker_restarts += 1
            self.log.append(f"{self.now():7.1f}s broker answers again after {outage:.1f}s")

    def supervise(self) -> None:
        with self.lock:
            for slot in self.workers.dead():
                if slot in self.down:
                    continue
                self.respawns += 1
                self.log.append(f"{self.now():7.1f}s worker {slot} exited on its own; respawned")
                self.workers.spawn(slot)

    def finish(self, timeout: float = 300.0) -> None:
        """Let the pending actions (restarts) run, then stop."""
        self.stopping.set()
        self.join(timeout)
        for thread in self.threads:
            thread.join(timeout)


# =========================================================================================
# The driver
# =========================================================================================


@dataclass(slots=True)
class Options:
    runs: int = 2000
    workers: int = 3
    kills: int = 5
    broker_restarts: int = 2
    seed: int = 1
    partitions: int = 6
    rate: float = 400.0
    window: int = 32
    idle_timeout_s: float = 45.0
    tick_interval_s: float = 1.0
    drain_timeout_s: float = 600.0
    #: Broker nodes: 1, or a cluster (``latch broker start --nodes N``, replication 3).
    cluster: int = 1
    #: faust settings for the workers, over :data:`FAST_FAUST`.
    faust: dict[str, str] = field(default_factory=dict)
    #: ``worker.engine`` (the worker's default, kafka): with ``kafka``, a duplicate at
    #: read_committed is a failure.
    engine: str = "kafka"
    #: Kinds of runs left out of the plan (``--exclude-kind``).
    exclude: tuple[str, ...] = ()
    #: A .cedar file to enforce (``--policy``); None: policy off.
    policy: str | None = None
    #: ``--approvals``: the plan's gated calls wait for the driver's approver this long
    #: (``approvals.approval_timeout_s``); None: approvals off.
    approval_timeout_s: float | None = None
    #: ``--runners N``: transactional runners executing the committed calls, killed and
    #: restarted; 0: none.
    runners: int = 0
    #: SIGKILLs of runners over the run (``--runner-kills``).
    runner_kills: int = 8
    #: Of those, how many leave their runner dead (``--runner-deaths``; never the last).
    runner_deaths: int = 0
    #: Shares of the committed calls the runners hang on (never answer) and answer twice
    #: (``--hang-rate``, ``--twice-rate``; plan.Misbehaviour picks them).
    hang_rate: float = 0.0
    twice_rate: float = 0.0
    #: ``results.deadline_s`` of the workers with ``--runners`` (``--results-deadline``).
    results_deadline_s: float = 30.0
    #: ``--policy-rollouts N``: the workers take ``policy`` from the registry; version 1
    #: before the runs, N more while publishing (rollout.py); 0: the file decides.
    policy_rollouts: int = 0


@dataclass(slots=True)
class Result:
    verdict: Verdict
    plan: Plan
    stack: Stack
    kills: int
    broker_restarts: int
    respawns: int
    durations: dict[str, float]
    notes: list[str]
    #: ``--runners``: the runners' verdict and their kills.
    runners: RunnerVerdict | None = None
    runner_kills: int = 0

    @property
    def summary(self) -> str:
        return self.verdict.summary(self.kills, self.broker_restarts) + (
            "" if self.runners is None else "\n" + self.runners.summary(self.runner_kills))

    @property
    def ok(self) -> bool:
        return self.verdict.ok and (self.runners is None or self.runners.ok)


class Driver:
    """Publishes the plan's runs interleaved, at a steady rate; sends each cancel once the
    run's envelopes are acknowledged."""

    def __init__(self, plan: Plan, stack: Stack, rng: random.Random, options: Options,
                 log_path: Path) -> None:
        from confluent_kafka import Producer

        from worker.client.publisher import FORCED_SETTINGS, PRODUCER_DEFAULTS, Delivery, Publisher

        self.plan, self.rng, self.options, self.log_path = plan, rng, options, log_path
        #: The approver (``--approvals``), polled as the driver goes.
        self.approver: Approver | None = None
        self.delivered: Counter[str] = Counter()
        #: Runs whose cancel the broker acknowledged: each must end its calls ``cancelled``.
        self.acked_cancels: set[str] = set()
        #: Records published so far (``--policy-rollouts`` registers versions by it).
        self.sent = 0
        delivered, acked, control = self.delivered, self.acked_cancels, stack.topic("control")

        def count(delivery: Delivery) -> None:
            delivered[delivery.key] += 1
            if delivery.topic == control:
                acked.add(delivery.key)

        # Publishing goes on while the broker restarts: keep messages and reconnect quickly;
        # librdkafka's complaints about the missing broker go to a log file, not the terminal.
        config = stack.config(message_timeout_ms="600000", reconnect_backoff_max_ms="1000")
        producer = Producer({**PRODUCER_DEFAULTS, **config.kafka.confluent_config(),
                             **FORCED_SETTINGS, "logger": _file_logger(log_path)})
        self.publisher = Publisher(config, on_delivery=count, clock=None, producer=producer)

    def publish(self) -> None:
        from tqdm import tqdm

        pending = list(self.plan.runs)
        self.rng.shuffle(pending)
        bad = list(self.plan.bad)
        active: list[tuple[RunPlan, Iterator[bytes]]] = []
        cancels: dict[str, RunPlan] = {}
        total = self.plan.events
        chance_bad = len(bad) / max(1, total)
        bar = tqdm(total=total, desc="publishing", unit="rec", file=sys.stderr, leave=False)
        started, sent = time.monotonic(), 0
        while pending or active or cancels or bad:
            while pending and len(active) < self.options.window:
                run = pending.pop()
                active.append((run, iter(run.envelopes)))
                if run.cancel is not None:
                    cancels[run.run_id] = run
            if active:
                slot = self.rng.randrange(len(active))
                run, rest = active[slot]
                value = next(rest, None)
                if value is None:
                    active.pop(slot)
                    continue
                self.publisher.send_raw(run.run_id, value)
            elif bad:
                chance_bad = 1.0
            if bad and self.rng.random() < chance_bad:
                item = bad.pop()
                self.publisher.send_raw(item.key.decode(), item.value, control=item.control)
                sent += 1
            sent += 1 + self._cancels(cancels)
            self.sent = sent
            bar.update(sent - bar.n)
            if not active and not pending and cancels:
                self.publisher.poll(0.05)
            if self.approver is not None and sent % 20 == 0:
                self.approver.poll()
            ahead = sent / self.options.rate - (time.monotonic() - started)
            if ahead > 0:
                self.publisher.poll(ahead)
        bar.close()

    def _cancels(self, cancels: dict[str, RunPlan]) -> int:
        """Send the cancels of runs whose ``cancel_after`` envelopes are acknowledged: all of
        them, or none for a cancel raced against its run's ``run.start`` (sent at once; it
        may reach the log first, and partitions may be moving)."""
        ready = [r for r in cancels.values() if self.delivered[r.run_id] >= r.cancel_after]
        for run in ready:
            assert run.cancel is not None
            self.publisher.send_raw(run.run_id, run.cancel, control=True)
            del cancels[run.run_id]
        return len(ready)

    def flush(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.publisher.flush(5.0)
                return
            except PublishError as exc:
                if exc.topic is not None or time.monotonic() > deadline:
                    raise


class Approver:
    """The person in the loop (``--approvals``): reads the pending topic from its beginning
    (read_committed) and, for each call it reads the first time, sends the plan's decision
    for it to the control topic (approve, deny, edit), or nothing (the call times out)."""

    def __init__(self, plan: Plan, stack: Stack, driver: Driver) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.driver = driver
        self.decisions = {(r.run_id, cid): env for r in plan.runs
                          for cid, env in r.decisions.items()}
        self.read: set[tuple[str, str]] = set()
        self.sent = 0
        self.consumer = Consumer({"bootstrap.servers": stack.bootstrap,
                                  "group.id": "chaos-approver", "enable.auto.commit": False,
                                  "isolation.level": "read_committed",
                                  "logger": _file_logger(driver.log_path)})
        self.consumer.assign([TopicPartition(stack.topic("pending"), p, OFFSET_BEGINNING)
                              for p in range(stack.partitions)])

    def poll(self) -> None:
        for msg in self.consumer.consume(500, timeout=0):
            if msg.error() is not None:
                continue
            with contextlib.suppress(ValueError, orjson.JSONDecodeError):
                value = orjson.loads(msg.value() or b"")
                call = (str(value.get("run_id")), str(value.get("call_id")))
                if call in self.read:
                    continue  # a repeated pending record: the call has its decision
                self.read.add(call)
                decision = self.decisions.get(call)
                if decision is not None:
                    self.driver.publisher.send_raw(call[0], decision, control=True)
                    self.sent += 1
        self.driver.publisher.poll(0)

    def close(self) -> None:
        self.consumer.close()


def _file_logger(path: Path, name: str | None = None) -> logging.Logger:
    logger = logging.getLogger(name or f"latch.chaos.{path}")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.FileHandler(path))
    return logger


def schedule(rng: random.Random, span: float, count: int, low: float = 0.1,
             high: float = 0.85) -> list[float]:
    """``count`` moments spread at random over ``[low, high] * span`` seconds."""
    if count <= 0:
        return []
    step = (high - low) * span / count
    return [span * low + step * (n + rng.random()) for n in range(count)]


def run_chaos(options: Options, broker: Broker | None, bootstrap: str, work_dir: Path,
              tag: str = "") -> Result:
    """Create the topics, start the workers, publish under faults, wait, verify."""
    durations: dict[str, float] = {}
    notes: list[str] = []
    began = time.monotonic()
    stack = Stack(bootstrap, f"chaos{tag}-{uuid.uuid4().hex[:8]}", options.partitions,
                  options.idle_timeout_s, options.tick_interval_s, options.engine,
                  replication=min(3, options.cluster), policy=options.policy,
                  approval_timeout_s=options.approval_timeout_s,
                  policy_registry=bool(options.policy_rollouts),
                  results_deadline_s=options.results_deadline_s if options.runners else None)
    if isinstance(broker, ClusterBroker):
        broker.watch_topic = stack.topic("events")
    # (the plan's offline core enforces the file: every rolled-out version decides alike)
    file_stack = dataclasses.replace(stack, policy_registry=False)
    plan = build_plan(options.seed, options.runs, file_stack.config(), tag, options.exclude,
                      os.environ | file_stack.env())
    durations["plan"] = time.monotonic() - began
    _say(f"{len(plan.runs)} runs, {plan.calls} calls, {len(plan.bad)} bad inputs, "
         f"{plan.events} records; app {stack.app_id}; work dir {work_dir}")
    if options.policy:
        denied = sum(c.intent == "policy_denied" for r in plan.runs for c in r.opened.values())
        _say(f"policy enforce ({options.policy}): {denied} calls meant to get policy_denied")
    stack.create_topics()
    if options.policy_rollouts:  # (the registry clients' librdkafka lines: to a file)
        _file_logger(work_dir / "registry.log", logs.KAFKA_LOGGER)
    versions = _first_version(options, stack)
    workers = Workers(stack, options.workers, work_dir, options.faust)
    for slot in range(options.workers):
        workers.spawn(slot)
    if options.approval_timeout_s is not None:
        held = Counter(c.decision for r in plan.runs for c in r.opened.values() if c.decision)
        _say(f"approvals (timeout {options.approval_timeout_s:g}s): {sum(held.values())} "
             f"calls of {GATED} wait, the approver means to "
             + ", ".join(f"{k} {v}" for k, v in sorted(held.items())))
    faults: Faults | None = None
    runners: Runners | None = None
    misbehaviour = Misbehaviour(options.seed, options.hang_rate, options.twice_rate)
    approver: Approver | None = None
    rollouts: rollout.Rollouts | None = None
    try:
        workers.wait_ready()
        if versions:
            _wait_markers(stack, 1, 120.0, "before publishing")
        if options.runners:
            runners = Runners(stack, options.runners, work_dir, random.Random(options.seed + 3),
                              options.runner_kills, plan.events / options.rate + 60,
                              options.runner_deaths, misbehaviour)
            for slot in range(options.runners):
                runners.spawn(slot)
            runners.start()
        faults = _start_faults(options, plan, workers, broker, notes)
        t = time.monotonic()
        driver = Driver(plan, stack, random.Random(options.seed + 2), options,
                        work_dir / "publisher.log")
        if options.approval_timeout_s is not None:
            approver = driver.approver = Approver(plan, stack, driver)
        if versions:
            rollouts = rollout.Rollouts(stack.config(), versions,
                                        max(1, plan.events // len(versions)),
                                        lambda: driver.sent)
            rollouts.start()
        driver.publish()
        driver.flush(options.drain_timeout_s)
        if rollouts is not None:
            notes += _rollouts_done(rollouts, faults, plan.events)
        durations["publish"] = time.monotonic() - t
        t = time.monotonic()
        notes += _drain(options, plan, stack, faults,
                        approver.poll if approver is not None else lambda: None)
        if approver is not None:
            driver.flush(60)
            notes.append(f"approver: read {len(approver.read)} held calls, sent "
                         f"{approver.sent} decisions")
        if rollouts is not None:
            notes += _wait_markers(stack, rollouts.registered[-1], 120.0, "at the end",
                                   faults.supervise)
        durations["drain"] = time.monotonic() - t
        if runners is not None:
            t = time.monotonic()
            notes += _wait_results(stack, options.drain_timeout_s, misbehaviour)
            notes += _wait_turns(stack, options.drain_timeout_s)
            durations["runners"] = time.monotonic() - t
    finally:
        if rollouts is not None:
            rollouts.stopping.set()
        if faults is not None:
            faults.stopping.set()
        if runners is not None:
            runners.stop_all()
            notes += runners.exits[:10]
        if approver is not None:
            approver.close()
        notes += workers.stop_all()
    t = time.monotonic()
    execution_log = ""
    if runners is not None and runners.exec_log.exists():
        execution_log = runners.exec_log.read_text()
    latch = None if runners is None else Latch(
        misbehaviour, execution_log, read_outputs(stack, ("events",), timeout=300.0),
        round(options.results_deadline_s * 1000))
    outputs = read_outputs(stack, OUTPUT_ROLES + (LATCH_ROLES if latch else ()))
    verdict = verify(plan, outputs, acked_cancels=driver.acked_cancels,
                     exactly_once=options.engine == "kafka", latch=latch,
                     rollout=None if rollouts is None else Rollout(
                         tuple(rollouts.registered),
                         markers(read_outputs(stack, ("events",), timeout=300.0)),
                         stack.partitions))
    durations["verify"] = time.monotonic() - t
    if verdict.policy_versions:
        named = [v for v in verdict.policy_audits if isinstance(v, int)]
        notes.append(f"policy: {verdict.policy_markers} markers in the events log; "
                     f"{sum(verdict.policy_audits.values())} audits decided by a policy name "
                     f"{len(verdict.policy_audits)} distinct versions"
                     + (f", {min(named)} to {max(named)}" if named else ""))
    durations["total"] = time.monotonic() - began
    assert faults is not None
    notes += _what_happened(options, faults, workers, broker)
    runner_verdict = None
    if runners is not None:
        runner_verdict = verify_runners([r for r in outputs if r.role in ("committed", "results")],
                                        execution_log, misbehaviour)
        notes.append(f"runners: {runners.deaths} of the runner kills left the runner dead")
    return Result(verdict, plan, stack, faults.kills, faults.broker_restarts, faults.respawns,
                  durations, notes, runner_verdict, runners.kills if runners else 0)


def _first_version(options: Options, stack: Stack) -> list[str]:
    """``--policy-rollouts``: the versions' texts (rollout.py), version 1 registered; else
    none."""
    if not options.policy_rollouts or options.policy is None:
        return []
    versions = rollout.texts(Path(options.policy).read_text(), options.policy_rollouts + 1)
    rollout.register(stack.config(), 1, versions[0])
    _say(f"policy from the registry: version 1 registered, {options.policy_rollouts} more "
         "while publishing")
    return versions


def _wait_markers(stack: Stack, version: int, timeout: float, when: str,
                  on_tick: Callable[[], None] = lambda: None) -> list[str]:
    """Wait until every events partition's last policy marker names ``version``; raise
    RuntimeError if not within ``timeout`` before publishing, else a note."""
    read = rollout.wait_markers(stack.bootstrap, stack.topic("events"), stack.partitions,
                                version, timeout, on_tick)
    behind = [p for p in range(stack.partitions) if not read.get(p) or read[p][-1][1] != version]
    if not behind:
        return []
    why = (f"policy version {version} not marked in events partitions {behind} {when} "
           f"within {timeout:.0f}s")
    if when == "before publishing":
        raise RuntimeError(why)
    return [why]


def _rollouts_done(rollouts: rollout.Rollouts, faults: Faults, total: int) -> list[str]:
    """Wait for the last registration (it may retry through a broker restart); a note."""
    while rollouts.is_alive():
        rollouts.join(0.5)
        faults.supervise()
    during = sum(1 for _, at in rollouts.lags if at < total)
    late = max((at - due for due, at in rollouts.lags), default=0)
    note = (f"policy rollouts: versions {rollouts.registered[0]} to {rollouts.registered[-1]} "
            f"registered, one every {rollouts.every} records published; {during} of "
            f"{len(rollouts.lags)} before publishing ended, at most {late} records after "
            "their turn")
    return [note] + ([rollouts.error] if rollouts.error else [])


def _wait_results(stack: Stack, timeout: float,
                  misbehaviour: Misbehaviour | None = None) -> list[str]:
    """Wait until every committed call has a result (read_committed): a runner's, or the
    latch's ``tool_timeout`` for a call the runners hang on (``misbehaviour``); what is left,
    as a note."""
    bad = misbehaviour or Misbehaviour()
    deadline = time.monotonic() + timeout
    left: set[str] = set()
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # the broker may be restarting
            records = read_outputs(stack, ("committed", "results"))
            committed: set[str] = set()
            answered: set[str] = set()
            for record in records:
                value = orjson.loads(record.value)
                key = str(value.get("idempotency_key"))
                if record.role == "committed":
                    committed.add(key)
                elif (value.get("by") == "latch") == (bad.of(key) == HANG):
                    answered.add(key)  # (a runner's answer; the latch's for a hung call)
            left = committed - answered
            if not left:
                return []
        time.sleep(3)
    return [f"{len(left)} committed calls had no result after {timeout:.0f}s"]


def _wait_turns(stack: Stack, timeout: float) -> list[str]:
    """Wait until every run with a final message has a turn record (read_committed); what is
    left, as a note (the verifier counts each as ``missing``)."""
    deadline = time.monotonic() + timeout
    left: set[bytes | None] = set()
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # the broker may be restarting
            records = read_outputs(stack, ("final", "turns"))
            left = ({r.key for r in records if r.role == "final"}
                    - {r.key for r in records if r.role == "turns"})
            if not left:
                return []
        time.sleep(3)
    return [f"{len(left)} runs had no turn record after {timeout:.0f}s"]


def _start_faults(options: Options, plan: Plan, workers: Workers, broker: Broker | None,
                  notes: list[str]) -> Faults:
    """Schedule the kills and broker restarts over the publishing span, and start them."""
    rng = random.Random(options.seed + 1)
    span = plan.events / options.rate
    restarts = options.broker_restarts if broker is not None else 0
    if options.broker_restarts and broker is None:
        notes.append("no broker to restart (--bootstrap without --broker-dir)")
    faults = Faults(workers, broker, rng, schedule(rng, span, options.kills),
                    schedule(rng, span, restarts, 0.25, 0.75))
    faults.start()
    return faults


def _drain(options: Options, plan: Plan, stack: Stack, faults: Faults,
           tick: Callable[[], None] = lambda: None) -> list[str]:
    """End the faults, then wait for every run's final message and for the group's commits
    to pass the inputs; what did not happen in time, as notes."""
    notes = []
    faults.finish()
    def on_tick() -> None:
        faults.supervise()
        tick()

    left = wait_for_finals(stack, (r.run_id for r in plan.runs), options.drain_timeout_s,
                           on_tick)
    if left:
        notes.append(f"{len(left)} runs had no final message after "
                     f"{options.drain_timeout_s:.0f}s, e.g. {sorted(left)[:3]}")
    lagging = wait_committed(stack, 120.0, on_tick)
    if lagging:
        notes.append(f"the worker group did not commit past the inputs within 120s: "
                     f"{'; '.join(lagging)}")
    return notes


def _what_happened(options: Options, faults: Faults, workers: Workers,
                   broker: Broker | None) -> list[str]:
    """The faults, exits, takeovers, log problems and broker outages of a run, as notes."""
    notes = faults.errors + faults.log + workers.exits
    notes.append(workers.takeovers())
    notes += [f"{n} x {line}" for line, n in workers.log_problems().most_common(12)]
    if broker is None:
        return notes
    notes += [f"broker {how} outage {ended - began:.1f}s" for how, began, ended
              in broker.outages]
    if broker.longest_outage() >= options.idle_timeout_s - 5:
        notes.append(f"the broker was away for {broker.longest_outage():.1f}s, within 5 s of "
                     f"the idle timeout ({options.idle_timeout_s:g}s): runs that straddle "
                     "the outage may expire (see the module docstring)")
    return notes


# =========================================================================================
# The command line
# =========================================================================================


#: The policy ``--policy`` enforces when it names no file.
DEFAULT_POLICY = Path(__file__).with_name("chaos.cedar")


def build_parser() -> argparse.ArgumentParser:
    defaults = Options()
    parser = argparse.ArgumentParser(
        prog="latch chaos", description="Publish runs while killing workers and restarting the "
        "broker, then verify every promise on the output topics.")
    add = parser.add_argument
    add("--runs", type=int, default=defaults.runs, help="runs to publish (M)")
    add("--workers", type=int, default=defaults.workers, help="worker processes (N)")
    add("--kills", type=int, default=defaults.kills, help="SIGKILLs of a random worker (K)")
    add("--broker-restarts", type=int, default=defaults.broker_restarts,
        help="broker restarts, SIGTERM and SIGKILL alternately (R)")
    add("--seed", type=int, default=defaults.seed, help="seed of the plan and the faults")
    add("--bootstrap", help="use the broker there (default: start an own broker)")
    add("--broker-dir", type=Path,
        help="with --bootstrap: the `latch broker` data dir of that broker, to restart it")
    add("--cluster", type=int, default=defaults.cluster, metavar="NODES",
        help="run an own cluster of NODES brokers (replication 3, min.insync.replicas 2); "
        "its faults kill a partition leader and the active controller, alternately")
    add("--partitions", type=int, default=defaults.partitions)
    add("--rate", type=float, default=defaults.rate, help="records published per second")
    add("--idle-timeout", type=float, default=defaults.idle_timeout_s,
        help="assemble_idle_timeout_s; keep it above the longest broker outage")
    add("--tick-interval", type=float, default=defaults.tick_interval_s)
    add("--drain-timeout", type=float, default=defaults.drain_timeout_s,
        help="seconds to wait for every final message after publishing")
    add("--engine", choices=("faust", "kafka"), default=defaults.engine,
        help="worker.engine of the workers; with kafka the verifier also fails on duplicates")
    add("--faust-setting", action="append", default=[], metavar="NAME=VALUE",
        help="a faust setting for the workers (over the fast timings), e.g. "
        "table_standby_replicas=0")
    add("--exclude-kind", action="append", default=[], metavar="KIND",
        help="leave a kind of run out of the plan (e.g. one whose fix is not merged yet)")
    add("--policy", nargs="?", const=str(DEFAULT_POLICY), metavar="FILE",
        help="workers enforce a Cedar policy (default FILE: the shipped chaos.cedar, which "
        "denies the plan's calls under /denied/; those must get policy_denied)")
    add("--policy-rollouts", type=int, default=defaults.policy_rollouts, metavar="N",
        help="with --policy: the workers take it from the registry (policy.mode enforce, no "
        "policy.file); version 1 is registered before the runs, N more (the same policies "
        "under another comment) evenly while publishing; audits must name the version in "
        "force")
    add("--approvals", nargs="?", type=float, const=-1.0, metavar="TIMEOUT_S",
        help="some runs call a gated tool (approvals.require_approval: delete_file); the "
        "driver's approver approves, denies or edits each (valid and invalid arguments) as "
        "planned, or leaves it to time out after TIMEOUT_S of record time (default: the idle "
        "timeout)")
    add("--runners", type=int, default=defaults.runners, metavar="N",
        help="N transactional runners (journal mode) execute the committed calls, killed "
        "with SIGKILL at random moments and restarted; each call must get one result")
    add("--runner-kills", type=int, default=defaults.runner_kills)
    add("--runner-deaths", type=int, default=defaults.runner_deaths, metavar="D",
        help="D of the runner kills leave their runner dead (never the last one): the "
        "group's other runners take its calls over")
    add("--hang-rate", type=float, default=defaults.hang_rate, metavar="P",
        help="with --runners: the runners take a share P of the committed calls and never "
        "answer them; the worker's result latch must answer each tool_timeout")
    add("--twice-rate", type=float, default=defaults.twice_rate, metavar="P",
        help="with --runners: the runners answer a share P of the committed calls twice; "
        "the second answer must reach the DLQ as result_duplicate, never the turn record")
    add("--results-deadline", type=float, default=defaults.results_deadline_s, metavar="S",
        help="with --runners: the workers' results.deadline_s (a hung call's tool_timeout "
        "comes S seconds of record time after its commit)")
    add("--work-dir", type=Path, help="logs (and the own broker); default: a temp dir, kept "
        "when the verdict is FAIL")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = Options(args.runs, args.workers, args.kills, args.broker_restarts, args.seed,
                      args.partitions, args.rate, idle_timeout_s=args.idle_timeout,
                      tick_interval_s=args.tick_interval, drain_timeout_s=args.drain_timeout,
                      faust=dict(pair.partition("=")[::2] for pair in args.faust_setting),
                      cluster=args.cluster, engine=args.engine,
                      exclude=tuple(args.exclude_kind),
                      policy=args.policy and str(Path(args.policy).absolute()),
                      approval_timeout_s=(None if args.approvals is None else
                                          args.idle_timeout if args.approvals < 0
                                          else args.approvals),
                      runners=args.runners, runner_kills=args.runner_kills,
                      policy_rollouts=args.policy_rollouts, runner_deaths=args.runner_deaths,
                      hang_rate=args.hang_rate, twice_rate=args.twice_rate,
                      results_deadline_s=args.results_deadline)
    if options.policy_rollouts and not options.policy:
        build_parser().error("--policy-rollouts needs --policy")
    if (options.hang_rate or options.twice_rate or options.runner_deaths) and not options.runners:
        build_parser().error("--hang-rate, --twice-rate and --runner-deaths need --runners")
    if not 0 <= options.hang_rate + options.twice_rate <= 1 or min(
            options.hang_rate, options.twice_rate) < 0:
        build_parser().error("--hang-rate and --twice-rate are shares: each >= 0, their sum <= 1")
    # absolute: workers and the broker run in directories of their own
    work_dir = (args.work_dir or Path(tempfile.mkdtemp(prefix="latch-chaos-"))).absolute()
    work_dir.mkdir(parents=True, exist_ok=True)
    broker: Broker | None = None
    own = args.bootstrap is None
    try:
        if own and options.cluster > 1:
            broker = ClusterBroker.own_cluster(work_dir, options.cluster)
            _say(f"starting an own cluster of {options.cluster} at {broker.bootstrap}")
            broker.start()
            bootstrap = broker.bootstrap
        elif own:
            broker = Broker.own(work_dir)
            _say(f"starting an own broker at {broker.bootstrap} in {broker.data_dir}")
            broker.start()
            bootstrap = broker.bootstrap
        else:
            bootstrap = args.bootstrap
            broker = Broker.managed(args.broker_dir.absolute()) if args.broker_dir else None
        result = run_chaos(options, broker, bootstrap, work_dir)
    except (PlanError, RuntimeError, OSError) as exc:
        _say(f"could not run: {exc} (work dir {work_dir})")
        return EXIT_SETUP
    except PublishError as exc:  # the driver's own producer: no verdict on the workers
        _say(f"could not run: the driver could not publish the plan: {exc} (its producer's "
             f"log: {work_dir / 'publisher.log'}; a producer that stays without a partition "
             "leader after a broker restart is librdkafka issue 5430, docs/chaos.md)")
        return EXIT_SETUP
    finally:
        if own and broker is not None:
            with contextlib.suppress(RuntimeError):
                broker.stop()
    for note in result.notes:
        _say(note)
    _say("durations: " + ", ".join(f"{k} {v:.1f}s" for k, v in result.durations.items())
         + f"; respawns={result.respawns}")
    for failure in result.verdict.failures[:20]:
        print(f"  {failure}")
    if len(result.verdict.failures) > 20:
        print(f"  ... and {len(result.verdict.failures) - 20} more")
    if result.runners is not None:
        for failure in result.runners.failures[:20]:
            print(f"  {failure}")
    print(result.summary, flush=True)
    if result.ok and args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    elif not result.ok:
        _say(f"logs kept in {work_dir}")
    return EXIT_PASS if result.ok else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
