"""The kafka engine around the registry, without a broker (issue 32 item 5): a policy marker
naming a version its reader has not read waits with no transaction open: the engine commits
the records before it first, outside the core (before, the core's lookup called back into
the engine to commit, nine frames deep); where no registry policy decides, a marker makes
no wait at all (whoever wrote it)."""

from __future__ import annotations

import threading
from typing import Any

import orjson
from kafka_fakes import EngineMessage

from worker.core import Assembler
from worker.runtime.config import load_config
from worker.runtime.governance.registry import POLICY_MARKER, marker_value
from worker.runtime.kafka_engine.engine import KafkaEngine
from worker.runtime.partition import PartitionState


class _Transactions:
    """A transactional producer that records each call."""

    def __init__(self) -> None:
        self.sent = 0
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append(f"begin {self.sent}")

    def produce(self, topic: str, value: bytes | None, key: bytes | None,
                partition: int | None = None, **options: Any) -> None:
        self.sent += 1

    def send_offsets_to_transaction(self, positions: list[Any], *args: Any) -> None:
        self.calls.append(f"offsets {[tp.offset for tp in positions]}")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append(f"commit {self.sent}")


class _GroupConsumer:
    def consumer_group_metadata(self) -> object:
        return object()

    def assignment(self) -> list[Any]:
        return []

    def close(self) -> None:
        pass


def _engine(**env: str) -> tuple[KafkaEngine, _Transactions]:
    config = load_config(None, env={"LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1", **env})
    engine = KafkaEngine(config)  # clients that never connect
    engine.consumer.close()
    producer = _Transactions()
    engine.txn.producer = producer  # type: ignore[assignment]
    engine.consumer = _GroupConsumer()  # type: ignore[assignment]
    engine.partitions[0] = PartitionState(Assembler(config.assemble), next_offset=0)
    return engine, producer


def _run(engine: KafkaEngine, run_id: str, first: int) -> list[EngineMessage]:
    run = {"v": 1, "run_id": run_id, "provider": "openai.chat"}
    docs = [run | {"seq": 0, "type": "run.start", "tenant": "t1", "tools": []},
            run | {"seq": 1, "type": "stream.end"}]
    return [EngineMessage(engine.events, first + n, run_id.encode(), orjson.dumps(doc))
            for n, doc in enumerate(docs)]


def test_a_marker_for_an_unread_policy_version_waits_with_no_transaction_open() -> None:
    """Policy sets from the registry (``enforce``, no file): a ``consume`` call holding a
    marker for version 3, which the reader has not read, is applied only after the open
    transaction (the previous call's run) committed with its offsets, and after the wait;
    the marker's records then go into a new transaction."""
    engine, producer = _engine(LATCH_POLICY__MODE="enforce")
    waits: list[list[str]] = []

    def policy_registered(version: int, at_ms: int) -> bool | None:
        assert threading.current_thread() is threading.main_thread()
        waits.append(list(producer.calls))
        return None

    engine.registry.policy_registered = policy_registered  # type: ignore[method-assign]
    engine.registry.policy_text = lambda version: None  # type: ignore[method-assign]
    engine._apply_events(_run(engine, "r1", 0))  # type: ignore[arg-type]
    assert producer.calls == ["begin 0"]
    marker = EngineMessage(engine.events, 2, POLICY_MARKER, marker_value(3, 1))
    engine._apply_events([marker, *_run(engine, "r2", 3)])  # type: ignore[arg-type]
    assert waits[0][:3] == ["begin 0", "offsets [2]", waits[0][2]]
    assert waits[0][2].startswith("commit") and len(waits[0]) == 3
    assert producer.calls[3].startswith("begin")  # the marker's call: a new transaction
    assert engine.partitions[0].next_offset == 5


def test_without_registry_policies_a_marker_waits_for_nothing() -> None:
    """``policy.mode`` off: a marker (the gateway could write one) naming a version nobody
    registered neither commits nor waits."""
    engine, producer = _engine()
    engine.registry.policy_registered = lambda version, at_ms: (  # type: ignore[method-assign]
        _ for _ in ()).throw(AssertionError("waited"))
    marker = EngineMessage(engine.events, 0, POLICY_MARKER, marker_value(9, 1))
    engine._apply_events([marker, *_run(engine, "r1", 1)])  # type: ignore[arg-type]
    assert producer.calls == ["begin 0"] and engine.partitions[0].next_offset == 3


def test_a_policy_version_never_read_is_waited_for_once(monkeypatch: Any) -> None:
    """The engine waits for a marker's version before the batch (no transaction open), then
    the driver asks for its text again while applying the marker: a version still unread
    after the bound is given up once, and the second ask answers None at once (a second
    wait would hold the transaction open past its timeout)."""
    import time

    from worker.runtime.governance import registry_io

    monkeypatch.setattr(registry_io, "HOLD_MAX_S", 0.3)
    config = load_config(None, env={"LATCH_REGISTRY__WAIT_S": "0"})
    reader = registry_io.RegistryReader(config)
    began = time.monotonic()
    assert reader.policy_registered(7, 1_000) is None
    assert time.monotonic() - began >= 0.3
    began = time.monotonic()
    assert reader.policy_registered(7, 1_000) is None
    assert reader.policy_text(7) is None
    assert time.monotonic() - began < 0.1
