"""Budgets as written, parked runs included (issue 32 item 9; docs/contract.md: memory is
budgeted per events partition; assembler's module docstring, "Memory budgets").

The open-run budget (``max_open_runs``) ends the least recently active run, and the byte
budget (``max_buffered_bytes``) the least recently active runs holding bytes: a run parked on
approval (its stream ended, a call held) is one of them, by its last stream envelope (the one
that parked it). Before this fix the open-run budget ended every streaming run before any
parked one, so a tenant that parks runs pinned the partition's slots for
``approval_timeout_s``; the byte budget ended parked runs before older streaming ones; and a
``run.start`` whose tool schemas needed room ended streaming runs only, then held the schemas
past the budget.

Who sends what: the gateway sends every run's ``run.start``, events and ``stream.end`` (the
order of these is a run's activity); an approver (or anyone who may write the control topic)
sends decisions, forwarded into the events log: they decide held calls, and never make a run
more recently active, so decisions (a DLQ'd one included) cannot keep a parked run's slot.
An evicted parked run's held calls fail ``budget_exceeded`` (the reason every budget eviction
gives), its final message is ``failed``, and a later decision for it is a DLQ record
``call_already_decided``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ALL_PROVIDERS,
    CHAT,
    PATH_SCHEMA,
    chat_chunk,
    chat_tool_delta,
    check_outputs,
    check_schemas,
    committed,
    decision,
    dlq,
    errors,
    feed,
    finals,
    provider_event,
    provider_run,
    run_envelopes,
    run_start,
    tools_for,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.settings import ApprovalSettings

TOOLS = {"read_file": PATH_SCHEMA, "delete_file": PATH_SCHEMA}
SECRET = "/srv/SECRET-hunter2"
GATED = ApprovalSettings(require_approval=("delete_file",), approval_timeout_s=600.0)


def asm(**overrides: Any) -> Assembler:
    return Assembler(AssembleSettings(**{"approvals": GATED, **overrides}))


def args(path: str) -> str:
    return orjson.dumps({"path": path}).decode()


def parked(run_id: str, provider: str = CHAT) -> list[dict[str, Any]]:
    """A whole run that commits a read and parks on its held delete (stream ended)."""
    return provider_run(provider, run_id, TOOLS, [("read", "read_file", args("/srv/a")),
                                                  ("del", "delete_file", args(SECRET))])


def started(run_id: str) -> list[dict[str, Any]]:
    """A streaming chat run: its ``run.start`` and a call's first fragment."""
    return run_envelopes(run_id, CHAT, tools_for(CHAT, TOOLS), [chat_chunk(
        [chat_tool_delta(0, f"{run_id}-c", "read_file", '{"path": "/srv/')])], end=False)


def more(run_id: str, seq: int, text: str = "b") -> dict[str, Any]:
    """A later fragment of a :func:`started` run (its ``seq``: 2, 3, ...)."""
    return provider_event(run_id, seq, chat_chunk([chat_tool_delta(0, arguments=text)]))


def checked(emits: list[Emit]) -> list[Emit]:
    check_schemas(emits)
    check_outputs(emits)
    return emits


def ended(emits: list[Emit]) -> dict[str, str]:
    """Run id -> final status of the runs that ended in ``emits``."""
    return {f["run_id"]: f["status"] for f in finals(emits)}


class TestOpenRuns:
    @pytest.mark.parametrize("provider", ALL_PROVIDERS)
    def test_a_parked_run_older_than_the_streaming_runs_is_ended(self, provider: str) -> None:
        """``max_open_runs`` 3: a run parked first, then two streaming runs; a fourth
        ``run.start`` ends the parked run (the least recently active), not a streaming one:
        its held call fails ``budget_exceeded`` (no argument text), its committed call stays
        committed, its final message is ``failed``; the streaming runs go on. The decision
        that comes after is a DLQ record ``call_already_decided``."""
        a = asm(max_open_runs=3)
        first = feed(a, [*parked("p", provider), *started("s1"), *started("s2")])
        assert [c["call_id"] for c in committed(first)] == ["read"]
        emits = checked(feed(a, [run_start("new", CHAT, tools_for(CHAT, TOOLS))]))
        assert ended(emits) == {"p": "failed"}
        (error,) = errors(emits)
        assert (error["tool_call_id"], error["reason"]) == ("del", "budget_exceeded")
        assert SECRET not in orjson.dumps(error).decode()
        assert [o["state"] for o in finals(emits)[0]["outcomes"]] == ["committed", "failed"]
        assert a.open_run_ids() == ["s1", "s2", "new"]
        assert a.stats["evicted_open_runs"] == 1 and a.waiting_runs == 0
        late = feed(a, [decision("p", "approve", "del")])
        assert [r["reason"] for r in dlq(late)] == ["call_already_decided"]
        assert not committed(late)

    def test_streaming_runs_active_after_the_park_are_more_recent(self) -> None:
        """Two runs start, then a run parks, then the two stream on: the parked run is the
        least recently active (its stream's end came before their events) and is ended."""
        a = asm(max_open_runs=3)
        feed(a, [*started("s1"), *started("s2"), *parked("p"), more("s1", 2), more("s2", 2)])
        emits = checked(feed(a, [run_start("new", CHAT, tools_for(CHAT, TOOLS))]))
        assert ended(emits) == {"p": "failed"}
        assert errors(emits)[0]["reason"] == "budget_exceeded"
        assert a.open_run_ids() == ["s1", "s2", "new"]

    def test_a_streaming_run_older_than_the_parked_one_is_ended_first(self) -> None:
        """A streaming run quiet since before the park is less recently active than the
        parked run: it is the one ended (its open call ``budget_exceeded``), and the parked
        run still waits; its approval then commits the held call."""
        a = asm(max_open_runs=3)
        feed(a, [*started("s1"), *started("s2"), *parked("p"), more("s2", 2)])
        emits = checked(feed(a, [run_start("new", CHAT, tools_for(CHAT, TOOLS))]))
        assert ended(emits) == {"s1": "failed"}
        assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
            ("s1-c", "budget_exceeded")]
        assert a.is_open("p") and a.waiting_runs == 1
        done = checked(feed(a, [decision("p", "approve", "del")]))
        assert [c["call_id"] for c in committed(done)] == ["del"]
        assert ended(done) == {"p": "completed"}

    def test_decisions_do_not_make_a_parked_run_active(self) -> None:
        """Decisions are not the run's stream: one for another held call and one for a call
        the run does not have (a DLQ record) leave the parked run the least recently active,
        so writing to the control topic cannot keep its slot."""
        a = asm(max_open_runs=3)
        two = provider_run(CHAT, "p", TOOLS, [("d1", "delete_file", args("/a")),
                                              ("d2", "delete_file", args("/b"))])
        feed(a, [*two, *started("s1"), *started("s2")])
        assert committed(feed(a, [decision("p", "approve", "d1")]))
        assert dlq(feed(a, [decision("p", "approve", "nobody")]))
        emits = checked(feed(a, [run_start("new", CHAT, tools_for(CHAT, TOOLS))]))
        assert ended(emits) == {"p": "failed"}
        assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
            ("d2", "budget_exceeded")]

    def test_several_parked_runs_oldest_first(self) -> None:
        """With ``max_open_runs`` 2 and two parked runs, each new run ends the oldest open
        run in the order of the records: parked ``p1``, then the run ``p2``... never the
        newest."""
        a = asm(max_open_runs=2)
        feed(a, [*parked("p1"), *parked("p2")])
        assert ended(feed(a, [run_start("n1", CHAT, tools_for(CHAT, TOOLS))])) == {
            "p1": "failed"}
        assert ended(feed(a, [run_start("n2", CHAT, tools_for(CHAT, TOOLS))])) == {
            "p2": "failed"}
        assert a.open_run_ids() == ["n1", "n2"]

    def test_same_records_same_victims(self) -> None:
        """The victims depend only on the order of the records, not on record times: the
        same records with other timestamps end the same runs, byte for byte."""
        envs = [*started("s1"), *parked("p"), more("s1", 2),
                run_start("new", CHAT, tools_for(CHAT, TOOLS))]
        stamped = [e | {"ts": 10_000 - 7 * n} for n, e in enumerate(envs)]
        outs = [feed(asm(max_open_runs=2), e) for e in (envs, stamped)]
        assert ended(outs[0]) == ended(outs[1]) == {"p": "failed"}
        assert [e.value for e in outs[0] if e.topic is Topic.ERRORS] == [
            e.value for e in outs[1] if e.topic is Topic.ERRORS]


def _held(envelopes: list[dict[str, Any]], **settings: Any) -> int:
    """The partition's buffered bytes after ``envelopes`` (a probe with no byte budget)."""
    probe = asm(**settings)
    feed(probe, envelopes)
    return probe.buffered_bytes


class TestBufferedBytes:
    def test_a_fragment_ends_the_least_recently_active_holder_first(self) -> None:
        """A fragment that needs room ends the least recently active run holding bytes: the
        streaming run quiet since before the park, not the newer parked run (which used to
        go first, being parked)."""
        head = [*started("s1"), *parked("p"), *started("r")]
        s1 = _held(started("s1"))
        limit = _held(head) + 1_000 - s1  # ending s1 alone makes room for 1,000 bytes
        a = asm(max_buffered_bytes=limit)
        feed(a, head)
        emits = checked(feed(a, [more("r", 2, "x" * 1_000)]))
        assert ended(emits) == {"s1": "failed"}
        assert a.is_open("p") and a.waiting_runs == 1
        assert a.buffered_bytes <= limit

    def test_tool_schemas_make_room_from_parked_runs_too(self) -> None:
        """A ``run.start`` whose tool schemas need room ends the least recently active runs
        holding bytes, a parked run among them, so the budget holds (it used to end streaming
        runs only, and then hold the schemas past the budget)."""
        head = parked("p")
        limit = _held([*head, run_start("new", CHAT, tools_for(CHAT, TOOLS))]) - 1
        a = asm(max_buffered_bytes=limit)
        feed(a, head)
        emits = checked(feed(a, [run_start("new", CHAT, tools_for(CHAT, TOOLS))]))
        assert ended(emits) == {"p": "failed"}
        assert errors(emits)[0]["reason"] == "budget_exceeded"
        assert a.buffered_bytes <= limit and a.open_run_ids() == ["new"]
