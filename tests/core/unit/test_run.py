"""``core/run.py``'s :class:`Run`, driven alone (issue 24 item 3): a run owns its calls and its
end, and reaches its partition only through the :class:`Ledger` passed in (the bytes held
against ``max_buffered_bytes``, the counters, the ``make_room`` and ``forget`` hooks) and the
:class:`Rules`. No assembler here: the hooks are the test's."""

from __future__ import annotations

from typing import Any

from builders import CHAT, chat_chunk, chat_tool, chat_tool_delta, run_start

from worker.core import ops as op
from worker.core.envelope import RunStart, checked
from worker.core.latch import Latch
from worker.core.ledger import Ledger, Rules
from worker.core.model import CallState, Emit, Reason, RunStatus, Topic
from worker.core.providers import adapter_for
from worker.core.run import Run
from worker.core.settings import AssembleSettings
from worker.core.tools import ValidatorCache, client_tools


class Partition:
    """The test's side of the ledger: records what the run asked of its partition."""

    def __init__(self, limit: int) -> None:
        self.rooms: list[tuple[Run, int]] = []
        self.forgotten: list[Run] = []
        self.ledger = Ledger(limit, self.make_room, self.forgotten.append)

    def make_room(self, run: Run, growth: int) -> list[Emit]:
        self.rooms.append((run, growth))
        self.ledger.held -= growth  # as if another run had been ended for it
        return []


def new_run(partition: Partition, **settings: Any) -> Run:
    """A chat run with one client tool ``f`` (no schema)."""
    config = AssembleSettings(**settings)
    start = checked(run_start("r", CHAT, [chat_tool("f", {})]), b"r", b"")
    assert isinstance(start, RunStart)
    cache = ValidatorCache()
    tools = {name: cache.prepare(schema) for name, schema in
             client_tools(start.provider, start.tools).items()}
    adapter = adapter_for(start.provider, start.run_id)
    latch = Latch(config, tools, config.max_tool_calls_per_run)
    return Run(start, adapter, latch, 0, b"r", partition.ledger, Rules(config))


def event(run: Run, chunk: dict[str, Any]) -> list[Emit]:
    return run.provider_event(chunk, b"r", b"", None)


def test_a_run_accounts_its_bytes_to_the_ledger_and_is_forgotten_at_its_end() -> None:
    """Argument text is counted in the run's ``nbytes`` and the ledger's ``held``; at the
    run's end every call gets its outcome, the bytes are released, the partition is told once
    (``forget``) and the run's status and counters are set."""
    partition = Partition(limit=1 << 20)
    run = new_run(partition, emit_progress=False)
    assert event(run, chat_chunk([chat_tool_delta(0, "call_1", "f", "")])) == []
    assert event(run, chat_chunk([chat_tool_delta(0, arguments='{"a": 1}')])) == []
    assert run.nbytes == partition.ledger.held == len('{"a": 1}')
    assert event(run, chat_chunk(finish_reason="tool_calls")) == []
    emits = run.stream_end()
    assert [e.topic for e in emits] == [Topic.COMMITTED, Topic.AUDIT, Topic.FINAL]
    assert run.status is RunStatus.COMPLETED and partition.forgotten == [run]
    assert partition.ledger.held == 0
    assert partition.ledger.stats["runs_completed"] == 1


def test_a_fragment_that_crosses_the_partition_budget_asks_the_partition_for_room() -> None:
    """A fragment that fits the run but not the partition's budget asks ``make_room`` for
    exactly its bytes, then is kept; one the run alone cannot hold fails its call
    ``budget_exceeded`` without asking anybody."""
    partition = Partition(limit=10)
    run = new_run(partition, emit_progress=False)
    event(run, chat_chunk([chat_tool_delta(0, "call_1", "f", "")]))
    partition.ledger.held = 6  # other runs hold 6 bytes (the fake make_room frees 7 of them)
    event(run, chat_chunk([chat_tool_delta(0, arguments='{"a":1}')]))
    assert partition.rooms == [(run, 7)] and run.nbytes == 7
    event(run, chat_chunk([chat_tool_delta(0, arguments="x" * 5)]))
    assert len(partition.rooms) == 1
    call = run.calls["0.0"]
    assert call.state is CallState.FAILED and call.reason is Reason.BUDGET_EXCEEDED
    assert run.nbytes == 0 and partition.ledger.stats["calls_over_buffered_bytes"] == 1


def test_a_late_op_for_a_decided_call_changes_nothing() -> None:
    """After its outcome, a call's late close, restated-as-failed or refused text is a defined
    outcome: nothing changes and nothing raises (the table refuses the move)."""
    partition = Partition(limit=1 << 20)
    run = new_run(partition, emit_progress=False, execute_before_stream_end=True,
                  allow_pipelined_execute=("f",))
    event(run, chat_chunk([chat_tool_delta(0, "call_1", "f", "{}")]))
    assert [e.topic for e in run._apply(op.CloseCall("0.0"))] == [Topic.COMMITTED, Topic.AUDIT]
    call = run.calls["0.0"]
    assert run._apply(op.CloseCall("0.0")) == []
    assert not call.fail(Reason.STREAM_ERROR, "late")
    assert not call.duplicate("late")
    assert call.state is CallState.COMMITTED and call.reason is None
