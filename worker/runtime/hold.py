"""Runs held for a registry toolset version, per events partition (issue 32, item 5).

A ``run.start`` that names ``{"toolset": NAME, "version": N}`` whose answer is not final yet
(:meth:`RegistryState.settled`: the version not read, nor a registry record appended after
the run's deadline) holds *that run only*: the driver parks the run's records here, in
order, and applies every other run's records as they come. Once the registry's answer is
final (:meth:`RegistryReader.ready`), the driver applies the parked records, in order, each
with the policy set that was in force at its own position in the log
(:meth:`worker.runtime.driver.Driver.apply_all`). Decision 0014 says why and what it costs.

Who sends what:

* The ``run.start`` and the run's later records are the gateway's (a tenant's run). What is
  trusted: the run id (the record key) names the run; nothing else. A ``run.start`` for a
  run that is open or finished already opens no hold (it cannot stall a run that exists,
  whoever sends it); a record that is not a ``run.start`` never opens one (the tenant's
  text cannot: in JSON, a quote inside a string is escaped, so ``"toolset"`` appears only as a
  key or a whole string, and the envelope is parsed before it counts).
* Many run.starts naming missing versions (a tenant's, or a flood) make as many held
  runs, within the bounds below; past them the run holding the most bytes is refused (with
  runs of one record each, the first held of them): a flood ends its own holds first, and
  can at worst end other runs' holds early, never stall the partition.
* The registry is the operator's (``latch registry put``): it only decides *when* a hold ends.
* Ticks and policy markers are the worker's own; they are never parked (a tick or a marker
  is the partition's, not a run's).

Bounds: the parked records of one partition are at most ``registry.hold_max_records``
records and ``registry.hold_max_bytes`` bytes (keys and values, plus :data:`OVERHEAD` each).
A record that would pass either ends the hold of the run that holds the most bytes (the
flooding one, not its neighbours): that run is applied at once as if its toolset version
had not come in time, so every call of it fails ``unknown_toolset`` (one error result
each) and the run's head says so (``"hold": "refused"``) for a rebuild to decide the same.

The rules live here too, as functions of the driver (:func:`held`, called by
:meth:`Driver.apply_all` for a record of a partition with held runs or naming a toolset):
what begins a hold, when one ends, what a bound does.

The events log stays the history: a held run's head is ``{"p", "start", "hold": "wait"}``,
committed with the offsets past its records; a takeover reads the run's records from its
``start`` again and parks them here rather than applying them (their outputs were never
made), and the new owner releases them when the answer is final.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from worker.core.envelope import TICK_KEY
from worker.runtime.observability import logs
from worker.runtime.step import Record

if TYPE_CHECKING:  # (the driver imports this module: its types only)
    from worker.runtime.driver import Driver
    from worker.runtime.partition import PartitionState

__all__ = ["HOLD_REFUSED", "HOLD_WAIT", "OVERHEAD", "HeldRun", "Holds", "Parked", "held",
           "refusable", "toolset_of"]

log = logging.getLogger("latch.worker")

TICK = TICK_KEY.encode()

#: The ``"hold"`` of a held run's head: its records are parked.
HOLD_WAIT = "wait"
#: The ``"hold"`` of a run whose hold passed the bounds: its toolset is unknown to it.
HOLD_REFUSED = "refused"
#: Bytes counted per parked record on top of its key and value (the objects that hold it).
OVERHEAD = 200


class Parked(NamedTuple):
    """One parked record, with what was in force at its position."""

    record: Record
    #: The record's Kafka headers (or a function returning them): kept for the run's first
    #: record only (read when a record opens its run), else None.
    headers: Any
    #: The policy set version and the policy in force at its position.
    policy_version: int | None
    policy: Any


@dataclass(slots=True)
class HeldRun:
    """One run's parked records, in order, and the toolset it waits for."""

    #: ``(name, version, run.start record time)`` (None: its run.start not parked yet, as
    #: in a rebuild that met a cancel of the run first).
    toolset: tuple[str, int, int] | None
    records: list[Parked] = field(default_factory=list)
    size: int = 0


class Holds:
    """The held runs of one events partition (module doc)."""

    __slots__ = ("_parks", "_sizes", "bytes", "checked_ms", "max_bytes", "max_records",
                 "records", "refused", "refusing", "runs")

    def __init__(self, max_records: int = 10_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_records, self.max_bytes = max_records, max_bytes
        #: The held runs by key, in the order their holds began.
        self.runs: dict[bytes, HeldRun] = {}
        #: Parked records and bytes, over every held run.
        self.records = 0
        self.bytes = 0
        #: The record time at which the driver last asked whether a hold can end.
        self.checked_ms = 0
        #: Runs whose head says their hold was refused (a rebuild applies them so again).
        self.refused: set[bytes] = set()
        #: Set while the driver applies a refused run's records: the toolset lookup answers
        #: "unknown" (:meth:`Driver.toolsets`).
        self.refusing = False
        #: (-size, park count, key) per park: :meth:`largest` in O(log n), stale ones skipped.
        self._sizes: list[tuple[int, int, bytes]] = []
        self._parks = 0

    def hold(self, key: bytes, toolset: tuple[str, int, int] | None) -> HeldRun:
        """Begin holding run ``key`` (or the run held already)."""
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = HeldRun(toolset)
        return run

    def park(self, key: bytes, record: Record, headers: Any, policy_version: int | None,
             policy: Any) -> None:
        """Park ``record`` behind its run's earlier ones (the run is held)."""
        run = self.runs[key]
        if run.toolset is None and b'"toolset"' in record.value and record.time_ms is not None:
            named = toolset_of(record.value)
            if named is not None:
                run.toolset = (*named, record.time_ms)
        size = len(record.value) + len(key) + OVERHEAD
        run.records.append(Parked(record, headers if not run.records else None,
                                  policy_version, policy))
        run.size += size
        self.records += 1
        self.bytes += size
        self._parks += 1
        if len(self._sizes) > 2 * self.records + 64:  # mostly stale: keep it in bounds
            self._sizes = [(-r.size, 0, k) for k, r in self.runs.items()]
            heapq.heapify(self._sizes)
        heapq.heappush(self._sizes, (-run.size, self._parks, key))

    def over(self) -> bool:
        """Whether the parked records pass a bound."""
        return self.records > self.max_records or self.bytes > self.max_bytes

    def largest(self) -> bytes:
        """The held run with the most parked bytes (a run held: the bounds are passed)."""
        sizes = self._sizes
        while True:
            size, _, key = sizes[0]
            run = self.runs.get(key)
            if run is not None and run.size == -size:
                return key
            heapq.heappop(sizes)  # a run released, or grown since

    def release(self, key: bytes) -> HeldRun:
        """Stop holding run ``key``: its parked records, for the driver to apply."""
        run = self.runs.pop(key)
        self.records -= len(run.records)
        self.bytes -= run.size
        return run

    def due(self, tick: bool, now_ms: int | None) -> bool:
        """Whether to ask now if the holds can end: at a tick, and at most every
        :data:`CHECK_EVERY_MS` of record time otherwise (a dict lookup per held run each
        time; a record of a held run asks for its own run only: :meth:`Driver._held`)."""
        if tick:
            return True
        if now_ms is not None and now_ms - self.checked_ms >= CHECK_EVERY_MS:
            self.checked_ms = now_ms
            return True
        return False


#: Record time between two looks at whether a hold can end (other than at ticks).
CHECK_EVERY_MS = 250


def toolset_of(value: bytes) -> tuple[str, int] | None:
    """The ``(name, version)`` a ``run.start`` envelope names in ``tools`` (None: not such a
    record). Parsed as JSON: the same reading as the core's envelope parser gives."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    tools = doc.get("tools") if isinstance(doc, dict) and doc.get(
        "type") == "run.start" else None
    if not isinstance(tools, dict):
        return None
    name, version = tools.get("toolset"), tools.get("version")
    if not isinstance(name, str) or type(version) is not int:
        return None
    return name, version


# -- the driver's rules for held runs (Driver.apply_all) ----------------------------------


def held(driver: Driver, state: PartitionState, record: Record, headers: Any) -> bool:
    """:meth:`Driver.apply_all` for a record of a partition with held runs, or naming a toolset:
    first the held runs whose answer is final now are applied; then the record is parked
    (True) if its run is held or its ``run.start`` begins a hold, else left to the caller
    to apply (False). A hold that passes the partition's bounds ends for the run with the
    most bytes (:func:`_release`, refused)."""
    holds, key = state.holds, record.key
    if holds.refusing:  # (a refused run's records: applied as they are)
        return False
    if holds.runs:  # (its own run's record asks for that run only: O(1) a record)
        if holds.due(key == TICK, record.time_ms):
            _release_ready(driver, state, list(holds.runs))
        elif key in holds.runs:
            _release_ready(driver, state, [key])
    if key is None or key == TICK:
        return False
    if key in holds.runs:
        holds.park(key, record, headers, state.policy_version, state.assembler.policy)
    elif not _begins(driver, state, record):  # (else its head says it is held: a takeover
        return False                          # parks its records again)
    while holds.over():
        _release(driver, state, holds.largest(), refuse=True)
    return True


def _begins(driver: Driver, state: PartitionState, record: Record) -> bool:
    """Whether ``record`` is a ``run.start`` naming a toolset whose answer is not final,
    of a run neither open nor finished (a run that exists is never held): if so its
    hold begins, the record parked, its head written (``"hold": "wait"``)."""
    registry, key = driver.registry, record.key
    wanted = None if registry is None else registry.unsettled(record.value, record.time_ms)
    if wanted is None or key is None:
        return False
    head = driver.heads.table.get(key)
    if (head is not None and "start" not in head) or state.assembler.is_open(
            key.decode("utf-8", "replace")):
        return False
    source, holds = record.source, state.holds
    holds.hold(key, wanted)
    holds.park(key, record, None, state.policy_version, state.assembler.policy)
    # (a cancel that waits for the run keeps its head's start: a rebuild reads it too)
    base = head if head is not None else {"p": source.partition, "start": source.offset}
    if state.policy_version is not None:  # (a rebuild from here starts with it: driver.py)
        from worker.runtime.partition import POLICY_AT  # (partition imports this module)
        base = {**base, POLICY_AT: state.policy_version}
    driver.heads.table[key] = {**base, "hold": HOLD_WAIT}
    return True


def _release_ready(driver: Driver, state: PartitionState, keys: list[bytes]) -> None:
    """Apply those of the held runs ``keys`` whose registry answer is final now (or was
    never asked), in the order their holds began."""
    registry, runs = driver.registry, state.holds.runs
    ready = []
    for key in keys:
        toolset = runs[key].toolset
        if toolset is None or registry is None or registry.ready(*toolset):
            ready.append(key)
    for key in ready:
        if key in runs:  # (not ended meanwhile)
            _release(driver, state, key, refuse=False)


def _release(driver: Driver, state: PartitionState, key: bytes, refuse: bool) -> None:
    """End run ``key``'s hold: apply its parked records in order, each with the policy set
    in force at its position; ``refuse``: its toolset counts as unknown (the bounds),
    which its head keeps for a rebuild. Then its head: no hold left."""
    holds = state.holds
    run = holds.release(key)
    if not run.records:
        return
    last = run.records[-1].record
    partitions = {last.source.partition: state}
    in_force = state.policy_version, state.assembler.policy
    for parked in run.records:
        state.policy_version, state.assembler.policy = parked.policy_version, parked.policy
        holds.refusing = refuse
        try:
            driver._apply(partitions, (parked.record,), (parked.headers,), False)
        finally:
            holds.refusing = False
            state.policy_version, state.assembler.policy = in_force
    table = driver.heads.table
    head = table.get(key)
    if head is not None and head.get("hold") == HOLD_WAIT:  # the run did not open
        rest = {k: v for k, v in head.items() if k != "hold"}
        if rest.get("cancel"):
            table[key] = rest
        else:
            del table[key]
    elif refuse and head is not None and "start" in head:
        table[key] = {**head, "hold": HOLD_REFUSED}
    if refuse:
        log.warning("partition %d: a run held for its toolset passed the hold's bounds "
                    "(registry.hold_max_records, hold_max_bytes); its calls fail "
                    "unknown_toolset", last.source.partition,
                    extra=logs.where(last.source.topic, last.source.partition,
                                     last.source.offset))


def refusable(holds: Holds, lookup: Callable[[str, int, int], Any]
              ) -> Callable[[str, int, int], Any]:
    """The partition's toolset lookup: the registry's, but "unknown" (None) while the driver
    applies a run whose hold was refused (:attr:`Holds.refusing`)."""
    def toolsets(name: str, version: int, at_ms: int) -> Any:
        return None if holds.refusing else lookup(name, version, at_ms)
    return toolsets
