"""The faust engine's sends of one record's outputs (``faust_engine/sends.py``): audit records
go after the record's other outputs are confirmed, so a broker refusal of an outcome (known
only at its send's future) turns its audit record into ``refused`` (issue 32, item 10); each
output but progress is left to the partition to confirm; a record aiokafka or the broker
refuses for its own sake is replaced by its ``output_refused`` DLQ record, any other failure
stands; deliveries are counted; the producer's batches are kept below the smallest limit.

Driven with fake faust topics whose sends the test settles: the broker's answer is the
test's (a success, or aiokafka's ``MessageSizeTooLargeError`` with the topic's limit read
again below the record's size).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import driving
import orjson
import pytest
from aiokafka.errors import (  # type: ignore[import-untyped]
    CorruptRecordException,
    KafkaConnectionError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    RecordListTooLargeError,
)
from builders import chat_calls, chat_run, chat_tool

from worker.core import Emit, Topic
from worker.runtime import admin, step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver, Outgoing
from worker.runtime.faust_engine.sends import Sends, refusal
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads
from worker.runtime.step import Source

_NAMES = {topic: f"t.{topic.value}" for topic in Topic}


class Message:
    """A send's message as faust's ``as_future_message`` makes it: awaitable, its future
    settled by the fake broker."""

    def __init__(self, value: bytes) -> None:
        self.value = value
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_done_callback = self.future.add_done_callback

    def __await__(self) -> Any:
        return self.future.__await__()


class FakeTopic:
    """A faust topic on a fake broker that answers each send at once (``refuse``: it refuses
    this topic's records as too large, at the send's future)."""

    def __init__(self, name: str, log: list[tuple[str, bytes]], refuse: bool = False) -> None:
        self.name, self.log, self.refuse = name, log, refuse

    def get_topic_name(self) -> str:
        return self.name

    def as_future_message(self, key: bytes | None, value: bytes, headers: Any) -> Message:
        return Message(value)

    async def publish_message(self, message: Message) -> None:
        self.log.append((self.name, message.value))
        if self.refuse:
            message.future.set_exception(MessageSizeTooLargeError())
        else:
            message.future.set_result(None)

    async def send(self, key: bytes | None, value: bytes) -> Any:
        self.log.append((self.name, value))
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


def emits_of_one_run() -> list[Emit]:
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0"})
    driver = Driver(config, EngineHooks(config), Heads({}, 3600))
    state = driver.takeover(0, 0).state
    envelopes = chat_run("r1", [chat_tool("get_weather", {"type": "object"})],
                         chat_calls([("c1", "get_weather", '{"city": "Oslo"}')]))
    records = [step.record(b"r1", orjson.dumps(e), 1_000 + n, "ev", 0, n)
               for n, e in enumerate(envelopes)]
    return [e for r in records if (a := driving.apply(driver, state, r)) for e in a.emits]


def sends(refuse: bool, monkeypatch: pytest.MonkeyPatch
          ) -> tuple[Sends, list[tuple[str, bytes]], Any]:
    config = load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0"})
    driver = Driver(config, EngineHooks(config), Heads({}, 3600))
    log: list[tuple[str, bytes]] = []
    outputs = {t: FakeTopic(_NAMES[t], log, refuse and t is Topic.COMMITTED) for t in Topic}
    monkeypatch.setattr(admin, "max_message_bytes",
                        lambda settings, names: {name: 100 for name in names})
    state = SimpleNamespace(unconfirmed=[])

    async def confirm() -> None:  # PartitionState.confirm
        pending, state.unconfirmed = state.unconfirmed, []
        await asyncio.gather(*pending)
    state.confirm = confirm
    return Sends(config, driver, driver.hooks, outputs,  # type: ignore[arg-type]  # fakes
                 _NAMES, SimpleNamespace(producer_max_batch_size=16384)), log, state


def topics(log: Sequence[tuple[str, bytes]]) -> list[str]:
    return [name.removeprefix("t.") for name, _ in log]


def test_audit_records_go_after_the_records_outcomes_are_confirmed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """All goes well: the committed call and the final message first, then (once confirmed)
    the audit record, which says ``committed``."""
    send, log, state = sends(False, monkeypatch)
    asyncio.run(send.publish(state, list(send.driver.outgoing(
        b"r1", emits_of_one_run(), _NAMES, None, 1_000))))
    assert topics(log) == ["committed", "final", "audit"]
    assert orjson.loads(log[-1][1])["outcome"] == "committed"


def test_an_outcome_the_broker_refuses_is_audited_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker refuses the committed call at its send's future (the topic's limit, read
    again, is below it): its output_refused DLQ record is sent, then its audit record, which
    says ``refused``, ``output_refused``, ``MSG_SIZE_TOO_LARGE``. (Before: the audit record
    went right after the outcome and said ``committed``.)"""
    send, log, state = sends(True, monkeypatch)
    asyncio.run(send.publish(state, list(send.driver.outgoing(
        b"r1", emits_of_one_run(), _NAMES, None, 1_000))))
    assert topics(log) == ["committed", "final", "dlq", "audit"]
    audit = orjson.loads(log[-1][1])
    assert (audit["outcome"], audit["reason"]) == ("refused", "output_refused")
    assert audit["refused"]["error"] == "MSG_SIZE_TOO_LARGE"


def test_only_errors_of_the_record_itself_are_refusals() -> None:
    """aiokafka's size errors and a corrupt or invalid record (Kafka error 87) are
    refusals of the record itself; a connection or leadership error is the cluster's (the
    worker stops as before)."""
    assert refusal(MessageSizeTooLargeError()) == "MSG_SIZE_TOO_LARGE"
    assert refusal(RecordListTooLargeError()) == "RECORD_LIST_TOO_LARGE"
    assert refusal(CorruptRecordException()) == "INVALID_RECORD"
    assert refusal(SimpleNamespace(errno=87)) == "INVALID_RECORD"  # type: ignore[arg-type]
    assert refusal(KafkaConnectionError()) is None
    assert refusal(NotLeaderForPartitionError()) is None
    assert refusal(None) is None


def _out(topic: Topic, value: bytes = b"{}", record_ms: int | None = 1_000) -> Outgoing:
    """One prepared output of run ``r1`` (read from ``ev[0]@7`` with key ``in``)."""
    return Outgoing(Emit(topic, "r1", {"idempotency_key": "r1:c1"}), topic, _NAMES[topic],
                    b"r1", value, None,
                    in_key=b"in", source=Source("ev", 0, 7), record_ms=record_ms)


def test_each_output_but_progress_is_left_to_the_partition_to_confirm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sent in order; the committed call's and the DLQ record's confirms go to the
    partition (the record is acked only once they are delivered), a progress record's does
    not; each delivery is counted once done, with the committed call's record time."""
    send, log, state = sends(False, monkeypatch)
    counted: list[tuple[Topic, int | None, bool]] = []
    monkeypatch.setattr(send.hooks, "delivered",
                        lambda topic, record_ms, ok: counted.append((topic, record_ms, ok)))
    outs = [_out(Topic.PROGRESS), _out(Topic.COMMITTED, record_ms=1_234), _out(Topic.DLQ)]

    async def publish() -> int:
        await send.publish(state, outs)
        waiting = len(state.unconfirmed)
        await state.confirm()
        return waiting

    assert asyncio.run(publish()) == 2
    assert topics(log) == ["progress", "committed", "dlq"]
    assert counted == [(Topic.COMMITTED, 1_234, True), (Topic.DLQ, 1_000, True)]


class _RefusingAtOnce(FakeTopic):
    """A topic whose client refuses a send at once (faust's ``ProducerSendError``, caused by
    ``cause``)."""

    def __init__(self, name: str, log: list[tuple[str, bytes]], cause: Exception) -> None:
        super().__init__(name, log)
        self.cause = cause

    async def publish_message(self, message: Message) -> None:
        from faust.exceptions import ProducerSendError

        raise ProducerSendError("refused") from self.cause


def test_a_record_the_client_refuses_at_once_is_replaced_by_its_dlq_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """aiokafka refuses the committed call at once for its size: its ``output_refused``
    DLQ record is sent in its place, keyed by the input record's key, naming the topic and
    the error (never the arguments); nothing is left unconfirmed for it."""
    send, log, state = sends(False, monkeypatch)
    send.outputs[Topic.COMMITTED] = _RefusingAtOnce(  # type: ignore[index]
        _NAMES[Topic.COMMITTED], log, MessageSizeTooLargeError())
    dlq_keys: list[bytes | None] = []
    dlq = send.outputs[Topic.DLQ]
    original = dlq.send

    async def keyed(key: bytes | None, value: bytes) -> Any:
        dlq_keys.append(key)
        return await original(key, value)

    monkeypatch.setattr(dlq, "send", keyed)
    asyncio.run(send.publish(state, [_out(Topic.COMMITTED, b'{"arguments": "secret"}')]))
    assert topics(log) == ["dlq"] and dlq_keys == [b"in"]
    record = orjson.loads(log[0][1])
    assert record["reason"] == "output_refused"
    assert b"secret" not in log[0][1]
    assert "MSG_SIZE_TOO_LARGE" in log[0][1].decode()
    assert state.unconfirmed == []


def test_a_send_the_cluster_fails_at_once_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A send refused at once for the cluster's sake (no connection) is no refusal: it
    raises, so the record is withheld and the worker stops; nothing goes to the DLQ."""
    from faust.exceptions import ProducerSendError

    send, log, state = sends(False, monkeypatch)
    send.outputs[Topic.COMMITTED] = _RefusingAtOnce(  # type: ignore[index]
        _NAMES[Topic.COMMITTED], log, KafkaConnectionError())
    with pytest.raises(ProducerSendError):
        asyncio.run(send.publish(state, [_out(Topic.COMMITTED)]))
    assert log == []


def test_a_size_refusal_of_a_record_that_fits_its_topic_stands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker refuses a batch as too large, but the topic's limit, read again, is above
    this record's size: it was refused for another record's sake, so the failure stands
    (the confirm raises) and no DLQ record replaces it."""
    send, log, state = sends(True, monkeypatch)
    monkeypatch.setattr(admin, "max_message_bytes",
                        lambda settings, names: dict.fromkeys(names, 1_000_000))

    async def publish() -> None:
        await send.publish(state, [_out(Topic.COMMITTED)])
        await state.confirm()

    with pytest.raises(MessageSizeTooLargeError):
        asyncio.run(publish())
    assert topics(log) == ["committed"]


def test_the_producers_batches_stay_below_the_smallest_output_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_limits`` reads the output topics' limits and lowers the app's producer batch
    size below the smallest; limits above the batch size leave it as it is."""
    send, _, _ = sends(False, monkeypatch)
    monkeypatch.setattr(admin, "max_message_bytes",
                        lambda settings, names: {name: 100_000 for name in names})
    send.read_limits()
    assert send.app_conf.producer_max_batch_size == 16384
    monkeypatch.setattr(admin, "max_message_bytes",
                        lambda settings, names: {name: 9_000 for name in names})
    send.read_limits()
    assert send.app_conf.producer_max_batch_size == 9_000
    assert send.limits.limit(_NAMES[Topic.FINAL]) == 9_000
