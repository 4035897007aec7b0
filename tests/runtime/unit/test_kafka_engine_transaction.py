"""The kafka engine's transaction (``worker/runtime/kafka_engine/transaction.py``, issue 24
item 2) without a broker: begin, hold while the previous commit is in flight, send the
offsets, commit, settle, abort, replace a wedged or refusing producer, each step's outcome
returned to the caller. The fake producer records every transactional call in order."""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.runtime.kafka_engine import transaction
from worker.runtime.kafka_engine.transaction import Aborted, Fatal, Settled, Transaction

ABORTABLE = KafkaError(KafkaError._FENCED, "aborted by the test", txn_requires_abort=True)


class _Producer:
    """A transactional producer that records its calls in ``calls`` (shared by the producers
    of one test); ``release`` gates ``commit_transaction``; ``failures`` maps a call's name
    to the errors it raises, one per call, before it succeeds; ``wedge`` makes
    ``send_offsets_to_transaction`` wait until ``release``."""

    def __init__(self, calls: list[str], name: str = "p1") -> None:
        self.calls, self.name = calls, name
        self.release = threading.Event()
        self.release.set()
        self.failures: dict[str, list[KafkaError]] = {}
        self.wedge = False
        self.full = 0  # ``produce`` calls that find the local queue full

    def _call(self, what: str) -> None:
        failures = self.failures.get(what.split()[0])
        if failures:
            raise KafkaException(failures.pop(0))
        self.calls.append(f"{self.name} {what}")

    def init_transactions(self, timeout: float) -> None:
        self._call("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def produce(self, topic: str, value: bytes | None, key: bytes | None, *args: Any,
                **options: Any) -> None:
        if self.full:
            self.full -= 1
            raise BufferError("queue full")
        self.calls.append(f"{self.name} produce {key!r}")

    def poll(self, timeout: float) -> int:
        self.calls.append(f"{self.name} poll")
        return 0

    def send_offsets_to_transaction(self, positions: list[Any], metadata: object,
                                    timeout: float) -> None:
        if self.wedge:
            self.release.wait()
        self._call(f"offsets {[(tp.topic, tp.partition, tp.offset) for tp in positions]}")

    def commit_transaction(self, timeout: float) -> None:
        self.release.wait()
        self._call("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort")


class _Harness:
    """A :class:`Transaction` over fake producers (``made``, in order), with what its
    ``learn`` callback was asked."""

    def __init__(self, learned: bool = False) -> None:
        self.calls: list[str] = []
        self.made: list[_Producer] = []
        self.learn_calls: list[str] = []
        self.learned = learned
        self.metadata_asked = 0

        def metadata() -> object:
            self.metadata_asked += 1
            return object()

        def learn(kind: str) -> bool:
            self.learn_calls.append(kind)
            return self.learned

        self.txn = Transaction(self._make, metadata, name="app-slot-0", timeout_s=1.0,
                               events_topic="events", learn=learn)

    def _make(self) -> Any:
        self.made.append(_Producer(self.calls, f"p{len(self.made) + 1}"))
        return self.made[-1]

    @property
    def producer(self) -> _Producer:
        return self.made[-1]

    def batch_of(self, *keys: bytes, offset: int = 1) -> None:
        """Open a batch, send a record per key, consume events partition 0 to ``offset``."""
        batch = self.txn.begin()
        for key in keys:
            self.txn.produce("out", key, b"v")
        batch.events[0] = offset
        batch.records += len(keys)


@pytest.fixture
def harness() -> Iterator[_Harness]:
    made = _Harness()
    yield made
    for producer in made.made:  # no commit thread left waiting
        producer.release.set()


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transaction, "_RETRY_S", 0.0)


def test_a_batch_begins_sends_its_offsets_commits_and_settles(harness: _Harness) -> None:
    """Steps 1, 3, 4, 5: the first record opens the transaction (``begin_transaction`` at
    once when nothing is in flight), records go straight to the producer, and a waited-for
    commit sends the batch's next offsets (events partitions by number and the others) and
    commits, returning :class:`Settled` with the committed calls' record times."""
    batch = harness.txn.begin()
    assert harness.txn.begin() is batch and batch.begun
    harness.txn.produce("out", b"r1", b"v", headers=[("traceparent", b"00")])
    harness.txn.produce("heads", b"r1", b"h", 3)
    batch.events[2] = 8
    batch.offsets[("control", 0)] = 4
    batch.committed.append(1_700_000_000_000)
    outcome = harness.txn.commit()
    assert outcome == Settled([1_700_000_000_000])
    assert harness.calls == ["p1 begin", "p1 produce b'r1'", "p1 produce b'r1'",
                             "p1 offsets [('control', 0, 4), ('events', 2, 8)]", "p1 commit"]
    assert harness.txn.batch is None and harness.txn.committing is None
    assert harness.metadata_asked == 1


def test_nothing_open_commits_nothing_and_no_offsets_ask_for_no_group_metadata(
        harness: _Harness) -> None:
    """A commit with no batch open is None and calls nothing; a batch that consumed nothing
    (only ticks, say) commits without ``send_offsets_to_transaction`` or the consumer's
    group metadata; settling with nothing in flight is None."""
    assert harness.txn.commit() is None and harness.txn.settle() is None
    harness.txn.begin()
    harness.txn.produce("events", b"__tick__", b"t", 0)
    assert harness.txn.commit() == Settled([])
    assert harness.calls == ["p1 begin", "p1 produce b'__tick__'", "p1 commit"]
    assert harness.metadata_asked == 0


def test_records_wait_while_the_previous_commit_is_in_flight_then_go_in_order(
        harness: _Harness) -> None:
    """Step 2: a batch opened while a commit runs in its thread does not begin (the producer
    has one transaction at a time); its records are held, in order. Settling without waiting
    is None while the commit runs; once it has returned, the held batch's transaction begins
    and its records are sent before anything produced after."""
    harness.batch_of(b"a1", offset=1)
    harness.producer.release.clear()
    assert harness.txn.commit(wait=False) is None and harness.txn.committing is not None
    harness.batch_of(b"b1", b"b2", offset=3)
    assert harness.txn.batch is not None and not harness.txn.batch.begun
    assert harness.txn.settle(wait=False) is None  # still committing
    with pytest.raises(RuntimeError):
        harness.txn.commit()  # one commit at a time: settle first
    assert harness.calls == ["p1 begin", "p1 produce b'a1'", "p1 offsets [('events', 0, 1)]"]
    harness.producer.release.set()
    assert harness.txn.settle() == Settled([])
    harness.txn.produce("out", b"b3", b"v")
    assert harness.calls[3:] == ["p1 commit", "p1 begin", "p1 produce b'b1'",
                                 "p1 produce b'b2'", "p1 produce b'b3'"]
    assert harness.txn.commit() == Settled([])
    assert harness.calls[-2:] == ["p1 offsets [('events', 0, 3)]", "p1 commit"]


def test_a_failed_commit_aborts_and_takes_the_held_batch_with_it(harness: _Harness) -> None:
    """Step 6: a commit that fails with an error that requires an abort is aborted
    (``abort_transaction``) and returns :class:`Aborted` with its reason and a backoff; the
    batch held behind it is dropped, its records never sent (its offsets are past the
    aborted ones: the engine consumes them again)."""
    harness.batch_of(b"a1")
    harness.producer.failures["commit"] = [ABORTABLE]
    harness.txn.commit(wait=False)
    harness.batch_of(b"b1", offset=2)
    outcome = harness.txn.settle()
    assert outcome == Aborted("aborted by the test", 1.0)
    assert harness.txn.batch is None and harness.txn.committing is None
    assert harness.calls == ["p1 begin", "p1 produce b'a1'", "p1 offsets [('events', 0, 1)]",
                             "p1 abort"]


def test_a_failure_that_allows_no_abort_is_fatal(harness: _Harness) -> None:
    """A commit failure that does not ask for an abort (nor is retriable) cannot be
    recovered from here: :class:`Fatal`, which stops the worker with status 1."""
    harness.batch_of(b"a1")
    harness.producer.failures["commit"] = [KafkaError(KafkaError._STATE, "bad state")]
    with pytest.raises(Fatal):
        harness.txn.commit()


def test_retriable_failures_are_called_again_and_fatal_ones_stop(harness: _Harness) -> None:
    """Step 4's retry policy: ``send_offsets_to_transaction`` and ``commit_transaction`` are
    called again while they fail with a retriable error; a fatal error (this producer
    fenced) is :class:`Fatal`."""
    harness.batch_of(b"a1")
    harness.producer.failures["offsets"] = [KafkaError(KafkaError._TIMED_OUT, retriable=True)]
    harness.producer.failures["commit"] = [KafkaError(KafkaError._TIMED_OUT, retriable=True)] * 2
    assert harness.txn.commit() == Settled([])
    assert harness.calls[-2:] == ["p1 offsets [('events', 0, 1)]", "p1 commit"]
    harness.batch_of(b"a2", offset=2)
    harness.producer.failures["commit"] = [KafkaError(KafkaError._FENCED, fatal=True)]
    with pytest.raises(Fatal, match="transaction"):
        harness.txn.commit()


def test_aborts_in_a_row_back_off_longer_until_too_many_stop_the_worker(
        harness: _Harness) -> None:
    """The abort policy: each abort in a row waits a second longer before the rewind (at
    most five); a commit resets the count; more than ``MAX_ABORTS`` in a row is
    :class:`Fatal`, naming the last reason."""
    backoffs = []
    for n in range(3):
        harness.batch_of(b"a", offset=n + 1)
        harness.producer.failures["commit"] = [ABORTABLE]
        outcome = harness.txn.commit()
        assert isinstance(outcome, Aborted)
        backoffs.append(outcome.backoff_s)
    assert backoffs == [1.0, 2.0, 3.0]
    harness.batch_of(b"a", offset=4)
    assert harness.txn.commit() == Settled([]) and harness.txn.aborts == 0
    for n in range(transaction.MAX_ABORTS):
        harness.batch_of(b"a", offset=n + 5)
        harness.producer.failures["commit"] = [ABORTABLE]
        outcome = harness.txn.commit()
        assert isinstance(outcome, Aborted) and outcome.backoff_s == min(n + 1, 5)
    harness.batch_of(b"a", offset=99)
    harness.producer.failures["commit"] = [ABORTABLE]
    with pytest.raises(Fatal, match=r"in a row.*aborted by the test"):
        harness.txn.commit()


def test_a_refused_record_replaces_the_producer_after_learning_why(harness: _Harness) -> None:
    """Step 6 for a record refused for its own sake (the delivery report set ``refusal``):
    ``learn`` is asked first (e.g. the topics' limits read again), then the producer is
    replaced (its sequence numbers would fail the next transaction) and initialised; the
    outcome is :class:`Aborted`. An abort that learned nothing counts in the row; one that
    learned something starts the count again."""
    for n in range(2):  # learned nothing: the aborts add up
        harness.batch_of(b"big", offset=n + 1)
        harness.txn.refusal = "size"
        harness.producer.failures["commit"] = [ABORTABLE]
        outcome = harness.txn.commit()
        assert isinstance(outcome, Aborted) and "refused for its own sake" in outcome.reason
        assert harness.txn.refusal is None
    assert harness.txn.aborts == 2 and harness.learn_calls == ["size", "size"]
    assert len(harness.made) == 3 and "p2 init" in harness.calls
    assert harness.calls[-1] == "p3 init"
    assert "p1 abort" not in harness.calls  # replaced, never aborted by hand
    harness.learned = True
    harness.batch_of(b"bad", offset=3)
    harness.txn.refusal = "invalid"
    harness.producer.failures["commit"] = [ABORTABLE]
    assert harness.txn.commit() == Aborted(
        "aborted by the test; a record was refused for its own sake", 1.0)
    assert harness.learn_calls[-1] == "invalid" and harness.txn.aborts == 1
    assert harness.calls[-1] == "p4 init" and cast(object, harness.txn.producer) is harness.made[-1]


def test_a_wedged_offsets_call_replaces_the_producer_and_too_many_are_fatal(
        harness: _Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 7: a ``send_offsets_to_transaction`` that has not returned within the
    transaction timeout and the grace is given up: a new producer with the same
    ``transactional.id`` is made and initialised (fencing the wedged one) and the outcome
    is :class:`Aborted`, the held batch dropped. Looked at from the loop (no wait) it is
    None until then. More than ``MAX_WEDGED`` calls wedged at once is :class:`Fatal`."""
    monkeypatch.setattr(transaction, "_WEDGED_GRACE_S", -0.9)  # 0.1 s in all
    harness.batch_of(b"a1")
    harness.producer.wedge = True
    harness.producer.release.clear()
    harness.txn.commit(wait=False)
    harness.batch_of(b"b1", offset=2)
    assert harness.txn.settle(wait=False) is None  # not yet past the deadline
    threading.Event().wait(0.15)
    outcome = harness.txn.settle(wait=False)
    assert isinstance(outcome, Aborted) and "did not return" in outcome.reason
    assert harness.txn.batch is None and harness.calls[-1] == "p2 init"
    assert cast(object, harness.txn.producer) is harness.made[1] and len(harness.txn.wedged) == 1
    for n in range(transaction.MAX_WEDGED - 1):
        harness.batch_of(b"a", offset=n + 3)
        harness.producer.wedge = True
        harness.producer.release.clear()
        assert isinstance(harness.txn.commit(), Aborted)
    harness.batch_of(b"a", offset=9)
    harness.producer.wedge = True
    harness.producer.release.clear()
    with pytest.raises(Fatal, match="wedged"):
        harness.txn.commit()


def test_abandoning_aborts_a_begun_batch_and_drops_a_held_one(harness: _Harness) -> None:
    """When the partitions are lost: a begun batch's transaction is aborted
    (:class:`Aborted`); a batch held behind a commit in flight had sent nothing and just
    goes (None); with no batch open nothing happens."""
    assert harness.txn.abandon("lost") is None
    harness.batch_of(b"a1")
    assert harness.txn.abandon("lost") == Aborted("lost", 1.0)
    assert harness.calls[-1] == "p1 abort" and harness.txn.batch is None
    harness.batch_of(b"a2")
    harness.producer.release.clear()
    harness.txn.commit(wait=False)
    harness.batch_of(b"b1", offset=2)
    assert harness.txn.abandon("lost") is None and harness.txn.batch is None
    harness.producer.release.set()
    assert harness.txn.settle() == Settled([])
    assert "p1 produce b'b1'" not in harness.calls


def test_a_full_local_queue_is_waited_out(harness: _Harness) -> None:
    """A ``produce`` that finds librdkafka's local queue full polls (letting it send) and
    produces the record again: no record is lost to back-pressure."""
    harness.txn.begin()
    harness.producer.full = 2
    harness.txn.produce("out", b"r1", b"v")
    assert harness.calls == ["p1 begin", "p1 poll", "p1 poll", "p1 produce b'r1'"]


def test_the_transaction_knows_nothing_of_the_engine() -> None:
    """The transaction returns what happened and never calls back into assignment, the
    partitions or the heads: its module imports only the standard library and
    confluent-kafka (no other module of the worker)."""
    source = Path(transaction.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "logging", "threading", "time", "collections",
                        "dataclasses", "typing", "confluent_kafka"}
