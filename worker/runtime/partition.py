"""What a worker holds for one events partition, and the run heads behind it.

Engine-independent: the partition driver (:mod:`worker.runtime.driver`) drives these for
both engines. Nothing here reads a socket or a clock; the heads go through a
mapping that the engine persists (faust's changelog-backed table).

* :class:`PartitionState`: the partition's :class:`~worker.core.Assembler`, the offset of the
  next record to apply, the sends not yet confirmed, and the latest record time.
* :class:`Heads`: per run, ``{"p", "start"}`` (the offset of its ``run.start``; with
  ``"pv"``, the registry policy set version in force there, when one is) while it is open,
  and ``{"p", "done", "seq", "status", "at"}`` once it has finished; done heads are
  tombstoned after ``finished_run_retention_s`` of record time. A cancel that reached the log
  before its run's ``run.start`` (the core remembers it, ``remember_early_cancels``) gets
  ``{"p", "start", "cancel": true}`` (and ``"pv"``) at the cancel's offset, so that a
  rebuild on any worker reads from there and the run is still cancelled as it starts; that
  head is replaced when the run starts (by its ``start`` or, cancelled at once, its ``done``
  head) and tombstoned at the first tick after the core let the cancel go (expired in record
  time, or forgotten).
  A run held for its registry toolset (:mod:`worker.runtime.hold`) has ``"hold": "wait"`` in
  its head (a rebuild parks its records again), and ``"hold": "refused"`` once the hold's
  bounds ended it (a rebuild applies it without its toolset again).
* :func:`replay`: one record of a rebuild (the log read back from the earliest head's start
  up to the committed offset), fed only when it is a tick, or belongs to a run with a head
  that starts at or before it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from worker.core import Assembler, Emit, RunStatus, Topic
from worker.core.envelope import TICK_KEY
from worker.runtime import step
from worker.runtime.hold import HOLD_REFUSED, HOLD_WAIT, Holds
from worker.runtime.step import Record

__all__ = ["POLICY_AT", "TICK", "Heads", "PartitionState", "StoredHead", "decode_head",
           "encode_head", "finished_runs", "head_partition", "head_policy", "pack_head",
           "refinished", "replay", "unpack_head"]

log = logging.getLogger("latch.worker")

#: The key of the ticks the worker writes into each events partition.
TICK = TICK_KEY.encode()


#: A head as an engine's table keeps it in memory: an open run's ``{"p": partition, "start":
#: offset}`` as the tuple ``(partition, offset)`` (56 bytes against a dict's 184: one per open
#: run, bench/bench_memory.py), with ``"pv"`` (:data:`POLICY_AT`) as ``(partition, offset,
#: version)``, any other head as its dict. Read, a head is always its dict.
StoredHead = dict[str, Any] | tuple[int, int] | tuple[int, int, int]

#: An open run's head key naming the registry policy set version in force at its ``start``:
#: a rebuild from that start begins with it, however many markers ago it was put in force
#: (the partition's policy head keeps only the last ``POLICY_HISTORY``; issue 32 item 6).
POLICY_AT = "pv"


def pack_head(head: dict[str, Any]) -> StoredHead:
    """A head as a table keeps it."""
    if type(head.get("p")) is int and type(head.get("start")) is int:
        if len(head) == 2:
            return head["p"], head["start"]
        if len(head) == 3 and type(head.get(POLICY_AT)) is int:
            return head["p"], head["start"], head[POLICY_AT]
    return head


def unpack_head(stored: StoredHead) -> dict[str, Any]:
    """A kept head as its dict."""
    if isinstance(stored, tuple):
        if len(stored) == 3:
            return {"p": stored[0], "start": stored[1], POLICY_AT: stored[2]}
        return {"p": stored[0], "start": stored[1]}
    return stored


def head_policy(head: Any) -> int | None:
    """The policy set version an open run's head names as in force at its start (None: none
    was, or a head written before heads named it; a value that is no version is ignored)."""
    version = head.get(POLICY_AT) if isinstance(head, dict) else None
    return version if type(version) is int and version >= 1 else None


def head_partition(stored: StoredHead) -> Any:
    """The events partition of a kept head (its ``"p"``)."""
    return stored[0] if isinstance(stored, tuple) else stored.get("p")


def encode_head(head: dict[str, Any]) -> bytes:
    """A head as the changelog holds it: a JSON object, as faust's ``json`` codec writes it."""
    return orjson.dumps(head)


def decode_head(value: bytes) -> dict[str, Any] | None:
    """A changelog value as a head; None if it is not a JSON object (never written by Latch:
    ignored rather than trusted)."""
    try:
        head = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return head if isinstance(head, dict) else None


@dataclass(slots=True)
class PartitionState:
    """What the worker holds for one events partition it processes."""

    assembler: Assembler
    #: The offset of the next record to apply.
    next_offset: int
    #: Sends not yet known to be delivered (progress records excepted).
    unconfirmed: list[Awaitable[Any]] = field(default_factory=list)
    #: The latest record time applied (ms): the time a run's ``done`` head records.
    clock_ms: int = 0
    #: Done heads of this partition in the order they were written: (record time, key).
    done: deque[tuple[int, bytes]] = field(default_factory=deque)
    #: Runs whose cancel came before their ``run.start`` and was held by the core, as last
    #: seen (checked at each tick: :meth:`Heads.forget_finished`).
    waiting: set[bytes] = field(default_factory=set)
    #: The registry policy set version in force (None: none), the markers that set it
    #: ([[offset, version]], its policy head) and the version this worker last marked.
    policy_version: int | None = None
    policy_history: list[list[int]] = field(default_factory=list)
    policy_marked: int | None = None
    #: The runs held for a registry toolset version, their records parked (hold.py).
    holds: Holds = field(default_factory=Holds)

    def apply(self, record: Record) -> list[Emit]:
        """The emits of the partition's next record, in order (its time moves the clock):
        the core's step (:func:`step.step`) for both engines, live and in a rebuild."""
        now = record.time_ms
        if now is not None and now > self.clock_ms:
            self.clock_ms = now
        return step.step(self.assembler, record)

    async def confirm(self) -> None:
        """Wait until every send so far is delivered; raise if one failed."""
        if not self.unconfirmed:  # most records send nothing that needs confirming
            return
        pending, self.unconfirmed = self.unconfirmed, []
        await asyncio.gather(*pending)


def finished_runs(emits: Sequence[Emit], turns: bool = False) -> list[str]:
    """The runs that ``emits`` finish: one final message each, or with the result latch on
    (``turns``), one turn record each (a run whose final message is out waits for its
    results: its head stays open, so that a take-over replays it)."""
    topic = Topic.TURNS if turns else Topic.FINAL
    return [e.key for e in emits if e.topic is topic and e.key is not None]


def replay(state: PartitionState, open_runs: Mapping[bytes, int], record: Record
           ) -> list[Emit]:
    """Feed one record of a rebuild: only ticks and the records of the runs with an open head
    (``open_runs``: key -> its start offset), from that start on, count (a finished run's
    records are known to the heads; a record of a run before its head's start was read when
    the run had not started, and changed nothing it holds now); progress records are never
    kept."""
    key = record.key
    if key != TICK:
        start = open_runs.get(key) if key is not None else None
        if start is None or record.source.offset < start:
            return []
    return [e for e in state.apply(record) if e.topic is not Topic.PROGRESS]


def refinished(partition: int, replayed: Sequence[Emit], turns: bool = False) -> list[Emit]:
    """The emits of the runs that finished during a rebuild (``turns``: as
    :func:`finished_runs`): they lost their ``done`` head, so their outcomes are published
    again (the same bytes) and recorded. Expected never to happen; logged if it does."""
    runs = set(finished_runs(replayed, turns))
    if runs:
        log.warning("partition %d: %d runs finished during the rebuild without a done head; "
                    "publishing their outcomes again", partition, len(runs))
    return [e for e in replayed if e.key in runs]


#: What :meth:`Heads.take` returns for a table that writes at once (never written to).
_NONE: list[Any] = []


class Heads:
    """The run heads of the partitions one worker owns, over the engine's table."""

    def __init__(self, table: MutableMapping[bytes, Any], retention_s: float) -> None:
        self.table = table
        self.retention_ms = retention_s * 1000
        self._take = getattr(table, "take_pending", None)

    def take(self) -> list[Any]:
        """The writes the table staged since the last call, for the engine to write once
        the outputs before them are delivered (its ``take_pending``: the kafka engine's
        changelog records, the faust engine's table writes); none for a table that writes
        at once (a dict)."""
        take = self._take
        return _NONE if take is None else take()

    def opened(self, key: bytes, partition: int, offset: int, policy: int | None = None
               ) -> None:
        """A run opened at ``offset``: a rebuild starts reading there, with policy set version
        ``policy`` in force (None: none). (It replaces the head of a cancel that waited for
        it: a run that opens did not take that cancel, which the core let go, so its rebuild
        must not read it again.)"""
        head: dict[str, Any] = {"p": partition, "start": offset}
        if policy is not None:
            head[POLICY_AT] = policy
        self.table[key] = head

    def applied(self, state: PartitionState, key: bytes | None, partition: int, offset: int,
                opened: bool, emits: Sequence[Emit]) -> None:
        """The heads of the record at ``offset``, just applied (``opened``: it opened its
        run): the run's ``start``, or, for a cancel that the core now holds for a run not
        started yet, ``{"p", "start", "cancel": true}`` at the cancel's offset (a run with a
        head already, a finished one, keeps it). Per record otherwise: a test of ``emits``
        and of the core's count of such cancels, which is 0 almost always."""
        if opened and key is not None:  # (a run that opens has a key)
            self.opened(key, partition, offset, state.policy_version)
            state.waiting.discard(key)
            return
        if emits or not state.assembler.early_cancels_waiting or key is None or key == TICK \
                or key in state.waiting:
            return
        if state.assembler.early_cancel_pending(key.decode("utf-8", "replace")):
            state.waiting.add(key)
            if self.table.get(key) is None:
                head: dict[str, Any] = {"p": partition, "start": offset, "cancel": True}
                if state.policy_version is not None:
                    head[POLICY_AT] = state.policy_version
                self.table[key] = head

    def finished(self, state: PartitionState, partition: int, run_ids: Sequence[str],
                 read_to: int | None = None) -> None:
        """Record runs as finished; their outputs must be confirmed first. ``read_to``: the
        offset before which the partition's records were applied (``"o"``: a decision read
        again from below it, after a take-over, is a repeat, not a second decision)."""
        for run_id in run_ids:
            seq, status = state.assembler.finished(run_id) or (None, None)
            key = run_id.encode()
            head: dict[str, Any] = {"p": partition, "done": True, "seq": seq,
                                    "status": status, "at": state.clock_ms}
            if read_to is not None:
                head["o"] = read_to
            decided = state.assembler.decided.get(run_id)
            if decided:  # (a decision forwarded twice is then a repeat after a take-over)
                head["d"] = [list(c) for c in sorted(decided)]
            pairing = state.assembler.pairing
            closed = pairing.closed_calls(run_id) if pairing is not None else None
            if closed is not None and (closed[0] or closed[1]):
                head["r"] = [closed[0], closed[1]]  # (a late result is named so after one)
            # one assignment, whole: a faust table writes its changelog record when a key is
            # set, so a head changed in place after that would differ from its changelog's
            self.table[key] = head
            state.done.append((state.clock_ms, key))

    def forget_finished(self, state: PartitionState) -> None:
        """At a tick: tombstone the done heads older than the retention, by record time (the
        same on every worker), and the heads of cancels that no longer wait for their run
        (the core, at this tick, let go those older than ``early_cancel_ttl_s``)."""
        horizon = state.clock_ms - self.retention_ms
        while state.done and state.done[0][0] < horizon:
            _, key = state.done.popleft()
            head = self.table.get(key)
            if head is not None and head.get("done"):
                del self.table[key]
        if state.waiting:
            assembler = state.assembler
            for key in [k for k in state.waiting
                        if not assembler.early_cancel_pending(k.decode("utf-8", "replace"))]:
                state.waiting.discard(key)
                head = self.table.get(key)
                if head is not None and head.get("cancel"):  # not replaced by its run's
                    del self.table[key]

    def load(self, state: PartitionState, partition: int) -> dict[bytes, int]:
        """Register the partition's finished runs with its assembler; return its open runs
        (and runs with a cancel waiting for them) and the offsets where they start."""
        open_runs: dict[bytes, int] = {}
        done: list[tuple[int, bytes]] = []
        for key, head in self.table.items():
            if head.get("p") != partition:
                continue
            if "start" in head:
                open_runs[key] = head["start"]
                if head.get("cancel"):  # a cancel waiting for its run: replayed from there
                    state.waiting.add(key)
                hold = head.get("hold")  # a run held for its toolset (hold.py)
                if hold == HOLD_WAIT:  # its records are parked again, not applied
                    state.holds.hold(key, None)
                elif hold == HOLD_REFUSED:  # applied again without its toolset
                    state.holds.refused.add(key)
            elif head.get("seq") is not None:
                read_to = head.get("o")
                state.assembler.remember_finished(
                    key.decode(), head["seq"], RunStatus(head["status"]),
                    read_to if type(read_to) is int else None, _controls(head.get("d")))
                closed = head.get("r")
                pairing = state.assembler.pairing
                if pairing is not None and _is_closed(closed):
                    pairing.remember_closed(key.decode(), [(c, p, o) for c, p, o in closed[0]],
                                            closed[1])
                done.append((head.get("at", 0), key))
        state.done.extend(sorted(done))
        return open_runs


def _is_closed(value: Any) -> bool:
    """Whether a done head's ``r`` is [answered [id, partition, offset]s, timed-out ids]."""
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(ids, list) for ids in value)
            and all(isinstance(a, list) and len(a) == 3 and isinstance(a[0], str)
                    and type(a[1]) is int and type(a[2]) is int for a in value[0])
            and all(isinstance(i, str) for i in value[1]))


def _controls(value: Any) -> list[tuple[int, int]] | None:
    """A ``done`` head's ``"d"``: the control records whose decisions the run applied."""
    if not isinstance(value, list):
        return None
    return [(c[0], c[1]) for c in value
            if isinstance(c, list) and len(c) == 2 and all(type(n) is int for n in c)]
