"""Approvals in the pure core (issue 26 item 1): a call that passes the whole latch and needs a
person's decision is held (``PENDING_APPROVAL``) and emitted on the pending topic; ``approve``,
``deny``, ``edit`` (forwarded from the control topic into the events log) or a timeout give it
its one outcome, and the run's final message waits for the last decision.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    CHAT,
    PATH_SCHEMA,
    cancel,
    chat_calls,
    chat_run,
    check_outputs,
    check_schemas,
    committed,
    decision,
    dlq,
    errors,
    feed,
    finals,
    lines,
    provider_run,
    run_start,
    tick,
    tools_for,
    values,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.policy import ENFORCE, PolicyDecision, PolicyRequest
from worker.core.settings import ApprovalSettings

TOOLS = {"read_file": PATH_SCHEMA, "delete_file": PATH_SCHEMA}
SECRET = "/srv/SECRET-hunter2"
GATED = ApprovalSettings(require_approval=("delete_file",), approval_timeout_s=10.0)


def asm(**overrides: Any) -> Assembler:
    policy = overrides.pop("policy", None)
    assembler = Assembler(AssembleSettings(**{"approvals": GATED, **overrides}))
    assembler.policy = policy
    return assembler


def args(path: str) -> str:
    return orjson.dumps({"path": path}).decode()


def held_run(run_id: str = "r1", **kw: Any) -> list[dict[str, Any]]:
    """A run that reads one file and deletes another (the delete waits for approval)."""
    return provider_run(CHAT, run_id, TOOLS, [("c1", "read_file", args("/srv/a")),
                                              ("c2", "delete_file", args(SECRET))], **kw)


def topics(emits: list[Emit]) -> list[Topic]:
    """The outputs' topics, the audit records aside (test_audit_follows_every_decided_outcome
    pins those)."""
    return [e.topic for e in emits if e.topic is not Topic.AUDIT]


def checked(emits: list[Emit]) -> list[Emit]:
    check_schemas(emits)
    check_outputs(emits)
    return emits


class TestHeld:
    def test_a_gated_call_goes_to_the_pending_topic_and_the_final_waits(self) -> None:
        """The ungated call commits; the gated one is emitted on the pending topic with the
        committed record's fields and why it waits; no final message yet, the run stays open
        (and a late stream.end changes nothing)."""
        a = asm()
        emits = checked(feed(a, held_run(ts=5)))
        assert topics(emits) == [Topic.COMMITTED, Topic.PENDING]
        (pending,) = values(emits, Topic.PENDING)
        assert pending["call_id"] == "c2" and pending["arguments"] == {"path": SECRET}
        assert pending["approval"] == {"required_by": ["require_approval"], "held_ms": 5}
        assert pending["idempotency_key"] == "r1:c2:pending"
        assert a.is_open("r1") and a.waiting_runs == 1

    def test_destructive_hint_needs_approval_when_configured(self) -> None:
        """An MCP tool annotated ``destructiveHint: true`` is held with
        ``approvals.destructive``, committed without it."""
        mcp = [{"name": "rm", "inputSchema": PATH_SCHEMA,
                "annotations": {"destructiveHint": True}}]
        run = chat_run("r1", mcp, chat_calls([("c1", "rm", args("/x"))]))
        on = feed(asm(approvals=ApprovalSettings(destructive=True)), run)
        assert topics(on) == [Topic.PENDING]
        assert values(on, Topic.PENDING)[0]["approval"]["required_by"] == ["destructive"]
        assert topics(feed(asm(approvals=ApprovalSettings()), run)) == [Topic.COMMITTED,
                                                                         Topic.FINAL]

    def test_a_policy_can_ask_for_approval(self) -> None:
        """A permit whose decision asks for approval (``PolicyDecision.approval``: a Cedar
        ``@approval("required")``) holds the call, naming the policy."""
        class Asks:
            mode, version = ENFORCE, None

            def decide(self, request: PolicyRequest) -> PolicyDecision:
                return PolicyDecision(ENFORCE, True, ("review-reads",), approval=True)

        emits = feed(asm(approvals=ApprovalSettings(), policy=Asks()),
                     provider_run(CHAT, "r1", TOOLS, [("c1", "read_file", args("/a"))]))
        (pending,) = values(emits, Topic.PENDING)
        assert pending["approval"]["required_by"] == ["policy"]
        assert pending["approval"]["policies"] == ["review-reads"]


class TestDecisions:
    def test_approve_commits_the_call_as_it_would_have_been(self) -> None:
        """``approve``: the committed record is the one the call would have had without the
        gate (same bytes, same idempotency key); then the final message, both committed."""
        a = asm()
        emits = checked(feed(a, [*held_run(), decision("r1", "approve", "c2")]))
        assert topics(emits) == [Topic.COMMITTED, Topic.PENDING, Topic.COMMITTED, Topic.FINAL]
        ungated = feed(asm(approvals=ApprovalSettings()), held_run())
        assert committed(emits) == committed(ungated)
        assert [o["state"] for o in finals(emits)[0]["outcomes"]] == ["committed", "committed"]
        assert not a.is_open("r1") and a.stats["approvals_approve"] == 1

    def test_audit_follows_every_decided_outcome(self) -> None:
        """Issue 25's audit with issue 26's approvals: a held call is not an outcome, so the
        pending record gets no audit record; each decided outcome (approve's committed call,
        deny's and timeout's error result, edit's commit) is followed by exactly one, naming
        the call, never its arguments."""
        for tail, outcome in (([decision("r1", "approve", "c2")], "committed"),
                              ([decision("r1", "deny", "c2")], "error"),
                              ([tick(60_000)], "error")):
            emits = checked(feed(asm(), [*held_run(ts=0), *tail]))
            kinds = [e.topic for e in emits if e.topic is not Topic.FINAL]
            assert kinds == [Topic.COMMITTED, Topic.AUDIT, Topic.PENDING,
                             Topic.COMMITTED if outcome == "committed" else Topic.ERRORS,
                             Topic.AUDIT], tail
            audits = [e.value for e in emits if e.topic is Topic.AUDIT]
            assert [(a["tool_call_id"], a["outcome"]) for a in audits] == [
                ("c1", "committed"), ("c2", outcome)]
            assert SECRET not in orjson.dumps(audits).decode()

    def test_deny_gives_one_error_result(self) -> None:
        """``deny``: one error result ``approval_denied`` naming who and why (never the
        arguments); the final message lists it failed."""
        emits = checked(feed(asm(), [*held_run(),
                                     decision("r1", "deny", "c2", reason="not today")]))
        assert topics(emits) == [Topic.COMMITTED, Topic.PENDING, Topic.ERRORS, Topic.FINAL]
        (error,) = errors(emits)
        assert error["reason"] == "approval_denied"
        assert error["content"] == "approval_denied: denied by ops@example.com: not today"
        assert SECRET not in orjson.dumps(error).decode()
        assert finals(emits)[0]["outcomes"][1]["reason"] == "approval_denied"

    def test_edit_with_valid_arguments_commits_them(self) -> None:
        """``edit``: the new arguments pass the whole latch again and are committed (not held
        again); the final message carries them."""
        emits = checked(feed(asm(), [*held_run(), decision("r1", "edit", "c2",
                                                           arguments=args("/srv/tmp/x"))]))
        assert topics(emits) == [Topic.COMMITTED, Topic.PENDING, Topic.COMMITTED, Topic.FINAL]
        assert committed(emits)[1]["arguments"] == {"path": "/srv/tmp/x"}
        assert "/srv/tmp/x" in orjson.dumps(finals(emits)[0]["message"]).decode()

    @pytest.mark.parametrize("text, reason", [
        ('{"path": "/a",}', "invalid_json"),
        ('{"path": 7}', "schema_invalid"),
        ("[1]", "arguments_not_object"),
        ('{"path": "' + "a" * 300_000 + '"}', "arguments_exceed_max_bytes"),
    ], ids=["invalid_json", "schema_invalid", "not_object", "too_large"])
    def test_edit_with_invalid_arguments_fails_them(self, text: str, reason: str) -> None:
        """``edit`` with arguments the latch refuses: one error result with the latch's
        reason, never the text; nothing more is committed."""
        emits = checked(feed(asm(), [*held_run(), decision("r1", "edit", "c2",
                                                           arguments=text)]))
        assert topics(emits) == [Topic.COMMITTED, Topic.PENDING, Topic.ERRORS, Topic.FINAL]
        assert [e["reason"] for e in errors(emits)] == [reason]
        assert "/a" not in errors(emits)[0]["content"]

    def test_edit_is_checked_by_the_policy(self) -> None:
        """The edited arguments are decided by the policy again: a denial is
        ``policy_denied``."""
        class PathPolicy:
            mode, version = ENFORCE, None

            def decide(self, request: PolicyRequest) -> PolicyDecision:
                ok = str(request.arguments.get("path", "")).startswith("/srv/")
                return PolicyDecision(ENFORCE, ok, () if ok else ("srv-only",))

        emits = feed(asm(policy=PathPolicy()), [*held_run(), decision(
            "r1", "edit", "c2", arguments=args("/etc/passwd"))])
        assert [e["reason"] for e in errors(emits)] == ["policy_denied"]

    def test_edit_is_checked_against_the_budget(self) -> None:
        """A held call keeps its place in the run's budget; a denial gives it back."""
        run = provider_run(CHAT, "r1", TOOLS, [("c1", "delete_file", args("/a")),
                                               ("c2", "delete_file", args("/b"))],
                           limits={"max_tool_calls": 1})
        emits = feed(asm(), run)
        assert topics(emits) == [Topic.PENDING, Topic.ERRORS]
        assert errors(emits)[0]["reason"] == "budget_exceeded"

    def test_timeout_fails_the_call_at_a_tick(self) -> None:
        """No decision within ``approval_timeout_s`` of record time: the first tick at or past
        it fails the call ``approval_timeout``; an earlier tick does nothing."""
        a = asm()
        feed(a, held_run(ts=1_000))
        assert feed(a, [tick(10_999)]) == []
        emits = checked(feed(a, [tick(11_000)]))
        assert topics(emits) == [Topic.ERRORS, Topic.FINAL]
        assert errors(emits)[0]["reason"] == "approval_timeout"
        assert a.stats["approvals_timed_out"] == 1

    def test_idle_timeout_does_not_end_a_waiting_run(self) -> None:
        """A run whose stream ended waits for people, not for the provider: the idle timeout
        does not end it (only the approval timeout does)."""
        a = asm(assemble_idle_timeout_s=1.0, approvals=ApprovalSettings(
            require_approval=("delete_file",), approval_timeout_s=100.0))
        feed(a, held_run(ts=0))
        assert feed(a, [tick(50_000)]) == []
        assert a.is_open("r1")

    def test_the_final_waits_for_the_last_decision(self) -> None:
        """Two held calls: the final message comes after the second decision only, listing
        both outcomes."""
        run = provider_run(CHAT, "r1", TOOLS, [("c1", "delete_file", args("/a")),
                                               ("c2", "delete_file", args("/b"))])
        a = asm()
        assert topics(feed(a, run)) == [Topic.PENDING, Topic.PENDING]
        assert topics(feed(a, [decision("r1", "approve", "c2")])) == [Topic.COMMITTED]
        last = checked(feed(a, [decision("r1", "deny", "c1")]))
        assert topics(last) == [Topic.ERRORS, Topic.FINAL]
        assert [o["state"] for o in finals(last)[0]["outcomes"]] == ["failed", "committed"]

    def test_cancel_while_waiting_cancels_the_held_calls(self) -> None:
        """A cancel reaching a waiting run cancels its held calls and ends it ``cancelled``;
        like every cancel, it gives the run's ``run.ended`` first (decision 0015)."""
        emits = checked(feed(asm(), [*held_run(), cancel("r1")]))
        assert topics(emits) == [Topic.COMMITTED, Topic.PENDING, Topic.RUN_ENDED, Topic.ERRORS,
                                 Topic.FINAL]
        assert errors(emits)[0]["state"] == "cancelled"
        assert finals(emits)[0]["status"] == "cancelled"


class TestDlq:
    def test_unknown_call(self) -> None:
        """A decision for a call the run does not have: DLQ ``unknown_call``, with the
        original bytes; the held call still waits."""
        a = asm()
        feed(a, held_run())
        raw = orjson.dumps(decision("r1", "approve", "c9"))
        (record,) = dlq(a.feed_record(b"r1", raw))
        assert record["reason"] == "unknown_call" and record["original_b64"]
        assert a.is_open("r1")

    def test_duplicate_decision(self) -> None:
        """A second decision for a decided call (here, the run still waits for another):
        DLQ ``call_already_decided``; after the run ended too."""
        run = provider_run(CHAT, "r1", TOOLS, [("c1", "delete_file", args("/a")),
                                               ("c2", "delete_file", args("/b"))])
        a = asm()
        feed(a, [*run, decision("r1", "approve", "c1")])
        assert [r["reason"] for r in dlq(feed(a, [decision("r1", "deny", "c1")]))] == [
            "call_already_decided"]
        feed(a, [decision("r1", "approve", "c2")])
        assert [r["reason"] for r in dlq(feed(a, [decision("r1", "approve", "c2")]))] == [
            "call_already_decided"]

    def test_decision_before_the_call_is_complete(self) -> None:
        """A decision that reaches a call still streaming is no approval in advance: DLQ
        ``call_not_pending``, and the call is held later as any other and waits."""
        run = held_run()
        a = asm()
        emits = feed(a, [*run[:-2], decision("r1", "approve", "c2"), *run[-2:]])
        assert [r["reason"] for r in dlq(emits)] == ["call_not_pending"]
        assert topics([e for e in emits if e.topic is not Topic.DLQ]) == [Topic.COMMITTED,
                                                                           Topic.PENDING]
        assert a.is_open("r1")

    def test_decision_for_an_ungated_call(self) -> None:
        """A decision for a call that committed without approval: ``call_already_decided``,
        and nothing is taken back."""
        a = asm()
        emits = feed(a, [*held_run(), decision("r1", "deny", "c1")])
        assert [r["reason"] for r in dlq(emits)] == ["call_already_decided"]
        assert [c["call_id"] for c in committed(emits)] == ["c1"]


class TestEarlyCommit:
    def test_a_pipelined_call_is_held_at_its_block_end_and_decided_while_streaming(self
                                                                                    ) -> None:
        """With block-level early commit a gated call is held as its block ends; approved
        while the run still streams, it commits at once; the final comes at the run's end."""
        from builders import ANTHROPIC, anthropic_calls, anthropic_run
        settings = {"execute_before_stream_end": True, "allow_pipelined_execute": ("delete_file",)}
        run = anthropic_run("r1", tools_for(ANTHROPIC, TOOLS),
                            anthropic_calls([("c1", "delete_file", args("/a"))]))
        a = asm(**settings)
        head, tail = run[:-3], run[-3:]
        first = feed(a, head)
        assert topics(first) == [Topic.PENDING]
        assert topics(feed(a, [decision("r1", "approve", "c1")])) == [Topic.COMMITTED]
        assert topics(feed(a, tail)) == [Topic.FINAL]


def test_same_input_same_bytes() -> None:
    """Replay: two assemblers fed the same run and decisions emit the same bytes (take-over
    and replay decide as the live worker did)."""
    envs = [*held_run(ts=0), decision("r1", "edit", "c2", arguments=args("/b")),
            run_start("r2", CHAT, tools_for(CHAT, TOOLS), ts=1), *held_run("r3", ts=2),
            decision("r3", "approve", "c9"), tick(20_000)]
    assert lines(feed(asm(), envs)) == lines(feed(asm(), envs))
