"""Signed approvals in the pure core (issue 32 item 3, "approvals by known people").

Who sends what: a decision reaches a run as a marker in its events partition, put there by
whoever may write the control topic (the gateway writes cancels there) or the events topic
(the gateway). With approvers configured (``Assembler.approvals.approvers``), only a decision signed
by an approver's key counts; each test below sends a decision from someone who is not the
approver (no signature, another key, a signature made for something else) and shows that
it changes nothing but one DLQ record, the call staying held. Then: an approve is decided
against the policy in force when it is applied; the audit record names the approver; and
a decision refused once is a repeat when the same control record is forwarded again.
"""

from __future__ import annotations

from typing import Any

import orjson
from builders import (
    CHAT,
    PATH_SCHEMA,
    check_outputs,
    check_schemas,
    decision,
    dlq,
    errors,
    feed,
    provider_calls,
    provider_run,
    run_envelopes,
    tick,
    tools_for,
    values,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.approvers import Approvers, mac, signed_bytes
from worker.core.policy import ENFORCE, PolicyDecision, PolicyRequest
from worker.core.settings import ApprovalSettings

TOOLS = {"read_file": PATH_SCHEMA, "delete_file": PATH_SCHEMA}
SECRET = "/srv/SECRET-hunter2"
GATED = ApprovalSettings(require_approval=("delete_file",), approval_timeout_s=10.0)
ALICE_KEY = b"a" * 32
BOB_KEY = b"b" * 32
KEYS = Approvers({"alice-1": ("alice", ALICE_KEY), "bob-1": ("bob", BOB_KEY)},
                 {"alice": ("oncall",)})


def asm(policy: Any = None) -> Assembler:
    assembler = Assembler(AssembleSettings(approvals=GATED))
    assembler.policy = policy
    assembler.approvals.approvers = KEYS
    return assembler


def held_run(run_id: str = "r1") -> list[dict[str, Any]]:
    """A run that reads one file and deletes another (the delete, c2, is held)."""
    return provider_run(CHAT, run_id, TOOLS, [
        ("c1", "read_file", orjson.dumps({"path": "/srv/a"}).decode()),
        ("c2", "delete_file", orjson.dumps({"path": SECRET}).decode())])


def signed(env: dict[str, Any], key_id: str = "alice-1", key: bytes = ALICE_KEY,
           ts: int = 7) -> dict[str, Any]:
    """``env`` signed as an approval tool signs it."""
    message = signed_bytes(env["run_id"], env["tool_call_id"], env["type"], env["by"],
                           env["reason"], env.get("arguments"), key_id, ts)
    return {**env, "signature": {"key": key_id, "ts": ts, "mac": mac(key, message)}}


def checked(emits: list[Emit]) -> list[Emit]:
    check_schemas(emits)
    check_outputs(emits)
    return emits


def outcomes(emits: list[Emit]) -> list[Topic]:
    return [e.topic for e in emits if e.topic in (Topic.COMMITTED, Topic.ERRORS)]


class TestWhoMayDecide:
    def test_an_unsigned_approve_does_not_count(self) -> None:
        """A principal that can write the control topic (the gateway, which writes cancels)
        sends a well-formed approve with no signature: one DLQ record
        ``approval_unsigned`` with its bytes, nothing committed, the call still held; a
        signed deny by alice then decides it."""
        a = asm()
        emits = feed(a, held_run())
        forged = decision("r1", "approve", "c2", by="alice")
        refused = checked(feed(a, [forged]))
        assert [d["reason"] for d in dlq(refused)] == ["approval_unsigned"]
        assert outcomes(refused) == [] and a.waiting_runs == 1
        done = checked(feed(a, [signed(decision("r1", "deny", "c2", by="alice"))]))
        assert [e["reason"] for e in errors(done)] == ["approval_denied"]
        assert "alice" in errors(done)[0]["content"]
        told = [*errors(emits + done), *(d["detail"] for d in dlq(refused))]
        assert SECRET not in orjson.dumps(told).decode()

    def test_someone_elses_signature_does_not_count(self) -> None:
        """Each forgery goes to the DLQ and leaves the call held: a key the worker does not
        know; bob's key with ``by: alice``; alice's signature of another call, another
        decision, another reason or other edited arguments, moved onto this one."""
        a = asm()
        feed(a, held_run())
        good = decision("r1", "approve", "c2", by="alice")
        cases = {
            "approver_unknown_key": [signed(good, "carol-1", b"c" * 32),
                                     signed(good, "bob-1", BOB_KEY)],
            "approval_bad_signature": [
                {**signed(decision("r1", "approve", "c1", by="alice")),
                 "tool_call_id": "c2"},
                {**signed(decision("r1", "deny", "c2", by="alice")), "type": "approve"},
                {**signed(decision("r1", "approve", "c2", by="alice", reason="ok")),
                 "reason": "changed"},
                {**signed(decision("r1", "edit", "c2", by="alice", arguments='{"path":"/a"}')),
                 "arguments": orjson.dumps({"path": SECRET + "x"}).decode()},
                {**signed(good, "alice-1", BOB_KEY)}],
        }
        for reason, envs in cases.items():
            for env in envs:
                refused = checked(feed(a, [env]))
                assert [d["reason"] for d in dlq(refused)] == [reason], env
                assert outcomes(refused) == []
        assert a.waiting_runs == 1
        done = checked(feed(a, [signed(good)]))
        assert [e.value["call_id"] for e in done if e.topic is Topic.COMMITTED] == ["c2"]

    def test_a_timed_out_call_is_not_approved_by_a_forgery_later(self) -> None:
        """An unsigned approve leaves the call held until its approval timeout."""
        a = asm()
        feed(a, [*[{**e, "ts": 0} for e in held_run()]])
        feed(a, [decision("r1", "approve", "c2", by="alice")])
        emits = checked(feed(a, [tick(11_000)]))
        assert [e["reason"] for e in errors(emits)] == ["approval_timeout"]


class Forbid:
    """A policy that allows every call except those of ``tool`` (and every approver)."""

    mode, version = ENFORCE, 2

    def __init__(self, tool: str) -> None:
        self.tool = tool

    def decide(self, request: PolicyRequest) -> PolicyDecision:
        if request.tool == self.tool:
            return PolicyDecision(ENFORCE, False, ("no-deletes",), version=2)
        return PolicyDecision(ENFORCE, True, ("all",), version=2)

    def decide_approver(self, request: Any) -> PolicyDecision:
        return PolicyDecision(ENFORCE, True, ("approvers",), version=2)


class Allow(Forbid):
    def __init__(self) -> None:
        super().__init__("")


class TestPolicyInForce:
    def test_an_approve_of_a_call_the_policy_now_forbids_is_denied(self) -> None:
        """The call was held under a policy that allowed it; the policy in force when the
        approve is applied forbids it: one error result ``policy_denied`` naming that
        policy, never a committed record."""
        a = asm(Allow())
        feed(a, held_run())
        a.policy = Forbid("delete_file")
        emits = checked(feed(a, [signed(decision("r1", "approve", "c2", by="alice"))]))
        assert outcomes(emits) == [Topic.ERRORS]
        (error,) = errors(emits)
        assert error["reason"] == "policy_denied" and "no-deletes" in error["content"]
        assert values(emits, Topic.FINAL)[0]["status"] == "completed"

    def test_a_policy_in_force_that_cannot_judge_approvers_refuses(self) -> None:
        """A policy in force without ``decide_approver`` (never the worker's: fail closed)
        lets no approver decide: ``approver_not_allowed``, the call stays held."""
        class Calls:
            mode, version = ENFORCE, None

            def decide(self, request: PolicyRequest) -> PolicyDecision:
                return PolicyDecision(ENFORCE, True, ("all",))

        a = asm(Calls())
        feed(a, held_run())
        emits = feed(a, [signed(decision("r1", "approve", "c2", by="alice"))])
        assert [d["reason"] for d in dlq(emits)] == ["approver_not_allowed"]
        assert a.waiting_runs == 1


class TestAudit:
    def test_the_audit_record_names_the_approver_and_the_decision(self) -> None:
        """The audit record of a call a person decided says which decision counted, who
        made it (the key's owner) and with which key; other calls' audit records have no
        ``approval``."""
        a = asm()
        emits = feed(a, held_run())
        emits += feed(a, [signed(decision("r1", "approve", "c2", by="alice"))])
        checked(emits)
        audits = {r["tool_call_id"]: r for r in values(emits, Topic.AUDIT)}
        assert audits["c2"]["approval"] == {"decision": "approve", "by": "alice",
                                            "key": "alice-1"}
        assert "approval" not in audits["c1"]


class TestRepeats:
    def test_a_decision_refused_as_not_pending_stays_refused_when_forwarded_again(
            self) -> None:
        """The faust engine forwards a control record at least once. A decision that
        arrives while its call still streams is refused ``call_not_pending``; the same
        control record forwarded again after the call is held is a repeat (counted, nothing
        emitted), not an approval: one control record, one outcome."""
        a = Assembler(AssembleSettings(approvals=GATED))
        envelopes = run_envelopes("r1", CHAT, tools_for(CHAT, TOOLS), provider_calls(
            CHAT, [("c2", "delete_file", orjson.dumps({"path": "/x"}).decode())]))
        early = {**decision("r1", "approve", "c2"), "control": [0, 41]}
        first = feed(a, [*envelopes[:2], early])
        assert [d["reason"] for d in dlq(first)] == ["call_not_pending"]
        feed(a, envelopes[2:])
        assert a.waiting_runs == 1
        again = feed(a, [early])
        assert again == [] and a.waiting_runs == 1
        assert a.stats["duplicates"] == 1


class TestRepeatsOfSignedDecisions:
    def test_a_signed_decision_refused_by_the_policy_stays_refused_when_forwarded_again(
            self) -> None:
        """A signed approve the policy in force refuses (``approver_not_allowed``), forwarded
        again after the policy changed to allow it, is a repeat: one control record, one
        answer. A forgery carrying the same ``control`` is refused and not remembered, so it
        cannot pre-empt a real decision's control record."""
        class Approvers_(Allow):
            allowed = False

            def decide_approver(self, request: Any) -> PolicyDecision:
                return PolicyDecision(ENFORCE, self.allowed, ("approvers",), version=2)

        policy = Approvers_()
        a = asm(policy)
        feed(a, held_run())
        forged = {**decision("r1", "approve", "c2", by="alice"), "control": [0, 9]}
        assert [d["reason"] for d in dlq(feed(a, [forged]))] == ["approval_unsigned"]
        real = {**signed(decision("r1", "approve", "c2", by="alice")), "control": [0, 9]}
        assert [d["reason"] for d in dlq(feed(a, [real]))] == ["approver_not_allowed"]
        policy.allowed = True
        assert feed(a, [real]) == [] and a.waiting_runs == 1
