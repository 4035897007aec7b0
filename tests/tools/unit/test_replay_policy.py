"""``latch replay``'s policy set version at a range's start (worker/tools/replay_policy.py,
issue 32 item 6): the latest marker before the start, read back window by window however far
back it is, in bounded memory; a record that only looks like a marker, or one written by
someone other than a worker with a value that names no version, changes nothing."""

from __future__ import annotations

from typing import Any

import orjson
from confluent_kafka import KafkaError, TopicPartition

from worker.core.envelope import TICK_KEY
from worker.runtime.config import load_config
from worker.runtime.governance.policy_source import NoPolicySet, PolicySource
from worker.runtime.governance.registry import (
    POLICY,
    POLICY_MARKER,
    RegistryState,
    encode,
    marker_value,
)
from worker.tools import replay_policy


class _Message:
    def __init__(self, offset: int, key: bytes | None = None, value: bytes = b"",
                 error: KafkaError | None = None) -> None:
        self._offset, self._key, self._value, self._error = offset, key, value, error

    def error(self) -> KafkaError | None:
        return self._error

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value


class _Log:
    """One partition's records from the assigned offset, two at a time, then its end; counts
    the records handed out and the most held at once."""

    def __init__(self, records: list[tuple[bytes | None, bytes]]) -> None:
        self.records, self.queue = records, []  # type: ignore[var-annotated]
        self.handed = 0
        self.assigned: list[int] = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        (tp,) = partitions
        self.assigned.append(tp.offset)
        self.queue = [_Message(n, k, v) for n, (k, v) in enumerate(self.records)
                      if n >= tp.offset]
        self.queue.append(_Message(len(self.records),
                                   error=KafkaError(KafkaError._PARTITION_EOF)))

    def unassign(self) -> None:
        self.queue = []

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        batch, self.queue = self.queue[:2], self.queue[2:]
        self.handed += len(batch)
        return batch


def _log(size: int, markers: dict[int, bytes]) -> list[tuple[bytes | None, bytes]]:
    tick = orjson.dumps({"v": 1, "type": "tick", "ts": 0})
    return [(POLICY_MARKER, markers[n]) if n in markers else (TICK_KEY.encode(), tick)
            for n in range(size)]


def test_the_latest_marker_before_the_start_however_far_back() -> None:
    """Markers at 3 (v1) and 10 (v2) in a log of 1,000 records: from offset 900 the scan
    finds v2 at 10 (windows of 8, 32, 128, 512, ...: each window read once), from 10 it finds
    v1 (a marker at the start itself is not before it), from 3 nothing."""
    records = _log(1000, {3: marker_value(1, 0), 10: marker_value(2, 0)})
    consumer = _Log(records)
    found = replay_policy.marker_before(consumer, "ev", 0, 0, 900, first_window=8)
    assert found == replay_policy.Found(2, 10)
    assert consumer.handed <= 900 + 2 * len(consumer.assigned)  # each record about once
    assert replay_policy.marker_before(_Log(records), "ev", 0, 0, 10, 8) == (1, 3)
    assert replay_policy.marker_before(_Log(records), "ev", 0, 0, 3, 8) is None


def test_a_marker_naming_no_version_is_passed_over_as_live() -> None:
    """A ``__latch_policy__`` record whose value names no version (not JSON, version 0, a
    string: anyone who can write the events topic can write one) is ignored, as the driver
    ignores it live: the scan goes on to the marker before it."""
    records = _log(50, {5: marker_value(3, 0), 20: b"not json",
                        30: orjson.dumps({"v": 1, "type": "policy", "version": 0}),
                        40: orjson.dumps({"v": 1, "type": "policy", "version": "9"})})
    assert replay_policy.marker_before(_Log(records), "ev", 0, 0, 45, 4) == (3, 5)


def test_the_scan_stops_at_the_logs_first_offset() -> None:
    """Records before ``low`` are gone (retention): the scan never asks for them."""
    consumer = _Log(_log(100, {2: marker_value(1, 0)}))
    assert replay_policy.marker_before(consumer, "ev", 0, 40, 90, 8) is None
    assert min(consumer.assigned) == 40


def test_a_partition_replayed_from_a_version_decides_as_with_it_in_force() -> None:
    """``policy_at``: the version found builds the policy the live worker built (its Cedar
    text from the registry); no version: the policy before any marker (fail closed)."""
    config = load_config(None, env={"LATCH_POLICY__MODE": "enforce"})
    state = RegistryState()
    key, value = encode(POLICY, "", 2, '@id("all")\npermit(principal, action, resource);')
    state.apply(key, value, 0, 0)
    policies = PolicySource(config)
    policy = replay_policy.policy_at(policies, state, 2)
    assert policy is not None and policy.version == 2
    assert not isinstance(policy, NoPolicySet)
    assert isinstance(replay_policy.policy_at(policies, state, None), NoPolicySet)
    assert isinstance(replay_policy.policy_at(policies, state, 3), NoPolicySet)  # never read
