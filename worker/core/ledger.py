"""What one partition's open runs share: the :class:`Ledger` and the :class:`Rules`.

Each :class:`~worker.core.run.Run` of a partition is passed the same two small objects by its
:class:`~worker.core.assembler.Assembler`: the ledger (the bytes all open runs hold against
``max_buffered_bytes``, the counters, the policy in force, and the partition's hooks to make
room, to forget an ended run and to park one whose calls wait for approval) and the rules (the
settings a run reads, copied once per partition).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from worker.core.envelope import RecordSource, Rejected, RunStart
from worker.core.model import Emit
from worker.core.outputs import Outputs, dlq_record
from worker.core.policy import Policy
from worker.core.settings import DROP_WITH_PROTOCOL_REPAIR, AssembleSettings

if TYPE_CHECKING:
    from worker.core.run import Run

__all__ = ["Ledger", "Rules"]


class Ledger:
    """The accounts one partition's open runs share: the bytes they hold (``held``) against
    ``max_buffered_bytes`` (``limit``), the partition's counters (``stats``) and the argument
    bytes of each call the latch checks (``sizes``, when a list), and the partition's two hooks:
    ``make_room(run, growth)`` ends the least recently active runs other than ``run`` until
    ``growth`` more bytes fit, and ``forget(run)`` is told when a run has ended."""

    __slots__ = ("at", "forget", "held", "limit", "make_room", "park", "policy", "sizes",
                 "stats")

    def __init__(self, limit: int, make_room: Callable[[Run, int], list[Emit]],
                 forget: Callable[[Run], None]) -> None:
        self.held = 0
        self.limit = limit
        self.make_room = make_room
        self.forget = forget
        self.stats: Counter[str] = Counter()
        self.sizes: list[int] | None = None
        #: The policy in force for the partition's calls (``Assembler.policy``), read when a
        #: call is decided; None: no policy (``policy.mode: off``).
        self.policy: Policy | None = None
        #: Where the record being applied was read (None: unknown, ``latch assemble``): the
        #: last offset of a ``run.ended`` record (``ending.run_ended``).
        self.at: RecordSource | None = None
        #: Told when a run's stream ended with calls still waiting for approval: the run's
        #: final message waits for their decisions (None: nobody to tell).
        self.park: Callable[[Run], None] | None = None

    def reject(self, rejected: Rejected, key: bytes | None, value: bytes,
               source: RecordSource | None) -> Emit:
        """The DLQ record of an input record, counted."""
        self.stats[f"dlq_{rejected.reason}"] += 1
        return dlq_record(rejected, key, value, source)


class Rules:
    """The settings a run reads, copied out of :class:`AssembleSettings` once per partition
    (read for every fragment: compiled, a setting is an attribute of a Python object)."""

    __slots__ = ("argument_bytes", "audit_key", "choices", "drop_invalid", "early",
                 "echo_tenants", "in_flight", "partial_args", "pipelined", "progress",
                 "text_bytes")

    def __init__(self, settings: AssembleSettings) -> None:
        self.argument_bytes = settings.max_tool_argument_bytes
        self.text_bytes = settings.max_run_text_bytes
        self.progress = settings.emit_progress
        self.partial_args = settings.ui_forward_partial_args
        self.early = settings.execute_before_stream_end
        self.pipelined = frozenset(settings.allow_pipelined_execute)
        self.in_flight = settings.max_tool_calls_in_flight_assemble
        self.choices = settings.max_choices_per_run
        #: Leave calls failing ``invalid_json`` out of the final message (``on_invalid_json``).
        self.drop_invalid = settings.on_invalid_json == DROP_WITH_PROTOCOL_REPAIR
        #: Tenants whose ``invalid_json`` error results echo the text sent (None never is).
        self.echo_tenants: frozenset[str | None] = frozenset(settings.echo_invalid_input_tenants)
        #: The key of the audit records' argument digests (None: size only).
        self.audit_key = settings.audit_key

    def outputs(self, start: RunStart) -> Outputs:
        """The builder of the output records of the run ``start`` opens, under these rules."""
        return Outputs(start, self.drop_invalid, start.tenant in self.echo_tenants,
                       self.audit_key)
