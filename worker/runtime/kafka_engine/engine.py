"""The kafka engine (:class:`KafkaEngine`): consume, step, produce, one Kafka transaction per
batch.

The same rules as the faust engine (``worker/runtime/faust_engine/engine.py``; decision 0001), on
confluent-kafka, with exactly once to readers at ``read_committed`` (decision 0011):

* **One ordered history per run.** Cancels on the control topic are forwarded into the
  events topic (keyed by ``run_id``, murmur2 as the gateway partitions: forwarding.py) and
  ticks are written into each owned events partition every ``worker.tick_interval_s``: the
  tick timer is the only clock read. The core decides from the history and record times only.
* **One transaction per batch.** A transactional producer (``transactional.id``
  ``<app_id>-<instance>``) sends, between ``begin_transaction`` and ``commit_transaction``: the
  outputs of the batch's records, the heads changelog writes they made, the ticks and the
  forwarded cancels, and (``send_offsets_to_transaction`` with the consumer's group metadata,
  KIP-447) the next offsets of the events and control partitions the batch consumed.
* **A batch commits as soon as its input is drained** (decision 0011): with no transaction
  open the loop waits for one record; then it takes what the consumer has fetched already
  (at most ``_CONSUME_MAX`` a call) and commits once a call returns fewer records than
  asked. Under a paced load a transaction holds what arrived during the previous commit (an
  outcome waits for about one commit, not ``worker.batch_max_ms``); under a backlog the
  calls keep returning full and the batch ends at its bounds, ``worker.batch_max_records``
  records or ``worker.batch_max_ms`` after it began (upper bounds, but for a batch due
  while the previous commit is in flight: below). A batch opened by a tick or a cancel
  commits the same way: the worker never waits for its own uncommitted ticks or cancels.
* **Every commit is overlapped with the records that follow.** A batch commits in a thread
  of its own (``send_offsets_to_transaction`` and ``commit_transaction``,
  ``transaction.Commit``; one in flight at a time) while the loop goes on consuming and
  applying, holding the next records' outputs and heads (the producer has one transaction
  at a time) until the commit returns: then it begins their transaction and sends them, in
  order. While a commit is in flight the next batch is never cut: it commits at the first
  turn after that commit returns where it is drained or due, so under a paced load it
  holds everything that arrived meanwhile (cutting it at its first drained turn left the
  records behind its first for one commit more; waiting for the commit before consuming
  again stood the loop still under a backlog, each time ``consume`` found the fetched
  records used up). Under a backlog a batch due before the commit returns takes records
  until it does, at most ``_HELD_MAX_BATCHES`` batches' worth (the first commits of a
  fresh transactional id took 0.3 to 0.7 s on the local broker). If the commit fails, the
  held batch is dropped with it (its offsets are past the aborted ones) and the partitions
  rewind as below. The transaction, from begin to settled or aborted, is an object of its
  own (``transaction.py``): it returns what happened and the engine acts on it.
* **Rebuild on assignment** (rebalance.py). For each events partition it gets, the worker
  restores the partition's heads from the changelog (read to its end), then feeds the open
  runs' records from the earliest open ``start`` up to the committed offset to a fresh
  assembler (outputs discarded: they were committed with that offset), and starts consuming
  at that offset.
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
* **Ticks wait for the control backlog** (the driver's rule, worker/runtime/driver.py, the
  same for both engines): a tick is written only once every control record this worker has
  seen in the log is forwarded (at most ``driver.TICK_DEFER_MAX_S`` late): after a takeover
  the first tick would otherwise reach the events log before the cancels that arrived while
  the partition stood still, and expire the runs they stop.
* **A record refused for its own sake does not stop a partition** (worker/runtime/refusals.py;
  the sends and delivery reports: sends.py):
  each output is checked against its topic's ``max.message.bytes`` (read at start) before it
  is sent, and ``batch.size`` is kept below the smallest; a refusal in a delivery report
  fails the transaction, so the worker reads the limits again, replaces the producer (the
  refused batch's sequence numbers would fail the next transaction too) and applies the
  records again: the refused one goes to the DLQ as ``output_refused``.
* **One live worker per ``worker.instance_id``** (instance.py): checked before
  ``init_transactions``, through the group's members.
* **A cluster that refuses transactions stops it at start** (``init_transactions`` bounded by
  ``worker.init_timeout_s``): one line naming the cause and ``worker.engine: faust``, exit
  status 1 (``transaction.refusal``; decision 0021).
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, Producer

from worker.core import Topic
from worker.runtime import admin, memory
from worker.runtime.config import Config
from worker.runtime.driver import Driver
from worker.runtime.governance.registry_io import RegistryError, RegistryReader
from worker.runtime.hooks import EngineHooks
from worker.runtime.kafka_engine import instance, reader
from worker.runtime.kafka_engine.forwarding import Forwarding
from worker.runtime.kafka_engine.heads import KafkaHeadsTable
from worker.runtime.kafka_engine.rebalance import Rebalance
from worker.runtime.kafka_engine.sends import Sends
from worker.runtime.kafka_engine.settings import consumer_settings, producer_settings
from worker.runtime.kafka_engine.transaction import (
    CLIENT_TIMEOUT_S,
    Aborted,
    Fatal,
    Outcome,
    Refused,
    Settled,
    Transaction,
    describe,
)
from worker.runtime.observability import logs
from worker.runtime.observability.metrics import PartitionView
from worker.runtime.partition import Heads
from worker.runtime.step import Record

__all__ = ["KafkaEngine", "consumer_settings", "producer_settings"]

log = logging.getLogger("latch.worker")

_CLIENT_TIMEOUT_S = CLIENT_TIMEOUT_S
#: /healthz: the engine's thread turned its loop within this many seconds (a commit may retry
#: for a while; a rebuild holds the loop as long as it takes and counts as alive).
LIVE_S = 2 * _CLIENT_TIMEOUT_S
#: Records taken per ``consume`` call: the batch's age is checked between calls, so a call's
#: records (about 5 ms of work for 1,000) are how far a batch can overrun ``batch_max_ms``;
#: a call that returns fewer than asked has drained what was fetched: the batch commits.
_CONSUME_MAX = 1000
#: How often the loop reads the consumer's positions and cached end offsets (lag gauges).
_LAGS_EVERY_S = 1.0

#: Under a backlog, a batch due while the previous one's commit is in flight goes on taking
#: records until that commit returns, up to this many times ``worker.batch_max_records``
#: (then the loop waits for it): the loop never stands still for a commit it can overlap.
_HELD_MAX_BATCHES = 20
#: How long the loop waits for a first record while a commit is in flight.
_COMMIT_POLL_S = 0.005
#: How long a ``consume`` call waits for more records while a commit is in flight and the
#: next batch holds records: it commits once that commit returns, seen at the next turn.
_HELD_POLL_S = 0.001
#: librdkafka's default ``batch.size``.
_BATCH_SIZE = 1_000_000


class KafkaEngine(Rebalance, Forwarding):
    """The consumer, the transactional producer, and the partitions this worker owns (its
    rebalances: rebalance.py; its control forwarding: forwarding.py)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        topics, worker = config.topics, config.worker
        self.events, self.control = topics.events, topics.control
        #: The results topic, forwarded like the control topic (None: the result latch off).
        self.results = topics.results if config.results.enabled else None
        self.results_next: dict[int, int] = {}
        self.changelog = admin.heads_changelog(config)
        self.outputs = {t: str(getattr(topics, t.value)) for t in Topic}
        self.table = KafkaHeadsTable()
        self.heads = Heads(self.table, worker.finished_run_retention_s)
        self.hooks = EngineHooks(config)
        #: Everything around the core, engine-neutral (worker/runtime/driver.py).
        self.driver = Driver(config, self.hooks, self.heads)
        #: The registry, read whole before the consumer subscribes (registry_io.py).
        self.registry = self.driver.registry = RegistryReader(config)
        #: The owned events partitions' states and the next offset to forward of each owned
        #: control partition: the driver's (worker/runtime/assignment.py).
        self.owned = self.driver.owned
        self.partitions, self.control_next = self.owned.partitions, self.owned.control_next
        self.hooks.metrics.watch(self._partition_views)
        self.hooks.health.heartbeat = self._alive
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
        #: checked by the driver before each output is sent (worker/runtime/refusals.py).
        self.limits = self.driver.limits
        self.batch_bytes: int | None = None
        #: The outputs and heads sent into the transaction, the delivery reports (sends.py).
        self.sends = Sends(self.driver, self.hooks, self.outputs, self.changelog, self.table)
        #: The group consumer carries worker.instance_id in its client.id (instance.py).
        member = instance.client_id(config)
        self.consumer = Consumer(logs.kafka_config(
            consumer_settings(config) | ({} if member is None else {"client.id": member})))
        #: The transactional producer and the open batch (transaction.py). A refusal teaches
        #: the topics' limits (a size refusal: read again) before its producer is replaced.
        self.txn = Transaction(
            self._new_producer, lambda: self.consumer.consumer_group_metadata(),
            name=f"{worker.app_id}-{self.instance}", timeout_s=worker.transaction_timeout_s,
            events_topic=self.events, init_timeout_s=worker.init_timeout_s,
            learn=lambda kind: kind == "invalid" or self._read_limits(replace=False))
        self.sends.txn = self.txn
        self.server: Any = None
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
            self.registry.start()
            self.txn.start()
            read = [self.events, self.control, *([self.results] if self.results else [])]
            self.consumer.subscribe(read, on_assign=self._on_assign,
                                    on_revoke=self._on_revoke, on_lost=self._on_lost)
            # What start-up made (the modules, the configuration, the clients) never
            # becomes garbage: out of the cyclic GC's way, which otherwise walked it on each
            # full collection (docs/benchmarks.md: gc was about a tenth of the loop's CPU).
            gc.collect()
            gc.freeze()
            self._loop()
            self._commit()
            return 0
        except (instance.InstanceTaken, RegistryError) as exc:
            log.error("not starting: %s", exc)
            return 2
        except Refused as exc:  # the cluster refuses transactions: one line, why and what else
            log.error("not starting: %s", exc)
            return 1
        except (Fatal, KafkaException) as exc:
            log.error("stopping: %s%s", describe(exc), instance.fenced_hint(exc, self.config))
            return 1
        finally:
            self._close()

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _close(self) -> None:
        try:
            self.consumer.close()  # revokes: commits the open transaction, if any
        except (Fatal, KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer: %s", describe(exc))
        self.hooks.stop(self.server)
        self.registry.stop()

    def _loop(self) -> None:
        worker = self.config.worker
        max_s = worker.batch_max_ms / 1000
        held_max = _HELD_MAX_BATCHES * worker.batch_max_records
        next_tick = time.monotonic() + worker.tick_interval_s
        consume, apply_events = self.consumer.consume, self._apply_events
        idle_trim, txn, health = self.idle_trim, self.txn, self.hooks.health
        while not self.stopping:
            self.beat = now = time.monotonic()
            if now - self.lags_read >= _LAGS_EVERY_S:
                self._read_lags()
                self.lags_read = now
            if txn.committing is not None:
                self._after(txn.settle(wait=False), rewind=True)
            batch = txn.batch
            if batch is None and txn.committing is None and health.waiting_control():
                self._control_forwarding()  # every forward is committed (readiness)
            if batch is None:  # no transaction open: wait for a first record
                # (while a commit is in flight, briefly: its outcome is counted at the next
                # turn)
                want, wait = 1, _COMMIT_POLL_S if txn.committing else min(max_s, 0.5)
            else:  # take what is fetched already (while a commit is in flight, wait
                # briefly for more: this batch commits at the first turn after it returns)
                left = worker.batch_max_records - batch.records
                want = min(left, _CONSUME_MAX) if left > 0 else _CONSUME_MAX
                wait = 0.0 if txn.committing is None else _HELD_POLL_S
            msgs = consume(want, timeout=wait)
            if msgs:
                idle_trim.active = True  # (IdleTrim.busy, inline)
            elif batch is None:  # nothing came for ``wait``: perhaps give memory back
                idle_trim.idle()
            apply_events(msgs)
            now = time.monotonic()
            if now >= next_tick and self._tick(now):
                next_tick = now + worker.tick_interval_s
            batch = txn.batch
            if batch is None:
                continue
            if len(msgs) < want:  # drained: commit, overlapped (module doc)
                if txn.committing is None:
                    self._commit(wait=False)
            elif batch.due(now, worker.batch_max_records, max_s) and (
                    txn.committing is None or batch.records >= held_max):
                self._commit(wait=False)  # a backlog: overlap it (module doc)

    # -- records ----------------------------------------------------------------------

    def _apply_events(self, msgs: Sequence[Message]) -> None:
        """Apply one ``consume`` call's records, in order: the events records through the
        driver (:meth:`Driver.apply_all`, the hot path), the others (errors, control
        records) through :meth:`_handle`."""
        events, partitions, txn = self.events, self.partitions, self.txn
        record_at = reader.record_at
        # 1. The events records of owned partitions, not read before (a repeat after a
        # rewind), as the core takes them
        records: list[Record] = []
        headers: list[Callable[[], Any]] = []
        for msg in msgs:
            if msg.error() is not None or msg.topic() != events:
                self._handle(msg)
                continue
            # (reader.where's assertion, without its cost: both are set on a consumed record)
            partition: int = msg.partition()  # type: ignore[assignment]
            offset: int = msg.offset()  # type: ignore[assignment]
            state = partitions.get(partition)
            if state is None or offset < state.next_offset:  # not ours (any more), a repeat
                continue
            records.append(record_at(msg, events, partition, offset))
            headers.append(msg.headers)
        if not records:
            return
        # 2. A policy marker naming a version not read yet waits for it (the registry's
        # bounded hold) with no transaction open: committed first
        if not self._settle_markers(records):
            return
        # 3. Applied by the driver, whole; then sent: the outputs, in order, and the heads
        # into the transaction, the partitions' next offsets noted for its commit (a run
        # held for its toolset: parked by the driver, applied when its answer is final)
        work = self.driver.apply_all(partitions, records, headers)
        batch = txn.begin()
        if work.out:
            self.sends.publish(work.out)
        if work.heads:
            self.sends.write_heads(work.heads)
        batch.records += len(records)
        if work.offsets:
            batch.events.update(work.offsets)

    def _settle_markers(self, records: Sequence[Record]) -> bool:
        """Before a ``consume`` call's records are applied: what the driver says they need
        settled (:meth:`Driver.unsettled`: a policy marker naming a version the registry
        reader cannot answer for yet) is waited for with no transaction open: the open one
        (its records are all applied: their offsets are noted) is committed first, then the
        reader's bounded hold (decision 0014). False if that commit aborted: the
        partitions are rebuilt and the records read again."""
        for version, at_ms in self.driver.unsettled(records):
            for commit in (self.txn.settle, self.txn.commit):  # (the one in flight first)
                outcome = commit()
                self._after(outcome, rewind=True)
                if isinstance(outcome, Aborted):
                    return False
            self.registry.policy_registered(version, at_ms)
        return True

    def _handle(self, msg: Message) -> None:
        """A consumer error (a fatal one stops the worker), or a control record: forwarded
        (:meth:`.forwarding.Forwarding._forward`)."""
        error = msg.error()
        if error is not None:
            if error.fatal():
                raise Fatal(f"consumer: {error.str()}")
            log.warning("consumer: %s", error.str())
            return
        self._forward(msg)

    def _tick(self, now: float) -> bool:
        """Write a tick into each events partition this worker owns (the only clock read)
        when the driver says it is due (not while the control backlog is unread: then try
        again at the next turn; driver.TickRule); return whether it is done."""
        if not self.partitions:
            return True
        if not self.driver.tick_due(now, self._control_behind()):
            return False
        self.txn.begin()
        events, produce = self.events, self.txn.produce
        for partition, key, value in self.driver.ticks(self.partitions,
                                                       int(time.time() * 1000)):
            produce(events, key, value, partition)
        return True

    # -- the transaction's outcomes -----------------------------------------------------

    def _commit(self, rewind: bool = True, wait: bool = True) -> None:
        """Commit the open transaction (transaction.py), after the one in flight; ``wait``:
        until it has settled (the loop does not wait under a backlog: it applies the next
        batch's records meanwhile, held until the producer begins their transaction). If it
        must be aborted, act as :meth:`_after` says."""
        self._after(self.txn.settle(), rewind)  # one transaction commits at a time, in order
        self._after(self.txn.commit(wait=wait), rewind)

    def _after(self, outcome: Outcome | None, rewind: bool) -> None:
        """Act on what the transaction did: a :class:`Settled` one's committed calls are
        visible to read_committed readers now (counted); after an :class:`Aborted` one its
        changelog writes are forgotten and (``rewind``) every owned partition is rebuilt
        from its committed offset (the in-memory state had moved past it)."""
        if isinstance(outcome, Settled):
            for record_ms in outcome.committed:
                self.hooks.delivered(Topic.COMMITTED, record_ms, True)
        elif isinstance(outcome, Aborted):
            log.warning("transaction aborted (%s); %s", outcome.reason,
                        "rebuilding from the committed offsets" if rewind else "partitions go")
            self.table.take_pending()
            if rewind:
                time.sleep(outcome.backoff_s)
                self._take_over(self.consumer.assignment(), seek=True)

    def _read_limits(self, replace: bool = True) -> bool:
        """Read the written topics' ``max.message.bytes`` (:class:`refusals.Limits`) and the
        batch size they allow; ``replace``: make the producer again if that changed (none has
        begun a transaction yet); return whether a limit changed."""
        changed, wanted = admin.read_limits(
            self.limits, self.reader_settings,
            [*self.outputs.values(), self.events, self.changelog],
            int(self.reader_settings.get("batch.size", _BATCH_SIZE)))
        if wanted != self.batch_bytes:
            log.info("producer batch.size %s: below the smallest max.message.bytes",
                     wanted if wanted is not None else "default")
            self.batch_bytes = wanted
            if replace:
                self.txn.producer = self._new_producer()
            changed = True
        return changed

    def _new_producer(self) -> Producer:
        return Producer(logs.kafka_config({
            **producer_settings(self.config, self.instance, self.batch_bytes),
            "on_delivery": self.sends.delivered}))

    # -- operations: lag, liveness -----------------------------------------------------

    def _read_lags(self) -> None:
        """Note each owned events partition's lag (:func:`.reader.lags`)."""
        self.lags = reader.lags(self.consumer, self.events, self.partitions)

    def _partition_views(self) -> list[PartitionView]:
        """The owned partitions for the metrics (called on the HTTP thread: reads only)."""
        lags = self.lags
        return self.owned.views(lambda partition, _: lags.get(partition))

    def _alive(self) -> bool:
        """/healthz: the engine's thread runs and turns its loop (or is rebuilding)."""
        return self.thread.is_alive() and (
            self.hooks.health.rebuilds_running > 0 or time.monotonic() - self.beat < LIVE_S)
