"""The gateway side: publish a model response's stream envelopes to Kafka.

A gateway holds one :class:`Publisher` per process and opens a :class:`RunHandle` per model
response::

    publisher = Publisher(load_config())
    run = publisher.run("r1", "openai.chat", tools, tenant="t1")   # run.start, seq 0
    for chunk in provider_stream:
        run.event(chunk)                                            # provider.event, seq 1, 2, ...
    run.end()                                                       # stream.end
    publisher.cancel("r2", "user_stop")                             # to the control topic
    publisher.approve("r3", "call_1", by="ann", reason="checked")  # approve, deny, edit too
    publisher.flush()

Stopping when Latch ended the run (decision 0015): when Latch ends a run for a reason the
gateway cannot see (a budget, too many calls, a protocol break, idle, a cancel), it writes one
``run.ended`` record to ``topics.run_ended``. The publisher follows that topic from its end
(a thread with its own consumer, started by the first of these calls)::

    publisher.on_run_ended(lambda ended: log.info("run %s ended: %s", ended.run_id,
                                                  ended.reason))
    stop = publisher.ended("r1")          # a threading.Event, set when r1's run.ended arrives
    for chunk in provider_stream:
        if stop.is_set():
            break                         # stop reading (and paying for) the provider's stream
        run.event(chunk)

Partitioning: stream envelopes go to the events topic and cancels to the control topic, both
keyed by ``run_id``. The worker forwards each cancel into the run's partition of the events
topic with aiokafka's ``DefaultPartitioner`` (Java's murmur2 of the key), so the producer here
uses librdkafka's ``murmur2_random``, the same function: a run's events and its forwarded
cancel land on one partition, in order. librdkafka's own default (``consistent_random``, CRC32)
would not; the setting is therefore forced, whatever the configuration says.

Delivery: idempotent, ``acks=all``, a short ``linger.ms``. A failed delivery is raised as a
:class:`PublishError` by the next :meth:`Publisher.flush` or send. Its message names the topic
and librdkafka's error, never the payload (provider events may hold secrets).

``latch publish [--config FILE] FILE|-`` sends a JSON-Lines file of envelopes (stream and
control, interleaved): see :func:`main`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from worker.core.envelope import DECISIONS, PROVIDERS
from worker.runtime.config import Config, ConfigError, load_config
from worker.runtime.observability import logs, tracing

__all__ = [
    "FORCED_SETTINGS",
    "PRODUCER_DEFAULTS",
    "RESERVED_PREFIX",
    "RESERVED_TYPES",
    "Delivery",
    "PublishError",
    "Publisher",
    "RunEnded",
    "RunHandle",
    "main",
]

#: Producer settings a configuration may override (``kafka.linger_ms: 20`` and the like).
PRODUCER_DEFAULTS: Mapping[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    "linger.ms": "5",
    "message.timeout.ms": "30000",
}
#: Settings the co-partitioning of events and forwarded cancels depends on (module docstring).
FORCED_SETTINGS: Mapping[str, str] = {"partitioner": "murmur2_random"}

#: Run ids starting with this are the worker's own (its ticks are keyed ``__latch_tick__``):
#: the gateway never sends one.
RESERVED_PREFIX = "__latch_"
#: Envelope types only the worker writes (a tick ends every idle run of its partition).
RESERVED_TYPES = frozenset({"tick"})

#: How long a send waits for room in librdkafka's local queue before it gives up.
QUEUE_FULL_WAIT_S = 30.0

EXIT_OK = 0
EXIT_SKIPPED = 1
EXIT_FAILED = 2


class PublishError(Exception):
    """Envelopes could not be delivered. ``topic`` is where they were going (None when the
    problem is the cluster rather than one topic) and ``error`` librdkafka's description;
    the message never holds a key or a payload."""

    def __init__(self, topic: str | None, error: str, count: int = 1) -> None:
        self.topic = topic
        self.error = error
        self.count = count
        where = f"to {topic}" if topic else "to Kafka"
        more = f" ({count} envelopes)" if count > 1 else ""
        super().__init__(f"delivery {where} failed{more}: {error}")


@dataclass(frozen=True, slots=True)
class Delivery:
    """One envelope the broker acknowledged: where it was written."""

    topic: str
    partition: int
    offset: int
    key: str


@dataclass(frozen=True, slots=True)
class RunEnded:
    """A ``run.ended`` record (schemas/run-ended.schema.json): Latch ended ``run_id`` for
    ``reason``; ``value`` is the whole record."""

    run_id: str
    tenant: str | None
    reason: str
    status: str
    last_seq: int
    value: Mapping[str, Any]


#: How many ended runs a publisher remembers (so that ``ended(run_id)`` asked after the
#: record arrived is already set), oldest forgotten first.
REMEMBER_ENDED_RUNS = 10_000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Publisher:
    """A confluent-kafka producer that speaks the stream and control envelope contract.

    ``on_delivery`` is called (from :meth:`poll`, :meth:`flush` and the sends, on the calling
    thread) with every acknowledged envelope. ``clock`` gives each envelope's ``ts`` in
    milliseconds; pass ``None`` to send envelopes without one. ``producer`` replaces the
    confluent-kafka producer (tests). ``env``: where an ``env:`` reference of the approver's
    key (``approvers.keys``) is read (default: this process's environment).
    """

    def __init__(
        self,
        config: Config,
        *,
        on_delivery: Callable[[Delivery], None] | None = None,
        clock: Callable[[], int] | None = _now_ms,
        producer: Producer | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._env = env
        self.events_topic = config.topics.events
        self.control_topic = config.topics.control
        self._clock = clock
        self._sender = Sender(producer if producer is not None
                              else Producer(logs.kafka_config(self.producer_config())),
                              on_delivery)
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[RunEnded], None]] = []
        self._waiting: dict[str, threading.Event] = {}
        self._seen: OrderedDict[str, RunEnded] = OrderedDict()
        self._follower: _Follower | None = None

    @property
    def sent(self) -> Counter[str]:
        """How many envelopes were handed to the producer, per topic."""
        return self._sender.sent

    def producer_config(self) -> dict[str, str]:
        """The librdkafka settings of the producer: defaults, the configuration, the forced."""
        return {**PRODUCER_DEFAULTS, **self.config.kafka.confluent_config(), **FORCED_SETTINGS}

    # -- envelopes ------------------------------------------------------------------------

    def run(
        self,
        run_id: str,
        provider: str,
        tools: Sequence[Any],
        tenant: str | None = None,
        limits: Mapping[str, Any] | None = None,
    ) -> RunHandle:
        """Open a run: send its ``run.start`` (seq 0) and return the handle for the rest."""
        _check_run_id(run_id)
        if provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {sorted(PROVIDERS)}, not {provider!r}")
        start: dict[str, Any] = {"v": 1, "run_id": run_id, "seq": 0, "type": "run.start",
                                 "provider": provider}
        if tenant is not None:
            start["tenant"] = tenant
        start["tools"] = list(tools)
        if limits is not None:
            start["limits"] = dict(limits)
        self.send_envelope(start)
        return RunHandle(self, run_id, next_seq=1)

    def cancel(self, run_id: str, reason: str = "user_stop") -> None:
        """Ask the worker to cancel every call of the run that is not committed yet."""
        _check_run_id(run_id)
        self.send_envelope({"v": 1, "run_id": run_id, "type": "cancel", "reason": reason})

    def approve(self, run_id: str, tool_call_id: str, *, by: str, reason: str = "") -> None:
        """Approve a call waiting for approval (docs/policies.md, "Approvals"): it commits as it is.
        Counts only signed (``approvers.key_id``): an unsigned decision goes to the DLQ."""
        self._decide("approve", run_id, tool_call_id, by, reason)

    def deny(self, run_id: str, tool_call_id: str, *, by: str, reason: str = "") -> None:
        """Deny a call waiting for approval: one error result, reason ``approval_denied``."""
        self._decide("deny", run_id, tool_call_id, by, reason)

    def edit(self, run_id: str, tool_call_id: str, arguments: str | Mapping[str, Any], *,
             by: str, reason: str = "") -> None:
        """Give a call waiting for approval new arguments (their JSON text, or a mapping
        written as JSON): the worker's latch checks them again, then commits or fails them."""
        text = arguments if isinstance(arguments, str) else orjson.dumps(dict(arguments)).decode()
        self._decide("edit", run_id, tool_call_id, by, reason, text)

    def _decide(self, kind: str, run_id: str, tool_call_id: str, by: str, reason: str,
                arguments: str | None = None) -> None:
        _check_run_id(run_id)
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise ValueError("tool_call_id must be a non-empty string")
        if not isinstance(by, str) or not by:
            raise ValueError("by must say who decided (a non-empty string)")
        doc: dict[str, Any] = {"v": 1, "run_id": run_id, "type": kind,
                               "tool_call_id": tool_call_id, "by": by, "reason": reason}
        if arguments is not None:
            doc["arguments"] = arguments
        signer = self._decision_signer()
        if signer is not None:  # (approvers.key_id: an unsigned decision never counts)
            doc = signer.sign(doc, _now_ms() if self._clock is None else self._clock())
        self.send_envelope(doc)

    def _decision_signer(self) -> Any:
        """The approver's signer (``approvers.key_id``; None: decisions go unsigned, and a
        worker counts none of them), read once. Raises
        :class:`~worker.runtime.config.ConfigError`."""
        if not hasattr(self, "_signer"):
            from worker.runtime.governance.approvers import decision_signer

            self._signer = decision_signer(self.config, self._env)
        return self._signer

    def send_envelope(self, envelope: Mapping[str, Any]) -> str:
        """Send one envelope as it is (plus ``ts`` when it has none); return the topic.

        ``cancel``, ``approve``, ``deny`` and ``edit`` envelopes go to the control topic,
        everything else to the events topic, keyed by the envelope's ``run_id``.
        """
        problem = _reserved(envelope.get("type"), envelope.get("run_id"))
        if problem is not None:
            raise ValueError(problem)
        run_id = envelope["run_id"]
        doc = dict(envelope)
        if self._clock is not None and "ts" not in doc:
            doc["ts"] = self._clock()
        return self.send_raw(run_id, orjson.dumps(doc), control=_control(doc.get("type")))

    def send_raw(self, run_id: str, value: bytes, *, control: bool = False) -> str:
        """Send envelope bytes unchanged, keyed by ``run_id``; return the topic. A reserved
        ``run_id`` (the worker's own keys) is refused with :class:`ValueError`. The record's
        headers carry the W3C ``traceparent`` of the caller's current span, if there is one
        (the worker continues that trace: :mod:`worker.runtime.observability.tracing`)."""
        _check_run_id(run_id)
        topic = self.control_topic if control else self.events_topic
        self._sender.produce(topic, run_id.encode("utf-8"), value, list(tracing.inject()) or None)
        return topic

    # -- run.ended (decision 0015) ---------------------------------------------------------

    def follow_run_ended(self, timeout: float = 10.0) -> None:
        """Follow ``topics.run_ended`` from its end now (idempotent): a run that Latch ends
        from here on is reported. Raises :class:`PublishError` if the topic cannot be read
        within ``timeout`` seconds."""
        with self._lock:
            if self._follower is None:
                self._follower = _Follower(self, timeout)

    def on_run_ended(self, callback: Callable[[RunEnded], None]) -> None:
        """Call ``callback`` (on the follower's thread) with every ``run.ended`` record from
        now on; starts following (:meth:`follow_run_ended`). A callback that raises is
        logged, never stops the follower."""
        with self._lock:
            self._callbacks.append(callback)
        self.follow_run_ended()

    def ended(self, run_id: str) -> threading.Event:
        """A :class:`threading.Event` set once Latch reports ``run_id`` ended (already set when
        it was reported before); starts following. ``ended(run_id).wait(timeout)`` blocks;
        from asyncio, ``await loop.run_in_executor(None, event.wait, timeout)``."""
        self.follow_run_ended()
        with self._lock:
            event = self._waiting.get(run_id)
            if event is None:
                event = self._waiting[run_id] = threading.Event()
                if run_id in self._seen:
                    event.set()
            return event

    def ended_record(self, run_id: str) -> RunEnded | None:
        """The ``run.ended`` record of ``run_id`` if it arrived (and is still remembered)."""
        with self._lock:
            return self._seen.get(run_id)

    def forget(self, run_id: str) -> None:
        """Drop what is held for ``run_id`` (its event and record): a gateway done with a run."""
        with self._lock:
            self._waiting.pop(run_id, None)
            self._seen.pop(run_id, None)

    def _run_ended(self, ended: RunEnded) -> None:
        with self._lock:
            self._seen[ended.run_id] = ended
            while len(self._seen) > REMEMBER_ENDED_RUNS:
                gone, _ = self._seen.popitem(last=False)
                self._waiting.pop(gone, None)
            event = self._waiting.get(ended.run_id)
            callbacks = list(self._callbacks)
        if event is not None:
            event.set()
        for callback in callbacks:
            try:
                callback(ended)
            except Exception:  # a gateway's bug must not stop the follower
                logging.getLogger("latch.publisher").exception("a run_ended callback failed")

    # -- delivery -------------------------------------------------------------------------

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports; raise :class:`PublishError` for a failed one."""
        return self._sender.poll(timeout)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every envelope is acknowledged; raise :class:`PublishError` if one
        failed or some are still waiting after ``timeout`` seconds."""
        self._sender.flush(timeout)

    def check_topics(self, timeout: float = 10.0) -> dict[str, int]:
        """The partition count of the events and control topics; raise :class:`PublishError`
        when the cluster does not answer, a topic does not exist, or the two topics have
        different partition counts (a run's cancel would then reach another partition)."""
        counts = self._sender.partition_counts(
            (self.events_topic, self.control_topic), self.config.kafka.bootstrap_servers,
            timeout)
        if len(set(counts.values())) > 1:
            shown = ", ".join(f"{t} has {n}" for t, n in counts.items())
            raise PublishError(
                None, f"the events and control topics must have as many partitions: {shown}"
            )
        return counts

    def close(self, timeout: float = 30.0) -> None:
        """Stop following ``run.ended`` records, and flush (see :meth:`flush`)."""
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()
        self.flush(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.flush()


class _Follower:
    """A thread reading ``topics.run_ended`` from the end it had when it started (every
    partition assigned at its high watermark, read before the constructor returns: nothing
    written after it is missed), handing each ``run.ended`` record to its publisher."""

    def __init__(self, publisher: Publisher, timeout: float) -> None:
        config = publisher.config
        self.topic = config.topics.run_ended
        self._publisher = publisher
        settings = {**config.kafka.confluent_config(),
                    "group.id": f"{config.worker.app_id}-publisher-{uuid.uuid4().hex}",
                    "enable.auto.commit": "false", "auto.offset.reset": "earliest"}
        for key in ("partitioner", "enable.idempotence", "acks", "linger.ms",
                    "message.timeout.ms"):
            settings.pop(key, None)
        self._consumer = Consumer(logs.kafka_config(settings))
        try:
            metadata = self._consumer.list_topics(self.topic, timeout=timeout)
            meta = metadata.topics.get(self.topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise PublishError(self.topic, "the topic does not exist "
                                   "(run `latch topics create`)")
            ends = [TopicPartition(self.topic, p, self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), timeout=timeout)[1]) for p in meta.partitions]
        except KafkaException as exc:
            self._consumer.close()
            raise PublishError(self.topic, _describe(exc)) from None
        except PublishError:
            self._consumer.close()
            raise
        self._consumer.assign(ends)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="latch-run-ended", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        consumer = self._consumer
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                ended = _run_ended(message.value())
                if ended is not None:
                    self._publisher._run_ended(ended)
        finally:
            consumer.close()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


def _run_ended(value: bytes | None) -> RunEnded | None:
    """A ``run.ended`` record's value read, or None (anything else is ignored)."""
    try:
        doc = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != "run.ended" \
            or not isinstance(doc.get("run_id"), str):
        return None
    return RunEnded(doc["run_id"], doc.get("tenant"), str(doc.get("reason")),
                    str(doc.get("status")), int(doc.get("last_seq") or 0), doc)


class Sender:
    """A confluent-kafka producer whose failed deliveries surface as :class:`PublishError` on
    the caller's thread (at the next send, poll or flush), and whose full local queue is
    waited out for :data:`QUEUE_FULL_WAIT_S` before it is an error."""

    def __init__(self, producer: Producer,
                 on_delivery: Callable[[Delivery], None] | None = None) -> None:
        self.sent: Counter[str] = Counter()
        self._producer = producer
        self._on_delivery = on_delivery
        self._failures: list[tuple[str, str]] = []

    def produce(self, topic: str, key: bytes, value: bytes,
                headers: list[tuple[str, str | bytes | None]] | None = None) -> None:
        """Hand one record to the producer (raise :class:`PublishError` for an earlier
        failed delivery, a queue that stays full, or a refused record)."""
        self._raise_failures()
        deadline = time.monotonic() + QUEUE_FULL_WAIT_S
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, headers=headers,
                                       on_delivery=self._delivered)
                break
            except BufferError:
                if time.monotonic() > deadline:
                    raise PublishError(topic, "the local producer queue stayed full") from None
                self._producer.poll(0.1)
            except KafkaException as exc:
                raise PublishError(topic, _describe(exc)) from None
        self.sent[topic] += 1
        self._producer.poll(0)

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        topic = message.topic() or "?"
        if error is not None:
            fatal = " (fatal)" if error.fatal() else ""
            self._failures.append((topic, f"{error.str()}{fatal}"))
            return
        if self._on_delivery is not None:
            key = message.key() or b""
            self._on_delivery(Delivery(topic, message.partition() or 0, message.offset() or 0,
                                       key.decode("utf-8", "replace")))

    def _raise_failures(self) -> None:
        if not self._failures:
            return
        failures, self._failures = self._failures, []
        topic, error = failures[0]
        raise PublishError(topic, error, count=len(failures))

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports; raise :class:`PublishError` for a failed one."""
        served = self._producer.poll(timeout)
        self._raise_failures()
        return served

    def flush(self, timeout: float) -> None:
        """Wait for every delivery; raise for a failed one or for any left after ``timeout``."""
        left = self._producer.flush(timeout)
        self._raise_failures()
        if left:
            raise PublishError(None, f"{left} envelopes not acknowledged within {timeout:g}s",
                               count=left)

    def partition_counts(self, topics: Sequence[str], servers: str,
                         timeout: float) -> dict[str, int]:
        """The partition count of each of ``topics``; raise :class:`PublishError` when the
        cluster does not answer or a topic does not exist."""
        try:
            metadata = self._producer.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise PublishError(None, f"no answer from {servers}: {_describe(exc)}") from None
        counts: dict[str, int] = {}
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise PublishError(topic, "the topic does not exist (run `latch topics create`)")
            counts[topic] = len(meta.partitions)
        return counts


class RunHandle:
    """One open run: numbers ``seq`` itself (``run.start`` had 0) and closes exactly once."""

    def __init__(self, publisher: Publisher, run_id: str, next_seq: int = 1) -> None:
        self.publisher = publisher
        self.run_id = run_id
        self.next_seq = next_seq
        self.closed = False

    def event(self, event: Mapping[str, Any]) -> int:
        """Send one raw provider streaming event; return its seq."""
        if not isinstance(event, Mapping):
            raise TypeError("a provider event is a JSON object (a mapping)")
        return self._send({"type": "provider.event", "event": dict(event)})

    def end(self) -> int:
        """The provider stream ended normally (OpenAI chat: ``[DONE]``)."""
        return self._send({"type": "stream.end"}, last=True)

    def error(self, message: str) -> int:
        """The transport failed; the worker fails the run's open calls (``stream_error``)."""
        return self._send({"type": "stream.error", "error": message}, last=True)

    def cancel(self, reason: str = "user_stop") -> None:
        """Cancel this run through the control topic (the run may still send events)."""
        self.publisher.cancel(self.run_id, reason)

    @property
    def stopped(self) -> threading.Event:
        """Set once Latch reports this run ended (:meth:`Publisher.ended`): stop reading."""
        return self.publisher.ended(self.run_id)

    def _send(self, body: dict[str, Any], last: bool = False) -> int:
        if self.closed:
            raise RuntimeError(f"run {self.run_id} already ended")
        seq = self.next_seq
        self.publisher.send_envelope({"v": 1, "run_id": self.run_id, "seq": seq, **body})
        self.next_seq += 1
        self.closed = last
        return seq


def _check_run_id(run_id: object) -> None:
    problem = _reserved(None, run_id)
    if problem is not None:
        raise ValueError(problem)


def _reserved(kind: object, run_id: object) -> str | None:
    """Why a gateway may not send an envelope of type ``kind`` keyed ``run_id``, or None.
    Never quotes the run id (it comes from the caller's input)."""
    if kind in RESERVED_TYPES:
        return f"type {kind!r} is reserved for the worker; a gateway never sends it"
    if not isinstance(run_id, str) or not run_id:
        return "run_id must be a non-empty string"
    if run_id.startswith(RESERVED_PREFIX):
        return f"run ids starting with {RESERVED_PREFIX} are reserved for the worker"
    return None


def _describe(exc: KafkaException) -> str:
    """librdkafka's description of an error, without anything else the exception holds."""
    first = exc.args[0] if exc.args else None
    return first.str() if isinstance(first, KafkaError) else type(exc).__name__


# ---------------------------------------------------------------------------------------
# latch publish

#: Inputs longer than this get a progress bar (when stderr is a terminal).
PROGRESS_MIN_LINES = 1000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latch publish",
        description="Send JSON-Lines envelopes to Kafka: stream envelopes to the events topic, "
        "cancel envelopes to the control topic, each keyed by its run_id.",
    )
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    parser.add_argument("--no-check", action="store_true",
                        help="do not check first that the events and control topics exist")
    parser.add_argument("input", help="a JSON-Lines file of envelopes, - for stdin")
    return parser


@dataclass(slots=True)
class _Line:
    number: int
    text: bytes


def main(argv: Sequence[str] | None = None) -> int:
    """``latch publish``. Exit 0: everything sent; 1: some lines were skipped (or a delivery
    failed); 2: the configuration, the input, the cluster or the topics are unusable."""
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        lines, total = _read_input(args.input)
        publisher = Publisher(config)
        if not args.no_check:
            publisher.check_topics()
    except (ConfigError, OSError) as exc:
        return _fail(str(exc))
    except (PublishError, KafkaException) as exc:
        return _fail(str(exc))
    return _publish(publisher, lines, total)


def _fail(message: str) -> int:
    print(f"latch publish: {message}", file=sys.stderr)
    return EXIT_FAILED


def _read_input(name: str) -> tuple[Iterable[_Line], int | None]:
    if name == "-":
        return (_Line(n, line) for n, line in enumerate(sys.stdin.buffer, start=1)), None
    text = Path(name).read_bytes().splitlines()
    return (_Line(n, line) for n, line in enumerate(text, start=1)), len(text)


def _publish(publisher: Publisher, lines: Iterable[_Line], total: int | None) -> int:
    skipped = 0
    runs: set[str] = set()
    try:
        for line in _progress(lines, total):
            text = line.text.strip()
            if not text:
                continue
            problem, run_id, control = _classify(text)
            if problem is not None:
                print(f"latch publish: line {line.number}: {problem}; skipped", file=sys.stderr)
                skipped += 1
                continue
            assert run_id is not None
            publisher.send_raw(run_id, text, control=control)
            runs.add(run_id)
        publisher.flush()
    except PublishError as exc:
        print(f"latch publish: {exc}", file=sys.stderr)
        print(_summary(publisher, runs, skipped, prefix="before the failure: "))
        return EXIT_SKIPPED
    print(_summary(publisher, runs, skipped))
    return EXIT_SKIPPED if skipped else EXIT_OK


def _classify(text: bytes) -> tuple[str | None, str | None, bool]:
    """(problem, run_id, is_control) for one input line; the problem never quotes the line."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at char {exc.pos})", None, False
    if not isinstance(doc, dict):
        return f"not a JSON object (a {type(doc).__name__}), no run_id", None, False
    run_id = doc.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return "no run_id (a non-empty string is needed)", None, False
    problem = _reserved(doc.get("type"), run_id)
    if problem is not None:
        return problem, None, False
    return None, run_id, _control(doc.get("type"))


def _control(kind: object) -> bool:
    """Whether an envelope of type ``kind`` goes to the control topic."""
    return kind == "cancel" or kind in DECISIONS


def _summary(publisher: Publisher, runs: set[str], skipped: int, prefix: str = "") -> str:
    total = sum(publisher.sent.values())
    where = ", ".join(f"{topic} ({n})" for topic, n in sorted(publisher.sent.items())) or "-"
    text = (f"{prefix}sent {total} envelope{'s' * (total != 1)} for {len(runs)} "
            f"run{'s' * (len(runs) != 1)} to {where}")
    if skipped:
        text += f"; skipped {skipped} line{'s' * (skipped != 1)}"
    return text


def _progress(lines: Iterable[_Line], total: int | None) -> Iterator[_Line]:
    """The lines, with a tqdm bar on stderr for long inputs when stderr is a terminal."""
    stream: IO[str] = sys.stderr
    if not stream.isatty() or (total is not None and total <= PROGRESS_MIN_LINES):
        yield from lines
        return
    from tqdm import tqdm

    bar: Any = None
    try:
        for line in lines:
            if bar is None and (total is not None or line.number > PROGRESS_MIN_LINES):
                bar = tqdm(total=total, initial=line.number - 1, unit="line", file=stream,
                           desc="publishing", leave=False)
            yield line
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
