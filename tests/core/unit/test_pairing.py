"""The result latch in the core (worker/core/pairing.py): every committed call answered once,
on time and checked; one turn record per run once every call has its one result."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from builders import (
    ALL_PROVIDERS,
    CHAT,
    GEMINI,
    PATH_SCHEMA,
    chat_calls,
    chat_tool,
    committed,
    dlq,
    errors,
    feed,
    provider_run,
    run_envelopes,
    tick,
    tool_result,
    values,
)

from worker.core import Assembler, AssembleSettings, Topic
from worker.core.settings import AuditKey, ResultSettings, ToolResultLimits

SCHEMAS = {"read_file": PATH_SCHEMA}


def paired(deadline_s: float = 10.0, **changes: Any) -> Assembler:
    results = ResultSettings(enabled=True, deadline_s=deadline_s,
                             **{k: v for k, v in changes.items() if k in ("max_bytes", "tools")})
    rest = {k: v for k, v in changes.items() if k not in ("max_bytes", "tools")}
    return Assembler(AssembleSettings(results=results, **rest))


def two_calls(run_id: str = "r1", ts: int = 1_000) -> list[dict[str, Any]]:
    return run_envelopes(run_id, CHAT, [chat_tool("read_file", PATH_SCHEMA)],
                         chat_calls([("c1", "read_file", '{"path": "/a"}'),
                                     ("c2", "read_file", '{"path": "/b"}')]), ts=ts)


def turns(emits: list[Any]) -> list[dict[str, Any]]:
    return values(emits, Topic.TURNS)


def test_both_answered_one_turn_in_message_order() -> None:
    """Two committed calls answered out of order: one turn record, its messages in the final
    message's order, one audit record per answer."""
    a = paired()
    out = feed(a, two_calls())
    calls = committed(out)
    assert [c["call_id"] for c in calls] == ["c1", "c2"] and not turns(out)
    assert a.is_open("r1")  # its turn waits for results
    out = feed(a, [tool_result(calls[1], "B"), tool_result(calls[0], "A")])
    [turn] = turns(out)
    assert turn["messages"] == [{"role": "tool", "tool_call_id": "c1", "content": "A"},
                                {"role": "tool", "tool_call_id": "c2", "content": "B"}]
    assert [(o["tool_call_id"], o["outcome"], o["reason"]) for o in turn["outcomes"]] == [
        ("c1", "answered", None), ("c2", "answered", None)]
    assert turn["final_idempotency_key"] and not a.is_open("r1")
    audits = [v for v in values(out, Topic.AUDIT)]
    assert [(v["tool_call_id"], v["outcome"], v["result"]["bytes"]) for v in audits] == [
        ("c2", "answered", 1), ("c1", "answered", 1)]


def test_no_result_by_the_deadline_is_tool_timeout_written_by_the_latch() -> None:
    """A call with no result by its deadline (record time, at a tick) gets the latch's own error
    result, tool_timeout; the runner's answer after that is result_late."""
    a = paired(deadline_s=10)
    calls = committed(feed(a, two_calls(ts=1_000)))
    out = feed(a, [tool_result(calls[0], "A"), tick(5_000)])
    assert not turns(out) and not values(out, Topic.RESULTS)
    out = feed(a, [tick(11_000)])
    [latch_result] = values(out, Topic.RESULTS)
    assert (latch_result["tool_call_id"], latch_result["reason"], latch_result["by"],
            latch_result["is_error"]) == ("c2", "tool_timeout", "latch", True)
    [turn] = turns(out)
    assert [o["outcome"] for o in turn["outcomes"]] == ["answered", "tool_timeout"]
    assert turn["messages"][1]["content"].startswith("tool_timeout: ")
    assert [o["size"] for o in turn["outcomes"]] == [1, None]  # (no result: no size)
    # the runner's answer after that is late
    out = feed(a, [tool_result(calls[1], "B")])
    assert [d["reason"] for d in dlq(out)] == ["result_late"] and not turns(out)


def test_per_tool_deadline() -> None:
    """A tool's own deadline_s replaces the section's."""
    a = paired(deadline_s=100, tools=(("read_file", ToolResultLimits(deadline_s=2)),))
    committed(feed(a, two_calls(ts=1_000)))
    assert len(values(feed(a, [tick(3_100)]), Topic.RESULTS)) == 2


def test_duplicate_unknown_and_forged_results_go_to_the_dlq() -> None:
    """The first valid result counts; a second is result_duplicate, the same forward twice a silent
    repeat, a result naming another call, name or idempotency key unknown_call."""
    a = paired()
    calls = committed(feed(a, two_calls()))
    out = feed(a, [tool_result(calls[0], "A", source=(0, 7)),
                   tool_result(calls[0], "A", source=(0, 7)),   # the same forward again
                   tool_result(calls[0], "A2", source=(0, 8)),  # a second answer
                   tool_result({**calls[0], "call_id": "nope"}, "X"),
                   tool_result(calls[1], "B", name="write_file"),
                   tool_result(calls[1], "B", idempotency_key="r1:forged")])
    assert [d["reason"] for d in dlq(out)] == [
        "result_duplicate", "unknown_call", "unknown_call", "unknown_call"]
    assert a.pairing is not None and a.pairing.stats["results_repeated"] == 1
    out = feed(a, [tool_result(calls[1], "B")])
    [turn] = turns(out)
    out = feed(a, [tool_result(calls[1], "B", source=(0, 9)), tool_result(calls[0], "A")])
    assert [d["reason"] for d in dlq(out)] == ["result_duplicate", "result_duplicate"]
    # the turn closed: the answer that counted, forwarded again, is still only a repeat
    assert feed(a, [tool_result(calls[0], "A", source=(0, 7))]) == []
    assert turn["messages"][0]["content"] == "A"
    # each DLQ record keeps the result's bytes
    assert all(d["original_b64"] for d in dlq(out))


def test_a_result_for_another_run_or_before_any_commit_is_unknown_call() -> None:
    """A result for a run with no committed call waiting is unknown_call."""
    a = paired()
    calls = committed(feed(a, two_calls("r1")))
    other = {**calls[0], "run_id": "r2"}
    assert [d["reason"] for d in dlq(feed(a, [tool_result(other)]))] == ["unknown_call"]


def test_a_result_over_max_bytes_is_result_too_large_never_its_text() -> None:
    """A result over max_bytes (or forwarded without its content) is answered result_too_large: its
    size, never its text."""
    a = paired(max_bytes=8)
    calls = committed(feed(a, two_calls()))
    secret = "s3cr3t-" * 4
    out = feed(a, [tool_result(calls[0], secret), tool_result(calls[1], "x" * 40,
                                                              keep_content=False)])
    [turn] = turns(out)
    assert [o["outcome"] for o in turn["outcomes"]] == ["result_too_large"] * 2
    assert turn["outcomes"][0]["size"] == len(secret)
    assert secret not in orjson.dumps(out[0:]).decode()
    assert all(m["content"].startswith("result_too_large: ") for m in turn["messages"])


def test_structured_result_checked_against_the_output_schema() -> None:
    """A structured result that fails its MCP tool's outputSchema is result_schema_invalid,
    the detail naming the keyword, never the value; a valid one and a text-only one count."""
    a = paired()
    tools = [{"name": "read_file", "inputSchema": PATH_SCHEMA,
              "outputSchema": {"type": "object", "required": ["n"],
                               "properties": {"n": {"type": "integer"}}}}]
    calls = committed(feed(a, run_envelopes("r1", CHAT, tools, chat_calls([
        ("c1", "read_file", '{"path": "/a"}'), ("c2", "read_file", '{"path": "/b"}'),
        ("c3", "read_file", '{"path": "/c"}')]))))
    assert len(calls) == 3
    out = feed(a, [tool_result(calls[0], "{}", structured={"n": "s3cret"}),
                   tool_result(calls[1], '{"n": 1}', structured={"n": 1}),
                   tool_result(calls[2], "plain text")])
    [turn] = turns(out)
    assert [o["outcome"] for o in turn["outcomes"]] == [
        "result_schema_invalid", "answered", "answered"]
    assert turn["messages"][0]["content"].startswith("result_schema_invalid: ")
    assert "s3cret" not in orjson.dumps(out).decode()


def test_failed_calls_answered_by_their_error_results() -> None:
    """A call that never committed is answered by its own error result in the turn."""
    a = paired()
    envs = run_envelopes("r1", CHAT, [chat_tool("read_file", PATH_SCHEMA)], chat_calls([
        ("c1", "read_file", '{"path": "/a"}'), ("c2", "no_such_tool", "{}")]))
    out = feed(a, envs)
    [call] = committed(out)
    [error] = errors(out)
    assert not turns(out)
    [turn] = turns(feed(a, [tool_result(call, "A")]))
    assert [(o["outcome"], o["reason"]) for o in turn["outcomes"]] == [
        ("answered", None), ("failed", "unknown_tool")]
    assert turn["messages"][1] == {"role": "tool", "tool_call_id": "c2",
                                   "content": error["content"]}


def test_a_run_without_committed_calls_gets_its_turn_with_its_final() -> None:
    """A run whose calls all failed gets its turn record right after its final message."""
    a = paired()
    out = feed(a, run_envelopes("r1", CHAT, [chat_tool("read_file", PATH_SCHEMA)],
                                chat_calls([("c1", "nope", "{}")])))
    [turn] = turns(out)
    assert [o["outcome"] for o in turn["outcomes"]] == ["failed"]
    assert out.index(next(e for e in out if e.topic is Topic.FINAL)) < out.index(
        next(e for e in out if e.topic is Topic.TURNS))


def test_dropped_calls_get_no_message() -> None:
    """A call dropped by drop_with_protocol_repair has an outcome and no message."""
    a = paired(on_invalid_json="drop_with_protocol_repair")
    out = feed(a, run_envelopes("r1", CHAT, [chat_tool("read_file", PATH_SCHEMA)],
                                chat_calls([("c1", "read_file", '{"path": ')])))
    [turn] = turns(out)
    assert turn["messages"] == [] and turn["outcomes"][0]["outcome"] == "dropped"


@pytest.mark.parametrize("provider", ALL_PROVIDERS)
def test_every_provider_gets_one_turn_with_every_call(provider: str) -> None:
    """Every provider: one turn with each call once, in the final message's order."""
    a = paired()
    out = feed(a, provider_run(provider, "r1", SCHEMAS, [("c1", "read_file", '{"path": "/a"}'),
                                                         ("c2", "read_file", '{"path": "/b"}')]))
    calls = committed(out)
    assert len(calls) == 2
    [turn] = turns(feed(a, [tool_result(c, f"R{n}") for n, c in enumerate(calls)]))
    assert turn["provider"] == provider
    assert [o["tool_call_id"] for o in turn["outcomes"]] == [c["call_id"] for c in calls]


def test_gemini_call_without_an_id_is_answered_without_one() -> None:
    """A Gemini call without an id is answered under the id the final message gave it
    (Latch's own), so that the response pairs with the call in the history."""
    a = paired()
    out = feed(a, provider_run(GEMINI, "r1", SCHEMAS, [(None, "read_file", '{"path": "/a"}')]))
    [call] = committed(out)
    assert call["call_id"].startswith("latch-")
    [turn] = turns(feed(a, [tool_result(call, "A")]))
    assert turn["outcomes"][0]["tool_call_id"] == call["call_id"]
    [part] = turn["messages"][0]["parts"]  # the id the final message's functionCall carries
    assert part["functionResponse"]["id"] == call["call_id"]


def test_audit_has_size_and_keyed_digest_never_text() -> None:
    """An answer's audit record has its size and keyed digest, never its text."""
    a = paired(audit_key=AuditKey("k1", b"0" * 32))
    calls = committed(feed(a, two_calls()))
    out = feed(a, [tool_result(calls[0], "top-secret")])
    [audit] = values(out, Topic.AUDIT)
    assert audit["result"]["bytes"] == 10 and len(audit["result"]["hmac"]) == 64
    assert "top-secret" not in orjson.dumps(audit).decode()


def test_off_by_default_a_result_is_a_dlq_record() -> None:
    """With the result latch off (the core's default) a forwarded result is a DLQ record and no run
    waits."""
    a = Assembler(AssembleSettings())
    calls = committed(feed(a, two_calls()))
    out = feed(a, [tool_result(calls[0])])
    assert [d["reason"] for d in dlq(out)] == ["invalid_envelope"] and not turns(out)
    assert not a.is_open("r1")


def test_replay_of_the_same_log_decides_the_same() -> None:
    """The same log fed twice decides the same, byte for byte (replay and take-over equal to
    live)."""
    log = [*two_calls(), tick(2_000)]
    first = feed(paired(), log)
    calls = committed(first)
    log += [tool_result(calls[0], "A", source=(0, 1)), tick(20_000),
            tool_result(calls[1], "B", source=(0, 2))]
    one, two = feed(paired(), log), feed(paired(), log)
    assert [(e.topic, e.value) for e in one] == [(e.topic, e.value) for e in two]
    assert [d["reason"] for d in dlq(one)] == ["result_late"]


def test_invalid_result_markers_are_rejected_with_a_reason() -> None:
    """A malformed tool.result marker is a DLQ record, invalid_envelope."""
    a = paired()
    calls = committed(feed(a, two_calls()))
    bad = [tool_result(calls[0], is_error="yes"), tool_result(calls[0], size=-1),
           {**tool_result(calls[0]), "content": 7}, tool_result(calls[0], source=[1]),
           tool_result(calls[0], tool_call_id=""), tool_result(calls[0], name="x" * 600),
           tool_result(calls[0], idempotency_key=None)]
    out = feed(a, bad)
    assert [d["reason"] for d in dlq(out)] == ["invalid_envelope"] * len(bad)


def test_settings_limits() -> None:
    """ResultSettings.limits: the tool's own limits over the section's."""
    s = ResultSettings(deadline_s=5, max_bytes=10,
                       tools=(("a", ToolResultLimits(max_bytes=99)),))
    assert s.limits("a") == (5000, 99) and s.limits("b") == (5000, 10)
    assert replace(s, deadline_s=1).limits("b") == (1000, 10)
