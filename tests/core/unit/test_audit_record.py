"""The audit record (``Outputs.audit``, schemas/audit.schema.json): one per call outcome,
right after it, with the outcome's identity and key, the policy's decision, and the size of
the argument bytes (with no audit key: no digest; keyed digests: test_audit_digest.py), never
the bytes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    CHAT,
    PATH_SCHEMA,
    PROVIDERS,
    cancel,
    chat_calls,
    check_schemas,
    feed,
    provider_run,
    responses_head,
    responses_run,
    responses_tail,
    run_envelopes,
    tick,
    tools_for,
    values,
)
from test_openai_responses import CUSTOM_TOOL, custom_events

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.call import Call
from worker.core.envelope import RunStart
from worker.core.model import CallState, Reason
from worker.core.outputs import Outputs
from worker.core.policy import ENFORCE, LOG_ONLY, PolicyDecision

SECRET = "sk-live-51HxSECRETtokenDoNotLeak0000"
TOOLS = {"read_file": PATH_SCHEMA}


def run(envelopes: list[dict[str, Any]], **settings: Any) -> list[Emit]:
    emits = feed(Assembler(AssembleSettings(**settings)), envelopes)
    check_schemas(emits)
    return emits


def audits(emits: list[Emit]) -> list[dict[str, Any]]:
    return values(emits, Topic.AUDIT)


def assert_one_audit_per_outcome(emits: list[Emit]) -> None:
    """Each committed call or error result is followed at once by its audit record, with its
    key, call id and name; and there is no other audit record."""
    outcomes = 0
    for at, emit in enumerate(emits):
        if emit.topic in (Topic.COMMITTED, Topic.ERRORS):
            outcomes += 1
            audit = emits[at + 1]
            assert audit.topic is Topic.AUDIT and audit.key == emit.key
            value, record = emit.value, audit.value
            assert record["idempotency_key"] == value["idempotency_key"]
            assert record["tool_call_id"] == value.get("call_id", value.get("tool_call_id"))
            assert record["name"] == value["name"]
            assert record["outcome"] == ("committed" if emit.topic is Topic.COMMITTED
                                         else "error")
            assert record["reason"] == value.get("reason")
    assert len(audits(emits)) == outcomes


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_committed_call_is_audited_with_the_digest_of_its_record_arguments(
        provider: str) -> None:
    """A committed call's audit record says who called what (run, tenant, call id, tool,
    provider), ``committed`` with no reason, policy mode ``off`` (no policy decided), and the
    byte size of its ``arguments`` exactly as the committed record writes them;
    where it was read and the trace are null in the core."""
    emits = run(provider_run(provider, "r1", TOOLS,
                             [("call_1", "read_file", '{ "path" :  "/srv/a"}')]))
    [committed] = values(emits, Topic.COMMITTED)
    [audit] = audits(emits)
    data = orjson.dumps(committed["arguments"])
    assert data in orjson.dumps(committed)  # the very bytes the record carries
    assert audit == {
        "v": 1, "run_id": "r1", "tenant": "t1", "provider": provider,
        "tool_call_id": "call_1", "name": "read_file", "outcome": "committed",
        "reason": None, "policy": {"mode": "off"},
        "arguments": {"bytes": len(data)},
        "trace_id": None, "source": None, "idempotency_key": committed["idempotency_key"]}
    assert_one_audit_per_outcome(emits)


def test_an_error_is_audited_with_the_digest_of_the_text_received() -> None:
    """A call that fails ``invalid_json`` is audited as an ``error`` with its reason and the
    size of the UTF-8 text received (non-ASCII included)."""
    text = '{"path": "/srv/é'
    emits = run(provider_run(CHAT, "r1", TOOLS, [("call_1", "read_file", text)]))
    [audit] = audits(emits)
    data = text.encode()
    assert (audit["outcome"], audit["reason"]) == ("error", "invalid_json")
    assert audit["arguments"] == {"bytes": len(data)}
    assert_one_audit_per_outcome(emits)


def test_a_custom_call_is_audited_with_the_digest_of_its_input() -> None:
    """A committed custom call (Responses ``custom_tool_call``) carries ``input``, not
    ``arguments``: its audit measures the input's UTF-8 bytes."""
    code = 'print("hi")'
    emits = run(responses_run("r1", [CUSTOM_TOOL], [
        *responses_head(), *custom_events(0, "call_c", "code_exec", code), responses_tail()]))
    [audit] = audits(emits)
    assert audit["arguments"] == {"bytes": len(code.encode())}


@pytest.mark.parametrize("text", [
    f'{{"path": "{SECRET}"}}',  # committed
    f'{{"path": "{SECRET}", "mode": 1}}',  # schema_invalid
    f'{{"path": "{SECRET}"',  # invalid_json
])
def test_argument_text_appears_nowhere_in_the_audit_record(text: str) -> None:
    """Whatever the outcome, a secret in the arguments is never in the audit record: only
    its size is."""
    emits = run(provider_run(CHAT, "r1", TOOLS, [("call_1", "read_file", text)]))
    [audit] = audits(emits)
    assert SECRET not in orjson.dumps(audit).decode()
    assert "sk-live" not in orjson.dumps(audit).decode()


def test_arguments_dropped_at_their_bound_have_no_digest() -> None:
    """A call whose text crossed ``max_tool_argument_bytes`` had its text dropped: its audit
    says ``arguments_exceed_max_bytes`` with no digest (null), never a digest of a part."""
    emits = run(provider_run(CHAT, "r1", TOOLS, [("call_1", "read_file",
                                                  '{"path": "' + "a" * 200 + '"}')]),
                max_tool_argument_bytes=64)
    [audit] = audits(emits)
    assert (audit["reason"], audit["arguments"]) == ("arguments_exceed_max_bytes", None)


def test_duplicate_ids_get_one_audit_per_outcome_record() -> None:
    """Two calls with one id each fail ``duplicate_call_id`` under keys of their own: each
    error result has its own audit record, with its key."""
    emits = run(provider_run(CHAT, "r1", TOOLS, [("dup", "read_file", '{"path": "/a"}'),
                                                 ("dup", "read_file", '{"path": "/b"}')]))
    records = audits(emits)
    assert [a["reason"] for a in records] == ["duplicate_call_id", "duplicate_call_id"]
    assert len({a["idempotency_key"] for a in records}) == 2
    assert_one_audit_per_outcome(emits)


def test_budget_exceeded_calls_are_audited() -> None:
    """Calls past ``max_tool_calls_per_run`` fail ``budget_exceeded`` and are audited like
    the committed ones."""
    calls = [(f"call_{i}", "read_file", f'{{"path": "/{i}"}}') for i in range(3)]
    emits = run(provider_run(CHAT, "r1", TOOLS, calls), max_tool_calls_per_run=2)
    assert [(a["tool_call_id"], a["outcome"], a["reason"]) for a in audits(emits)] == [
        ("call_0", "committed", None), ("call_1", "committed", None),
        ("call_2", "error", "budget_exceeded")]
    assert_one_audit_per_outcome(emits)


def test_truncated_calls_are_audited() -> None:
    """A chat run cut by ``finish_reason: length`` fails its call ``truncated``: audited."""
    events = chat_calls([("call_1", "read_file", '{"path": "/a"}')], finish_reason="length")
    emits = run(run_envelopes("r1", CHAT, tools_for(CHAT, TOOLS), events))
    assert [a["reason"] for a in audits(emits)] == ["truncated"]
    assert_one_audit_per_outcome(emits)


def test_cancelled_and_idle_runs_audit_every_call() -> None:
    """A cancelled run and an idle run (expired by a tick) audit each of their calls, with
    the reason of the run's end."""
    open_calls = chat_calls([("c1", "read_file", '{"path": "/a"}'),
                             ("c2", "read_file", '{"path": "/b"}')])[:-1]
    cancelled = run_envelopes("rc", CHAT, tools_for(CHAT, TOOLS), [*open_calls, cancel()],
                              end=False, ts=0)
    idle = run_envelopes("ri", CHAT, tools_for(CHAT, TOOLS), open_calls, end=False, ts=0)
    emits = run([*cancelled, *idle, tick(600_000)], assemble_idle_timeout_s=60)
    assert [(a["run_id"], a["reason"]) for a in audits(emits)] == [
        ("rc", "cancelled"), ("rc", "cancelled"),
        ("ri", "assemble_idle_timeout"), ("ri", "assemble_idle_timeout")]
    assert_one_audit_per_outcome(emits)


def test_a_name_the_model_invented_is_carried_as_the_error_carries_it() -> None:
    """A call to a tool the run never registered fails ``unknown_tool``; its audit carries the
    name exactly as the error result does."""
    emits = run(provider_run(CHAT, "r1", TOOLS, [("c1", "rm_rf_everything", "{}")]))
    [error] = values(emits, Topic.ERRORS)
    [audit] = audits(emits)
    assert audit["name"] == error["name"] == "rm_rf_everything"
    assert audit["reason"] == "unknown_tool"


def _decided(decision: PolicyDecision | None, state: CallState) -> dict[str, Any]:
    """The audit record of one call in ``state`` with ``decision``."""
    start = RunStart(run_id="r1", seq=0, ts=None, provider=CHAT, tenant="acme", tools=[],
                     max_tool_calls=None)
    call = Call("0", 0, None, 0, call_id="c1", name="read_file")
    call.state, call.decision, call.parsed = state, decision, True
    call.arguments, call.text = {"path": "/srv/a"}, '{"path": "/srv/a"}'
    if state is not CallState.COMMITTED:
        call.reason, call.detail = Reason.SCHEMA_INVALID, "denied"
    [_, audit] = Outputs(start).outcomes([call])
    return audit.value


@pytest.mark.parametrize("decision, state, expected", [
    (None, CallState.COMMITTED, {"mode": "off"}),
    (PolicyDecision(LOG_ONLY, False, ("forbid-rm",), (), 7), CallState.COMMITTED,
     {"mode": "log_only", "allow": False, "policies": ["forbid-rm"], "errors": [],
      "version": 7}),
    (PolicyDecision(ENFORCE, True, ("p1", "p2")), CallState.COMMITTED,
     {"mode": "enforce", "allow": True, "policies": ["p1", "p2"], "errors": [],
      "version": None}),
    (PolicyDecision(ENFORCE, False, (), ("p3: type error",)), CallState.FAILED,
     {"mode": "enforce", "allow": False, "policies": [], "errors": ["p3: type error"],
      "version": None}),
])
def test_the_policy_decision_is_audited(decision: PolicyDecision | None, state: CallState,
                                        expected: dict[str, Any]) -> None:
    """The call's ``decision`` (mode, allow or deny, determining policies, evaluation errors,
    policy version) is the audit record's ``policy``; no decision is mode ``off``; the
    record fits its schema either way."""
    audit = _decided(decision, state)
    assert audit["policy"] == expected
    assert audit["tenant"] == "acme"
    check_schemas([Emit(Topic.AUDIT, "r1", audit)])
