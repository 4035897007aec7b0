"""The kafka engine: consume, step, produce, one Kafka transaction per batch.

The same rules as the faust engine (``worker/runtime/app.py``; decision 0001), on
confluent-kafka, with exactly once to readers at ``read_committed`` (decision 0004):

* **One ordered history per run.** Cancels on the control topic are forwarded into the
  events topic (keyed by ``run_id``, murmur2 as the gateway partitions) and ticks are written
  into each owned events partition every ``worker.tick_interval_s``: the tick timer is the
  only clock read. The core decides from the history and record times only.
* **One transaction per batch.** A transactional producer (``transactional.id``
  ``<app_id>-<instance>``) sends, between ``begin_transaction`` and ``commit_transaction``: the
  outputs of the batch's records, the heads changelog writes they made, the ticks and the
  forwarded cancels, and (``send_offsets_to_transaction`` with the consumer's group metadata,
  KIP-447) the next offsets of the events and control partitions the batch consumed.
* **A batch commits as soon as its input is drained** (decision 0004): with no transaction
  open the loop waits for one record; then it takes, without waiting, what the consumer has
  fetched already (``consume`` with a zero time-out, at most ``_CONSUME_MAX`` a call) and
  commits once a call returns fewer records than asked, i.e. nothing more is at hand. Under a
  paced load a transaction holds what arrived during the previous commit (small and quick:
  an outcome waits for about one commit, not ``worker.batch_max_ms``); under a backlog the
  calls keep returning full and the batch ends at its bounds, ``worker.batch_max_records``
  records or ``worker.batch_max_ms`` after it began, whichever comes first (the bounds are
  upper bounds only). A batch opened by a tick or a cancel commits the same way: the worker
  never waits for its own uncommitted ticks or cancels, which its ``read_committed``
  consumer sees once the batch commits.
* **Under a backlog, a batch commits while the next one is applied.** A batch ended by its
  bounds (the input not drained) commits in a thread of its own (``send_offsets_to_transaction``
  and ``commit_transaction``, :class:`Commit`); meanwhile the loop applies the next records,
  holding their output and heads records (the producer has one transaction at a time) until
  the commit returns: then it begins their transaction and sends them, in order. If the commit
  fails, the next batch is dropped with it (its offsets are past the aborted ones) and the
  partitions rewind as below. One commit is in flight at a time. **A drained batch commits
  before the loop consumes again** (the same thread, waited for): overlapped there, the
  next batch was cut at its first record, which waited for this commit while the records
  behind it waited for one more; waiting lets everything that arrives meanwhile into the
  next transaction, which begins at once (docs/benchmarks.md, "The kafka engine's
  latency: a drained batch's commit waited for").
* **Rebuild on assignment.** For each events partition it gets, the worker restores the
  partition's heads from the changelog (read to its end), then feeds the open runs' records
  from the earliest open ``start`` up to the committed offset to a fresh assembler (outputs
  discarded: they were committed with that offset), and starts consuming at that offset.
* **Abort and rewind.** A transaction that cannot commit is aborted; every owned partition is
  then rebuilt from its committed offset as on assignment (the in-memory state had moved past
  it). On revocation the open transaction is committed first (aborted if that fails); a lost
  assignment aborts it. A fatal error (this producer fenced by a newer one) stops the worker
  with status 1.
* **A wedged producer is replaced.** librdkafka's ``send_offsets_to_transaction`` can wait
  without bound for its group-coordinator request (confluentinc/librdkafka#5456; seen here
  after a broker restart: every worker blocked in it for good, so no cancel was forwarded and
  runs expired). The call runs in the commit's thread; if it has not returned within the
  transaction timeout (librdkafka caps the call's own timeout to it) and a grace, the worker
  creates a new producer with the same ``transactional.id``: its ``init_transactions`` fences
  the wedged one and aborts its transaction, and the worker rewinds as after an abort.
* **Ticks wait for the control backlog.** A tick is written only once every control record
  this worker has seen in the log is forwarded (at most ``_TICK_DEFER_MAX_S`` late):
  after a takeover the first tick would otherwise reach the events log before the cancels
  that arrived while the partition stood still, and expire the runs they stop.
* **A record refused for its own sake does not stop a partition** (worker/runtime/refusals.py):
  each output is checked against its topic's ``max.message.bytes`` (read at start) before it
  is sent, and ``batch.size`` is kept below the smallest; a refusal in a delivery report
  fails the transaction, so the worker reads the limits again, replaces the producer (the
  refused batch's sequence numbers would fail the next transaction too) and applies the
  records again: the refused one goes to the DLQ as ``output_refused``.
* **One live worker per ``worker.instance_id``** (instance.py): checked before
  ``init_transactions``, through the group's members.
"""

from __future__ import annotations

import functools
import gc
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from worker.core import Assembler, Emit, Topic
from worker.runtime import admin, control, logs, memory, refusals, step
from worker.runtime import partition as partition_module
from worker.runtime.config import Config
from worker.runtime.hooks import EngineHooks
from worker.runtime.kafka_engine import instance, reader
from worker.runtime.kafka_engine.heads import HeadsTable
from worker.runtime.metrics import PartitionView
from worker.runtime.partition import TICK, Heads, PartitionState

_T = TypeVar("_T")

__all__ = ["Batch", "KafkaEngine", "consumer_settings", "producer_settings"]

log = logging.getLogger("latch.worker")

#: Transactions aborted in a row (no commit between them) before the worker gives up.
MAX_ABORTS = 10
_CLIENT_TIMEOUT_S = 30.0
#: /healthz: the engine's thread turned its loop within this many seconds (a commit may retry
#: for a while; a rebuild holds the loop as long as it takes and counts as alive).
LIVE_S = 2 * _CLIENT_TIMEOUT_S
#: Records taken per ``consume`` call: the batch's age is checked between calls, so a call's
#: records (about 5 ms of work for 1,000) are how far a batch can overrun ``batch_max_ms``;
#: a call that returns fewer than asked has drained what was fetched: the batch commits.
_CONSUME_MAX = 1000
#: How often the loop reads the consumer's positions and cached end offsets (lag gauges).
_LAGS_EVERY_S = 1.0
#: How long past the transaction timeout a ``send_offsets_to_transaction`` may take before
#: its producer counts as wedged and is replaced.
_WEDGED_GRACE_S = 2.0
#: Seconds a tick may wait for the control backlog (a control partition whose end is never
#: reached, e.g. held by someone's open transaction, must not stop the clock).
_TICK_DEFER_MAX_S = 10.0


#: How long the loop waits for a first record while a commit is in flight.
_COMMIT_POLL_S = 0.005
#: Calls that may stay wedged at once (each holds a fenced producer) before the worker exits.
MAX_WEDGED = 3
#: librdkafka's default ``batch.size``.
_BATCH_SIZE = 1_000_000
#: Errors of a record refused for its size (synchronously by ``produce``, or in the
#: delivery report: the broker refuses the whole batch that held it).
_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                        KafkaError.INVALID_MSG_SIZE})
#: The broker found this record invalid (KIP-467: the others of its batch are reported as
#: ``_INVALID_DIFFERENT_RECORD`` and are sent again).
_INVALID = frozenset({KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG})


class Wedged(Exception):
    """A transactional producer call did not return in time: the producer must be replaced.
    ``thread`` is the thread still in the call (it holds the old producer until it returns)."""

    def __init__(self, message: str, thread: threading.Thread) -> None:
        super().__init__(message)
        self.thread = thread


class Fatal(Exception):
    """The worker cannot go on (fenced, or transactions keep failing): exit 1."""


@dataclass(slots=True)
class Batch:
    """The open transaction: when it began, how many input records it holds, and the next
    offset of each input partition it consumed."""

    began: float
    records: int = 0
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: The next offset of each partition of ``events_topic`` consumed (apart from
    #: ``offsets``: an int key per record costs less than a (topic, partition) tuple).
    events: dict[int, int] = field(default_factory=dict)
    events_topic: str = ""
    #: The record time of the input of each committed call sent (visible once it commits).
    committed: list[int | None] = field(default_factory=list)
    #: Whether the producer's transaction has begun: not while the previous batch's commit
    #: is still in flight (:class:`Commit`); until then its records wait in ``held``.
    begun: bool = True
    held: list[tuple[Any, ...]] = field(default_factory=list)

    def due(self, now: float, max_records: int, max_s: float) -> bool:
        """Whether the batch is full or old enough to commit."""
        return self.records >= max_records or now - self.began >= max_s

    def positions(self) -> list[TopicPartition]:
        """The consumed positions to commit with the transaction."""
        offsets = self.offsets | {(self.events_topic, p): o for p, o in self.events.items()}
        return [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]


@dataclass(slots=True)
class Commit:
    """A batch's commit (``send_offsets_to_transaction``, then ``commit_transaction``) in a
    thread of its own, while the loop applies the next batch's records: what it raised, and
    when its offsets were sent (a ``send_offsets_to_transaction`` that never returns is the
    wedge of confluentinc/librdkafka#5456)."""

    batch: Batch
    began: float
    thread: threading.Thread | None = None
    offsets_sent: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    failed: list[BaseException] = field(default_factory=list)


def consumer_settings(config: Config) -> dict[str, Any]:
    """The group consumer: offsets only through transactions, committed records only."""
    return {"session.timeout.ms": 15000, **config.kafka.confluent_config(),
            "group.id": config.worker.app_id, "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed", "partition.assignment.strategy": "range"}


def producer_settings(config: Config, instance: str, batch_bytes: int | None = None
                      ) -> dict[str, Any]:
    """The transactional producer: Java's partitioner (a forwarded cancel lands in its run's
    partition, as the gateway's records do), output records up to the output topics' size.

    ``retry.backoff.ms`` 10 (librdkafka's default 100; overridable under ``kafka:``): right
    after a commit the coordinator is still writing the markers and answers the next
    transaction's AddOffsetsToTxn with CONCURRENT_TRANSACTIONS; each retry waited 100 ms, and
    ``send_offsets_to_transaction`` took 84 to 108 ms a transaction against 3 to 15 ms
    (measured on the local broker; Java's client lowered this backoff for the same reason,
    KAFKA-5477). Now 2 ms: with transactions committed as soon as their input is drained,
    the markers are usually written within a few ms, and a 10 ms backoff still made
    ``send_offsets_to_transaction`` take 12.5 ms at the median (2.1 to 3.6 ms at 2 ms; paced
    load of 1,000 envelopes/s, docs/benchmarks.md). librdkafka backs off exponentially from
    there (2, 4, 8 ms ...) to ``retry.backoff.max.ms`` on repeated failures.

    ``batch_bytes``: a ``batch.size`` below every written topic's ``max.message.bytes``
    (:meth:`worker.runtime.refusals.Limits.batch_bytes`; the broker refuses a whole batch over
    it)."""
    worker = config.worker
    batch = {} if batch_bytes is None else {"batch.size": batch_bytes}
    return {"retry.backoff.ms": 2, **config.kafka.confluent_config(), **batch,
            "transactional.id": f"{worker.app_id}-{instance}",
            "transaction.timeout.ms": int(worker.transaction_timeout_s * 1000),
            "partitioner": "murmur2_random", "linger.ms": 5,
            "message.max.bytes": admin.OUTPUT_MAX_BYTES,
            # delivery reports of failures only (all the engine counts): a report needs the
            # GIL, which the commit's thread would otherwise wait for while the loop runs
            "delivery.report.only.error": True}


class KafkaEngine:
    """The consumer, the transactional producer, and the partitions this worker owns."""

    def __init__(self, config: Config) -> None:
        self.config = config
        topics, worker = config.topics, config.worker
        self.events, self.control = topics.events, topics.control
        self.changelog = admin.heads_changelog(config)
        self.outputs = {t: str(getattr(topics, t.value)) for t in Topic}
        self.table = HeadsTable()
        self.heads = Heads(self.table, worker.finished_run_retention_s)
        self.partitions: dict[int, PartitionState] = {}
        #: The next offset to forward of each control partition this worker owns.
        self.control_next: dict[int, int] = {}
        self.hooks = EngineHooks(config)
        self.hooks.metrics.watch(self._partition_views)
        self.hooks.health.heartbeat = self._alive
        self.topic_of = {name: topic for topic, name in self.outputs.items()}
        #: The lag of each owned events partition, as the loop last read it from the consumer
        #: (the HTTP thread reads this, never the consumer).
        self.lags: dict[int, int] = {}
        self.lags_read = 0.0
        self.beat = time.monotonic()
        #: The heap's free memory goes back to the system when the events stop (memory.py).
        self.idle_trim = memory.IdleTrim(memory.malloc_trim())
        self.thread = threading.current_thread()
        self.reader_settings = config.kafka.confluent_config()
        self.instance = worker.instance_id or uuid.uuid4().hex
        #: Each written topic's limit (read at start, and again after a refusal for size),
        #: checked before each output is sent (worker/runtime/refusals.py).
        self.limits = refusals.Limits()
        self.batch_bytes: int | None = None
        #: Records the broker found invalid: (topic, key, value size) -> the error's name.
        self.invalid: dict[tuple[str, bytes | None, int], str] = {}
        #: Set by a delivery report (in the commit's thread) of a record refused for its own
        #: sake: ``size`` or ``invalid``; the transaction then fails (:meth:`_refused_abort`).
        self.refusal: str | None = None
        #: The group consumer carries worker.instance_id in its client.id (instance.py).
        member = instance.client_id(config)
        self.consumer = Consumer(logs.kafka_config(
            consumer_settings(config) | ({} if member is None else {"client.id": member})))
        self.producer = self._new_producer()
        #: Threads still in a wedged call of a replaced (fenced) producer.
        self.wedged: list[threading.Thread] = []
        #: When the tick waiting for the control backlog first fell due (None: none waits).
        self.tick_deferred: float | None = None
        self.batch: Batch | None = None
        #: The previous batch's commit, while it is in flight (at most one).
        self.committing: Commit | None = None
        self.server: Any = None
        self.aborts = 0
        self.stopping = False
        self.ready = False

    # -- running ----------------------------------------------------------------------

    def run(self) -> int:
        """Run until SIGTERM or SIGINT; return the exit status."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        try:
            self.server = self.hooks.serve_http()
        except OSError as exc:
            print(self.hooks.http_error(exc), file=sys.stderr)
            return 2
        self.thread = threading.current_thread()
        try:
            # before init_transactions: never fence a live worker that holds our id
            instance.check(self.config, self.reader_settings,
                           int(consumer_settings(self.config)["session.timeout.ms"]) / 1000)
            self._read_limits()
            self.producer.init_transactions(_CLIENT_TIMEOUT_S)
            self.consumer.subscribe([self.events, self.control], on_assign=self._on_assign,
                                    on_revoke=self._on_revoke, on_lost=self._on_lost)
            # What start-up made (modules, faust's among them: the CLI imports app.py) never
            # becomes garbage: out of the cyclic GC's way, which otherwise walked it on each
            # full collection (docs/benchmarks.md: gc was about a tenth of the loop's CPU).
            gc.collect()
            gc.freeze()
            self._loop()
            self._commit()
            return 0
        except instance.InstanceTaken as exc:
            log.error("not starting: %s", exc)
            return 2
        except (Fatal, KafkaException) as exc:
            log.error("stopping: %s%s", _describe(exc), instance.fenced_hint(exc, self.config))
            return 1
        finally:
            self._close()

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _close(self) -> None:
        try:
            self.consumer.close()  # revokes: commits the open transaction, if any
        except (Fatal, KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer: %s", _describe(exc))
        self.hooks.stop(self.server)

    def _loop(self) -> None:
        worker = self.config.worker
        max_s = worker.batch_max_ms / 1000
        next_tick = time.monotonic() + worker.tick_interval_s
        consume, apply_events = self.consumer.consume, self._apply_events
        idle_trim = self.idle_trim
        while not self.stopping:
            self.beat = now = time.monotonic()
            if now - self.lags_read >= _LAGS_EVERY_S:
                self._read_lags()
                self.lags_read = now
            if self.committing is not None:
                self._settle(wait=False)
            batch = self.batch
            if batch is None:  # no transaction open: wait for a first record
                # (while a commit is in flight, briefly: its outcome is counted at the next
                # turn)
                want, wait = 1, _COMMIT_POLL_S if self.committing else min(max_s, 0.5)
            else:  # take what is fetched already, without waiting
                want = min(max(worker.batch_max_records - batch.records, 1), _CONSUME_MAX)
                wait = 0.0
            msgs = consume(want, timeout=wait)
            if msgs:
                idle_trim.active = True  # (IdleTrim.busy, inline)
            elif batch is None:  # nothing came for ``wait``: perhaps give memory back
                idle_trim.idle()
            apply_events(msgs)
            now = time.monotonic()
            if now >= next_tick and self._tick(now):
                next_tick = now + worker.tick_interval_s
            batch = self.batch
            if batch is None:
                continue
            if len(msgs) < want:  # drained: commit at once, and wait for it (module doc)
                self._commit()
            elif batch.due(now, worker.batch_max_records, max_s):  # a backlog: overlap it
                self._commit(wait=False)

    def _handle(self, msg: Message) -> None:
        error = msg.error()
        if error is not None:
            if error.fatal():
                raise Fatal(f"consumer: {error.str()}")
            log.warning("consumer: %s", error.str())
        elif msg.topic() == self.events:
            self._apply_events((msg,))
        else:
            self._apply_control(msg)

    # -- records ----------------------------------------------------------------------

    def _apply_events(self, msgs: Sequence[Message]) -> None:
        """Apply one ``consume`` call's records, in order: events records here, the others
        (errors, control records) through :meth:`_handle`."""
        # The hot path (every envelope), with what it reads bound once per call:
        # reader.record_of inlined; the outputs and the finished heads touched only when the
        # record emitted something; Heads.applied called only when a run opened or a cancel
        # may wait for its run (it writes a head only then).
        events, partitions, apply = self.events, self.partitions, self.hooks.apply
        heads, table = self.heads, self.table
        batch = self.batch
        for msg in msgs:
            if msg.error() is not None or msg.topic() != events:
                self._handle(msg)
                batch = self.batch
                continue
            # (reader.where's assertion, without its cost: both are set on a consumed record)
            partition: int = msg.partition()  # type: ignore[assignment]
            offset: int = msg.offset()  # type: ignore[assignment]
            state = partitions.get(partition)
            if state is None or offset < state.next_offset:  # not ours (any more), a repeat
                continue
            if batch is None:
                batch = self._begin()
            key = msg.key()
            kind, ts = msg.timestamp()
            record_ms = None if kind == 0 else ts
            record = (key, msg.value() or b"", record_ms,
                      {"topic": events, "partition": partition, "offset": offset})
            emits, opened = apply(state, record, msg.headers)
            if opened or (not emits and state.assembler.early_cancels_waiting):
                heads.applied(state, key, partition, offset, opened, emits)
            if emits:
                self._publish(key, emits, record_ms, record[3])
                finished = partition_module.finished_runs(emits)
                if finished:
                    heads.finished(state, partition, finished)
            if key == TICK:
                heads.forget_finished(state)
            if table.pending:
                self._write_heads()
            state.next_offset = batch.events[partition] = offset + 1
            batch.records += 1

    def _apply_control(self, msg: Message) -> None:
        _, partition, offset = reader.where(msg)
        expected = self.control_next.get(partition)
        if expected is None or offset < expected:
            return
        batch = self._begin()
        record = reader.record_of(msg)
        routed = control.route(record)
        if isinstance(routed, Emit):
            self.hooks.routed(routed)
            self._produce(self.outputs[Topic.DLQ], record[0], step.out_value(routed))
        else:
            self._produce(self.events, *routed)
        self.control_next[partition] = offset + 1
        batch.offsets[(self.control, partition)] = offset + 1
        batch.records += 1

    def _tick(self, now: float) -> bool:
        """Write a tick into each events partition this worker owns (the only clock read),
        unless a control record already in the log is still to forward (then try again at
        the next turn, for at most ``_TICK_DEFER_MAX_S``); return whether it is done."""
        if not self.partitions:
            return True
        if self._control_behind():
            if self.tick_deferred is None:
                self.tick_deferred = now
            if now - self.tick_deferred < _TICK_DEFER_MAX_S:
                return False
            log.warning("ticking with control records not yet forwarded (waited %.1fs)",
                        now - self.tick_deferred)
        self.tick_deferred = None
        self._begin()
        value = orjson.dumps({"v": 1, "type": "tick", "ts": int(time.time() * 1000)})
        for partition in sorted(self.partitions):
            self._produce(self.events, TICK, value, partition)
        return True

    def _control_behind(self) -> bool:
        """Whether an owned control partition has records in the log (its end as the last
        fetch reported it; unknown right after an assignment) not yet forwarded."""
        for partition, next_offset in self.control_next.items():
            try:
                _, high = self.consumer.get_watermark_offsets(
                    TopicPartition(self.control, partition), cached=True)
            except KafkaException:
                return True
            if high < 0 or next_offset < high:
                return True
        return False

    def _publish(self, key: bytes | None, emits: Sequence[Emit],
                 record_ms: int | None = None, source: dict[str, Any] | None = None) -> None:
        """Send each emit, in order, with its run's trace headers; a DLQ record keeps the
        input record's key. ``record_ms``: the time of the record that produced them;
        ``source``: where it was read. An emit its topic would refuse (over the topic's
        limit, or found invalid by the broker before) is not sent: a small ``output_refused``
        DLQ record goes in its place (:meth:`_refuse`)."""
        hooks, outputs, limits, invalid = self.hooks, self.outputs, self.limits, self.invalid
        for emit in emits:
            topic = emit.topic
            name = outputs[topic]
            out_key, value = step.out_key(emit, key), step.out_value(emit)
            headers = hooks.headers(emit, value)
            size = limits.over(name, out_key, value, headers)
            if size is not None:
                self._refuse(emit, name, out_key, size, "MSG_SIZE_TOO_LARGE", key, source)
                continue
            if invalid and (name, out_key, len(value)) in invalid:
                self._refuse(emit, name, out_key, refusals.batch_size(out_key, value, headers),
                             invalid[(name, out_key, len(value))], key, source)
                continue
            try:
                self._produce(name, out_key, value, headers=headers)
            except KafkaException as exc:  # refused by librdkafka at once
                if exc.args[0].code() not in _TOO_LARGE | _INVALID:
                    raise
                self._refuse(emit, name, out_key, refusals.batch_size(out_key, value, headers),
                             exc.args[0].name(), key, source)
                continue
            if topic is Topic.COMMITTED and self.batch is not None:
                self.batch.committed.append(record_ms)

    def _refuse(self, emit: Emit, name: str, out_key: bytes | None, size: int, error: str,
                key: bytes | None, source: dict[str, Any] | None) -> None:
        """Send, instead of ``emit`` (for topic ``name``), its ``output_refused`` DLQ record,
        keyed by the input record's ``key``."""
        limit = self.limits.limit(name)
        detail = (refusals.too_large_detail(name, size, limit) if size > limit
                  else refusals.refused_detail(name, size, error))
        dlq = refusals.dlq_record(name, out_key, size, error, detail, source, key,
                                  refusals.run_of(emit))
        where = logs.where(source["topic"], source["partition"], source["offset"]) \
            if source else {}
        log.warning("an output record for %s (%d bytes) is refused (%s); an output_refused "
                    "DLQ record replaces it", name, size, error, extra=where)
        self.hooks.metrics.dlq[str(dlq.value["reason"])] += 1
        self._produce(self.outputs[Topic.DLQ], key, step.out_value(dlq))

    def _write_heads(self) -> None:
        if not self.table.pending:
            return
        for partition, key, value in self.table.take_pending():
            self._produce(self.changelog, key, value, partition)

    def _produce(self, topic: str, key: bytes | None, value: bytes | None,
                 partition: int | None = None, headers: list[tuple[str, bytes]] | None = None,
                 on_delivery: Callable[[KafkaError | None, Message], None] | None = None
                 ) -> None:
        """Queue one record in the open transaction (held until it begins); a delivery
        failure surfaces when the transaction commits (it must then abort)."""
        batch = self.batch
        if batch is not None and not batch.begun:
            batch.held.append((topic, key, value, partition, headers, on_delivery))
            return
        options: dict[str, Any] = {}
        if headers:
            options["headers"] = headers
        if on_delivery is not None:  # (else the producer's: :meth:`_delivered`)
            options["on_delivery"] = on_delivery
        while True:
            try:
                if partition is None:
                    self.producer.produce(topic, value, key, **options)
                else:
                    self.producer.produce(topic, value, key, partition, **options)
                return
            except BufferError:  # the local queue is full: let librdkafka send
                self.producer.poll(0.05)

    # -- transactions -----------------------------------------------------------------

    def _begin(self) -> Batch:
        if self.batch is None:
            begun = self.committing is None
            if begun:
                self.producer.begin_transaction()
            self.batch = Batch(time.monotonic(), events_topic=self.events, begun=begun)
        return self.batch

    def _commit(self, rewind: bool = True, wait: bool = True) -> None:
        """Commit the open transaction with its consumed offsets, in a thread of its own
        (:class:`Commit`), after the one in flight; ``wait``: until it has committed (the
        loop does not wait: it applies the next batch's records meanwhile, holding their
        outputs until the producer begins their transaction). If it must be aborted, abort it
        and (``rewind``) rebuild every owned partition from its committed offset."""
        self._settle(rewind=rewind)  # one transaction commits at a time, in order
        batch, self.batch = self.batch, None
        if batch is None:
            return
        commit = Commit(batch, time.monotonic())
        producer, positions = self.producer, batch.positions()
        metadata = self.consumer.consumer_group_metadata() if positions else None

        def run() -> None:
            try:
                if positions:
                    self._retrying(lambda: producer.send_offsets_to_transaction(
                        positions, metadata, _CLIENT_TIMEOUT_S))
                commit.offsets_sent.set()
                self._retrying(lambda: producer.commit_transaction(_CLIENT_TIMEOUT_S))
            except BaseException as exc:  # handed to the loop (_settle)
                commit.failed.append(exc)
            finally:
                commit.offsets_sent.set()
                commit.done.set()

        commit.thread = threading.Thread(target=run, name="latch-txn-commit", daemon=True)
        self.committing = commit
        commit.thread.start()
        if wait:
            self._settle(rewind=rewind)

    def _settle(self, wait: bool = True, rewind: bool = True) -> None:
        """The commit in flight, if any, once it has returned (``wait``: wait for it): its
        committed calls counted and the next batch's transaction begun with the records it
        held; or, if it failed, the next batch dropped (its records are consumed again) and
        the transaction aborted as :meth:`_commit` says. :class:`Wedged` handling: a
        ``send_offsets_to_transaction`` that has not returned by the transaction timeout
        (which caps the call's own) and a grace."""
        commit = self.committing
        if commit is None:
            return
        wait_s = self.config.worker.transaction_timeout_s + _WEDGED_GRACE_S
        wedged = False
        if not commit.done.is_set():
            left = commit.began + wait_s - time.monotonic()
            if not wait:
                if commit.offsets_sent.is_set() or left > 0:
                    return
                wedged = True
            elif not commit.offsets_sent.wait(max(0.0, left)):
                wedged = True
            else:
                commit.done.wait()
        self.committing = None
        if (wedged or commit.failed) and self.batch is not None and not self.batch.begun:
            self.batch = None  # the next batch builds on this one: it goes too
        try:
            if wedged:
                assert commit.thread is not None
                raise Wedged(f"send_offsets_to_transaction did not return in {wait_s:g}s",
                             commit.thread)
            if commit.failed:
                raise commit.failed[0]
            self.aborts = 0
            for record_ms in commit.batch.committed:  # visible to read_committed readers
                self.hooks.delivered(Topic.COMMITTED, record_ms, True)
        except Wedged as exc:
            self.wedged = [t for t in self.wedged if t.is_alive()] + [exc.thread]
            if len(self.wedged) > MAX_WEDGED:
                raise Fatal(f"{len(self.wedged)} transactional calls wedged") from exc
            self._abort(str(exc), rewind, wedged=True)
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.txn_requires_abort():
                raise Fatal(f"transaction: {error.str()}") from exc
            if self.refusal is not None:
                self._refused_abort(error.str(), rewind)
            else:
                self._abort(error.str(), rewind)
            return
        batch = self.batch
        if batch is not None and not batch.begun:
            self.producer.begin_transaction()
            batch.begun = True
            held, batch.held = batch.held, []
            for args in held:
                self._produce(*args)

    def _retrying(self, call: Callable[[], None]) -> None:
        """``call``, again while it fails with a retriable error (librdkafka's advice for
        ``send_offsets_to_transaction`` and ``commit_transaction``)."""
        while True:
            try:
                call()
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal():
                    raise Fatal(f"transaction: {error.str()}") from exc
                if not error.retriable():
                    raise
                log.warning("transaction: %s; retrying", error.str())
                time.sleep(0.5)

    def _refused_abort(self, reason: str, rewind: bool) -> None:
        """The transaction failed because the broker refused a record for its own sake
        (:meth:`_delivered`). Learn why: for size, read the topics' limits again (one was
        lowered, or records that fit alone were batched past it: the batch size follows the
        smallest limit); an invalid record is remembered already. Then abort by replacing the
        producer (the refused batch's sequence numbers would fail the next transaction too)
        and rewind: applied again, the refused records go to the DLQ (:meth:`_publish`). An
        abort that learned something does not count towards :data:`MAX_ABORTS`."""
        kind, self.refusal = self.refusal, None
        learned = kind == "invalid"
        if kind == "size":
            learned = self._read_limits(replace=False)
        if learned:
            self.aborts = 0
        self._abort(f"{reason}; a record was refused for its own sake", rewind, wedged=True,
                    why="refusing")

    def _read_limits(self, replace: bool = True) -> bool:
        """Read the written topics' ``max.message.bytes`` (:class:`refusals.Limits`) and the
        batch size they allow; ``replace``: make the producer again if that changed (none has
        begun a transaction yet); return whether a limit changed."""
        topics = [*self.outputs.values(), self.events, self.changelog]
        changed = self.limits.update(refusals.read(self.reader_settings, topics))
        default = int(self.reader_settings.get("batch.size", _BATCH_SIZE))
        batch_bytes = self.limits.batch_bytes(default)
        wanted = None if batch_bytes >= default else batch_bytes
        if wanted != self.batch_bytes:
            log.info("producer batch.size %d: below the smallest max.message.bytes",
                     batch_bytes)
            self.batch_bytes = wanted
            if replace:
                self.producer = self._new_producer()
            changed = True
        return changed

    def _abort(self, reason: str, rewind: bool, wedged: bool = False,
               why: str = "wedged") -> None:
        """Abort the open transaction (``wedged``: replace the producer, which fences it and
        aborts its transaction), forget its changelog writes, and (``rewind``) rebuild every
        owned partition from its committed offset."""
        self.aborts += 1
        log.warning("transaction aborted (%s); %s", reason,
                    "rebuilding from the committed offsets" if rewind else "partitions go")
        if self.aborts > MAX_ABORTS:
            raise Fatal(f"{self.aborts} transactions aborted in a row")
        if wedged:
            self._replace_producer(why)
        else:
            self._retrying(lambda: self.producer.abort_transaction(_CLIENT_TIMEOUT_S))
        self.table.take_pending()
        if rewind:
            time.sleep(min(self.aborts, 5))
            self._take_over(self.consumer.assignment(), seek=True)

    def _new_producer(self) -> Producer:
        return Producer(logs.kafka_config({
            **producer_settings(self.config, self.instance, self.batch_bytes),
            "on_delivery": self._delivered}))

    def _replace_producer(self, why: str = "wedged") -> None:
        """A new producer with the same ``transactional.id``: its ``init_transactions`` bumps
        the epoch, so the wedged producer is fenced and its open transaction aborted (also
        after a refused record: :meth:`_refused_abort`)."""
        log.warning("replacing the %s transactional producer (transactional.id %s-%s)", why,
                    self.config.worker.app_id, self.instance)
        self.producer = self._new_producer()
        self._retrying(lambda: self.producer.init_transactions(_CLIENT_TIMEOUT_S))

    # -- assignment -------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        """Rebuild each events partition as it was at its committed offset; consume every
        partition from that offset."""
        self._settle(rewind=False)  # (none in flight: a revocation came first)
        self.hooks.assigned([tp.partition for tp in assigned if tp.topic == self.events])
        self._take_over(assigned, seek=False)
        if not self.ready:
            self.ready = True
            log.info("kafka engine ready (transactional.id %s-%s)", self.config.worker.app_id,
                     self.instance)

    def _on_revoke(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        """Commit the open transaction while the partitions are still ours, then drop them."""
        self._commit(rewind=False)
        self._drop(revoked)

    def _on_lost(self, consumer: Consumer, lost: list[TopicPartition]) -> None:
        """The partitions are someone else's already: abort, drop them."""
        self._settle(rewind=False)  # the commit in flight, committed or aborted
        if self.batch is not None:
            batch, self.batch = self.batch, None
            if batch.begun:
                self._abort("the assignment was lost", rewind=False)
            else:  # nothing sent yet: its records and heads go
                self.table.take_pending()
        self._drop(lost)

    def _drop(self, partitions: Iterable[TopicPartition]) -> None:
        partitions = list(partitions)
        self.hooks.revoked([tp.partition for tp in partitions if tp.topic == self.events])
        for tp in partitions:
            if tp.topic == self.events:
                self.partitions.pop(tp.partition, None)
                self.table.drop(tp.partition)
            elif tp.topic == self.control:
                self.control_next.pop(tp.partition, None)

    def _take_over(self, partitions: list[TopicPartition], seek: bool) -> None:
        """Rebuild ``partitions`` at their committed offsets and consume from there (assign
        them, or seek when they are assigned already)."""
        if not partitions:
            return
        committed = self._query(lambda: self.consumer.committed(partitions,
                                                                timeout=_CLIENT_TIMEOUT_S))
        changelogs = reader.read_all(self.reader_settings, self.changelog,
                                     [tp.partition for tp in committed if tp.topic == self.events])
        positions = []
        for tp in committed:
            low, _ = self._query(functools.partial(self.consumer.get_watermark_offsets, tp,
                                                   timeout=_CLIENT_TIMEOUT_S))
            resume = max(tp.offset, low)
            if tp.topic == self.events:
                self.table.restore(tp.partition, changelogs[tp.partition])
                self.partitions[tp.partition] = self._rebuild(tp.partition, resume)
            elif tp.topic == self.control:
                self.control_next[tp.partition] = resume
            positions.append(TopicPartition(tp.topic, tp.partition, resume))
        if seek:
            for tp in positions:
                self.consumer.seek(tp)
        else:
            self.consumer.assign(positions)
        log.info("events partitions assigned: %s", sorted(self.partitions))

    def _query(self, call: Callable[[], _T]) -> _T:
        """A broker query of a takeover, again while it fails other than fatally (for up to
        twice the client time-out): a cluster node killed mid-query destroys its broker
        handle (``_DESTROY_BROKER``), and the takeover must outlast that."""
        deadline = time.monotonic() + 2 * _CLIENT_TIMEOUT_S
        while True:
            try:
                return call()
            except KafkaException as exc:
                error = exc.args[0]
                if error.fatal() or time.monotonic() > deadline:
                    raise
                log.warning("takeover: %s; retrying", error.str())
                time.sleep(0.5)

    def _rebuild(self, partition: int, resume: int) -> PartitionState:
        """A fresh assembler for ``partition`` in its state at offset ``resume`` (its heads
        restored already)."""
        with self.hooks.rebuilding(partition) as rebuild:
            state = PartitionState(Assembler(self.config.assemble), next_offset=resume)
            open_runs = self.heads.load(state, partition)
            starts = [start for start in open_runs.values() if start < resume]
            count, replayed = 0, list[Emit]()
            if starts:
                for msg in reader.read(self.reader_settings, self.events, partition,
                                       min(starts), resume):
                    count += 1
                    replayed += partition_module.replay(state, open_runs,
                                                        reader.record_of(msg))
            rebuild.state, rebuild.records = state, count
        log.info("partition %d: rebuilt before offset %d from %d records; %d runs open",
                 partition, resume, count, state.assembler.open_runs,
                 extra=logs.where(self.events, partition, resume))
        self._refinish(state, partition, replayed)
        return state

    def _refinish(self, state: PartitionState, partition: int, replayed: list[Emit]) -> None:
        """Runs that finished during a rebuild have no ``done`` head (never expected with
        transactions: a head commits with its outputs): publish them again and record them."""
        outputs = partition_module.refinished(partition, replayed)
        if outputs:
            self._begin()
            self._publish(None, [e for e in outputs if e.topic is not Topic.DLQ])
            self.heads.finished(state, partition, partition_module.finished_runs(outputs))
            self._write_heads()

    # -- operations: delivery, lag, liveness -------------------------------------------

    def _delivered(self, error: KafkaError | None, msg: Message) -> None:
        """The producer's delivery report of a failed record (served while the transaction
        commits, in the commit's thread): a failure of an output is counted (progress aside)
        and the transaction then aborts. A record refused for its own sake is noted
        (:attr:`refusal`; an invalid one in :attr:`invalid`) for :meth:`_refused_abort`."""
        if error is None:
            return
        name = str(msg.topic())
        topic = self.topic_of.get(name)
        if topic is not None and topic is not Topic.PROGRESS:
            self.hooks.delivered(topic, None, False)
        code = error.code()
        if code in _TOO_LARGE:
            self.refusal = "size"
        elif code in _INVALID:
            self.invalid[(name, msg.key(), len(msg.value() or b""))] = error.name()
            self.refusal = self.refusal or "invalid"

    def _read_lags(self) -> None:
        """Note each owned events partition's lag: its end offset in the consumer's cache (at
        ``read_committed``, the last stable offset; no request to the broker) less the
        consumer's position, which passes the transaction markers that no record follows."""
        lags = {}
        try:
            positions = self.consumer.position(
                [TopicPartition(self.events, p) for p in self.partitions])
            for tp in positions:
                _, high = self.consumer.get_watermark_offsets(tp, cached=True)
                if high >= 0 and tp.offset >= 0:
                    lags[tp.partition] = max(0, high - tp.offset)
        except KafkaException:  # unknown until the next turn
            pass
        self.lags = lags

    def _partition_views(self) -> list[PartitionView]:
        """The owned partitions for the metrics (called on the HTTP thread: reads only)."""
        lags = self.lags
        return self.hooks.views(self.partitions, lambda partition, _: lags.get(partition))

    def _alive(self) -> bool:
        """/healthz: the engine's thread runs and turns its loop (or is rebuilding)."""
        return self.thread.is_alive() and (
            self.hooks.health.rebuilds_running > 0 or time.monotonic() - self.beat < LIVE_S)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].str())
    return str(exc)

