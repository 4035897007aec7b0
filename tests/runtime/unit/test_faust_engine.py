"""The faust engine (``worker.runtime.faust_engine.engine.FaustEngine``) against hostile
inputs to the runtime (issue 9): every kind has a defined result, and this file, the unit file
it names or the integration test it names proves each one. The core's own table is
``tests/core/unit/test_assembler.py``; this is its successor for what the core never sees.
The faust engine's per-record path is ``test_worker_hot_path.py``, its commits past skipped
records ``test_worker_commit_gap.py``.

=========================================  ===========================================  ======
Hostile input                              Defined result                               Test
=========================================  ===========================================  ======
tick sent through ``Publisher``            ``ValueError`` naming the reserved type;     [4]
                                           nothing is sent
``__latch_…`` run id through ``Publisher``  ``ValueError`` naming the reserved prefix;   [4]
(``run``, ``cancel``, ``send_raw``)        nothing is sent
tick or ``__latch_…`` line in              the line is skipped with its line number and [4]
``latch publish``                          the reason; exit 1
far-future ``ts`` in a tick (or any        expiry follows the record time only; the     [5]
envelope)                                  events topic stamps it (``LogAppendTime``)
events topic created with ``CreateTime``   ``latch topics create`` and the worker's     integ.
                                           start refuse it, naming the setting          [1]
output sent, no final follows (DLQ,        confirmed before its input record is acked;  here
early commit, forwarded cancel)            a failed delivery stops the worker unacked
a flood of DLQ-only records                pending sends never outlive their record:    here
                                           the unconfirmed set is one record's outputs
partition revoked, compacted, re-assigned  heads of a revoked partition leave the       here,
                                           memory store: the changelog alone decides    [3]
broken ``latch.yaml`` holding a password   file, line, column and problem; no snippet   [6]
secret of the wrong type or value          the key and the failed rule; never the value [6]
no ``web_*`` setting                       faust's web server off                       here
``web_enabled: true``                      bound to 127.0.0.1 unless ``web_host`` says  here
control partition whose first record       read from the log on assignment and at each  integ.
faust never delivers                       tick, without waiting for a later record     [2]
=========================================  ===========================================  ======

[1] ``tests/runtime/integration/test_worker_topics.py`` (and ``test_admin.py`` here).
[2] ``tests/runtime/integration/test_control_gap.py`` (a ``kill -9`` of the owner of a
control partition while a cancel is in flight; the cancel ends the run's calls ``cancelled``).
[3] ``tests/runtime/integration/test_heads_return.py`` (the partition moves away and back
after compaction removed the tombstone of a run finished elsewhere).
[4] ``tests/client/unit/test_publisher.py``.
[5] ``tests/runtime/unit/test_step.py`` and ``tests/runtime/unit/test_admin.py``.
[6] ``tests/runtime/unit/test_config.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.types import TP
from faust_fakes import FaustStream

from worker.core import Assembler, Topic
from worker.runtime.config import load_config
from worker.runtime.faust_engine import kafka_io
from worker.runtime.faust_engine.engine import FaustEngine
from worker.runtime.faust_engine.heads import FaustHeadsMap
from worker.runtime.faust_engine.settings import app_settings
from worker.runtime.partition import Heads, PartitionState

# -- faust's web server -------------------------------------------------------------------


def test_web_server_is_off_by_default() -> None:
    """With no ``web_*`` setting, faust's web server (which serves run ids and heads without
    authentication) is not started."""
    settings = app_settings(load_config(None, env={}), {})
    assert settings["web_enabled"] is False


def test_web_server_binds_to_localhost_when_enabled() -> None:
    """``web_enabled: true`` alone binds to 127.0.0.1; ``web_host`` chooses another address."""
    on = load_config(None, env={"LATCH_WORKER__WEB_ENABLED": "true"})
    settings = app_settings(on, {})
    assert settings["web_enabled"] is True and settings["web_bind"] == "127.0.0.1"
    anywhere = load_config(None, env={"LATCH_WORKER__WEB_ENABLED": "true",
                                      "LATCH_WORKER__WEB_HOST": "0.0.0.0"})
    assert app_settings(anywhere, {})["web_bind"] == "0.0.0.0"


# -- outputs confirmed before the offset moves ----------------------------------------------


class _Topic:
    """A faust topic whose sends are delivered (or fail) one loop turn later, logging when."""

    def __init__(self, log: list[str], name: str, fail: bool = False) -> None:
        self.log, self.name, self.fail = log, name, fail

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, key: bytes | None = None, value: bytes = b"",
                   partition: int | None = None,
                   headers: Any = None) -> asyncio.Future[None]:
        self.log.append(f"send {self.name}")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def deliver() -> None:
            self.log.append(f"delivered {self.name}")
            if self.fail:
                future.set_exception(RuntimeError("MessageSizeTooLarge"))
            else:
                future.set_result(None)

        asyncio.get_running_loop().call_soon(deliver)
        return future

    def as_future_message(self, key: bytes | None = None, value: bytes = b"",
                          headers: Any = None) -> asyncio.Future[None]:
        """faust's: the message's future (set once the send is delivered or failed)."""
        message: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        message.key, message.value = key, value  # type: ignore[attr-defined]
        return message

    async def publish_message(self, message: asyncio.Future[None]) -> asyncio.Future[None]:
        """faust's: send ``message``; its future follows the send's."""
        sent = await self.send(message.key, message.value)  # type: ignore[attr-defined]

        def done(future: asyncio.Future[None]) -> None:
            if future.exception() is not None:
                message.set_exception(future.exception())  # type: ignore[arg-type]
            else:
                message.set_result(None)

        sent.add_done_callback(done)
        return sent


def _worker(log: list[str], fail: bool = False) -> FaustEngine:
    latch = FaustEngine(load_config(None, env={"LATCH_TOPICS__EVENTS": "ev",
                                               "LATCH_TOPICS__CONTROL": "ctl"}))
    latch.outputs = latch.sends.outputs = {t: _Topic(log, t.value, fail) for t in Topic}
    latch.events = _Topic(log, "ev", fail)  # type: ignore[assignment]
    latch.partitions[0] = PartitionState(Assembler(), next_offset=0)
    latch.control_next[0] = 0

    async def crash(exc: BaseException) -> None:
        log.append(f"crash {type(exc).__name__}")

    latch.app.crash = crash  # type: ignore[method-assign]
    return latch


def _message(topic: str, offset: int, key: bytes | None, doc: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(topic=topic, partition=0, offset=offset, key=key,
                           value=orjson.dumps(doc), timestamp=1.0, headers=[])


NOT_AN_ENVELOPE = {"v": 1, "run_id": "r1", "type": "no.such.type"}
CANCEL = {"v": 1, "run_id": "r1", "type": "cancel", "reason": "user_stop"}


@pytest.mark.parametrize(
    ("topic", "message", "output"),
    [
        ("ev", _message("ev", 0, b"r1", NOT_AN_ENVELOPE), "dlq"),  # a DLQ record, no final
        ("ctl", _message("ctl", 0, b"r1", CANCEL), "ev"),  # the forwarded cancel
        ("ctl", _message("ctl", 0, b"r1", NOT_AN_ENVELOPE), "dlq"),  # a control DLQ record
    ],
)
def test_an_output_is_delivered_before_its_record_is_acked(
        topic: str, message: SimpleNamespace, output: str) -> None:
    """A record whose only output is not followed by a run's end (a DLQ record, a forwarded
    cancel) is acked only once that output is delivered, so faust never commits its offset
    while the output could still be lost."""
    log: list[str] = []
    latch = _worker(log)
    agent = latch._events_agent if topic == "ev" else latch._control_agent
    asyncio.run(agent(FaustStream(log, [message])))
    assert log == [f"send {output}", f"delivered {output}", "ack 0"]


@pytest.mark.parametrize(
    ("topic", "message"),
    [("ev", _message("ev", 0, b"r1", NOT_AN_ENVELOPE)), ("ctl", _message("ctl", 0, b"r1", CANCEL))],
)
def test_a_failed_delivery_stops_the_worker_unacked(topic: str, message: SimpleNamespace) -> None:
    """A send that fails (the broker refused it) stops the worker and leaves the record
    unacked, so its offset is never committed and it is processed again after a restart."""
    log: list[str] = []
    latch = _worker(log, fail=True)
    agent = latch._events_agent if topic == "ev" else latch._control_agent
    with pytest.raises(RuntimeError, match="MessageSizeTooLarge"):
        asyncio.run(agent(FaustStream(log, [message])))
    assert log[-1] == "crash RuntimeError" and not any(e.startswith("ack") for e in log)
    assert latch.failed


# -- heads after revocations --------------------------------------------------------------


class _LiveTable(dict[bytes, Any]):
    """faust's table as the events agent writes it: values go to its local store (``data``)
    and, in faust, to the changelog; no event context is needed here."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self.data = store

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.data[key] = value

    def __getitem__(self, key: bytes) -> Any:
        return self.data[key]

    def items(self) -> Any:  # type: ignore[override]
        return self.data.items()


def test_heads_written_live_leave_memory_with_their_partition() -> None:
    """A head written live for partition 1 (a run that opened there) is dropped from faust's
    memory store by faust's own clean-up after a recovery in which partition 1 is no longer
    owned; so when partition 1 comes back after compaction removed the tombstone that ended
    the head, the worker does not see a finished run as open (it would re-read the run from
    its start and publish its outcomes again). A head of a partition still owned stays.
    (The store state is simulated: faust's ``on_recovery_completed`` on the real store.)"""
    latch = FaustEngine(load_config(None, env={"LATCH_TOPICS__PARTITIONS": "2"}))
    store = latch.heads.data
    assert isinstance(latch.run_heads.table.store, FaustHeadsMap)  # type: ignore[attr-defined]  # the worker's wiring: staged over it
    heads = Heads(FaustHeadsMap(_LiveTable(store)), retention_s=3600)
    heads.opened(b"gone", partition=1, offset=40)
    heads.opened(b"kept", partition=0, offset=7)
    changelog = f"{latch.config.worker.app_id}-heads-changelog"
    asyncio.run(store.on_recovery_completed({TP(changelog, 0)}, set()))
    assert dict(store.items()) == {b"kept": (0, 7)}  # an open run's head, kept packed
    state = PartitionState(Assembler(), next_offset=50)
    assert heads.load(state, 1) == {}  # partition 1 is back: nothing stale is open


def test_an_assignment_drops_the_heads_of_partitions_owned_elsewhere() -> None:
    """faust's own clean-up waits for its recovery to complete, and that recovery can stall
    until the next rebalance (CI saw it: partition 0 went to another worker and came back
    within one stalled recovery, and the finished run's stale head made the worker publish
    its outcomes again). The worker's assignment handler drops, on the real faust store, the
    heads of every partition it no longer owns, by itself; the owned ones stay."""
    latch = FaustEngine(load_config(None, env={"LATCH_TOPICS__PARTITIONS": "3"}))
    store = latch.heads.data
    heads = Heads(FaustHeadsMap(_LiveTable(store)), retention_s=3600)
    heads.opened(b"stale", partition=0, offset=0)
    heads.opened(b"kept", partition=1, offset=7)
    heads.opened(b"also-gone", partition=2, offset=3)
    latch.heads_store = FaustHeadsMap(_LiveTable(store))
    events = latch.events.get_topic_name()
    asyncio.run(latch._on_assigned(latch.app, {TP(events, 1), TP("other", 0)}))
    assert dict(store.items()) == {b"kept": (1, 7)}
    assert store._key_partition == {b"kept": 1}
    assert heads.load(PartitionState(Assembler(), next_offset=9), 0) == {}


# -- a control range faust never delivers ---------------------------------------------------


def test_a_cancel_faust_never_delivers_is_forwarded_at_the_next_ticks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The only record of an owned control partition is a cancel that faust skipped (it
    started the partition past it, and nothing later arrives): within two ticks the worker
    reads it from the log, forwards it into the events topic (confirmed), and commits the
    control partition past it, without any later record of that partition."""
    log: list[str] = []
    latch = _worker(log)
    latch.control_next.clear()  # nothing delivered yet
    cancel = SimpleNamespace(topic="ctl", partition=0, offset=0, key=b"r1",
                             value=orjson.dumps(CANCEL), timestamp=1_000, headers=[])

    async def resume_offset(*args: Any) -> int:
        return 0

    async def end_offsets(options: Any, topic: str, partitions: list[int]) -> dict[int, int]:
        return dict.fromkeys(partitions, 1)

    async def read_range(options: Any, topic: str, partition: int, start: int,
                         stop: int) -> AsyncIterator[SimpleNamespace]:
        log.append(f"read {topic}[{partition}] {start}..{stop}")
        yield cancel

    async def commit(offsets: dict[TP, int]) -> bool:
        log.append(f"commit {offsets}")
        return True

    monkeypatch.setattr(kafka_io, "resume_offset", resume_offset)
    monkeypatch.setattr(kafka_io, "end_offsets", end_offsets)
    monkeypatch.setattr(kafka_io, "read_range", read_range)
    monkeypatch.setattr(latch.app, "assignor",
                        SimpleNamespace(assigned_actives=lambda: {TP("ctl", 0)}))
    monkeypatch.setattr(latch.app.consumer, "_commit_offsets", commit)

    async def two_ticks() -> None:
        await latch._repair_tick()  # the cancel is there, unapplied
        await latch._repair_tick()  # and still is: read it

    asyncio.run(two_ticks())
    assert log == ["read ctl[0] 0..1", "send ev", "delivered ev",
                   f"commit {({TP('ctl', 0): 1})}"]
    assert latch.control_next[0] == 1


def test_a_marker_for_an_unread_policy_version_is_settled_before_it_is_applied() -> None:
    """Policy sets from the registry (``enforce``, no file): a policy marker naming version 3,
    which the reader cannot answer for yet, is settled before the driver applies it
    (``Driver.unsettled``, as the kafka engine does), and off the event loop's thread: the
    loop never waits inside the driver (issue 35, item 3). Then the marker is applied and
    the partition moves past it."""
    import threading

    from worker.runtime.governance.registry import POLICY_MARKER, marker_value

    latch = FaustEngine(load_config(None, env={"LATCH_POLICY__MODE": "enforce",
                                               "LATCH_WORKER__WEB_PORT": "0"}))
    latch.staged.store = {}  # type: ignore[assignment]  # (no faust table: no app running)
    state = latch.partitions[0] = PartitionState(Assembler(latch.config.assemble), 7)
    settled: list[tuple[int, int, bool]] = []

    def policy_registered(version: int, at_ms: int) -> bool | None:
        settled.append((version, at_ms, threading.current_thread() is threading.main_thread()))
        return None

    latch.registry.policy_registered = policy_registered  # type: ignore[method-assign]
    latch.registry.policy_text = lambda version: None  # type: ignore[method-assign]
    marker = SimpleNamespace(topic="events", partition=0, offset=7, headers=[],
                             key=POLICY_MARKER, value=marker_value(3, 1), timestamp=1.0)
    rest = latch._step_event(marker)
    assert rest is not None and settled == []  # (not on the hot path)
    asyncio.run(rest)  # type: ignore[arg-type]
    assert settled[0] == (3, 1000, False)
    assert state.next_offset == 8
