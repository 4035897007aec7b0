"""A partition taken over: its state rebuilt from its heads and its log, for both engines.

Engine-neutral (no I/O): the engine reads, the driver decides. The whole sequence is one
generator (:func:`rebuild`) that each engine drives with its own reads, the way
``aioquic``'s connection is handed datagrams and never reads a socket itself::

    rebuild = driver.rebuild(topic, partition, resume)
    read = next(rebuild)                       # what to read: records start..end (excluded)
    for chunk in chunks(read):                 # the engine's reads, in offset order
        rebuild.send(chunk)
    rebuilt = takeover.end(rebuild)            # read through: the state, and what to send

1. **Begin** (:func:`begin`): a fresh state at offset ``resume``, its finished runs
   registered from the heads (:meth:`Heads.load`), the policy set in force at the first
   record to read (:func:`in_force_at`), the run's hold bounds; the engine's readiness and
   rebuild metrics around the whole read (:meth:`EngineHooks.rebuilding`).
2. **Read**: the generator yields :class:`Read`, the records of the open runs from the
   earliest open ``start`` up to ``resume`` (an empty range when none is open), and is
   sent them in chunks (:meth:`Takeover.feed`: their outputs kept only to find the runs
   that finished during it; a held run's records parked again; a policy marker changes the
   policy in force). An empty chunk ends the read.
3. **Rebuilt** (:func:`rebuilt`): logged; the runs that finished during the rebuild lost
   their ``done`` head (never expected: logged), so their outcomes are prepared again, the
   same bytes, and their ``done`` heads staged: the generator returns :class:`Rebuilt`, the
   state and the :class:`~worker.runtime.driver.Work` the engine sends and writes (in one
   transaction, or heads after the outputs are confirmed) before it applies the partition.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, NamedTuple, cast

from worker.core import Assembler, Emit, Topic
from worker.runtime import hold
from worker.runtime import partition as partition_module
from worker.runtime.governance.registry import POLICY_MARKER, in_force, policy_head_key
from worker.runtime.hold import Holds
from worker.runtime.observability import logs
from worker.runtime.partition import PartitionState, head_policy
from worker.runtime.step import Record

if TYPE_CHECKING:  # (the driver imports this module: its types only)
    from worker.runtime.driver import Driver, Work

__all__ = [
    "Read",
    "Rebuild",
    "Rebuilt",
    "Takeover",
    "begin",
    "end",
    "in_force_at",
    "rebuild",
    "rebuilt",
]

log = logging.getLogger("latch.worker")


class Read(NamedTuple):
    """What a rebuild asks its engine to read: ``topic[partition]`` from ``start`` up to
    ``end`` (excluded), sent back in offset order."""

    topic: str
    partition: int
    start: int
    end: int


class Rebuilt(NamedTuple):
    """What a rebuild returns: the partition's state at its resume offset, and what the
    engine sends and writes before it applies the partition's next record."""

    state: PartitionState
    work: Work


#: The takeover as its engine drives it (:func:`rebuild`).
Rebuild = Generator[Read | None, Sequence[Record], Rebuilt]


class Takeover:
    """One partition being rebuilt: a fresh state at offset ``resume``, its heads loaded; the
    log is read from :attr:`start` (None: nothing to read) up to ``resume``, each record
    fed to :meth:`feed`."""

    __slots__ = ("count", "marker", "open_runs", "partition", "replayed", "resume", "start",
                 "state")

    def __init__(self, state: PartitionState, partition: int, resume: int,
                 open_runs: dict[bytes, int],
                 marker: Callable[[PartitionState, Record], object] | None = None) -> None:
        self.state, self.partition, self.resume, self.open_runs = \
            state, partition, resume, open_runs
        starts = [start for start in open_runs.values() if start < resume]
        self.start: int | None = min(starts) if starts else None
        self.count = 0
        self.replayed: list[Emit] = []
        self.marker = marker

    def feed(self, record: Record) -> None:
        """One record of the rebuild (:func:`partition.replay`: its outputs are kept only to
        find the runs that finished during it; a policy marker changes the policy in force)."""
        self.count += 1
        key, state = record.key, self.state
        if key == POLICY_MARKER:
            if self.marker is not None:
                self.marker(state, record)
            return
        holds = state.holds
        if key is not None and key in holds.runs:  # held when the offset was committed
            if record.source.offset >= self.open_runs.get(key, 0):
                holds.park(key, record, None, state.policy_version, state.assembler.policy)
            return
        holds.refusing = key is not None and key in holds.refused
        try:
            self.replayed += partition_module.replay(state, self.open_runs, record)
        finally:
            holds.refusing = False


def rebuild(driver: Driver, topic: str, partition: int, resume: int) -> Rebuild:
    """The takeover of ``partition`` at offset ``resume`` (module doc): yields one
    :class:`Read`, is sent its records in chunks (an empty one ends it), returns
    :class:`Rebuilt`."""
    with driver.hooks.rebuilding(partition) as measured:
        takeover = begin(driver, partition, resume)
        start = resume if takeover.start is None else takeover.start
        chunk = yield Read(topic, partition, start, resume)
        while chunk:
            for record in chunk:
                takeover.feed(record)
            chunk = yield None
        measured.state, measured.records = takeover.state, takeover.count
    state = takeover.state
    outputs = rebuilt(takeover, topic)
    from worker.runtime.driver import Work  # (the driver imports this module)

    work = Work()
    if outputs:  # published again (a DLQ record is not), then recorded
        work.out.extend(driver.outgoing(None, [e for e in outputs if e.topic is not Topic.DLQ],
                                        driver.names))
        driver.refinished(state, partition, outputs)
        work.heads = driver.heads.take()
    return Rebuilt(state, work)


def begin(driver: Driver, partition: int, resume: int) -> Takeover:
    """A fresh state for ``partition`` at offset ``resume``: its finished runs registered
    from the heads, its open runs' records to read from :attr:`Takeover.start`."""
    assembler = Assembler(driver.assemble)
    assembler.policy = driver.policies.initial()
    assembler.approvals.approvers = driver.approvers
    if assembler.pairing is not None:  # the result latch: the operator's redaction rules
        assembler.pairing.redact = driver.redact
        assembler.pairing.redactions = driver.hooks.metrics.redactions
    state = PartitionState(assembler, next_offset=resume)
    bounds = driver.config.registry
    state.holds = Holds(bounds.hold_max_records, bounds.hold_max_bytes)
    heads = driver.heads
    takeover = Takeover(state, partition, resume, heads.load(state, partition),
                        driver.set_policy)
    if driver.registry is not None:
        state.assembler.toolsets = hold.refusable(state.holds, driver.registry.toolsets)
    head = heads.table.get(policy_head_key(partition))
    history = head.get("policy") if isinstance(head, dict) else None
    state.policy_history = list(history) if isinstance(history, list) else []
    version = in_force_at(driver, takeover)
    if version is not None:
        driver.put_in_force(state, version)
    return takeover


def in_force_at(driver: Driver, takeover: Takeover) -> int | None:
    """The policy set version in force at the rebuild's first record: the one the head of
    the run that starts there names (``partition.POLICY_AT``: however many markers ago
    it was put in force), else the latest marker before it that the partition's policy
    head remembers (a head written before heads named it; nothing to read: at
    ``resume``). Both are the previous owner's heads, which this worker trusts as its
    own (the changelog only workers write, decision 0001)."""
    start = takeover.start
    if start is not None:
        for key, at in takeover.open_runs.items():
            if at == start:
                version = head_policy(driver.heads.table.get(key))
                if version is not None:
                    return version
    return in_force(takeover.state.policy_history,
                    takeover.resume if start is None else start)


def rebuilt(takeover: Takeover, topic: str) -> list[Emit]:
    """The rebuild is read: log it; return the outputs of runs that finished during it
    (they lost their ``done`` head: published again, then recorded)."""
    partition, resume = takeover.partition, takeover.resume
    holds = takeover.state.holds
    holds.refused.clear()  # (only the rebuild applies them again)
    log.info("partition %d: rebuilt before offset %d from %d records; %d runs open%s",
             partition, resume, takeover.count, takeover.state.assembler.open_runs,
             f", {len(holds.runs)} held for their toolset" if holds.runs else "",
             extra=logs.where(topic, partition, resume))
    return partition_module.refinished(partition, takeover.replayed,
                                       takeover.state.assembler.pairing is not None)



#: Records an engine sends a rebuild at a time (it may pause between chunks). The engine
#: sends them: a rebuild never pulls from a reader (the engine's I/O) itself.
CHUNK = 1000


def end(rebuild: Rebuild) -> Rebuilt:
    """End a rebuild's read (an empty chunk): what it returns."""
    try:
        rebuild.send(())
    except StopIteration as done:
        return cast(Rebuilt, done.value)
    raise RuntimeError("a rebuild went on after its read ended")
