"""``latch tail``'s lines (``worker/tools/tail.py``): one line per output record, what it
shows of each topic, arguments cut, an audit record on one line without its digest, and the
topic list. Moved out of test_publisher.py (issue 35, item 5)."""

from __future__ import annotations

from typing import Any

import pytest

from worker.tools import tail

# -- latch tail's lines ---------------------------------------------------------------------


def rec(topic: str, value: Any, key: str | None = "r1") -> tail.Record:
    return tail.Record(topic, key, value, timestamp_ms=None)


def without_clock(line: str) -> str:
    clock, _, rest = line.partition(" ")
    assert len(clock) == 8 and clock[2] == clock[5] == ":"
    return rest


def test_tail_lines() -> None:
    """``latch tail`` formats each record kind (committed, error, final, DLQ, progress,
    events, control, not JSON) as one readable line, newlines escaped; ``as_line`` keeps the
    whole record."""
    committed = {"v": 1, "run_id": "r1", "call_id": "call_abc", "name": "read_file",
                 "index": 0, "arguments": {"path": "/tmp/a"}}
    error = {"v": 1, "run_id": "r1", "tool_call_id": "call_x", "name": "read_file",
             "state": "failed", "reason": "invalid_json",
             "content": "invalid_json: trailing comma at char 46"}
    final = {"v": 1, "run_id": "r1", "status": "completed",
             "outcomes": [{"state": "committed"}, {"state": "failed"}]}
    dlq = {"v": 1, "reason": "unknown_run", "detail": "no run.start\nfor this run"}
    progress = {"run_id": "r1", "tool_call_id": None, "call_key": "0:1", "name": None,
                "bytes": 12}
    lines = [without_clock(tail.format_record(r)) for r in [
        rec("committed", committed), rec("errors", error), rec("final", final),
        rec("dlq", dlq, key="k1"), rec("progress", progress), rec("final", "not json"),
        rec("events", {"run_id": "r1", "seq": 3, "type": "provider.event",
                       "event": {"type": "ping"}}),
        rec("control", {"run_id": "r1", "type": "cancel", "reason": "user_stop"}),
    ]]
    assert lines == [
        'committed r1 call_abc read_file {"path": "/tmp/a"}',
        "errors r1 call_x read_file failed invalid_json: trailing comma at char 46",
        "final r1 completed 2 calls (1 committed, 1 failed)",
        "dlq k1 unknown_run no run.start\\nfor this run",
        "progress r1 0:1 - 12 bytes",
        "final r1 <8 bytes, not a JSON object>",
        "events r1 #3 provider.event ping",
        "control r1 cancel user_stop",
    ]
    assert rec("final", final).as_line() == {"topic": "final", "key": "r1", "value": final}


def test_tail_prints_an_audit_record_on_one_line_without_a_digest() -> None:
    """``latch tail --topics audit`` prints the call, its outcome and reason, the policy's
    mode and decision with the determining policies, and the argument size (not the digest:
    a long hex string helps no one reading a terminal)."""
    audit = {"v": 1, "run_id": "r1", "tool_call_id": "c1", "name": "rm", "outcome": "error",
             "reason": "policy_denied", "policy": {"mode": "enforce", "allow": False,
                                                   "policies": ["forbid-rm"], "errors": [],
                                                   "version": 3},
             "arguments": {"bytes": 16, "sha256": "ab" * 32}}
    off = {"run_id": "r2", "tool_call_id": "c2", "name": "ls", "outcome": "committed",
           "reason": None, "policy": {"mode": "off"}, "arguments": None}
    assert [without_clock(tail.format_record(rec("audit", v))) for v in (audit, off)] == [
        "audit r1 c1 rm error policy_denied policy=enforce:deny(forbid-rm) 16 bytes",
        "audit r2 c2 ls committed policy=off - bytes"]


def test_tail_cuts_long_arguments() -> None:
    """``latch tail`` cuts a committed call's long arguments with ``...``: the line stays short."""
    committed = {"run_id": "r1", "call_id": "c", "name": "n", "arguments": {"a": "x" * 500}}
    line = without_clock(tail.format_record(rec("committed", committed)))
    assert line.endswith("...") and len(line) < 230


def test_tail_topic_list() -> None:
    """``--topics`` takes a comma-separated list (spaces and repeats tolerated) and refuses an
    unknown topic name."""
    assert tail.build_parser().parse_args(["--topics", "final, dlq,final"]).topics == [
        "final", "dlq"]
    with pytest.raises(SystemExit):
        tail.build_parser().parse_args(["--topics", "committed,bogus"])


def test_tail_prints_results_and_turn_records_on_one_line() -> None:
    """``latch tail --topics results,turns`` (issue 36): a runner's result with its text cut as
    arguments are, the latch's ``tool_timeout`` answer naming who wrote it, and a turn record
    as its provider, its calls' outcomes (a failed call's reason after it) and its message
    count; both topics are logical names ``--topics`` takes."""
    answered = {"run_id": "r1", "tool_call_id": "c1", "name": "add", "is_error": False,
                "content": "5"}
    timeout = {"run_id": "r1", "tool_call_id": "c2", "name": "get", "is_error": True,
               "content": "tool_timeout: no result\nwithin 5 s", "reason": "tool_timeout",
               "by": "latch"}
    long = {**answered, "content": "y" * 500}
    turn = {"run_id": "r1", "provider": "anthropic.messages",
            "messages": [{"role": "user", "content": []}],
            "outcomes": [{"tool_call_id": "c1", "outcome": "answered", "reason": None},
                         {"tool_call_id": "c2", "outcome": "tool_timeout",
                          "reason": "tool_timeout"},
                         {"tool_call_id": "c3", "outcome": "failed",
                          "reason": "invalid_json"}]}
    empty = {"run_id": "r2", "provider": "openai.chat", "messages": [], "outcomes": []}
    lines = [without_clock(tail.format_record(r)) for r in [
        rec("results", answered), rec("results", timeout), rec("turns", turn),
        rec("turns", empty, key="r2")]]
    assert lines == [
        "results r1 c1 add ok: 5",
        "results r1 c2 get error tool_timeout by latch: tool_timeout: no result\\nwithin 5 s",
        "turns r1 anthropic.messages 3 calls (answered, tool_timeout, failed invalid_json), "
        "1 message",
        "turns r2 openai.chat 0 calls 0 messages",
    ]
    cut = without_clock(tail.format_record(rec("results", long)))
    assert cut.endswith("...") and len(cut) < 230
    assert tail.build_parser().parse_args(["--topics", "turns,results"]).topics == [
        "turns", "results"]
