"""The kafka engine's Kafka transaction, as an object of its own (decision 0011).

Quix Streams' ``Checkpoint`` is the model: one object owns the transactional producer and the
open batch (what it consumed, what it sent) and takes it from begin to commit or abort. The
engine (``engine.py``) applies records and puts their outputs, heads and forwarded records into
the transaction (:meth:`Transaction.produce`); it asks the transaction to commit and gets back
what happened, an :data:`Outcome`: :class:`Settled` (visible to ``read_committed`` readers)
or :class:`Aborted` (the engine then forgets the batch's heads and, where its partitions stay,
rewinds: rebuilds them from their committed offsets). The transaction never touches the
partitions, the heads or the assignment.

A batch's life, step by step:

1. **Begin** (:meth:`Transaction.begin`): the batch's first record, tick or cancel opens it;
   the producer's ``begin_transaction`` is called at once, unless the previous batch's commit
   is still in flight.
2. **Hold** (:meth:`Transaction.produce`): while that commit is in flight the producer still
   has the previous transaction open (it has one at a time): the batch's records are held, in
   order, until it settles (step 5). Otherwise each record is produced into the transaction.
3. **Send the offsets** (:meth:`Transaction.commit`, in a thread of its own,
   :class:`Commit`): ``send_offsets_to_transaction`` with the next offset of every partition
   the batch consumed and the consumer's group metadata (KIP-447: the coordinator refuses an
   old generation's). The engine applies the next batch meanwhile (steps 1 and 2), or waits.
4. **Commit**: ``commit_transaction``. Steps 3 and 4 are called again while they fail with a
   retriable error (librdkafka's advice, :func:`retrying`); a fatal error is :class:`Fatal`.
5. **Settle** (:meth:`Transaction.settle`): once the thread has returned (waited for, or
   looked at from the loop without waiting), a commit that succeeded is :class:`Settled`,
   with the record times of the committed calls it made visible; the held batch's
   transaction then begins and its records are sent, in order.
6. **Abort**: a commit that failed with an error that requires an abort is aborted
   (``abort_transaction``) and is :class:`Aborted`; the batch held behind it is dropped with
   it (its offsets are past the aborted ones: the engine consumes its records again). A
   failure that came with the delivery report of a record refused for its own sake
   (:attr:`Transaction.refusal`, set by the engine's delivery report) is aborted by
   replacing the producer (step 7: the refused batch's sequence numbers would fail the next
   transaction too), after :attr:`Transaction.learn` has read what the refusal teaches (the
   topics' limits); an abort that learned something does not count towards
   :data:`MAX_ABORTS`. More than :data:`MAX_ABORTS` aborts in a row: :class:`Fatal`.
   :meth:`Transaction.abandon` aborts the open batch when the partitions are lost.
7. **Replace a wedged producer** (:meth:`Transaction.replace_producer`): librdkafka's
   ``send_offsets_to_transaction`` can wait without bound (confluentinc/librdkafka#5456).
   One that has not returned within the transaction timeout (which caps the call's own) and
   :data:`_WEDGED_GRACE_S` is given up: a new producer with the same ``transactional.id``,
   whose ``init_transactions`` fences the wedged one and aborts its transaction; the outcome
   is :class:`Aborted`. More than :data:`MAX_WEDGED` calls wedged at once: :class:`Fatal`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

__all__ = ["Aborted", "Batch", "Commit", "Fatal", "Outcome", "Refused", "Settled", "Transaction",
           "describe", "refusal", "retrying"]

log = logging.getLogger("latch.worker")

#: The time-out of each transactional call and broker query.
CLIENT_TIMEOUT_S = 30.0
#: Transactions aborted in a row (no commit between them) before the worker gives up.
MAX_ABORTS = 10
#: Calls that may stay wedged at once (each holds a fenced producer) before the worker exits.
MAX_WEDGED = 3
#: How long past the transaction timeout a ``send_offsets_to_transaction`` may take before
#: its producer counts as wedged and is replaced.
_WEDGED_GRACE_S = 2.0
#: The longest wait before a rewind, after many aborts in a row (one second per abort).
_BACKOFF_MAX_S = 5.0
#: A retriable failure of a transactional call is tried again after this long.
_RETRY_S = 0.5


class Fatal(Exception):
    """The worker cannot go on (fenced, or transactions keep failing): exit 1."""


class Refused(Exception):
    """The cluster did not start this worker's transactions (``init_transactions`` failed):
    the message is the one line that says why (:func:`refusal`). Exit 1."""


#: What each error of ``init_transactions`` says about the cluster. A cluster that refuses
#: transactions fails there, before the worker consumed anything: librdkafka's fatal
#: TRANSACTIONAL_ID_AUTHORIZATION_FAILED (FindCoordinator or InitProducerId refused to the
#: principal), CLUSTER_AUTHORIZATION_FAILED (IdempotentWrite refused), an unsupported
#: request (an old or partial Kafka implementation), or no answer within the time-out (no
#: coordinator: the transaction state log cannot be created or has too few replicas in sync).
_CAUSES: dict[int, str] = {
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        "the cluster denies this worker's principal the transactional id {tid} (Kafka ACLs: "
        "the worker needs WRITE and DESCRIBE on the transactional ids prefixed by "
        "worker.app_id and '-', deploy/kafka/acls.sh)",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        "the cluster denies this worker's principal IdempotentWrite on the cluster (a Kafka "
        "ACL on the cluster resource)",
    KafkaError.UNSUPPORTED_VERSION:
        "the cluster does not support transactions (no InitProducerId for a transactional "
        "id: Kafka before 0.11, or a Kafka-compatible service without transactions)",
    KafkaError._UNSUPPORTED_FEATURE:
        "the cluster does not support transactions (no InitProducerId for a transactional "
        "id: Kafka before 0.11, or a Kafka-compatible service without transactions)",
    KafkaError._TIMED_OUT:
        "no transaction coordinator registered transactional id {tid} within {timeout:g}s "
        "(worker.init_timeout_s): the cluster's transaction state log (__transaction_state) "
        "cannot be created or has too few replicas in sync "
        "(transaction.state.log.replication.factor or min.isr above the brokers available), "
        "or the cluster does not implement transactions",
}
_CAUSES[KafkaError.COORDINATOR_NOT_AVAILABLE] = _CAUSES[KafkaError._TIMED_OUT]


def refusal(exc: BaseException, tid: str, timeout_s: float) -> str:
    """The one log line for a failed ``init_transactions`` of transactional id ``tid``: the
    cause (:data:`_CAUSES`, or the client's own words), the client's error, and that
    ``worker.engine: faust`` works without transactions."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    code, said = -1, str(exc)
    if isinstance(error, KafkaError):
        code, said = error.code(), f"{error.name()}: {error.str()}"
    cause = _CAUSES.get(code, "the cluster did not start this worker's transactions").format(
        tid=tid, timeout=timeout_s)
    return (f"the kafka engine needs Kafka transactions and {cause} [{said}]; grant them, or "
            f"run worker.engine: faust, which works without transactions (at least once: "
            f"runners deduplicate on idempotency_key)")


@dataclass(frozen=True, slots=True)
class Settled:
    """The transaction committed: its outputs, heads and offsets are visible to
    ``read_committed`` readers. ``committed``: the record time of the input of each
    committed call it carried (for the commit latency)."""

    committed: list[int | None]


@dataclass(frozen=True, slots=True)
class Aborted:
    """The transaction was aborted (and a batch held behind it dropped): nothing it carried
    becomes visible. The engine forgets its heads and, where its partitions stay, rebuilds
    them from their committed offsets after ``backoff_s``."""

    reason: str
    backoff_s: float


#: What a commit came to.
Outcome = Settled | Aborted


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


def retrying(call: Callable[[], None]) -> None:
    """``call``, again while it fails with a retriable error (librdkafka's advice for
    ``send_offsets_to_transaction`` and ``commit_transaction``); a fatal one is
    :class:`Fatal`, any other is raised."""
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
            time.sleep(_RETRY_S)


class Transaction:
    """The transactional producer and the open batch, from begin to settled or aborted (the
    module's steps 1 to 7). ``make_producer``: a new producer with this worker's
    ``transactional.id`` (``name``, for the logs); ``group_metadata``: the consumer's, for
    ``send_offsets_to_transaction``; ``timeout_s``: the transaction timeout;
    ``events_topic``: the topic whose partitions a batch records by number
    (:attr:`Batch.events`); ``learn``: called with :attr:`refusal` (``size`` or
    ``invalid``) before a refused transaction's producer is replaced, returns whether it
    learned something (e.g. a topic's lowered limit)."""

    def __init__(self, make_producer: Callable[[], Producer],
                 group_metadata: Callable[[], object], *, name: str, timeout_s: float,
                 events_topic: str, learn: Callable[[str], bool] = lambda kind: False,
                 init_timeout_s: float = CLIENT_TIMEOUT_S) -> None:
        self.make_producer = make_producer
        self.init_timeout_s = init_timeout_s
        self.producer = make_producer()
        self.group_metadata = group_metadata
        self.name, self.timeout_s, self.events_topic = name, timeout_s, events_topic
        self.learn = learn
        #: The open batch (None: no transaction open).
        self.batch: Batch | None = None
        #: The previous batch's commit, while it is in flight (at most one).
        self.committing: Commit | None = None
        #: Set by a delivery report (in the commit's thread) of a record refused for its own
        #: sake: ``size`` or ``invalid``; the transaction then fails (step 6).
        self.refusal: str | None = None
        #: Transactions aborted since the last commit.
        self.aborts = 0
        #: Threads still in a wedged call of a replaced (fenced) producer.
        self.wedged: list[threading.Thread] = []

    def start(self) -> None:
        """``init_transactions``: fences this ``transactional.id``'s previous producer and
        aborts its open transaction. Raises :class:`Refused` if the cluster does not start
        the transactions within ``init_timeout_s`` (:func:`refusal` says why)."""
        try:
            self.producer.init_transactions(self.init_timeout_s)
        except KafkaException as exc:
            raise Refused(refusal(exc, self.name, self.init_timeout_s)) from exc

    # -- steps 1 and 2: begin, hold or send ---------------------------------------------

    def begin(self) -> Batch:
        """The open batch, opened now if none is (step 1)."""
        if self.batch is None:
            begun = self.committing is None
            if begun:
                self.producer.begin_transaction()
            self.batch = Batch(time.monotonic(), events_topic=self.events_topic, begun=begun)
        return self.batch

    def produce(self, topic: str, key: bytes | None, value: bytes | None,
                partition: int | None = None, headers: list[tuple[str, bytes]] | None = None
                ) -> None:
        """Queue one record in the open transaction, or hold it until the transaction begins
        (step 2). A delivery failure surfaces when the transaction commits (it then aborts);
        a record refused by librdkafka at once raises its :class:`KafkaException`."""
        batch = self.batch
        if batch is not None and not batch.begun:
            batch.held.append((topic, key, value, partition, headers))
            return
        options: dict[str, Any] = {"headers": headers} if headers else {}
        while True:
            try:
                if partition is None:
                    self.producer.produce(topic, value, key, **options)
                else:
                    self.producer.produce(topic, value, key, partition, **options)
                return
            except BufferError:  # the local queue is full: let librdkafka send
                self.producer.poll(0.05)

    # -- steps 3 to 5: commit and settle ------------------------------------------------

    def commit(self, wait: bool = True) -> Outcome | None:
        """Commit the open batch with its consumed offsets in a thread of its own (steps 3
        and 4); ``wait``: until it has settled, and return its outcome (else None: the
        caller applies the next batch and calls :meth:`settle`). None if no batch is open.
        The commit in flight, if any, must have been settled first."""
        if self.committing is not None:
            raise RuntimeError("a commit is in flight: settle it first")
        batch, self.batch = self.batch, None
        if batch is None:
            return None
        commit = Commit(batch, time.monotonic())
        producer, positions = self.producer, batch.positions()
        metadata = self.group_metadata() if positions else None

        def run() -> None:
            try:
                if positions:
                    retrying(lambda: producer.send_offsets_to_transaction(
                        positions, metadata, CLIENT_TIMEOUT_S))
                commit.offsets_sent.set()
                retrying(lambda: producer.commit_transaction(CLIENT_TIMEOUT_S))
            except BaseException as exc:  # handed to the loop (settle)
                commit.failed.append(exc)
            finally:
                commit.offsets_sent.set()
                commit.done.set()

        commit.thread = threading.Thread(target=run, name="latch-txn-commit", daemon=True)
        self.committing = commit
        commit.thread.start()
        return self.settle() if wait else None

    def settle(self, wait: bool = True) -> Outcome | None:
        """The commit in flight once it has returned (``wait``: wait for it; else None while
        it runs): :class:`Settled`, and the held batch's transaction begun with its records
        (step 5); or :class:`Aborted` (steps 6 and 7: a failure that requires an abort, or a
        ``send_offsets_to_transaction`` not returned by the transaction timeout and a
        grace), the held batch dropped. None if no commit is in flight. Raises
        :class:`Fatal` for a failure that allows no abort, too many aborts or wedges."""
        commit = self.committing
        if commit is None:
            return None
        wait_s = self.timeout_s + _WEDGED_GRACE_S
        wedged = False
        if not commit.done.is_set():
            left = commit.began + wait_s - time.monotonic()
            if not wait:
                if commit.offsets_sent.is_set() or left > 0:
                    return None
                wedged = True
            elif not commit.offsets_sent.wait(max(0.0, left)):
                wedged = True
            else:
                commit.done.wait()
        self.committing = None
        if (wedged or commit.failed) and self.batch is not None and not self.batch.begun:
            self.batch = None  # the next batch builds on this one: it goes too
        if wedged:
            assert commit.thread is not None
            self.wedged = [t for t in self.wedged if t.is_alive()] + [commit.thread]
            if len(self.wedged) > MAX_WEDGED:
                raise Fatal(f"{len(self.wedged)} transactional calls wedged")
            return self._abort(f"send_offsets_to_transaction did not return in {wait_s:g}s",
                               replace="wedged")
        if commit.failed:
            failure = commit.failed[0]
            if not isinstance(failure, KafkaException):
                raise failure
            error = failure.args[0]
            if not error.txn_requires_abort():
                raise Fatal(f"transaction: {error.str()}") from failure
            if self.refusal is not None:
                kind, self.refusal = self.refusal, None
                if self.learn(kind):
                    self.aborts = 0
                return self._abort(f"{error.str()}; a record was refused for its own sake",
                                   replace="refusing")
            return self._abort(error.str())
        self.aborts = 0
        batch = self.batch
        if batch is not None and not batch.begun:
            self.producer.begin_transaction()
            batch.begun = True
            held, batch.held = batch.held, []
            for args in held:
                self.produce(*args)
        return Settled(commit.batch.committed)

    # -- steps 6 and 7: abort, replace the producer ---------------------------------------

    def abandon(self, reason: str) -> Aborted | None:
        """Drop the open batch (the partitions are someone else's already): abort its
        transaction if it has begun (None if it had not: nothing was sent)."""
        batch, self.batch = self.batch, None
        if batch is None or not batch.begun:
            return None
        return self._abort(reason)

    def _abort(self, reason: str, replace: str | None = None) -> Aborted:
        """Abort the transaction (``replace``: by replacing the producer, and why)."""
        self.aborts += 1
        if self.aborts > MAX_ABORTS:
            raise Fatal(f"{self.aborts} transactions aborted in a row (the last: {reason})")
        if replace is not None:
            self.replace_producer(replace)
        else:
            retrying(lambda: self.producer.abort_transaction(CLIENT_TIMEOUT_S))
        return Aborted(reason, min(float(self.aborts), _BACKOFF_MAX_S))

    def replace_producer(self, why: str = "wedged") -> None:
        """A new producer with the same ``transactional.id``: its ``init_transactions`` bumps
        the epoch, so the old producer is fenced and its open transaction aborted."""
        log.warning("replacing the %s transactional producer (transactional.id %s)", why,
                    self.name)
        self.producer = self.make_producer()
        retrying(lambda: self.producer.init_transactions(CLIENT_TIMEOUT_S))


def describe(exc: BaseException) -> str:
    """What a client error says (a :class:`KafkaException`'s error), for the logs."""
    if isinstance(exc, KafkaException) and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].str())
    return str(exc)
