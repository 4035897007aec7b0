"""The worker side by side with the least a worker could do, on one broker, in one run.

    python bench/bench_worker.py                       # 3 rounds, 400 runs, latency mode off
    python bench/bench_worker.py --rounds 5 --latency  # and the paced latency mode
    python bench/bench_worker.py --contenders latch-faust,bare-faust
    python bench/bench_worker.py --quick               # small (CI smoke): 1 round, 16 runs
    python bench/bench_worker.py --python .venv-compiled/bin/python   # Latch's compiled core
    python bench/bench_worker.py --contenders latch-faust,latch-faust-enforce  # policy on/off
    python bench/bench_worker.py --contenders latch-faust,latch-kafka --results on,off  # latch

Contenders (``--contenders``, a comma list; each a process of its own):

* ``latch-faust``: ``python -m worker worker`` with ``LATCH_WORKER__ENGINE=faust`` (the faust
  engine);
* ``latch-kafka``: the same with ``LATCH_WORKER__ENGINE=kafka`` (the confluent-kafka engine);
  skipped, with a printed line, when the configuration does not accept ``engine: kafka``;
* ``latch-faust-enforce``, ``latch-kafka-enforce``: those two with ``policy.mode`` ``enforce``
  and ``--policy`` (default ``bench/policies20.cedar``: 20 Cedar policies that permit every
  call of the backlog, on conditions over its arguments, so each call is decided and commits);
  named in ``--contenders`` only; their ratio to the same engine without a policy is reported;
* ``latch-faust-results-on``, ``latch-faust-results-off``, ``latch-kafka-results-on``,
  ``latch-kafka-results-off``: the two engines with the result latch (``results.enabled``)
  on or off; ``--results on,off`` runs each engine named in ``--contenders`` so, in the same
  rounds (``--results off``: only off), and reports on/off. The backlog has no runners: with
  the latch on, a run with committed calls keeps waiting for their results (its heads stay
  open, no turn record), a run without one gets its turn record (counted, ``turns``). Their
  ``results.deadline_s`` is a day: the backlog's record times age through the rounds, and
  with the default (300 s) the later rounds alone would time out every waiting call;
* ``latch-faust-results-answered``, ``latch-kafka-results-answered`` (``--results answered``):
  the latch on, and the benchmark answers every committed call as a runner would (a process
  of its own reads the committed calls at ``read_committed`` and publishes a result for each,
  ``worker.client.results.answer``), so that every run gets its turn record; the round waits
  for them all and reports how long after the last final record the last one came. The
  latch forwards each result into its run's events partition, so each answered round reads
  a copy of the backlog of its own (published before the rounds), never the shared one;
* ``bare-faust``: a faust agent that parses each value and forwards one record per
  ``stream.end`` (``bench/bare.py faust``);
* ``bare-loop``: a confluent-kafka consume -> parse -> produce loop (``bench/bare.py loop``).

What it does:

1. starts the project's broker (``worker.tools.broker``) on ``--port`` with its data in
   ``--broker-dir`` (fresh), unless ``--bootstrap`` names a running one; stops it at the end;
2. builds the backlog with ``bench/bench_core.py``'s generator (runs of the three providers
   from the recorded provider streams, mostly text deltas, two or three parallel calls, one run
   in twenty with a 64 KiB argument), publishes it once to an events topic whose records carry
   the broker's append time (``LogAppendTime``);
3. each round, each contender in turn (the order rotates by round) reads the whole backlog
   cold with a fresh consumer group and fresh output topics (``LogAppendTime`` too); the
   benchmark waits for one final record per run, stops the contender, and checks that its
   group committed the end of every events partition (it read every envelope);
4. throughput: envelopes / (last final record's append time - first one's), the same window
   for every contender, the finals read at ``read_committed`` (an exactly-once engine's count
   only once committed); CPU seconds of the contender's process (all its threads) in that
   window (:class:`CpuTimeline`: sampled every 10 ms, in ns) and in total (start-up included);
   ratios Latch / bare, by rate and by CPU, per round, and their median;
5. ``--latency``: for each contender, fresh topics, the contender started and warmed up (one
   tiny run through each events partition, then ``--latency-warmup-runs`` runs of the same
   load under other run ids, at the same rate, not measured), then ``--latency-runs`` runs
   published at ``--fraction`` of its median envelopes/s (or ``--latency-rate``
   envelopes/s, the same for every contender); for each run, "``stream.end`` appended ->
   final record appended" (broker append times) and "-> final record visible to a
   ``read_committed`` consumer" (a live watcher's clock, same host); p50/p99 of each.
   With ``--latency-rounds N`` the whole latency mode runs N times, the contenders taking
   turns in each round; the p50/p99 are of every round's runs pooled, and each round's own
   p99 is printed beside them (a p99 of a few hundred runs is their few slowest, which one
   broker pause moves). With ``--latency-rate`` the latency mode runs **before** the
   backlog is published (it needs no throughput figure): for about half a minute after
   the backlog and the throughput rounds, this broker's appends stall for 20 to 80 ms at
   times, and a paced run there measures the broker's recovery, not the contender
   (``docs/benchmarks.md``). ``--latency-dump`` writes each run's figures, to find what
   the slow ones share.

Every figure is of this machine at that moment: on a shared machine, compare the ratios of
one run, not the absolute rates of two.
"""

from __future__ import annotations

import argparse
import bisect
import concurrent.futures
import contextlib
import functools
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# the checkout last: an installed build of worker (the compiled core) comes first
sys.path[:0] = [str(ROOT / "bench")]
sys.path.append(str(ROOT))

import bench_core  # noqa: E402
import orjson  # noqa: E402
from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests import worker_harness  # noqa: E402
from worker.client.results import MAX_RESULT_BYTES, answer  # noqa: E402
from worker.core import Assembler, AssembleSettings  # noqa: E402
from worker.core.settings import ResultSettings  # noqa: E402
from worker.runtime import admin  # noqa: E402
from worker.runtime.config import load_config  # noqa: E402

#: faust timings that make start-up quick on a local broker (tests/worker_harness.py's).
FAST_FAUST = {"broker_session_timeout": 6, "broker_heartbeat_interval": 1,
              "broker_rebalance_timeout": 20, "broker_commit_interval": 0.5}
APPEND_TIME = ("message.timestamp.type", "LogAppendTime")
OUTPUTS = ("committed", "errors", "final", "progress", "dlq")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Record = tuple[bytes, bytes, int]


def say(text: str) -> None:
    print(text, flush=True)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from ``/proc/PID/stat``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuTimeline:
    """A contender's CPU time sampled every ``every`` seconds by a thread, in nanoseconds
    (the scheduler's ``/proc/PID/task/*/schedstat``: ``/proc/PID/stat`` counts in 10 ms
    ticks, too coarse for a bare loop that reads the backlog in 0.3 s of CPU), so that the
    CPU of any window can be read afterwards: :meth:`between` two wall-clock times. Sampled
    apart from the watcher, which may see a whole window's outputs in one fetch (then the
    CPU read when it saw the first and the last was the same, and the window's CPU came out
    0). A thread that ends keeps the time it had at its last sample."""

    def __init__(self, pid: int, every: float = 0.01) -> None:
        self.pid, self.every = pid, every
        self.threads: dict[str, int] = {}
        self.samples: list[tuple[float, float]] = []  # (wall time s, CPU s)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cpu-timeline", daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        now = time.time()
        try:
            tasks = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return
        for tid in tasks:
            try:
                with open(f"/proc/{self.pid}/task/{tid}/schedstat", "rb") as f:
                    self.threads[tid] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
        self.samples.append((now, sum(self.threads.values()) / 1e9))

    def _run(self) -> None:
        while not self.done.wait(self.every):
            self._sample()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def at(self, wall_s: float) -> float:
        """The CPU seconds at ``wall_s``, interpolated between the samples around it."""
        samples = self.samples
        if not samples:
            return float("nan")
        i = bisect.bisect_left(samples, (wall_s, -1.0))
        if i == 0:
            return samples[0][1]
        if i == len(samples):
            return samples[-1][1]
        (t0, c0), (t1, c1) = samples[i - 1], samples[i]
        return c0 + (c1 - c0) * (wall_s - t0) / (t1 - t0) if t1 > t0 else c1

    def between(self, start_s: float, end_s: float) -> float:
        return self.at(end_s) - self.at(start_s)


def find_fixtures() -> Path:
    """The shared provider fixtures: beside the checkout, or beside its main checkout."""
    for base in (ROOT, *ROOT.parents):
        candidate = base / "shared" / "fixtures" / "providers"
        if candidate.is_dir():
            return candidate
    raise SystemExit("no shared/fixtures/providers beside the checkout: pass --fixtures")


# -- the broker and topics ---------------------------------------------------------------


@contextlib.contextmanager
def own_broker(args: argparse.Namespace) -> Iterator[str]:
    """The broker at ``--bootstrap``, or the project's own, started fresh and stopped after."""
    if args.bootstrap:
        yield args.bootstrap
        return
    env = os.environ | {"LATCH_BROKER_DIR": str(args.broker_dir)}
    command = [sys.executable, "-m", "worker.tools.broker"]
    say(f"starting the broker on 127.0.0.1:{args.port} (data in {args.broker_dir})")
    out = subprocess.run([*command, "start", "--fresh", "--port", str(args.port),
                          "--controller-port", str(args.port + 1000), "--timeout", "180"],
                         env=env, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"broker start failed: {out.stderr.strip()}")
    try:
        yield out.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([*command, "stop"], env=env, check=False, cwd=ROOT,
                       capture_output=True)
        say("broker stopped")


class Topics:
    """Creates topics (all with the broker's append times) and deletes them all at the end.

    Every topic and consumer group of a benchmark run is named under ``prefix``
    (``--topic-prefix``), by :meth:`fresh`: never a default name of the configuration, which
    another user of the broker (``latch demo``, a worker) may hold with other settings."""

    def __init__(self, bootstrap: str, prefix: str = "latch-bench") -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.prefix = prefix
        self.created: list[str] = []

    def fresh(self, what: str, tag: str | None = None) -> str:
        """A new name ``<prefix>-<what>-<tag>`` (a random tag unless given): a contender's
        consumer group and app id, which its topics are named after (:class:`Setup`)."""
        return f"{self.prefix}-{what}-{tag or uuid.uuid4().hex[:6]}"

    def create(self, specs: Sequence[admin.TopicSpec]) -> None:
        admin.create(self.admin, specs)
        self.created += [s.name for s in specs]

    def simple(self, names: Sequence[str], partitions: int) -> None:
        self.create([admin.TopicSpec(n, partitions, 1, (APPEND_TIME,)) for n in names])

    def delete_all(self) -> None:
        if not self.created:
            return
        # each name once: librdkafka's DeleteTopics result for a name listed twice has crashed
        # confluent-kafka 2.16 (a segfault in rd_kafka_topic_result_error_string)
        futures = self.admin.delete_topics(list(dict.fromkeys(self.created)),
                                           operation_timeout=30)
        for future in futures.values():
            with contextlib.suppress(KafkaException):
                future.result(timeout=60)
        self.created = []


def publish(bootstrap: str, topic: str, records: Sequence[Record]) -> None:
    """Publish as a gateway does (the integration tests' publisher)."""
    worker_harness.publish(bootstrap, topic, ((key, value) for key, value, _ in records))


def end_offsets(consumer: Consumer, topic: str, partitions: int) -> list[int]:
    return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)]


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                   timeout=10)
        return [max(tp.offset, 0) for tp in found]
    finally:
        consumer.close()


# -- contenders -----------------------------------------------------------------------------


@dataclass
class Setup:
    """One contender's topics in one round (or in the latency mode)."""

    bootstrap: str
    group: str
    events: str
    partitions: int
    work: Path

    def topic(self, role: str) -> str:
        return f"{self.group}.{role}"


@dataclass
class Contender:
    """How to start one contender; ``latch`` contenders write Latch's five output topics,
    bare ones only ``final``."""

    name: str
    latch: bool
    start: Callable[[Setup, Path], subprocess.Popen[bytes]]
    #: Why it cannot run here, or None.
    unavailable: Callable[[], str | None] = lambda: None
    #: Output roles counted besides ``OUTPUTS`` (the result latch's ``turns``).
    more_outputs: tuple[str, ...] = ()
    #: Whether the benchmark answers each committed call (:func:`answer_calls`) and waits
    #: for every run's turn record.
    answers: bool = False

    def outputs(self) -> tuple[str, ...]:
        return (*OUTPUTS, *self.more_outputs) if self.latch else ("final",)

    def prepare(self, topics: Topics, setup: Setup) -> None:
        # the topic a faust app (bare or Latch's) makes for its group: deleted with the rest
        topics.created.append(f"{setup.group}-__assignor-__leader")
        if not self.latch:
            topics.simple([setup.topic("final")], setup.partitions)
            return
        config = load_config(None, env=latch_env(setup))
        outs = {config.topics.committed, config.topics.errors, config.topics.final,
                config.topics.progress, config.topics.dlq}
        specs = [replace(s, config=(*s.config, APPEND_TIME)) if s.name in outs else s
                 for s in admin.specs(config) if s.name != setup.events]
        topics.create(specs)


#: The enforce contenders' policy file (``--policy``).
POLICY_FILE = ROOT / "bench" / "policies20.cedar"


def latch_env(setup: Setup, engine: str | None = None,
              roles: Sequence[str] = worker_harness.TOPIC_ROLES) -> dict[str, str]:
    """A Latch contender's settings: every topic of the configuration (``roles``: this
    checkout's ``TOPIC_ROLES``, the runners' results topic too; another build's own, which
    may know fewer) named after ``setup.group``, and that group as its app id."""
    env = {f"LATCH_TOPICS__{role.upper()}": setup.topic(role) for role in roles}
    env |= {"LATCH_TOPICS__EVENTS": setup.events,
            "LATCH_KAFKA__BOOTSTRAP_SERVERS": setup.bootstrap,
            "LATCH_TOPICS__PARTITIONS": str(setup.partitions),
            "LATCH_WORKER__APP_ID": setup.group,
            "LATCH_WORKER__WEB_PORT": "0",
            # no HTTP port: another worker on this machine may hold the default one
            "LATCH_WORKER__HTTP_PORT": "0"}
    if engine is not None:
        env["LATCH_WORKER__ENGINE"] = engine
    return env


def spawn(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        # cwd: the work directory, so that `-m worker` imports the installed package (the
        # compiled core, when installed so) rather than this checkout's sources.
        return subprocess.Popen(command, env=os.environ | env | {"PYTHONUNBUFFERED": "1"},
                                cwd=log_path.parent, stdout=log, stderr=subprocess.STDOUT)


@functools.cache
def topic_roles(python: str) -> tuple[str, ...]:
    """The topic roles the build of ``python`` knows (an earlier build refuses a
    ``LATCH_TOPICS__`` setting it does not have, e.g. ``turns``)."""
    code = ("from dataclasses import fields\n"
            "from worker.runtime.config import TopicNames\n"
            "print(' '.join(f.name for f in fields(TopicNames) "
            "if isinstance(getattr(TopicNames(), f.name), str)))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                         cwd=empty_dir(), check=False)
    if out.returncode != 0:
        return worker_harness.TOPIC_ROLES
    return tuple(out.stdout.split())


#: ``results.deadline_s`` of the ``--results`` contenders (a day).
RESULTS_DEADLINE_S = 86_400

#: ``--results`` modes: the ``results.enabled`` each sets (``answered``: on, and the
#: benchmark answers each committed call).
RESULTS_MODES = {"on": "true", "off": "false", "answered": "true"}


def with_results(wanted: Sequence[str], modes: Sequence[str]) -> list[str]:
    """``--contenders`` with each engine contender (``latch-faust``, ``latch-kafka``) run
    once per ``--results`` mode (``latch-kafka-results-on``, ...), in the given order; the
    other contenders as they are."""
    out: list[str] = []
    for name in wanted:
        if name in ("latch-faust", "latch-kafka") and modes:
            out += [f"{name}-results-{mode}" for mode in modes]
        else:
            out.append(name)
    return list(dict.fromkeys(out))


@functools.cache
def empty_dir() -> str:
    """A directory with nothing in it, where ``python -c 'import worker'`` finds the
    installed package, not a checkout or a stray ``worker`` directory."""
    return tempfile.mkdtemp(prefix="latch-bench-empty-")


def contenders(python: str, baseline: str | None = None,
               policy: Path = POLICY_FILE) -> dict[str, Contender]:
    """The contenders; with ``baseline`` (another interpreter, e.g. a venv holding main's
    worker), ``latch-faust-baseline`` and ``latch-kafka-baseline`` too, for a before/after in
    the same rounds; the ``-enforce`` ones enforce ``policy``."""
    faust_args = [f"--faust-setting={k}={v}" for k, v in FAST_FAUST.items()]
    enforce = {"LATCH_POLICY__MODE": "enforce", "LATCH_POLICY__FILE": str(policy.resolve())}

    def faust_engine(interpreter: str, extra: dict[str, str] | None = None
                     ) -> Callable[[Setup, Path], subprocess.Popen[bytes]]:
        def start(setup: Setup, log: Path) -> subprocess.Popen[bytes]:
            return spawn([interpreter, "-m", "worker", "worker", *faust_args],
                         latch_env(setup, "faust", topic_roles(interpreter)) | (extra or {}),
                         log)
        return start

    def kafka_engine(interpreter: str, extra: dict[str, str] | None = None
                     ) -> Callable[[Setup, Path], subprocess.Popen[bytes]]:
        def start(setup: Setup, log: Path) -> subprocess.Popen[bytes]:
            # no HTTP port: another worker on this machine may hold the default one
            return spawn([interpreter, "-m", "worker", "worker"],
                         latch_env(setup, "kafka", topic_roles(interpreter))
                         | {"LATCH_WORKER__HTTP_PORT": "0"} | (extra or {}), log)
        return start

    def policy_missing() -> str | None:
        code = ("from worker.runtime.config import load_config\n"
                f"load_config(None, env={enforce!r})")
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             cwd=empty_dir(), check=False)
        if out.returncode == 0:
            return None
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return f"this build does not enforce {policy} ({last})"

    def kafka_missing() -> str | None:
        code = ("from worker.runtime.config import load_config\n"
                "load_config(None, env={'LATCH_WORKER__ENGINE': 'kafka'})")
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             cwd=empty_dir(), check=False)
        if out.returncode == 0:
            return None
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        if "engine" not in last:
            raise SystemExit(f"cannot load Latch's configuration with {python}: {last}")
        return f"worker.engine does not accept 'kafka' in this build ({last})"

    def bare(mode: str) -> Callable[[Setup, Path], subprocess.Popen[bytes]]:
        def start(setup: Setup, log: Path) -> subprocess.Popen[bytes]:
            env = {"BARE_BOOTSTRAP": setup.bootstrap, "BARE_EVENTS": setup.events,
                   "BARE_OUTPUT": setup.topic("final"), "BARE_GROUP": setup.group,
                   "BARE_PARTITIONS": str(setup.partitions)}
            return spawn([python, str(ROOT / "bench" / "bare.py"), mode], env, log)
        return start

    found = [Contender("latch-faust", True, faust_engine(python)),
             Contender("latch-faust-enforce", True, faust_engine(python, enforce),
                       policy_missing),
             Contender("latch-kafka", True, kafka_engine(python), kafka_missing),
             Contender("latch-kafka-enforce", True, kafka_engine(python, enforce),
                       lambda: kafka_missing() or policy_missing()),
             Contender("bare-faust", False, bare("faust")),
             Contender("bare-loop", False, bare("loop"))]
    for mode, enabled in RESULTS_MODES.items():
        latch_on = ("turns",) if enabled == "true" else ()
        answers = mode == "answered"
        # no deadline passes in a benchmark: a backlog read minutes after it was published
        # would time out every waiting call (tool_timeout) in the later rounds only
        results = {"LATCH_RESULTS__ENABLED": enabled,
                   "LATCH_RESULTS__DEADLINE_S": str(RESULTS_DEADLINE_S)}
        found += [Contender(f"latch-faust-results-{mode}", True, faust_engine(python, results),
                            more_outputs=latch_on, answers=answers),
                  Contender(f"latch-kafka-results-{mode}", True, kafka_engine(python, results),
                            kafka_missing, more_outputs=latch_on, answers=answers)]
    if baseline:
        found.insert(1, Contender("latch-faust-baseline", True, faust_engine(baseline)))
        # named in --contenders only (the baseline must have the kafka engine)
        found.insert(3, Contender("latch-kafka-baseline", True, kafka_engine(baseline)))
    return {c.name: c for c in found}


#: The ratios reported: (Latch contender, the bare one it is measured against).
RATIOS = (("latch-faust", "bare-faust"), ("latch-faust-baseline", "bare-faust"),
          ("latch-kafka", "bare-loop"), ("latch-kafka", "bare-faust"),
          ("latch-kafka-baseline", "bare-loop"), ("latch-faust", "latch-faust-baseline"),
          ("latch-kafka", "latch-kafka-baseline"),
          ("latch-faust-enforce", "latch-faust"), ("latch-kafka-enforce", "latch-kafka"),
          ("latch-faust-results-on", "latch-faust-results-off"),
          ("latch-kafka-results-on", "latch-kafka-results-off"),
          ("latch-faust-results-answered", "latch-faust-results-off"),
          ("latch-kafka-results-answered", "latch-kafka-results-off"),
          ("latch-faust-results-off", "latch-faust-baseline"),
          ("latch-kafka-results-off", "latch-kafka-baseline"),
          ("latch-faust-results-off", "bare-faust"), ("latch-kafka-results-off", "bare-loop"))


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(45)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# -- watching outputs --------------------------------------------------------------------------


@dataclass
class Watch:
    """The final records of one contender, as they become visible (read_committed)."""

    #: run key -> (broker append time ms, time seen by the watcher ms), first seen only.
    finals: dict[bytes, tuple[int, float]] = field(default_factory=dict)
    cpu_first: float = float("nan")
    cpu_last: float = float("nan")


def watch_finals(setup: Setup, proc: subprocess.Popen[bytes], wanted: set[bytes],
                 timeout: float, label: str, progress_every: float = 10.0) -> Watch:
    """Read the final topic live until every wanted run has a final record; sample the
    contender's CPU when the first and the last arrive; a progress line on long waits."""
    consumer = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 5})
    topic = setup.topic("final")
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                     for p in range(setup.partitions)])
    watch = Watch()
    started = time.monotonic()
    shown = started
    try:
        while not wanted <= watch.finals.keys():
            now = time.monotonic()
            if now - started > timeout:
                raise RuntimeError(f"{label}: {len(wanted & watch.finals.keys())}/{len(wanted)} "
                                   f"finals after {timeout:.0f} s")
            if proc.poll() is not None:
                raise RuntimeError(f"{label}: the contender exited {proc.returncode}")
            if now - shown >= progress_every:
                shown = now
                say(f"    {label}: {len(wanted & watch.finals.keys())}/{len(wanted)} runs "
                    f"finished, {now - started:.0f} s")
            # poll, not consume(n, timeout): a batch consume waits out its timeout unless n
            # records arrive, which would add up to that timeout to every "visible" time
            msg = consumer.poll(0.05)
            if msg is None or msg.error() is not None or msg.key() in watch.finals:
                continue
            if not watch.finals:
                watch.cpu_first = cpu_seconds(proc.pid)
            watch.finals[msg.key()] = (msg.timestamp()[1], time.time() * 1000)
        watch.cpu_last = cpu_seconds(proc.pid)
        return watch
    finally:
        consumer.close()


def count_outputs(setup: Setup, roles: Sequence[str]) -> dict[str, int]:
    """The records of each output topic as a ``read_committed`` reader sees them: counted by
    reading them, since an exactly-once engine's transaction markers take offsets too; and
    the DLQ's records by reason (``dlq <reason>``), when it has any."""
    counts: dict[str, int] = {}
    for role in roles:
        counts[role], reasons = _count_records(setup, setup.topic(role), role == "dlq")
        counts |= {f"dlq {reason}": n for reason, n in sorted(reasons.items())}
    return counts


def _count_records(setup: Setup, topic: str, reasons: bool = False
                   ) -> tuple[int, dict[str, int]]:
    consumer = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    by_reason: dict[str, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                         for p in range(setup.partitions)])
        count, at_end, deadline = 0, set(), time.monotonic() + 60
        while len(at_end) < setup.partitions and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                error = msg.error()
                if error is None:
                    count += 1
                    if reasons:
                        reason = str(orjson.loads(msg.value()).get("reason"))
                        by_reason[reason] = by_reason.get(reason, 0) + 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
        return count, by_reason
    finally:
        consumer.close()


# -- throughput ------------------------------------------------------------------------------


@dataclass
class Result:
    contender: str
    round: int
    envelopes: int
    window_s: float
    cpu_window_s: float
    cpu_total_s: float
    wall_s: float
    read_all: bool
    outputs: dict[str, int]
    #: the machine's load average (1, 5, 15 min) when the round ended
    load: str = ""
    #: answered contenders: the last turn record's append time - the last final record's, s
    turns_after_s: float = float("nan")

    @property
    def rate(self) -> float:
        return self.envelopes / self.window_s if self.window_s > 0 else float("nan")


def throughput_round(c: Contender, n: int, bootstrap: str, events: str, backlog: list[int],
                     runs: set[bytes], envelopes: int, topics: Topics, work: Path) -> Result:
    """One contender reads the backlog (whose partitions end at ``backlog``) cold (an
    answering contender with a runner beside it, until every run has its turn record)."""
    partitions = len(backlog)
    setup = Setup(bootstrap, topics.fresh(f"{c.name}-r{n}"), events, partitions, work)
    c.prepare(topics, setup)
    log_path = work / f"{c.name}-r{n}.log"
    runner = start_answering(setup) if c.answers else None
    began = time.monotonic()
    proc = c.start(setup, log_path)
    cpu = CpuTimeline(proc.pid)
    last_turn = float("nan")
    try:
        timeout = max(180.0, envelopes / 500)
        watch = watch_finals(setup, proc, runs, timeout, f"{c.name} round {n}")
        if runner is not None:
            last_turn = watch_turns(setup, proc, len(runs), timeout, f"{c.name} round {n}")
        wall = time.monotonic() - began
        cpu_total = cpu_seconds(proc.pid)
        wait_committed(bootstrap, setup.group, events, backlog, 15.0)
    finally:
        cpu.stop()
        status = stop(proc)
        if runner is not None:
            runner[1].set()
            runner[0].join(60)
    if status != 0:
        say(f"    {c.name}: exited {status} on SIGTERM (log: {log_path})")
    # Latch's ticks land in the events topic too: every backlog offset must be committed.
    done = committed(bootstrap, setup.group, events, partitions)
    read_all = all(d >= end for d, end in zip(done, backlog, strict=True))
    times = sorted(t for t, _ in watch.finals.values())
    # the CPU of the same window as the rate: first final appended -> last final appended
    return Result(c.name, n, envelopes, (times[-1] - times[0]) / 1000,
                  cpu.between(times[0] / 1000, times[-1] / 1000), cpu_total, wall, read_all,
                  count_outputs(setup, c.outputs()),
                  turns_after_s=(last_turn - times[-1]) / 1000)


def start_answering(setup: Setup) -> tuple[Any, Any]:
    """:func:`answer_calls` for ``setup``'s topics in a process of its own (forked: the
    contender's CPU is sampled apart from it); the process and the event that stops it."""
    fork = multiprocessing.get_context("fork")
    stopped = fork.Event()
    process = fork.Process(target=answer_calls, name="bench-answerer", daemon=True,
                           args=(setup.bootstrap, setup.topic("committed"),
                                 setup.topic("results"), setup.partitions, stopped))
    process.start()
    return process, stopped


def answer_calls(bootstrap: str, committed_topic: str, results_topic: str, partitions: int,
                 stopped: Any) -> None:
    """A runner that answers at once: each committed call, read as a runner reads it
    (``read_committed``), gets one result (``worker.client.results.answer``, the text
    ``ok``), keyed by its run id (co-partitioned with its events), until ``stopped``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 5})
    consumer.assign([TopicPartition(committed_topic, p, OFFSET_BEGINNING)
                     for p in range(partitions)])
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True, "linger.ms": 5})
    try:
        while not stopped.is_set():
            for msg in consumer.consume(500, timeout=0.05):
                if msg.error() is not None:
                    continue
                call = orjson.loads(msg.value())
                producer.produce(results_topic, key=call["run_id"].encode(),
                                 value=answer(call, False, "ok", MAX_RESULT_BYTES))
            producer.poll(0)
    finally:
        producer.flush(30)
        consumer.close()


def watch_turns(setup: Setup, proc: subprocess.Popen[bytes], runs: int, timeout: float,
                label: str) -> float:
    """Read the turns topic (``read_committed``) until it holds ``runs`` turn records; the
    last one's broker append time (ms)."""
    consumer = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 5})
    consumer.assign([TopicPartition(setup.topic("turns"), p, OFFSET_BEGINNING)
                     for p in range(setup.partitions)])
    seen, last = 0, float("nan")
    deadline = time.monotonic() + timeout
    try:
        while seen < runs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: {seen}/{runs} turn records after {timeout:.0f} s")
            if proc.poll() is not None:
                raise RuntimeError(f"{label}: the contender exited {proc.returncode}")
            for msg in consumer.consume(1000, timeout=0.05):
                if msg.error() is None:
                    seen += 1
                    last = msg.timestamp()[1] if math.isnan(last) else max(
                        last, msg.timestamp()[1])
        return last
    finally:
        consumer.close()


def wait_committed(bootstrap: str, group: str, topic: str, backlog: list[int],
                   timeout: float) -> None:
    """Wait (``timeout`` at most) until ``group`` has committed the end of the backlog: the
    last final record can be out before the record that made it is acked and committed (at
    the next commit interval), and stopping the contender then would leave it uncommitted."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = committed(bootstrap, group, topic, len(backlog))
        if all(d >= end for d, end in zip(done, backlog, strict=True)):
            return
        time.sleep(0.25)


def end_offsets_of(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        return end_offsets(consumer, topic, partitions)
    finally:
        consumer.close()


# -- latency ---------------------------------------------------------------------------------


def warm_records(tag: str, partitions: int) -> list[tuple[int, Record]]:
    """One tiny run (start, end) into each events partition, published first so that the
    contender is assigned and has taken over every partition (Latch: its first record there
    rebuilds it) before the paced load begins: otherwise the first paced run of each
    partition pays for the takeover."""
    warm = []
    for partition in range(partitions):
        run_id = f"warm-{tag}-{partition}"
        start = {"v": 1, "run_id": run_id, "seq": 0, "type": "run.start",
                 "provider": "openai.chat", "tenant": "t1", "tools": []}
        end = {"v": 1, "run_id": run_id, "seq": 1, "type": "stream.end"}
        warm += [(partition, (run_id.encode(), orjson.dumps(doc), 0)) for doc in (start, end)]
    return warm


def publish_to_partitions(bootstrap: str, topic: str,
                          records: Sequence[tuple[int, Record]]) -> None:
    """Publish each record into the partition given with it."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for partition, (key, value, _) in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    if producer.flush(60):
        raise RuntimeError("the warm-up records were not all delivered")


def paced_publish(bootstrap: str, topic: str, records: Sequence[Record], rate: float) -> float:
    """Publish ``records`` at ``rate`` per second; return the rate achieved."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "linger.ms": 1, "message.max.bytes": 4 << 20})
    began = time.monotonic()
    sent = 0
    while sent < len(records):
        due = min(len(records), int((time.monotonic() - began) * rate) + 1)
        while sent < due:
            key, value, _ = records[sent]
            try:
                producer.produce(topic, key=key, value=value)
            except BufferError:
                producer.poll(0.01)
                continue
            sent += 1
        producer.poll(0)
        time.sleep(0.001)
    elapsed = time.monotonic() - began
    producer.flush(60)
    return len(records) / elapsed if elapsed > 0 else float("nan")


def stream_end_times(bootstrap: str, topic: str, partitions: int) -> dict[bytes, int]:
    """The broker append time of each run's ``stream.end``."""
    # to the end of each partition as the consumer sees it (enable.partition.eof): the
    # exactly-once engine's ticks leave transaction markers there, which take offsets but
    # are never delivered, so the end offset itself may never be reached; read_uncommitted:
    # the envelopes are not transactional, and an open transaction must not hide them
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_uncommitted"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    found: dict[bytes, int] = {}
    at_end: set[int] = set()
    try:
        while len(at_end) < partitions:
            for msg in consumer.consume(1000, timeout=1.0):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition())
                    continue
                if b'"stream.end"' in msg.value() and \
                        orjson.loads(msg.value()).get("type") == "stream.end":
                    found[msg.key()] = msg.timestamp()[1]
    finally:
        consumer.close()
    return found


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Latency:
    contender: str
    rate: float
    achieved: float
    runs: int
    appended: list[float]
    visible: list[float]
    #: each run's key, in the order of ``appended`` and ``visible`` (for --latency-dump)
    keys: list[bytes] = field(default_factory=list)
    #: each run's stream.end append time (ms since the epoch), in the same order
    ends: list[int] = field(default_factory=list)
    #: which of ``--latency-rounds`` this is
    round: int = 1


def latency_run(c: Contender, bootstrap: str, partitions: int, records: list[Record],
                rate: float, topics: Topics, work: Path,
                warmup: Sequence[Record] = ()) -> Latency:
    tag = uuid.uuid4().hex[:6]
    group = topics.fresh(f"lat-{c.name}", tag)
    setup = Setup(bootstrap, group, f"{group}.events", partitions, work)
    topics.simple([setup.events], partitions)
    c.prepare(topics, setup)
    proc = c.start(setup, work / f"{c.name}-latency-{tag}.log")
    try:
        warm = warm_records(tag, partitions)
        publish_to_partitions(bootstrap, setup.events, warm)
        watch_finals(setup, proc, {key for _, (key, _, _) in warm}, 120, f"{c.name} warm-up")
        if warmup:  # the same load, not measured: the contender and the broker warmed up
            say(f"    {c.name}: warming up with {len(warmup):,} envelopes at {rate:,.0f}/s")
            paced(setup, proc, warmup, rate, f"{c.name} warm-up load")
        say(f"    {c.name}: warm; publishing {len(records):,} envelopes at {rate:,.0f}/s")
        watch, achieved = paced(setup, proc, records, rate, f"{c.name} latency")
    finally:
        stop(proc)
    ends = stream_end_times(bootstrap, setup.events, partitions)
    order = sorted({key for key, _, _ in records})
    appended = [watch.finals[k][0] - ends[k] for k in order]
    visible = [watch.finals[k][1] - ends[k] for k in order]
    return Latency(c.name, rate, achieved, len(order), appended, visible, order,
                   [ends[k] for k in order])


def paced(setup: Setup, proc: subprocess.Popen[bytes], records: Sequence[Record], rate: float,
          label: str) -> tuple[Watch, float]:
    """Publish ``records`` at ``rate`` while watching their finals appear."""
    runs = {key for key, _, _ in records}
    # The watcher must see each final as it appears: publish from another process (a
    # thread would share this one's interpreter lock with the watcher).
    fork = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=fork) as pool:
        publishing = pool.submit(paced_publish, setup.bootstrap, setup.events, records, rate)
        watch = watch_finals(setup, proc, runs, 300, label)
        return watch, publishing.result()


def renamed(records: Sequence[Record], prefix: str) -> list[Record]:
    """``records`` with each run id's ``run`` prefix replaced by ``prefix`` (a warm-up load
    of the same shape as the measured one, whose runs cannot be mistaken for its runs)."""
    out = []
    for _key, value, now in records:
        doc = orjson.loads(value)
        run_id = prefix + doc["run_id"].removeprefix("run")
        doc["run_id"] = run_id
        out.append((run_id.encode(), orjson.dumps(doc), now))
    return out


# -- reporting -------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(results: list[Result], order: list[str]) -> dict[str, Any]:
    say(f"\n{'contender':24}{'envelopes/s':>13}{'CPU s':>8}{'CPU µs/env':>12}"
        f"{'CPU s total':>13}{'wall s':>8}  rounds (envelopes/s)")
    summary: dict[str, Any] = {"contenders": {}, "ratios": {}}
    for name in order:
        mine = [r for r in results if r.contender == name]
        if not mine:
            continue
        rate = median([r.rate for r in mine])
        summary["contenders"][name] = {
            "envelopes_per_s": rate, "cpu_s": median([r.cpu_window_s for r in mine]),
            "cpu_total_s": median([r.cpu_total_s for r in mine]),
            "read_all": all(r.read_all for r in mine), "outputs": mine[-1].outputs,
            "rounds": [r.rate for r in mine], "loads": [r.load for r in mine],
            "turns_after_s": median([r.turns_after_s for r in mine])}
        s = summary["contenders"][name]
        s["cpu_us_per_envelope"] = s["cpu_s"] / mine[0].envelopes * 1e6
        say(f"{name:24}{rate:13,.0f}{s['cpu_s']:8.2f}{s['cpu_us_per_envelope']:12.1f}"
            f"{s['cpu_total_s']:13.1f}"
            f"{median([r.wall_s for r in mine]):8.1f}  "
            + ", ".join(f"{r.rate:,.0f}" for r in mine))
    for latch, bare in RATIOS:
        per_round = [a.rate / b.rate for a in results if a.contender == latch
                     for b in results if b.contender == bare and b.round == a.round]
        if per_round:
            ratio = median(per_round)
            summary["ratios"][f"{latch}/{bare}"] = ratio
            say(f"ratio {latch} / {bare}: {ratio:.2f} (median of {len(per_round)} rounds: "
                + ", ".join(f"{r:.2f}" for r in per_round) + ")")
        # The same ratio by CPU time (bare's CPU / Latch's, per round): what the rates would
        # be if each had the cores to itself; less moved by the other load on the machine.
        by_cpu = [b.cpu_window_s / a.cpu_window_s for a in results if a.contender == latch
                  for b in results if b.contender == bare and b.round == a.round
                  and a.cpu_window_s > 0]
        if by_cpu:
            summary["ratios"][f"{latch}/{bare} by CPU"] = median(by_cpu)
            say(f"ratio {latch} / {bare} by CPU time: {median(by_cpu):.2f} (rounds: "
                + ", ".join(f"{r:.2f}" for r in by_cpu) + ")")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=400, help="LLM runs in the backlog")
    parser.add_argument("--contenders", default="latch-faust,latch-kafka,bare-faust,bare-loop")
    parser.add_argument("--latency", action="store_true", help="and the paced latency mode")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="latency mode: the load, as a fraction of the measured maximum")
    parser.add_argument("--latency-rate", type=float,
                        help="latency mode: the same load (envelopes/s) for every contender, "
                             "instead of --fraction of each one's maximum")
    parser.add_argument("--latency-runs", type=int, default=160)
    parser.add_argument("--latency-rounds", type=int, default=1,
                        help="latency mode: rounds (the contenders in turn each round); the "
                             "percentiles are of all rounds' runs pooled")
    parser.add_argument("--latency-warmup-runs", type=int, default=100,
                        help="latency mode: runs of the same load, published at the same rate "
                             "and not measured, before the measured ones (0: none)")
    parser.add_argument("--latency-dump", type=Path,
                        help="latency mode: write each run's latencies here, one JSON object "
                             "a line (contender, round, run id, its stream.end's time from "
                             "the round's first, appended and visible ms)")
    parser.add_argument("--quick", action="store_true",
                        help="small: 1 round of 16 runs (latency: 16 runs after 4 warm-up runs); "
                             "for CI smoke")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs the contenders (e.g. a venv with the "
                             "compiled core)")
    parser.add_argument("--baseline-python",
                        help="also run latch-faust-baseline: the faust engine of this "
                             "interpreter (a venv with another build of the worker); or "
                             "name latch-kafka-baseline in --contenders (its kafka engine)")
    parser.add_argument("--policy", type=Path, default=POLICY_FILE,
                        help="the .cedar file of the -enforce contenders (default: "
                             "bench/policies20.cedar)")
    parser.add_argument("--results", default="",
                        help="a comma list of on/off: run latch-faust and latch-kafka with "
                             "the result latch (results.enabled) so, in the same rounds, as "
                             "latch-<engine>-results-<mode> (e.g. on,off)")
    parser.add_argument("--bootstrap", help="a running broker (default: start our own)")
    parser.add_argument("--port", type=int, default=19492, help="our own broker's port")
    parser.add_argument("--broker-dir", type=Path, default=ROOT / ".latch" / "bench-broker")
    parser.add_argument("--fixtures", type=Path, help="shared/fixtures/providers")
    parser.add_argument("--topic-prefix", default="latch-bench",
                        help="every topic and consumer group this run creates is named "
                             "<prefix>-..., each with a random tag (default latch-bench)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.runs, args.latency_runs = 1, 16, 16
        args.latency_warmup_runs = min(args.latency_warmup_runs, 4)

    args.python = os.path.abspath(args.python)  # the contenders run in another directory
    every = contenders(args.python, args.baseline_python and
                       os.path.abspath(args.baseline_python), args.policy)
    if args.baseline_python and "-baseline" not in args.contenders:
        args.contenders += ",latch-faust-baseline"
    wanted = [n.strip() for n in args.contenders.split(",") if n.strip()]
    modes = [m.strip() for m in args.results.split(",") if m.strip()]
    if any(m not in RESULTS_MODES for m in modes):
        parser.error(f"--results takes a comma list of {', '.join(RESULTS_MODES)}")
    wanted = with_results(wanted, modes)
    unknown = [n for n in wanted if n not in every]
    if unknown:
        parser.error(f"unknown contenders {unknown}; known: {', '.join(every)}")
    chosen = []
    for name in wanted:
        reason = every[name].unavailable()
        if reason:
            say(f"skipping {name}: {reason}")
        else:
            chosen.append(every[name])

    probe = subprocess.run([args.python, "-c", "import worker; print(worker.compiled_core(), "
                            "worker.__file__)"], capture_output=True, text=True,
                           cwd=empty_dir(), check=True).stdout.split()
    core = "compiled (mypyc)" if probe[0] == "True" else "pure Python"
    say(f"Latch's core in the contenders: {core} ({probe[1]})")

    fixtures = args.fixtures or find_fixtures()
    records = bench_core.corpus(fixtures, args.runs)
    runs = {key for key, _, _ in records}
    size = sum(len(v) for _, v, _ in records)
    offline = Assembler(AssembleSettings())
    expected: dict[str, int] = {}
    for key, value, now in records:
        for emit in offline.feed_record(key, value, now):
            expected[emit.topic.value] = expected.get(emit.topic.value, 0) + 1
    say(f"backlog: {len(records):,} envelopes, {size / 1e6:.1f} MB, {len(runs)} runs; "
        f"the offline core emits {expected}; {os.cpu_count()} cores, load average "
        f"{load_average()}")
    expected_on: dict[str, int] = {}
    if any(c.more_outputs for c in chosen):
        # the result latch on: the same outputs, and a turn record for each run that
        # committed no call (the others wait for their results: the backlog has no runners)
        latch_on = Assembler(replace(AssembleSettings(), results=ResultSettings(True)))
        for key, value, now in records:
            for emit in latch_on.feed_record(key, value, now):
                expected_on[emit.topic.value] = expected_on.get(emit.topic.value, 0) + 1
        say(f"with the result latch on, the offline core emits {expected_on}")
    if any(c.name.endswith("-enforce") for c in chosen):
        # The enforce contenders must do the same work with one more step: the policy permits
        # every call of the backlog (checked offline), so their outputs equal the others'.
        from worker.runtime.governance.policy import load_policy

        offline = Assembler(AssembleSettings())
        offline.policy = load_policy("enforce", str(args.policy))
        decided: dict[str, int] = {}
        for key, value, now in records:
            for emit in offline.feed_record(key, value, now):
                decided[emit.topic.value] = decided.get(emit.topic.value, 0) + 1
        if decided != expected:
            raise SystemExit(f"{args.policy} does not permit every call of the backlog: "
                             f"the offline core emits {decided} with it")
        say(f"policy for the -enforce contenders: {args.policy}, every call permitted offline")

    work = Path(tempfile.mkdtemp(prefix="latch-bench-worker-"))
    results: list[Result] = []
    latencies: list[Latency] = []
    summary: dict[str, Any] = {}
    with own_broker(args) as bootstrap:
        topics = Topics(bootstrap, args.topic_prefix)
        try:
            # With a fixed rate the latency mode needs no throughput figure, and runs first:
            # on a broker that has just taken the 30 MB backlog and the throughput rounds'
            # outputs, appends stall for tens of ms for about half a minute (docs/benchmarks.md).
            latency_first = args.latency and args.latency_rate is not None
            if latency_first:
                latencies = latency_rounds(args, chosen, fixtures, bootstrap, topics, work, {})
            events = f"{topics.fresh('backlog')}.events"
            backlog = []
            if args.rounds:  # the latency mode alone does not need the backlog
                topics.simple([events], args.partitions)
                publish(bootstrap, events, records)
                backlog = end_offsets_of(bootstrap, events, args.partitions)
                say(f"published to {events} ({args.partitions} partitions)")
            # An answering contender forwards each result into its run's events partition
            # (the result latch's design): the contenders after it would read them. Each of
            # its rounds reads a copy of the backlog of its own, published now.
            copies: dict[tuple[str, int], tuple[str, list[int]]] = {}
            for c in (c for c in chosen if c.answers):
                for n in range(1, args.rounds + 1):
                    copy = f"{topics.fresh(f'backlog-{c.name}-r{n}')}.events"
                    topics.simple([copy], args.partitions)
                    publish(bootstrap, copy, records)
                    copies[c.name, n] = copy, end_offsets_of(bootstrap, copy, args.partitions)
                    say(f"published a copy for {c.name} round {n} to {copy}")
            for n in range(1, args.rounds + 1):
                shift = (n - 1) % max(1, len(chosen))
                for c in chosen[shift:] + chosen[:shift]:
                    say(f"  round {n}: {c.name} ...")
                    read, ends = copies.get((c.name, n), (events, backlog))
                    result = replace(throughput_round(c, n, bootstrap, read, ends, runs,
                                                      len(records), topics, work),
                                     load=load_average())
                    results.append(result)
                    say(f"  round {n}: {c.name}: {result.rate:,.0f} envelopes/s, CPU "
                        f"{result.cpu_window_s:.2f} s ({result.cpu_total_s:.1f} s total), "
                        f"read every envelope: {result.read_all}, outputs {result.outputs}, "
                        f"load average {result.load}"
                        + (f", last turn record {result.turns_after_s:.2f} s after the last "
                           "final" if c.answers else ""))
            summary = report(results, [c.name for c in chosen])
            summary["expected"] = expected
            if expected_on:
                summary["expected_results_on"] = expected_on
            summary["envelopes"], summary["runs"] = len(records), len(runs)
            summary["core"] = core
            if args.latency:
                if not latency_first:
                    latencies = latency_rounds(args, chosen, fixtures, bootstrap, topics, work,
                                               summary["contenders"])
                summary["latency"] = report_latency(latencies)
                if args.latency_dump:
                    dump_latencies(args.latency_dump, latencies)
        finally:
            topics.delete_all()
    say(f"load average at the end {load_average()}; logs in {work}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


def latency_rounds(args: argparse.Namespace, chosen: Sequence[Contender], fixtures: Path,
                   bootstrap: str, topics: Topics, work: Path,
                   throughput: dict[str, Any]) -> list[Latency]:
    """The latency mode, ``--latency-rounds`` times, the contenders in turn each round."""
    paced_runs = bench_core.corpus(fixtures, args.latency_runs, seed=11)
    warmup = renamed(bench_core.corpus(fixtures, args.latency_warmup_runs, seed=13), "wup") \
        if args.latency_warmup_runs > 0 else []
    latencies: list[Latency] = []
    for n in range(1, args.latency_rounds + 1):
        if args.latency_rounds > 1:
            say(f"  latency round {n} of {args.latency_rounds}")
        for c in chosen:
            rate = args.latency_rate or (
                args.fraction * throughput[c.name]["envelopes_per_s"])
            try:
                lat = latency_run(c, bootstrap, args.partitions, paced_runs, rate, topics,
                                  work, warmup)
                latencies.append(replace(lat, round=n))
            except RuntimeError as exc:  # the others' figures still count
                say(f"    {c.name}: no latency figures: {exc}")
    return latencies


def dump_latencies(path: Path, latencies: Sequence[Latency]) -> None:
    """Each run's latencies, a JSON object a line, to find what the slow runs share."""
    with path.open("w", encoding="utf-8") as out:
        for lat in latencies:
            first = min(lat.ends, default=0)
            for key, end, appended, visible in zip(lat.keys, lat.ends, lat.appended,
                                                   lat.visible, strict=True):
                out.write(json.dumps({"contender": lat.contender, "round": lat.round,
                                      "run": key.decode(), "end_s": (end - first) / 1000,
                                      "appended_ms": appended, "visible_ms": visible}) + "\n")


def pooled(rounds: Sequence[Latency]) -> Latency:
    """One contender's latency rounds as one: their runs' samples together, the mean load."""
    return Latency(rounds[0].contender, statistics.fmean(r.rate for r in rounds),
                   statistics.fmean(r.achieved for r in rounds), sum(r.runs for r in rounds),
                   [x for r in rounds for x in r.appended], [x for r in rounds for x in r.visible])


def report_latency(latencies: list[Latency]) -> dict[str, Any]:
    """Each contender's p50/p99 over all its latency rounds' runs pooled (and, with more
    than one round, each round's visible p99)."""
    by_contender: dict[str, list[Latency]] = {}
    for lat in latencies:
        by_contender.setdefault(lat.contender, []).append(lat)
    say(f"\n{'latency, ms':14}{'load/s':>9}{'achieved':>10}{'runs':>6}"
        f"{'appended p50':>14}{'p99':>7}{'visible p50':>13}{'p99':>7}")
    out: dict[str, Any] = {}
    for name, rounds in by_contender.items():
        lat = pooled(rounds)
        figures: dict[str, Any] = {
            "rate": lat.rate, "achieved": lat.achieved, "runs": lat.runs,
            "appended_p50": percentile(lat.appended, 0.5),
            "appended_p99": percentile(lat.appended, 0.99),
            "visible_p50": percentile(lat.visible, 0.5),
            "visible_p99": percentile(lat.visible, 0.99),
            "rounds_visible_p99": [percentile(r.visible, 0.99) for r in rounds]}
        out[name] = figures
        each = ("  rounds' visible p99: "
                + ", ".join(f"{p:.0f}" for p in figures["rounds_visible_p99"])
                if len(rounds) > 1 else "")
        say(f"{name:14}{lat.rate:9,.0f}{lat.achieved:10,.0f}{lat.runs:6}"
            f"{figures['appended_p50']:14.0f}{figures['appended_p99']:7.0f}"
            f"{figures['visible_p50']:13.0f}{figures['visible_p99']:7.0f}{each}")
    bare = out.get("bare-faust")
    if bare:
        for name, figures in out.items():
            if name.startswith("latch"):
                # the criterion: committed (visible to read_committed readers) p99
                # within 50 ms of the bare faust agent's
                over = figures["visible_p99"] - bare["visible_p99"]
                figures["visible_p99_over_bare_faust"] = over
                say(f"{name} p99 - bare-faust p99: {over:+.0f} ms (visible; within 50 ms: "
                    f"{'yes' if over <= 50 else 'no'}), "
                    f"{figures['appended_p99'] - bare['appended_p99']:+.0f} ms (appended)")
    return out


if __name__ == "__main__":
    sys.exit(main())
