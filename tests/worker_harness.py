"""Helpers for the worker's integration tests: a stack of topics, worker processes, a
publisher, a reader, and runs built in each provider's streaming format.

* :class:`Stack`: one test's app id and topic names (all unique), created with
  ``worker.runtime.admin`` and deleted afterwards, and the ``LATCH_`` environment that points a
  worker at them.
* :class:`WorkerProcess`: ``python -m worker worker`` as a subprocess with test-friendly faust
  timings; :meth:`~WorkerProcess.stop` sends SIGTERM and expects a clean exit,
  :meth:`~WorkerProcess.kill` sends SIGKILL.
* :func:`publish`: confluent-kafka with the Java-compatible ``murmur2_random`` partitioner, as a
  gateway publishes.
* :class:`Reader`: every record of the output topics from the beginning.
* :func:`provider_run`, :func:`expected`: a run's envelopes, and what ``latch assemble`` (the
  same core, offline) emits for them: the worker must emit the same values.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson
from aiokafka.partitioner import murmur2  # type: ignore[import-untyped]
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from worker.core import Assembler, Emit, Topic
from worker.runtime import admin
from worker.runtime.config import Config, TopicNames, load_config

#: The root of the checkout these tests belong to (put first on a worker's PYTHONPATH).
CHECKOUT = str(Path(__file__).resolve().parents[1])

#: faust settings that make start-up, rebalances and failover quick on a local broker
#: (6 s is the broker's minimum session timeout).
FAST_FAUST = {
    "broker_session_timeout": 6,
    "broker_heartbeat_interval": 1,
    "broker_rebalance_timeout": 20,
    "broker_commit_interval": 0.5,
}
#: librdkafka settings that do the same for the kafka engine (``worker.engine: kafka``).
FAST_KAFKA = {
    "LATCH_KAFKA__SESSION_TIMEOUT_MS": "6000",
    "LATCH_KAFKA__HEARTBEAT_INTERVAL_MS": "1000",
}
#: The line each engine logs once it is consuming.
READY = r"\[\^Worker\]: Ready|kafka engine ready"
ENGINES = ("faust", "kafka")
OUTPUTS = ("committed", "errors", "final", "progress", "dlq", "audit", "pending", "run_ended")
#: Every topic name of the configuration's ``topics`` section (events, control, the outputs,
#: the runners' results): a test or benchmark names each one of them after its own app id,
#: so that nothing depends on what the broker holds under the default names.
TOPIC_ROLES = tuple(f.name for f in fields(TopicNames)
                    if isinstance(getattr(TopicNames(), f.name), str))

# -- the topics of one test ------------------------------------------------------------


@dataclass
class Stack:
    """One test's app id and topics; ``env()`` points a worker (or ``load_config``) at them."""

    bootstrap: str
    app_id: str
    partitions: int
    settings: dict[str, str] = field(default_factory=dict)

    def topic(self, role: str) -> str:
        return f"{self.app_id}.{role}"

    @property
    def engine(self) -> str:
        """The stack's engine: faust unless the test names one. The tests that name none
        were written for faust, which was the default engine until issue 34 made it kafka:
        ``env()`` names it, so that they do not follow the configuration's default."""
        return self.settings.get("LATCH_WORKER__ENGINE", "faust")

    def env(self) -> dict[str, str]:
        env = {f"LATCH_TOPICS__{role.upper()}": self.topic(role) for role in TOPIC_ROLES}
        env |= {"LATCH_WORKER__ENGINE": self.engine,
                "LATCH_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
                "LATCH_TOPICS__PARTITIONS": str(self.partitions),
                "LATCH_WORKER__APP_ID": self.app_id,
                "LATCH_WORKER__WEB_PORT": "0", "LATCH_WORKER__HTTP_PORT": "0",
                "LATCH_WORKER__TICK_INTERVAL_S": "1"}
        return env | self.settings

    def config(self) -> Config:
        return load_config(None, env=self.env())

    def all_topics(self) -> list[str]:
        names = [s.name for s in admin.specs(self.config())]
        leader = admin.faust_leader(self.config())  # (the engine's own, when it is kafka)
        return names if leader in names else [*names, leader]


@contextlib.contextmanager
def make_stack(bootstrap: str, test_name: str, partitions: int = 3,
               **settings: str) -> Iterator[Stack]:
    """Create a stack's topics with ``latch topics create``'s code; delete them after."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", test_name)[:40].strip("-")
    stack = Stack(bootstrap, f"latch-it-{stem}-{uuid.uuid4().hex[:6]}", partitions,
                  {f"LATCH_{k.upper()}": v for k, v in settings.items()})
    client = AdminClient({"bootstrap.servers": bootstrap})
    admin.create(client, admin.specs(stack.config()))
    try:
        yield stack
    finally:
        futures = client.delete_topics(stack.all_topics(), operation_timeout=30)
        for future in futures.values():
            with contextlib.suppress(KafkaException):  # never created, or already gone
                future.result(timeout=60)


def partition_of(key: str, partitions: int) -> int:
    """The partition Java's (and aiokafka's, and librdkafka's murmur2_random) partitioner picks."""
    return int((murmur2(key.encode()) & 0x7FFFFFFF) % partitions)


def run_ids(prefix: str, partitions: int, per_partition: int = 1) -> list[str]:
    """Run ids that cover every partition ``per_partition`` times, in partition order."""
    found: dict[int, list[str]] = defaultdict(list)
    n = 0
    while any(len(found[p]) < per_partition for p in range(partitions)):
        run_id = f"{prefix}-{n}"
        part = partition_of(run_id, partitions)
        if len(found[part]) < per_partition:
            found[part].append(run_id)
        n += 1
    return [r for p in range(partitions) for r in found[p]]


# -- worker processes --------------------------------------------------------------------


class WorkerProcess:
    """``python -m worker worker`` for one stack, its output in ``log_path``."""

    def __init__(self, stack: Stack, log_path: Path, prelude: str = "", **faust: Any) -> None:
        """Start the worker; ``prelude`` is Python run first in the process (to inject a
        fault), then ``worker.runtime.engine.main`` runs as ``latch worker`` would."""
        self.log_path = log_path
        settings = FAST_FAUST | faust
        args = [f"--faust-setting={k}={v}" for k, v in settings.items()]
        # The worker imports this checkout's ``worker`` (not whatever an editable install of
        # another checkout points at), as the test process itself does.
        path = os.pathsep.join(p for p in (CHECKOUT, os.environ.get("PYTHONPATH")) if p)
        env = os.environ | stack.env() | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        if stack.engine == "kafka":
            args, env = [], FAST_KAFKA | env
        command = [sys.executable, "-m", "worker", "worker", *args]
        if prelude:
            code = (f"{prelude}\nimport sys, worker.runtime.engine\n"
                    "sys.exit(worker.runtime.engine.main(sys.argv[1:]))")
            command = [sys.executable, "-c", code, *args]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(command, env=env, cwd=log_path.parent, stdout=log,
                                         stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 45.0, count: int = 1) -> None:
        """Wait until ``pattern`` (a regex) occurs ``count`` times in the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(re.findall(pattern, self.log())) >= count:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in the worker log after {timeout}s:\n{self.tail()}")

    def wait_ready(self) -> None:
        self.wait_for(READY)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker ignored SIGTERM for {timeout}s:\n{self.tail()}") from None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def problems(self) -> list[str]:
        """Log lines that no healthy run should have."""
        return [line for line in self.log().splitlines()
                if re.search(r"\[(ERROR|CRITICAL)\]|Traceback", line)]


def http_get(port: int, path: str) -> tuple[int, bytes] | None:
    """(status, body) of a worker's HTTP endpoint, or None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return None


def start_worker(stack: Stack, log: Path, port: int, log_format: str = "text",
                 prelude: str = "", **faust: Any) -> WorkerProcess:
    """A worker that serves ``/metrics``, ``/healthz`` and ``/readyz`` on ``port``
    (``faust``: faust settings over :data:`FAST_FAUST`)."""
    prelude = (f"import os; os.environ['LATCH_WORKER__HTTP_PORT'] = '{port}'; "
               f"os.environ['LATCH_WORKER__LOG_FORMAT'] = '{log_format}'\n{prelude}")
    return WorkerProcess(stack, log, prelude=prelude, **faust)


def readiness(port: int, proc: WorkerProcess, timeout: float = 90.0,
              every: float = 0.1) -> list[dict[str, Any]]:
    """Every /readyz answer until the first 200 (the last one in the list, with ``at``: the
    wall time at which it was asked), asking every ``every`` seconds."""
    answers: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, proc.tail()
        asked = time.time()
        answer = http_get(port, "/readyz")
        if answer is not None:
            body = orjson.loads(answer[1])
            answers.append(body | {"http": answer[0], "at": asked})
            if answer[0] == 200:
                return answers
        time.sleep(every)
    raise AssertionError(f"/readyz never 200 in {timeout}s: {answers[-3:]}\n{proc.tail()}")


def assignments(worker: WorkerProcess) -> list[set[int]]:
    """The events partitions of each assignment the worker logged, in order."""
    return [set(map(int, re.findall(r"\d+", found)))
            for found in re.findall(r"events partitions assigned: \[([\d, ]*)\]", worker.log())]


@contextlib.contextmanager
def worker_pair(stack: Stack, log_dir: Path,
                timeout: float = 40) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """Two workers that have settled on a split of the stack's partitions (each owns some,
    none owns one twice); killed afterwards if still running."""
    first = WorkerProcess(stack, log_dir / "a.log")
    second = None
    try:
        first.wait_ready()
        second = WorkerProcess(stack, log_dir / "b.log")
        second.wait_ready()
        deadline = time.monotonic() + timeout
        while True:
            a, b = assignments(first), assignments(second)
            if a and b and a[-1] and b[-1] and not a[-1] & b[-1] \
                    and a[-1] | b[-1] == set(range(stack.partitions)):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"no split: {a} / {b}")
            time.sleep(0.2)
        yield first, second
    finally:
        for proc in (first, second):
            if proc is not None and proc.proc.poll() is None:
                proc.kill()


@contextlib.contextmanager
def running_worker(stack: Stack, log_path: Path, **faust: Any) -> Iterator[WorkerProcess]:
    """A worker of ``stack``, ready; afterwards stopped with SIGTERM, which must end it with
    exit status 0 and no problem in its log (killed if it is still running)."""
    proc = WorkerProcess(stack, log_path, **faust)
    try:
        proc.wait_ready()
        yield proc
        assert proc.stop() == 0, f"unclean exit on SIGTERM:\n{proc.tail()}"
        # the lines themselves in the message: a test's temp dir may be gone when it is read
        assert proc.problems() == [], f"problems in the worker log:\n{proc.tail(120)}"
    finally:
        if proc.proc.poll() is None:
            proc.kill()


# -- in and out ----------------------------------------------------------------------------


def publish(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> None:
    """Produce ``(key, value)`` records in order, as a gateway does."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True, "linger.ms": 5})
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def publish_envelopes(bootstrap: str, topic: str, envelopes: Iterable[dict[str, Any]]) -> None:
    publish(bootstrap, topic, ((e["run_id"].encode(), orjson.dumps(e)) for e in envelopes))


def produce_acked(bootstrap: str, topic: str, key: bytes, value: bytes) -> float:
    """Produce one record as a gateway does and wait for its acknowledgement; the wall
    time (``time.time()``) at which the broker's acknowledgement arrived."""
    acked: list[float] = []
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                         "enable.idempotence": True, "linger.ms": 0})

    def delivered(error: KafkaError | None, _msg: Any) -> None:
        assert error is None, error
        acked.append(time.time())

    producer.produce(topic, key=key, value=value, on_delivery=delivered)
    assert producer.flush(60) == 0 and acked
    return acked[0]


class Markers:
    """Reads the forwarded cancels of a stack's events topic (every partition, from the
    beginning, read_committed: the kafka engine forwards in a transaction)."""

    def __init__(self, stack: Stack) -> None:
        self.topic = stack.topic("events")
        self.consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "unused",
                                  "enable.auto.commit": False,
                                  "isolation.level": "read_committed"})
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                              for p in range(stack.partitions)])
        #: run id -> (events partition, the marker's record time in ms, the wall time at
        #: which this reader saw it)
        self.seen: dict[str, tuple[int, int, float]] = {}

    def wait(self, run_id: str, timeout: float = 45.0) -> tuple[int, int, float]:
        """The forwarded cancel of ``run_id``: (partition, record time in ms, seen at)."""
        deadline = time.monotonic() + timeout
        while run_id not in self.seen:
            if time.monotonic() > deadline:
                raise AssertionError(f"the cancel of {run_id} was not forwarded in {timeout}s")
            msg = self.consumer.poll(0.05)  # returns at the first record
            if (msg is not None and msg.error() is None and msg.key() is not None
                    and orjson.loads(msg.value() or b"{}").get("type") == "cancel"):
                self.seen.setdefault(msg.key().decode(), (
                    int(msg.partition()), int(msg.timestamp()[1]), time.time()))
        return self.seen[run_id]

    def close(self) -> None:
        self.consumer.close()


def approver_settings(*approvers: str) -> dict[str, str]:
    """:func:`make_stack` settings by which a worker knows each approver's fixed test key
    (``builders.approver_env``; default: ``builders.APPROVER``): with no approver keys, no
    decision counts (docs/policies.md, "Approvals")."""
    from builders import approver_env

    return {name.removeprefix("LATCH_").lower(): value
            for name, value in approver_env(*approvers).items()}


def approver(stack: Stack, by: str) -> Any:
    """A Publisher that signs its decisions as ``by`` with ``by``'s test key, as ``latch
    approve`` with that approver's ``approvers.key_id`` does (the stack must list the key:
    :func:`approver_settings`). Decide with ``by=by``."""
    from builders import approver_key_id

    from worker.client.publisher import Publisher

    env = stack.env() | {"LATCH_APPROVERS__KEY_ID": approver_key_id(by)}
    return Publisher(load_config(None, env=env), env=env)


@dataclass(frozen=True)
class Out:
    """One output record: where it landed, its key and its decoded value."""

    role: str
    partition: int
    key: bytes | None
    value: dict[str, Any]
    #: The record's Kafka headers (the worker's trace context).
    headers: tuple[tuple[str, bytes], ...] = ()


class Reader:
    """Reads the output topics of a stack from the beginning, without a consumer group."""

    def __init__(self, stack: Stack, roles: Sequence[str] = OUTPUTS) -> None:
        self.roles = {stack.topic(role): role for role in roles}
        # read_committed (librdkafka's default, said here because it matters): the kafka
        # engine's aborted transactions are not seen. The end of a partition is where the
        # consumer says it is (enable.partition.eof): a transaction's commit marker takes the
        # last offset and is never delivered.
        self.consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "unused",
                                  "enable.auto.commit": False, "enable.partition.eof": True,
                                  "isolation.level": "read_committed"})
        self.admin = AdminClient({"bootstrap.servers": stack.bootstrap})
        meta = self.consumer.list_topics(timeout=10).topics
        self.consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING)
                              for t in self.roles for p in meta[t].partitions])
        self.records: list[Out] = []
        self.positions: dict[tuple[str, int], int] = {}

    def collect(self, until: Callable[[list[Out]], bool], timeout: float = 45.0) -> list[Out]:
        """Read until ``until(records so far)`` holds, then on to the end of every output
        partition as it is at that moment (topics have no order between them: a run's final
        message may be read before its committed calls); fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not until(self.records):
            self._poll(deadline)
        latest = self.admin.list_offsets(
            {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest()
             for tp in self.consumer.assignment()}, request_timeout=10)
        ends = {(tp.topic, tp.partition): f.result().offset for tp, f in latest.items()}
        while any(self.positions.get(tp, 0) < end for tp, end in ends.items()):
            self._poll(deadline)
        return self.records

    def _poll(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            summary = {r: len(self.of(r)) for r in self.roles.values()}
            raise AssertionError(f"outputs incomplete: {summary}")
        for msg in self.consumer.consume(500, timeout=0.2):
            if msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                where = (msg.topic(), msg.partition())
                self.positions[where] = max(self.positions.get(where, 0), msg.offset())
            elif msg.error() is None:
                self.positions[(msg.topic(), msg.partition())] = msg.offset() + 1
                self.records.append(Out(self.roles[msg.topic()], msg.partition(),
                                        msg.key(), _decoded(msg.value()),
                                        tuple(msg.headers() or ())))

    def of(self, role: str) -> list[Out]:
        return [r for r in self.records if r.role == role]

    def finals(self) -> dict[str, dict[str, Any]]:
        return {r.value["run_id"]: r.value for r in self.of("final")}

    def close(self) -> None:
        self.consumer.close()


def read_results(bootstrap: str, topic: str, want: int, timeout: float = 60.0) -> list[Any]:
    """The values of partition 0 of ``topic`` (a runner test's results topic) visible at
    read_committed, once ``want`` are (then 2 s more, so that an extra one would show)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < want and time.monotonic() < deadline:
            found += [orjson.loads(m.value()) for m in consumer.consume(100, timeout=0.5)
                      if m.error() is None]
        found += [orjson.loads(m.value()) for m in consumer.consume(100, timeout=2.0)
                  if m.error() is None]
    finally:
        consumer.close()
    return found


def _decoded(value: bytes | None) -> dict[str, Any]:
    """A record's JSON value; what is not JSON (a test wrote it on an input topic read here)
    as ``{"undecodable": its bytes}``."""
    try:
        decoded = orjson.loads(value or b"null")
    except orjson.JSONDecodeError:
        return {"undecodable": value}
    return decoded if isinstance(decoded, dict) else {"undecodable": value}


def finished(run_ids: Iterable[str]) -> Callable[[list[Out]], bool]:
    """``Reader.collect`` condition: every run has its final message."""
    wanted = set(run_ids)
    return lambda records: wanted <= {r.value["run_id"] for r in records if r.role == "final"}


def run_outputs(stack: Stack, run_id: str, timeout: float = 45.0) -> list[Out]:
    """The output records of one run, read once its final message is out."""
    reader = Reader(stack)
    try:
        reader.collect(finished([run_id]), timeout=timeout)
        return [r for r in reader.records if r.value.get("run_id") == run_id]
    finally:
        reader.close()


# -- runs --------------------------------------------------------------------------------

PATH_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}},
               "required": ["path"], "additionalProperties": False}
PROVIDERS = ("openai.chat", "anthropic.messages", "openai.responses")
#: (call id, tool name, argument text)
Call = tuple[str, str, str]


def tools(provider: str, names: Sequence[str] = ("read_file",)) -> list[dict[str, Any]]:
    """The tool list in the provider's own format, every tool taking ``{"path": str}``."""
    if provider == "openai.chat":
        return [{"type": "function", "function": {"name": n, "parameters": PATH_SCHEMA}}
                for n in names]
    if provider == "anthropic.messages":
        return [{"name": n, "input_schema": PATH_SCHEMA} for n in names]
    return [{"type": "function", "name": n, "parameters": PATH_SCHEMA} for n in names]


def fragments(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _chat(calls: Sequence[Call], size: int) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    events = [chunk({"role": "assistant", "content": None})]
    for i, (call_id, name, text) in enumerate(calls):
        events.append(chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function",
                                             "function": {"name": name, "arguments": ""}}]}))
        events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                   for piece in fragments(text, size)]
    return [*events, chunk({}, "tool_calls")]


def _anthropic(calls: Sequence[Call], size: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
        "content": [], "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}}]
    for i, (call_id, name, text) in enumerate(calls):
        events.append({"type": "content_block_start", "index": i, "content_block": {
            "type": "tool_use", "id": call_id, "name": name, "input": {}}})
        events += [{"type": "content_block_delta", "index": i,
                    "delta": {"type": "input_json_delta", "partial_json": piece}}
                   for piece in fragments(text, size)]
        events.append({"type": "content_block_stop", "index": i})
    return [*events, {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                      "usage": {"output_tokens": 9}}, {"type": "message_stop"}]


def _responses(calls: Sequence[Call], size: int) -> list[dict[str, Any]]:
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": response}]
    items = []
    for i, (call_id, name, text) in enumerate(calls):
        item = {"type": "function_call", "id": f"fc_{i}", "call_id": call_id, "name": name,
                "arguments": "", "status": "in_progress"}
        events.append({"type": "response.output_item.added", "output_index": i, "item": item})
        events += [{"type": "response.function_call_arguments.delta", "output_index": i,
                    "item_id": f"fc_{i}", "delta": piece} for piece in fragments(text, size)]
        done = {**item, "arguments": text, "status": "completed"}
        events.append({"type": "response.output_item.done", "output_index": i, "item": done})
        items.append(done)
    completed = {**response, "status": "completed", "output": items}
    return [*events, {"type": "response.completed", "response": completed}]


_EVENTS = {"openai.chat": _chat, "anthropic.messages": _anthropic,
           "openai.responses": _responses}


def provider_run(provider: str, run_id: str, calls: Sequence[Call], *, size: int = 8,
                 end: bool = True) -> list[dict[str, Any]]:
    """The envelopes of one run: ``run.start``, the provider's events carrying ``calls``
    (argument text in ``size``-character fragments), then ``stream.end`` if ``end``."""
    names = sorted({name for _, name, _ in calls} | {"read_file"})
    envelopes = [{"v": 1, "run_id": run_id, "seq": 0, "type": "run.start", "provider": provider,
                  "tenant": "t1", "tools": tools(provider, names)}]
    envelopes += [{"v": 1, "run_id": run_id, "seq": n, "type": "provider.event", "event": e}
                  for n, e in enumerate(_EVENTS[provider](calls, size), start=1)]
    if end:
        envelopes.append({"v": 1, "run_id": run_id, "seq": len(envelopes), "type": "stream.end"})
    return envelopes


def two_call_runs(prefix: str, partitions: int, per_partition: int
                  ) -> dict[str, list[dict[str, Any]]]:
    """Runs of the three providers in turn covering every partition ``per_partition`` times,
    each with two valid calls whose arguments name the run, in 3-character fragments."""
    runs = {}
    for n, run_id in enumerate(run_ids(prefix, partitions, per_partition)):
        calls = [(f"call_{run_id}_{i}", "read_file", f'{{"path": "/data/{i}/{run_id}"}}')
                 for i in range(2)]
        runs[run_id] = provider_run(PROVIDERS[n % 3], run_id, calls, size=3)
    return runs


def expected(envelopes: Iterable[dict[str, Any]], config: Config) -> list[Emit]:
    """What the core emits for these envelopes offline (``latch assemble``'s code path)."""
    assembler = Assembler(config.assemble)
    return [e for env in envelopes for e in assembler.feed_record(None, orjson.dumps(env))]


def by_run(values: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Values grouped by run id, each run's in order, duplicates (same bytes) dropped."""
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for value in values:
        if value not in runs[value["run_id"]]:
            runs[value["run_id"]].append(value)
    return dict(runs)


def assert_same_outcomes(reader: Reader, wanted: Sequence[Emit]) -> None:
    """The worker's committed calls, error results and final messages, per run and in
    order, are those of the offline core; every repeated idempotency key repeats the same
    value byte for byte."""
    for topic in (Topic.COMMITTED, Topic.ERRORS, Topic.FINAL):
        got = by_run(r.value for r in reader.of(topic.value))
        want = by_run(e.value for e in wanted if e.topic is topic)
        differ = {run: (got.get(run), want.get(run)) for run in set(got) | set(want)
                  if got.get(run) != want.get(run)}
        assert not differ, f"{topic}: worker and offline core differ (got, wanted): {differ}"
    seen: dict[tuple[str, str], bytes] = {}  # (an audit record has its outcome's key)
    for record in reader.records:
        key = record.value.get("idempotency_key")
        if key is not None:
            value = orjson.dumps(record.value, option=orjson.OPT_SORT_KEYS)
            assert seen.setdefault((record.role, key), value) == value, \
                f"two different values for {key}"
