"""``latch results``'s join without a broker (issue 26, item 2): one line per call id of the
run, whatever topics its answers are on; and the run's turn record in its place when there is
one (issue 36, item 5: "``latch results RUN`` reads the turn record when there is one")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from worker.tools import results
from worker.tools.results import join, table, turn_of, turn_table


def test_calls_errors_and_results_join_by_call_id_in_call_order() -> None:
    """A committed call with a result is ``result`` (the first result wins over a repeat), a
    committed call without one ``pending``, an error result ``error`` with its state and
    reason; lines follow ``index``; a result whose committed call is gone still shows; no
    line carries arguments."""
    records = {
        "committed": [
            {"call_id": "b", "name": "add", "index": 1, "idempotency_key": "r:b",
             "arguments": {"secret": "x"}},
            {"call_id": "a", "name": "add", "index": 0, "idempotency_key": "r:a",
             "arguments": {"secret": "x"}},
        ],
        "errors": [{"tool_call_id": "c", "name": "get", "index": 2, "idempotency_key": "r:c",
                    "is_error": True, "state": "failed", "reason": "invalid_json",
                    "content": "invalid_json: ..."}],
        "results": [
            {"tool_call_id": "a", "name": "add", "idempotency_key": "r:a", "is_error": False,
             "content": "3"},
            {"tool_call_id": "a", "name": "add", "idempotency_key": "r:a", "is_error": True,
             "content": "again"},
            {"tool_call_id": "z", "name": "old", "idempotency_key": "r:z", "is_error": False,
             "content": "kept"},
        ],
    }
    lines = join("r", records)
    assert [(line["call_id"], line["status"]) for line in lines] == [
        ("a", "result"), ("b", "pending"), ("c", "error"), ("z", "result")]
    assert (lines[0]["is_error"], lines[0]["content"]) == (False, "3")
    assert (lines[2]["state"], lines[2]["reason"]) == ("failed", "invalid_json")
    assert all("arguments" not in line and "secret" not in str(line) for line in lines)


def test_the_table_is_one_row_per_call_with_content_cut() -> None:
    """``--table``: a header and one row per call; long content is cut to 60 characters and
    never spans lines."""
    lines = join("r", {"committed": [], "errors": [], "results": [
        {"tool_call_id": "a", "name": "add", "is_error": False, "content": "x\n" * 100}]})
    text = table(lines).splitlines()
    assert len(text) == 2 and text[0].startswith("CALL") and text[1].endswith("...")
    assert len(text[1].split("  ")[-1]) <= 60


TURN = {"v": 1, "run_id": "r", "tenant": "acme", "provider": "anthropic.messages",
        "final_idempotency_key": "r:final",
        "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "3"},
            {"type": "tool_result", "tool_use_id": "b", "is_error": True,
             "content": "tool_timeout: no result within the call's deadline (5 s)"}]}],
        "outcomes": [{"tool_call_id": "a", "name": "add", "outcome": "answered",
                      "reason": None, "is_error": False, "size": 1},
                     {"tool_call_id": "b", "name": "add", "outcome": "tool_timeout",
                      "reason": "tool_timeout", "is_error": True, "size": None}]}
CALLS = {"committed": [{"call_id": "a", "name": "add", "index": 0, "idempotency_key": "r:a"}],
         "errors": [], "results": [{"tool_call_id": "a", "name": "add", "is_error": False,
                                    "content": "3"}]}


def test_the_turn_record_is_the_first_whole_one_of_the_run() -> None:
    """``turn_of`` takes the run's first turn record that has its messages and outcomes (a
    repeat written by the faust engine is the same); another run's, a broken one or none at
    all is no turn record."""
    assert turn_of("r", {**CALLS, "turns": [TURN, {**TURN, "messages": []}]}) is TURN
    assert turn_of("r", {**CALLS, "turns": [{**TURN, "run_id": "other"}]}) is None
    assert turn_of("r", {**CALLS, "turns": [{**TURN, "messages": None}]}) is None
    assert turn_of("r", CALLS) is None


def test_the_turn_table_is_a_line_on_the_run_and_a_row_per_outcome() -> None:
    """``--table`` for a turn record: the run, its provider, the final message's key and the
    message count, then one row per call: outcome, error, reason, size."""
    lines = turn_table(TURN).splitlines()
    assert lines[0].startswith("turn record of r (anthropic.messages), after the final "
                               "message r:final: 1 message to append")
    assert lines[1].split() == ["CALL", "NAME", "OUTCOME", "ERROR", "REASON", "SIZE"]
    assert lines[2].split() == ["a", "add", "answered", "-", "-", "1"]
    assert lines[3].split() == ["b", "add", "tool_timeout", "yes", "tool_timeout", "-"]


@pytest.mark.parametrize(("args", "turns", "expected"), [
    ([], [TURN], "turn"), (["--calls"], [TURN], "calls"), ([], [], "calls"),
    (["--table"], [TURN], "turn table"), (["--table", "--calls"], [TURN], "calls table"),
])
def test_latch_results_prints_the_turn_record_when_there_is_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: list[str], turns: list[dict[str, Any]], expected: str) -> None:
    """``latch results RUN`` prints the run's turn record as one JSON line (its messages ready
    to append, its outcomes) when there is one, the per-call join when there is none or with
    ``--calls``; ``--table`` shows either as a table."""
    monkeypatch.setattr(results, "read_run", lambda *a, **k: {**CALLS, "turns": turns})
    assert results.main(["r", "--no-progress", *args]) == 0
    out = capsys.readouterr().out
    if expected == "turn":
        assert [orjson.loads(line) for line in out.splitlines()] == [TURN]
    elif expected == "calls":
        assert [orjson.loads(line)["status"] for line in out.splitlines()] == ["result"]
    elif expected == "turn table":
        assert out.startswith("turn record of r ") and "tool_timeout" in out
    else:
        assert out.startswith("CALL") and "STATUS" in out.splitlines()[0]
