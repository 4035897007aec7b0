"""The transactional runner without a broker (issue 26, item 2): one transaction holds the
result, the journal record and the consumed offset; a transaction that fails never leaves
the call recorded, and stops the runner with an error naming the call (never a silent
second execution)."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException

from worker.client import runner as runner_module
from worker.client.runner import JournalError, MemoryStore, Runner
from worker.runtime.config import Config
from worker.runtime.schemas import validator

CALL = orjson.dumps({"v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat",
                     "call_id": "call_1", "name": "add", "index": 0,
                     "arguments": {"a": 1, "b": 2}, "idempotency_key": "r1:call_1"})


class _Message:
    def value(self) -> bytes:
        return CALL

    def topic(self) -> str:
        return "tool.calls.committed"

    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return 41

    def headers(self) -> None:
        return None


class _Consumer:
    def consumer_group_metadata(self) -> str:
        return "group-metadata"


class _TxnProducer:
    """Records each transactional call; ``commit_errors``: what each commit raises (None:
    it commits), ``delivery_errors``: each produced record's delivery report."""

    def __init__(self, commit_errors: list[KafkaError | None] | None = None,
                 delivery_errors: list[KafkaError | None] | None = None,
                 block: threading.Event | None = None) -> None:
        self.commit_errors, self.delivery_errors = commit_errors or [], delivery_errors or []
        self.block = block
        self.calls: list[str] = []
        self.sent: list[tuple[str, bytes, dict[str, Any]]] = []
        self.offsets: list[Any] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, key: bytes, value: bytes, headers: Any = None,
                on_delivery: Any = None) -> None:
        self.sent.append((topic, key, orjson.loads(value)))
        error = self.delivery_errors.pop(0) if self.delivery_errors else None
        on_delivery(error, None)

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.calls.append("send_offsets")
        self.offsets.append((offsets, metadata))
        if self.block is not None:
            self.block.wait()

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        error = self.commit_errors.pop(0) if self.commit_errors else None
        if error is not None:
            raise KafkaException(error)

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


def _runner(producer: _TxnProducer) -> tuple[Runner, list[Any]]:
    ran: list[Any] = []

    def add(args: dict[str, int]) -> int:
        ran.append(args)
        return args["a"] + args["b"]

    made = Runner(Config(), {"add": add}, consumer=_Consumer(), producer=producer,
                  store=MemoryStore(), transactional_id="latch-runner-0")
    return made, ran


def test_one_transaction_holds_the_result_the_journal_record_and_the_offset() -> None:
    """An executed call: begin, the result (results topic, keyed by run_id), the journal
    record (journal topic, keyed by idempotency_key, valid against journal-entry, without
    arguments or content), the next offset with the consumer's group metadata, commit; the
    key is remembered after the commit, and a copy of the call then commits its offset only."""
    producer = _TxnProducer()
    runner, ran = _runner(producer)
    runner._process(_Message())
    assert producer.calls == ["begin", "send_offsets", "commit"]
    (results, key, result), (journal, jkey, entry) = producer.sent
    assert (results, key, result["tool_call_id"]) == ("tool.calls.results", b"r1", "call_1")
    assert (journal, jkey) == ("tool.calls.journal", b"r1:call_1")
    assert validator("journal-entry").is_valid(entry) and "content" not in entry
    (offsets, metadata), = producer.offsets
    assert [(o.topic, o.partition, o.offset) for o in offsets] == [
        ("tool.calls.committed", 3, 42)] and metadata == "group-metadata"
    assert runner.store.seen("r1:call_1")
    runner._process(_Message())
    assert len(ran) == 1 and len(producer.sent) == 2 and len(producer.offsets) == 2


def test_a_fenced_producer_stops_the_runner_with_the_call_unrecorded() -> None:
    """A fatal error on commit (another instance took the transactional id: fenced) raises
    JournalError naming the call; the key is not remembered and the tool ran once."""
    fenced = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    runner, ran = _runner(_TxnProducer(commit_errors=[fenced]))
    with pytest.raises(JournalError, match="r1:call_1"):
        runner._process(_Message())
    assert len(ran) == 1 and not runner.store.seen("r1:call_1")


def test_an_abortable_failure_is_aborted_and_stops_the_runner() -> None:
    """An error that requires an abort: abort_transaction, then JournalError (the runner does
    not run the call again by itself); the key is not remembered."""
    abortable = KafkaError(KafkaError.INVALID_TXN_STATE, "x", txn_requires_abort=True)
    producer = _TxnProducer(commit_errors=[abortable])
    runner, ran = _runner(producer)
    with pytest.raises(JournalError, match="runs again after a restart"):
        runner._process(_Message())
    assert producer.calls == ["begin", "send_offsets", "commit", "abort"]
    assert len(ran) == 1 and not runner.store.seen("r1:call_1")


def test_a_result_too_large_for_the_topic_is_answered_by_an_error_in_a_new_transaction() -> None:
    """The results topic refuses the result (MSG_SIZE_TOO_LARGE): the transaction is aborted
    and a second one carries an error result, its journal record and the offset; the tool ran
    once and the key is remembered."""
    abortable = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large", txn_requires_abort=True)
    producer = _TxnProducer(commit_errors=[abortable],
                            delivery_errors=[KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)])
    runner, ran = _runner(producer)
    runner._process(_Message())
    assert producer.calls == ["begin", "send_offsets", "commit", "abort",
                              "begin", "send_offsets", "commit"]
    assert [v["is_error"] for t, _, v in producer.sent if t == "tool.calls.results"] == [
        False, True]
    assert len(ran) == 1 and runner.store.seen("r1:call_1")


def test_a_wedged_commit_stops_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A send_offsets_to_transaction that never returns (confluentinc/librdkafka#5456) is
    given up after the time-outs: JournalError saying the producer is wedged; the key is not
    remembered."""
    monkeypatch.setattr(runner_module, "CLIENT_TIMEOUT_S", 0.05)
    monkeypatch.setattr(runner_module, "WEDGED_GRACE_S", 0.05)
    block = threading.Event()
    runner, _ = _runner(_TxnProducer(block=block))
    try:
        with pytest.raises(JournalError, match="wedged"):
            runner._process(_Message())
    finally:
        block.set()
    assert not runner.store.seen("r1:call_1")
