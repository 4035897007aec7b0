"""The faust engine's sends of one record's outputs (``faust_engine/sends.py``): audit records
go after the record's other outputs are confirmed, so a broker refusal of an outcome (known
only at its send's future) turns its audit record into ``refused`` (issue 32, item 10).

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
from aiokafka.errors import MessageSizeTooLargeError  # type: ignore[import-untyped]
from builders import chat_calls, chat_run, chat_tool

from worker.core import Emit, Topic
from worker.runtime import admin, step
from worker.runtime.config import load_config
from worker.runtime.driver import Driver
from worker.runtime.faust_engine.sends import Sends
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import Heads

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
