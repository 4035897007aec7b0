"""The chaos verifier (``worker.verify``) without Kafka: it passes the outputs the offline
core emits for a plan, and fails each kind of broken promise it exists to catch."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from worker.core import DlqReason, Emit, Topic
from worker.core.envelope import Rejected
from worker.core.outputs import dlq_record
from worker.runtime.config import load_config
from worker.tools.chaos import run as chaos
from worker.tools.chaos.plan import (
    EARLY_SETTINGS,
    PROVIDERS,
    Plan,
    PlanError,
    build_plan,
    check_intent,
)
from worker.tools.chaos.verify import OutRecord, verify

CONFIG = load_config(None, env={"LATCH_AGENT_STREAM_ASSEMBLE__ASSEMBLE_IDLE_TIMEOUT_S": "5"})
Records = list[OutRecord]


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(seed=7, runs=60, config=CONFIG)


def _records(plan: Plan) -> Records:
    """What a correct worker writes: every expected record once, and each bad input's DLQ
    record."""
    out = []
    for run in plan.runs:
        out += [OutRecord(e.topic.value, 0, len(out), run.run_id.encode(),
                                orjson.dumps(e.value)) for e in run.expected]
    for bad in plan.bad:
        emit = dlq_record(Rejected(DlqReason(bad.reason), "detail"), bad.key, bad.value,
                          {"topic": "x", "partition": 0, "offset": len(out)})
        out.append(OutRecord("dlq", 0, len(out), bad.key, orjson.dumps(emit.value)))
    return out


def _first(records: Records, role: str) -> tuple[int, dict[str, object]]:
    index = next(i for i, r in enumerate(records) if r.role == role)
    return index, orjson.loads(records[index].value)


def _with(records: Records, role: str, value: dict[str, object]) -> Records:
    return [*records, OutRecord(role, 0, len(records), None, orjson.dumps(value))]


def test_plan_covers_every_kind_and_provider(plan: Plan) -> None:
    """The plan mixes the kinds of runs and the providers, and its bad inputs go to the DLQ
    for several reasons (the offline core agreed with every intent, or build_plan raised)."""
    assert {r.provider for r in plan.runs} == set(PROVIDERS)
    assert len({r.kind for r in plan.runs}) >= 9
    assert {"undecodable", "key_mismatch", "unknown_run", "invalid_envelope"} <= {
        b.reason for b in plan.bad}
    assert any(b"\"tick\"" in b.value for b in plan.bad)
    assert any(len(r.envelopes) > 200 for r in plan.runs if r.kind == "large")


def test_plan_is_seeded() -> None:
    """The same seed gives the same bytes; another seed other bytes."""
    def digest(seed: int) -> list[bytes]:
        return [v for r in build_plan(seed, 20, CONFIG).runs for v in r.envelopes]
    assert digest(3) == digest(3)
    assert digest(3) != digest(4)


def test_correct_outputs_pass(plan: Plan) -> None:
    """Every expected record once: PASS, nothing missing, no duplicates."""
    verdict = verify(plan, _records(plan))
    assert verdict.ok, verdict.failures
    assert (verdict.committed + verdict.errors, verdict.duplicates) == (plan.calls, 0)
    assert verdict.dlq == len(plan.bad)
    assert verdict.summary(2, 1).endswith("missing=0 contradictions=0 mismatched=0 -> PASS")


def test_byte_identical_duplicates_pass(plan: Plan) -> None:
    """At least once: a record delivered twice with the same bytes is a counted duplicate."""
    records = _records(plan)
    verdict = verify(plan, records + records[:10])
    assert verdict.ok, verdict.failures
    assert verdict.duplicates == 10


def test_a_duplicate_fails_when_exactly_once_is_promised(plan: Plan) -> None:
    """The kafka engine read at read_committed: one byte-identical repeat fails the verdict,
    and the same records without it pass."""
    records = _records(plan)
    assert verify(plan, records, exactly_once=True).ok
    verdict = verify(plan, records + records[:1], exactly_once=True)
    assert (verdict.ok, verdict.duplicates) == (False, 1)
    assert verdict.summary(0, 0).endswith("-> FAIL")


def test_a_lost_outcome_fails(plan: Plan) -> None:
    """A committed call that never reached the topic is missing."""
    records = _records(plan)
    index, _ = _first(records, "committed")
    verdict = verify(plan, records[:index] + records[index + 1:])
    assert not verdict.ok
    assert verdict.missing == 1


def test_audit_records_with_their_live_source_and_trace_pass_and_a_lost_one_fails(
        plan: Plan) -> None:
    """The worker fills an audit record's ``source`` and ``trace_id``: the verifier sets
    them aside and passes; an outcome whose audit record is lost is missing."""
    records = _records(plan)
    live = []
    for record in records:
        if record.role == "audit":
            value = orjson.loads(record.value)
            value["source"] = {"topic": "ev", "partition": 0, "offset": record.offset}
            value["trace_id"] = "4bf92f3577b34da6a3ce929d0e0e4736"
            record = dataclasses.replace(record, value=orjson.dumps(value))
        live.append(record)
    assert verify(plan, live).ok
    index, _ = _first(live, "audit")
    verdict = verify(plan, live[:index] + live[index + 1:])
    assert (verdict.ok, verdict.missing) == (False, 1)


def test_a_contradicting_error_fails(plan: Plan) -> None:
    """An error result for a call that was committed is a contradiction."""
    records = _records(plan)
    _, committed = _first(records, "committed")
    error = {"v": 1, "run_id": committed["run_id"], "tenant": committed["tenant"],
             "provider": committed["provider"], "tool_call_id": committed["call_id"],
             "name": committed["name"], "index": committed["index"], "is_error": True,
             "state": "cancelled", "reason": "cancelled", "content": "cancelled: late",
             "idempotency_key": committed["idempotency_key"]}
    verdict = verify(plan, _with(records, "errors", error))
    assert not verdict.ok
    assert verdict.contradictions >= 2  # two outcomes for the call; the final disagrees
    assert verdict.mismatched == 1  # an error record nobody expected


def test_a_duplicate_with_other_bytes_fails(plan: Plan) -> None:
    """Two records under one idempotency key must be byte-identical."""
    records = _records(plan)
    _, committed = _first(records, "committed")
    other = {**committed, "arguments": {"path": "/somewhere/else"}}
    verdict = verify(plan, _with(records, "committed", other))
    assert not verdict.ok
    assert verdict.contradictions == 2  # two records for the key, two outcomes for the call


@pytest.mark.parametrize("change", [
    lambda v: {**v, "arguments": {"path": "/tampered"}},
    lambda v: {**v, "name": "tampered"},
])
def test_other_committed_arguments_fail(
        plan: Plan, change: Callable[[dict[str, object]], dict[str, object]]) -> None:
    """A committed call must carry exactly the expected arguments and name."""
    records = _records(plan)
    index, committed = _first(records, "committed")
    records[index] = OutRecord("committed", 0, index, None, orjson.dumps(change(committed)))
    verdict = verify(plan, records)
    assert not verdict.ok
    assert verdict.mismatched >= 1


def test_a_final_that_disagrees_fails(plan: Plan) -> None:
    """A run's final message must list the outcomes its records carry."""
    records = _records(plan)
    index, final = _first(records, "final")
    outcomes = final["outcomes"]
    assert isinstance(outcomes, list)
    doctored = {**final, "outcomes": [{**o, "state": "cancelled"} for o in outcomes]}
    records[index] = OutRecord("final", 0, index, None, orjson.dumps(doctored))
    run = next(r for r in plan.runs if r.run_id == final["run_id"])
    verdict = verify(plan, records)
    assert not verdict.ok
    assert verdict.mismatched == 1
    assert verdict.contradictions == (1 if run.opened else 0)


def test_the_dlq_holds_exactly_the_bad_inputs(plan: Plan) -> None:
    """A bad input missing from the DLQ, or a DLQ record of something else, fails."""
    records = _records(plan)
    index, _ = _first(records, "dlq")
    assert verify(plan, records[:index] + records[index + 1:]).missing == 1
    stray = dlq_record(Rejected(DlqReason.UNKNOWN_RUN, "x"), b"k", b"{}", None)
    verdict = verify(plan, _with(records, "dlq", stray.value))
    assert verdict.mismatched == 1
    changed = {**orjson.loads(records[index].value),
               "original_b64": base64.b64encode(b"other bytes").decode()}
    records[index] = OutRecord("dlq", 0, index, None, orjson.dumps(changed))
    verdict = verify(plan, records)
    assert (verdict.missing, verdict.mismatched) == (1, 1)


def test_every_expected_run_has_one_final(plan: Plan) -> None:
    """The plan's expectation itself: one final per run, outcomes for every opened call."""
    for run in plan.runs:
        assert [e.topic for e in run.expected].count(Topic.FINAL) == 1


def test_the_command_line_parses() -> None:
    """``python -m worker.tools.chaos.run`` takes the options the issue names."""
    args = chaos.build_parser().parse_args(
        ["--runs", "5", "--workers", "1", "--kills", "0", "--broker-restarts", "0",
         "--seed", "9", "--bootstrap", "127.0.0.1:1"])
    assert (args.runs, args.workers, args.kills, args.broker_restarts, args.seed) == (
        5, 1, 0, 0, 9)
    assert isinstance(args.work_dir, Path | None)


# -- issue 9: early commit, reused ids, tight budgets, raced cancels ------------------------

EARLY = load_config(None, env={"LATCH_AGENT_STREAM_ASSEMBLE__ASSEMBLE_IDLE_TIMEOUT_S": "5"} | {
    f"LATCH_AGENT_STREAM_ASSEMBLE__{k.upper()}": v for k, v in EARLY_SETTINGS.items()})


@pytest.fixture(scope="module")
def early_plan() -> Plan:
    return build_plan(seed=11, runs=400, config=EARLY)


def test_plan_has_the_issue_9_kinds(early_plan: Plan) -> None:
    """With the chaos workers' settings, the plan holds early commits (committed before the
    stream's end), early commits then a cancel, reused call ids, tight budgets and raced
    cancels; the offline core agreed with every intent (one outcome per call id)."""
    kinds = {r.kind for r in early_plan.runs}
    assert {"early", "early_cancel", "reuse", "tight", "cancel_race", "cancel_mid"} <= kinds
    assert all(r.cancel_after == 0 for r in early_plan.runs if r.kind == "cancel_race")
    assert all(r.cancel_after == len(r.envelopes) for r in early_plan.runs
               if r.kind in ("cancel", "early_cancel"))
    early_cancelled = [r for r in early_plan.runs if r.kind == "early_cancel"]
    assert any(c.intent == "commit" for r in early_cancelled for c in r.opened.values())


def test_an_early_committed_id_reused_later_has_one_record(early_plan: Plan) -> None:
    """In the plan's ``early_reuse`` runs whose first call commits at its block's end, the
    later call reusing its id has no record: the id's one record is the committed call, and
    the final lists the later call ``failed``/``duplicate_call_id`` (checked offline by
    ``check_intent`` when the plan was built, and by the verifier on the records)."""
    runs = [r for r in early_plan.runs if r.kind == "early_reuse" and r.provider != "openai.chat"]
    assert runs
    for run in runs:
        first = next(iter(run.opened.values()))
        records = [e for e in run.expected if e.topic in (Topic.COMMITTED, Topic.ERRORS)
                   and first.call_id in (e.value.get("call_id"), e.value.get("tool_call_id"))]
        assert [e.topic for e in records] == [Topic.COMMITTED]
        final = next(e for e in run.expected if e.topic is Topic.FINAL)
        assert [(o["state"], o.get("reason")) for o in final.value["outcomes"]
                if o["tool_call_id"] == first.call_id] == [
            ("committed", None), ("failed", "duplicate_call_id")]
    assert verify(early_plan, _records(early_plan)).ok


@pytest.mark.parametrize(("reason", "key", "problem"), [
    # a committed id failing anything contradicts it
    ("schema_invalid", "{run}:x", r"2 kinds of outcome .* for one id"),
    # the old early-commit reuse rule (issue 9, item 4): a duplicate_call_id result for the
    # id under a key of its own; a runner pairing results by id gets two for one call id
    ("duplicate_call_id", "{run}:x:9", r"2 kinds of outcome .* for one id"),
    # the same, under the committed call's own key: a runner would drop one
    ("duplicate_call_id", "{committed}", r"2 outcomes under one idempotency key"),
])
def test_the_plan_catches_two_outcomes_for_one_id(early_plan: Plan, reason: str, key: str,
                                                  problem: str) -> None:
    """A core that gives an early-committed call id an error result as well (a contradicting
    one, or the old rule's ``duplicate_call_id`` for a later call reusing the id), or a
    second record under the committed call's idempotency key, fails the plan itself, before
    anything is published (issue 9, item 4; docs/contract.md, one kind of outcome per id)."""
    run = next(r for r in early_plan.runs if r.kind == "early" and any(
        e.topic is Topic.COMMITTED for e in r.expected))
    committed = next(e for e in run.expected if e.topic is Topic.COMMITTED)
    error = Emit(Topic.ERRORS, run.run_id, {
        "run_id": run.run_id, "tool_call_id": committed.value["call_id"], "reason": reason,
        "idempotency_key": key.format(run=run.run_id,
                                      committed=committed.value["idempotency_key"])})
    broken = dataclasses.replace(run, expected=[*run.expected, error])
    with pytest.raises(PlanError, match=problem):
        check_intent(broken)


def test_a_lost_acknowledged_cancel_fails(early_plan: Plan) -> None:
    """A run whose cancel the broker acknowledged must end ``cancelled``: the same run ending
    ``assemble_idle_timeout`` (the cancel never reached the events log) is missing."""
    records = _records(early_plan)
    run = next(r for r in early_plan.runs if r.kind == "cancel_race" and r.opened)
    lost = [rec for rec in records if orjson.loads(rec.value).get("run_id") == run.run_id]
    rest = [rec for rec in records if rec not in lost]
    timed_out = []
    for rec in lost:
        value = orjson.loads(rec.value)
        if rec.role == "errors":
            value |= {"state": "failed", "reason": "assemble_idle_timeout"}
        elif rec.role == "final":
            value["status"] = "idle_timeout"
            for outcome in value["outcomes"]:
                outcome |= {"state": "failed", "reason": "assemble_idle_timeout"}
        timed_out.append(OutRecord(rec.role, 0, rec.offset, rec.key, orjson.dumps(value)))
    assert verify(early_plan, records).ok
    verdict = verify(early_plan, rest + timed_out, acked_cancels={run.run_id})
    assert not verdict.ok and verdict.missing >= 2
    assert verify(early_plan, rest + timed_out, acked_cancels=set()).ok  # never acknowledged


def _policy_plan() -> Plan:
    stack = chaos.Stack("127.0.0.1:1", "chaos-unit", 3, 5.0, 1.0, policy=str(chaos.DEFAULT_POLICY))
    return build_plan(seed=7, runs=120, config=stack.config())


def test_plan_with_a_policy_means_some_calls_to_be_denied_and_the_verifier_holds_them() -> None:
    """``latch chaos --policy``: the workers' settings carry ``enforce`` and the shipped
    ``chaos.cedar``; the plan means some good calls (paths under /denied/) to get
    ``policy_denied`` and the offline core, with the same policy, agrees (or build_plan would
    raise); the verifier passes the expected records and fails when a denied call is committed
    instead."""
    env = chaos.Stack("b", "a", 1, 5.0, 1.0, policy="p.cedar").env()
    assert env["LATCH_POLICY__MODE"] == "enforce" and env["LATCH_POLICY__FILE"] == "p.cedar"
    assert "LATCH_POLICY__MODE" not in chaos.Stack("b", "a", 1, 5.0, 1.0).env()
    plan = _policy_plan()
    meant = {c.call_id for r in plan.runs for c in r.opened.values()
             if c.intent == "policy_denied"}
    denied = {e.value["tool_call_id"] for r in plan.runs for e in r.expected
              if e.topic is Topic.ERRORS and e.value["reason"] == "policy_denied"}
    assert meant and denied == meant
    committed = {e.value["call_id"] for r in plan.runs for e in r.expected
                 if e.topic is Topic.COMMITTED}
    assert not committed & meant
    records = _records(plan)
    assert verify(plan, records).ok
    # a worker that let one denied call through fails the verdict
    index = next(i for i, r in enumerate(records) if r.role == "errors"
                 and orjson.loads(r.value)["reason"] == "policy_denied")
    value = orjson.loads(records[index].value)
    forged = {"v": 1, "run_id": value["run_id"], "call_id": value["tool_call_id"],
              "name": value["name"], "arguments": {"path": "/denied/x"}}
    records[index] = OutRecord("committed", 0, index, None, orjson.dumps(forged))
    assert not verify(plan, records).ok


def _approvals_plan() -> Plan:
    stack = chaos.Stack("127.0.0.1:1", "chaos-unit", 3, 5.0, 1.0, approval_timeout_s=7.0)
    return build_plan(seed=7, runs=160, config=stack.config(), env=stack.env())


@pytest.mark.parametrize("reason", ["approval_denied", "approval_timeout", "schema_invalid",
                                    "committed"])
def test_approvals_plan_holds_each_decision_and_a_lost_approval_outcome_fails(
        reason: str) -> None:
    """``latch chaos --approvals``: the workers' settings gate ``delete_file`` with the given
    timeout; the plan's approval runs give every planned decision (approve, deny, edits valid
    and invalid, none) and the offline core agrees with each meant outcome (or build_plan would
    raise); the verifier passes those records, a pending record whose ``held_ms`` is the live
    record time, and fails when one held call's outcome (here: ``reason``) is lost or when a
    denied call is committed instead."""
    args = chaos.build_parser().parse_args(["--approvals", "--runners", "2"])
    assert (args.approvals, args.runners) == (-1.0, 2)  # -1: the idle timeout
    assert chaos.build_parser().parse_args(["--approvals", "30"]).approvals == 30.0
    env = chaos.Stack("b", "a", 1, 5.0, 1.0, approval_timeout_s=7.0).env()
    assert env["LATCH_APPROVALS__REQUIRE_APPROVAL"] == "delete_file"
    assert env["LATCH_APPROVALS__APPROVAL_TIMEOUT_S"] == "7.0"
    assert "LATCH_APPROVALS__REQUIRE_APPROVAL" not in chaos.Stack("b", "a", 1, 5.0, 1.0).env()
    plan = _approvals_plan()
    held = [c for r in plan.runs for c in r.opened.values() if c.decision]
    assert {c.decision for c in held} == {"approve", "deny", "edit", "edit_schema", "edit_json",
                                          "none"}
    assert all((c.decision == "none") == (c.call_id not in r.decisions)
               for r in plan.runs for c in r.opened.values() if c.decision)
    records = _records(plan)
    # the live worker's pending records carry the record time the call was held at
    records = [OutRecord(r.role, r.partition, r.offset, r.key, orjson.dumps(
        {**orjson.loads(r.value), "approval": {**orjson.loads(r.value)["approval"],
                                               "held_ms": 1_700_000_000_000}}))
               if r.role == "pending" else r for r in records]
    verdict = verify(plan, records)
    assert verdict.ok, verdict.failures[:3]
    assert verdict.approvals["approval_denied"] and verdict.approvals["approval_timeout"]
    assert sum(verdict.approvals.values()) == len(held)
    ids = {c.call_id for c in held}

    def lost(r: OutRecord) -> bool:
        value = orjson.loads(r.value)
        if r.role == "committed":
            return reason == "committed" and value["call_id"] in ids
        return (r.role == "errors" and value["tool_call_id"] in ids
                and value["reason"] == reason)

    index = next(i for i, r in enumerate(records) if lost(r))
    verdict = verify(plan, records[:index] + records[index + 1:])
    assert not verdict.ok and verdict.missing >= 1
    # a worker that committed a denied call instead fails the verdict too
    index = next(i for i, r in enumerate(records) if r.role == "errors"
                 and orjson.loads(r.value)["reason"] == "approval_denied")
    value = orjson.loads(records[index].value)
    forged = {"v": 1, "run_id": value["run_id"], "call_id": value["tool_call_id"],
              "name": value["name"], "arguments": {"path": "/x"},
              "idempotency_key": value["idempotency_key"]}
    records[index] = OutRecord("committed", 0, index, None, orjson.dumps(forged))
    assert not verify(plan, records).ok


def test_runner_verifier_counts_executions_and_fails_a_repeat_after_commit() -> None:
    """``latch chaos --runners``: each committed call needs exactly one result; a call run
    twice is allowed only when its earlier run was cut short before its transaction committed
    (inside the tool, or after it), and counted as such; a run again after its commit, a lost
    result or two results fail."""
    from worker.tools.chaos.verify import verify_runners

    def rec(role: str, key: str, n: int = 0) -> OutRecord:
        return OutRecord(role, 0, n, None, orjson.dumps({"idempotency_key": key, "n": n}))

    records = [rec("committed", k) for k in "abc"] + [rec("results", k) for k in "abc"]
    log = "\n".join(["S a 1", "E a 1", "C a 1",
                     "S b 1", "S b 2", "E b 2", "C b 2",  # killed inside the tool
                     "S c 2", "E c 2", "S c 3", "E c 3", "C c 3"])  # killed before commit
    verdict = verify_runners(records, log)
    assert verdict.ok, verdict.failures
    assert (verdict.once, verdict.repeated_in_tool, verdict.repeated_after_tool,
            verdict.executions) == (1, 1, 1, 5)
    again = verify_runners(records, log + "\nS a 4\nE a 4\nC a 4")
    assert not again.ok and again.unexplained == 1
    assert verify_runners(records[:-1], log).missing == 1
    assert verify_runners([*records, rec("results", "a", 1)], log).duplicates == 1


def test_the_chaos_approver_signs_and_an_unsigned_copy_does_not_count() -> None:
    """``latch chaos --approvals`` (issue 32): the workers verify approvers' keys and the
    chaos approver signs every planned decision with its own (``approvers.key_id``); the
    offline core, given the same keys, agrees with every meant outcome (build_plan raises
    otherwise), and the same decision without its signature goes to the DLQ
    (``approval_unsigned``) instead of deciding the call."""
    from worker.core import Assembler
    from worker.runtime.config import load_config
    from worker.runtime.governance.approvers import approvers

    stack = chaos.Stack("127.0.0.1:1", "chaos-unit", 3, 5.0, 1.0, approval_timeout_s=7.0)
    env = stack.env()
    assert env["LATCH_APPROVERS__KEY_ID"] == "chaos-approver-1"
    assert stack.approver_key not in repr(stack)
    plan = _approvals_plan()
    decided = [(r, v) for r in plan.runs for v in r.decisions.values()]
    assert decided and all("signature" in orjson.loads(v) for _, v in decided)
    run, value = decided[0]
    assembler = Assembler(load_config(None, env=env).assemble)
    assembler.approvals.approvers = approvers(load_config(None, env=env), env)
    for envelope in run.envelopes:
        assembler.feed_record(None, envelope)
    unsigned = {k: v for k, v in orjson.loads(value).items() if k != "signature"}
    refused = assembler.feed_record(None, orjson.dumps(unsigned))
    assert [e.value["reason"] for e in refused] == ["approval_unsigned"]
