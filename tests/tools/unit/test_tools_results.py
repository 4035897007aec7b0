"""``latch results``'s join without a broker (issue 26, item 2): one line per call id of the
run, whatever topics its answers are on."""

from __future__ import annotations

from worker.tools.results import join, table


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
