"""``worker/client/results.py``, what a runner answers a committed call with: one result
record per call whatever its tool returned or raised, a return value as text or JSON, a lone
surrogate escaped, an exception as its type and message, a result too large for the results
topic an error result. When a runner answers is test_runner.py's. Named
``test_client_results.py``: ``latch results`` (worker/tools/results.py) has its own."""

from __future__ import annotations

from typing import Any

import orjson

from worker.client.results import (
    ToolResult,
    answer,
    content_of,
    escaped,
    failure,
    outcome_of,
    result_record,
)

CALL = {"run_id": "r1", "tenant": "t1", "provider": "openai.chat", "call_id": "c1",
        "name": "read_file", "idempotency_key": "r1:c1", "arguments": {"path": "/secret"}}


def test_a_result_record_answers_its_call_without_its_arguments() -> None:
    """The record carries the call's run, tenant, provider, id, name and key, and never its
    arguments."""
    record = result_record(CALL, False, "ok")
    assert record == {"v": 1, "run_id": "r1", "tenant": "t1", "provider": "openai.chat",
                      "tool_call_id": "c1", "name": "read_file", "idempotency_key": "r1:c1",
                      "is_error": False, "content": "ok"}


def test_a_return_value_is_text_or_json() -> None:
    """A string is the content as it is (a subclass's own ``__str__`` is not asked); any other
    value is its JSON text; a value that is not JSON is an error result naming its type."""
    class Loud(str):
        def __str__(self) -> str:
            return "LOUD"

    assert content_of("plain") == (False, "plain")
    assert content_of(Loud("quiet")) == (False, "quiet")
    assert content_of({"a": [1, 2]}) == (False, '{"a":[1,2]}')
    is_error, content = content_of(object())
    assert is_error and "not JSON (TypeError)" in content


def test_a_lone_surrogate_is_escaped() -> None:
    """``escaped`` writes a lone surrogate as its six characters, and leaves other text as
    it is."""
    assert escaped("a\udcffb") == "a\\udcffb"
    assert escaped("é€") == "é€"


def test_an_exception_is_its_type_and_message() -> None:
    """``failure`` gives ``Type: message``, cut at 2,000 characters; an exception whose
    ``__str__`` raises is named by its type alone."""
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert failure(ValueError("bad path")) == "ValueError: bad path"
    assert len(failure(ValueError("x" * 5000))) == 2000
    assert failure(Broken()) == "Broken (its message could not be read)"


def test_an_answer_is_always_one_record_that_fits() -> None:
    """``answer`` gives the record's bytes; content with a lone surrogate is escaped, and
    content over ``max_bytes`` (JSON-escaped) becomes an error result saying so."""
    def load(data: bytes) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(data)
        return value

    assert load(answer(CALL, False, "ok", 10))["content"] == "ok"
    assert load(answer(CALL, False, "a\udcff", 100))["content"] == "a\\udcff"
    big = load(answer(CALL, False, "x" * 11, 10))
    assert big["is_error"] is True and "larger than 10 bytes" in big["content"]
    assert load(answer(CALL, False, '"' * 5, 10))["is_error"] is False  # 10 escaped bytes


def test_a_tool_result_says_error_and_structured_and_both_count_in_the_bound() -> None:
    """A ``ToolResult`` is sent as it says (``is_error``, ``content``, ``structured``); its
    structured value counts with the content in ``max_bytes`` (over it: an error result
    without it), one that is not JSON is an error result naming only its type, and a
    structured value of None is left out of the record."""
    assert outcome_of(ToolResult("t", True, {"a": 1})) == (True, "t", {"a": 1})
    assert outcome_of({"a": 1}) == (False, '{"a":1}', None)
    assert outcome_of(ToolResult(123))[0] is True  # type: ignore[arg-type]
    record = orjson.loads(answer(CALL, False, "ok", 100, {"n": 1}))
    assert (record["is_error"], record["content"], record["structured"]) == (False, "ok",
                                                                             {"n": 1})
    assert "structured" not in orjson.loads(answer(CALL, False, "ok", 100))
    over = orjson.loads(answer(CALL, False, "ok", 10, {"text": "x" * 20}))
    assert over["is_error"] is True and "structured" not in over
    assert over["content"] == "the tool's result is larger than 10 bytes"
    bad = orjson.loads(answer(CALL, False, "ok", 100, {"s": {1, 2}}))
    assert bad["is_error"] is True and "structured" not in bad
    assert bad["content"] == "the tool's structured result is not JSON (TypeError)"
