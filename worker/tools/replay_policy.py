"""Which policy set version was in force where a ``latch replay`` range starts.

Where the registry's policy sets decide (``policy.mode`` not off, no ``policy.file``), the
version in force at an offset of an events partition is the one the latest policy marker
before it named (decision 0014; the driver applies markers live, in a rebuild and here
alike). A replay from the beginning reads every marker; one that starts in the middle
(``--from-offset``, ``--from-time``) starts each partition with the version the live worker
had in force there, found here by reading the partition backwards from the range's start,
window by window, until a marker: memory O(1) (each record is dropped once looked at), time
in proportion to how far back the latest marker is, however many rollouts ago it was.

Who writes what is read: the markers (key ``__latch_policy__``) are written into the events
log by the partition's owner; the gateway, which may also write the events topic, could write
one too, and the live worker would have applied it the same way, so a replay, deciding as
live does, applies it too (a value that names no version is ignored, as live). The heads
changelog is written by the workers alone. Nothing else of the records read here is used:
their keys are compared, only a marker's or the policy head's value is parsed, and no record
content reaches the notes.

Where retention removed what preceded the log (its first offset is not 0) and no marker is
left before the start, the partition's policy head in the heads changelog decides (its last
16 markers with their offsets, as a takeover reads them, :func:`policy_history`: read whole,
one value kept). Where neither knows (no marker was ever written; or more than 16 rollouts
since the start and the marker before it removed), the partition starts with no version in
force, as a live partition that never had one: every call is denied in ``enforce``; a note
says so.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from worker.core import Assembler
from worker.core.policy import Policy
from worker.runtime.admin import heads_changelog
from worker.runtime.config import Config
from worker.runtime.governance.approvers import approvers as approvers_for
from worker.runtime.governance.policy_source import PolicySource
from worker.runtime.governance.registry import (
    POLICY_MARKER,
    RegistryState,
    in_force,
    marker_refusal,
    marker_version,
    policy_head_key,
)
from worker.runtime.partition import decode_head

__all__ = ["FIRST_WINDOW", "MAX_WINDOW", "Found", "ScanError", "Scanner", "Start",
           "marker_before", "policy_at", "policy_history", "versions_at"]

#: The first window read back from a range's start (offsets); each next one is 4 times
#: larger, up to :data:`MAX_WINDOW`.
FIRST_WINDOW = 4096
MAX_WINDOW = 1 << 20
#: How long a window may give nothing (no record, no end of partition) before the cluster is
#: called unreachable, in seconds.
STALL_S = 30.0


class Found(NamedTuple):
    """The latest policy marker before an offset."""

    version: int
    offset: int


class Scanner(Protocol):
    """The consumer calls the backward read makes (a confluent-kafka ``Consumer``)."""

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def unassign(self) -> None: ...

    def consume(self, num_messages: int, timeout: float) -> list[Any]: ...


class ScanError(Exception):
    """The events log cannot be read back (one line for the user)."""


def marker_before(consumer: Scanner, topic: str, partition: int, low: int, offset: int,
                  first_window: int = FIRST_WINDOW) -> Found | None:
    """The latest policy marker naming a version in ``partition`` before ``offset``, read
    back to ``low`` (the log's first offset) at most; None: there is none."""
    high, window = offset, first_window
    while high > low:
        start = max(low, high - window)
        found = _last_marker(consumer, topic, partition, start, high)
        if found is not None:
            return found
        high, window = start, min(window * 4, MAX_WINDOW)
    return None


def _last_marker(consumer: Scanner, topic: str, partition: int, start: int, stop: int
                 ) -> Found | None:
    """The last marker naming a version among the offsets ``start`` to ``stop`` (excluded).
    (read_committed: an aborted marker never happened, as for the worker.)"""
    found: Found | None = None
    with contextlib.closing(_records(consumer, topic, partition, start)) as records:
        for message in records:
            at = message.offset()
            if at is None or at >= stop:
                break
            if message.key() == POLICY_MARKER:
                version = marker_version(message.value() or b"")
                if version is not None:
                    found = Found(version, at)
            if at == stop - 1:
                break
    return found


def _records(consumer: Scanner, topic: str, partition: int, start: int
             ) -> Generator[Any, None, None]:
    """The records of ``partition`` from ``start`` to its end, one at a time; raises
    :class:`ScanError` when none comes for :data:`STALL_S`, or the consumer fails."""
    consumer.assign([TopicPartition(topic, partition, start)])
    try:
        stalled = time.monotonic() + STALL_S
        while True:
            messages = consumer.consume(500, timeout=0.5)
            if not messages and time.monotonic() > stalled:
                raise ScanError(f"{topic} [{partition}]: no record within {STALL_S:.0f} s")
            for message in messages:
                stalled = time.monotonic() + STALL_S
                error = message.error()
                if error is None:
                    yield message
                elif error.code() == KafkaError._PARTITION_EOF:
                    return
                elif error.fatal():
                    raise ScanError(f"the consumer failed: {error.str()}")
    finally:
        consumer.unassign()


class Start(Protocol):
    """Where a partition's range starts (``replay.Span``)."""

    @property
    def partition(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def size(self) -> int: ...


def versions_at(config: Config, client: Mapping[str, Any], topic: str,
                spans: Sequence[Start], notes: list[str]) -> dict[int, int]:
    """The policy set version in force at each non-empty span's start where the registry's
    policy sets decide (else none); a partition with none there is left out, with a note.
    ``client``: librdkafka settings (its own consumer, in no group, read_committed)."""
    starts = [(s.partition, s.start) for s in spans if s.size]
    if not PolicySource(config).registry or not starts:
        return {}
    consumer = Consumer({**client, "group.id": f"latch-replay-markers-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed"})
    versions: dict[int, int] = {}
    try:
        for partition, start in starts:
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                    timeout=STALL_S, cached=False)
            found = marker_before(consumer, topic, partition, int(low), start)
            version = found.version if found is not None else None
            if version is None and low > 0:  # retention removed what preceded the log
                version = in_force(policy_history(consumer, heads_changelog(config),
                                                  partition), start)
            if version is not None:
                versions[partition] = version
            elif start > 0:
                notes.append(f"partition {partition}: no policy marker before offset {start} "
                             f"(the log starts at {low}) nor in its policy head: it starts "
                             "with no policy set version in force (enforce denies every call)")
    finally:
        consumer.close()
    return versions


def policy_history(consumer: Scanner, changelog: str, partition: int) -> Any:
    """The policy head of events ``partition`` (its last markers, ``[[offset, version],
    ...]``) as the heads changelog holds it now (None: none): read whole, only that key's
    latest value kept. Written by the workers alone (decision 0001), as a takeover trusts it."""
    key, history = policy_head_key(partition), None
    with contextlib.closing(_records(consumer, changelog, partition, OFFSET_BEGINNING)) as read:
        for message in read:
            if message.key() == key:
                value = message.value()
                head = None if value is None else decode_head(value)
                history = None if head is None else head.get("policy")
    return history


def policy_at(policies: PolicySource, registry: RegistryState, version: int | None
              ) -> Policy | None:
    """The policy a partition's replay starts with: version ``version``'s (None: the one
    before any marker), built as the live worker builds it."""
    if version is None:
        return policies.initial()
    return policies.at(version, registry.policy_text)


def assemblers_for(config: Config, policies: PolicySource, registry: RegistryState,
                   partitions: Iterable[int], starting: Mapping[int, int]
                   ) -> dict[int, Assembler]:
    """One assembler per partition, set up as the live worker's: the policy version in force
    at the span's start, whose signed decisions count, the registry's toolsets."""
    approvers = approvers_for(config)
    wait_ms = int(config.registry.wait_s * 1000)
    assemblers = {}
    for p in partitions:
        assembler = assemblers[p] = Assembler(config.assemble)
        assembler.policy = policy_at(policies, registry, starting.get(p))
        assembler.approvals.approvers = approvers
        assembler.toolsets = lambda name, version, at_ms: registry.toolset(
            name, version, at_ms, wait_ms)
    return assemblers


class Markers:
    """The policy markers of the replayed spans, applied as the live driver applies them
    (``Driver.set_policy``): a repeat, an older version or one the registry did not hold by
    the marker's time changes nothing (``registry.marker_refusal``); a version no worker can
    build leaves the one in force (``PolicySource.at``)."""

    def __init__(self, policies: PolicySource, registry: RegistryState,
                 assemblers: Mapping[int, Assembler], starting: Mapping[int, int]) -> None:
        self.policies, self.registry, self.assemblers = policies, registry, assemblers
        self.versions: dict[int, int] = dict(starting)

    def apply(self, partition: int, value: bytes, at_ms: int | None) -> None:
        """The marker ``value`` read in ``partition`` at record time ``at_ms``."""
        version, in_force = marker_version(value), self.versions.get(partition)
        if version is None or version == in_force:
            return
        registered = None if at_ms is None else self.registry.policy_registered(version, at_ms)
        if marker_refusal(version, in_force, registered) is not None:
            return
        assembler = self.assemblers[partition]
        assembler.policy = self.policies.at(version, self.registry.policy_text,
                                            assembler.policy)
        if version not in self.policies.refused:
            self.versions[partition] = version
