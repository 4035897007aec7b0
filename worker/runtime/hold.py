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
* The registry is the operator's (``latch registry put``): it only decides *when* a hold ends.
* Ticks and policy markers are the worker's own; they are never parked (a tick or a marker
  is the partition's, not a run's).

Bounds: the parked records of one partition are at most ``registry.hold_max_records``
records and ``registry.hold_max_bytes`` bytes (keys and values, plus :data:`OVERHEAD` each).
A record that would pass either ends the hold of the run that holds the most bytes (the
flooding one, not its neighbours): that run is applied at once as if its toolset version
had not come in time, so every call of it fails ``unknown_toolset`` (one error result
each) and the run's head says so (``"hold": "refused"``) for a rebuild to decide the same.

The events log stays the history: a held run's head is ``{"p", "start", "hold": "wait"}``,
committed with the offsets past its records; a takeover reads the run's records from its
``start`` again and parks them here rather than applying them (their outputs were never
made), and the new owner releases them when the answer is final.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from worker.runtime.step import Record

__all__ = ["HOLD_REFUSED", "HOLD_WAIT", "OVERHEAD", "HeldRun", "Holds", "Parked", "toolset_of"]

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
