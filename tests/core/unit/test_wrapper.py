"""``core/wrapper.py``: the parallel wrapper ``multi_tool_use.parallel`` of OpenAI Chat
Completions unwrapped into one call per entry (issue 11, item 3; decision 0006), each with its
own outcome; a wrapper the run registered itself, or a text that is no wrapper, stays one call.
Moved out of test_openai_chat.py (issue 35, item 5). Every emitted line is checked against
``schemas/output-line.schema.json``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    chat_call_chunks,
    chat_chunk,
    chat_run,
    chat_tool,
    checked_run,
    committed,
    errors,
    finals,
    wrapper_text,
)

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}


run = checked_run


# -- the parallel wrapper, chat ------------------------------------------------------------


def chat_wrapper_run(text: str, tools: list[Any], call_id: str = "call_w",
                     name: str = "multi_tool_use.parallel") -> list[dict[str, Any]]:
    chunks = [*chat_call_chunks(0, call_id, name, text), chat_chunk(finish_reason="tool_calls")]
    return chat_run("r1", tools, chunks)


def test_chat_wrapper_unwraps_into_one_call_per_entry() -> None:
    """Chat ``multi_tool_use.parallel`` with two ``functions.X`` entries, neither the wrapper's
    name registered: two calls ``call_w#0`` and ``call_w#1``, each checked on its own (the
    second breaks its schema), at the wrapper's index; the final message lists the two calls
    in the wrapper's place, never the wrapper."""
    text = wrapper_text(("functions.weather", {"city": "Rome"}), ("functions.weather", {"x": 1}))
    emits = run(chat_wrapper_run(text, [chat_tool("weather", CITY)]))
    assert [(c["call_id"], c["name"], c["index"], c["arguments"]) for c in committed(emits)] == [
        ("call_w#0", "weather", 0, {"city": "Rome"})]
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("call_w#1", "schema_invalid")]
    [final] = finals(emits)
    assert final["status"] == "completed"
    assert final["message"]["tool_calls"] == [
        {"id": "call_w#0", "type": "function",
         "function": {"name": "weather", "arguments": '{"city":"Rome"}'}},
        {"id": "call_w#1", "type": "function",
         "function": {"name": "weather", "arguments": '{"x":1}'}}]
    assert [o["tool_call_id"] for o in final["outcomes"]] == ["call_w#0", "call_w#1"]


def test_chat_wrapper_registered_by_the_run_is_an_ordinary_call() -> None:
    """A run that registered ``multi_tool_use.parallel`` itself gets one call to it."""
    text = wrapper_text(("functions.weather", {"city": "Rome"}))
    emits = run(chat_wrapper_run(text, [chat_tool("multi_tool_use.parallel", {})]))
    assert [(c["call_id"], c["name"]) for c in committed(emits)] == [
        ("call_w", "multi_tool_use.parallel")]


@pytest.mark.parametrize(("text", "reason"), [
    ('{"tool_uses": []}', "unknown_tool"),
    ('{"calls": [1]}', "unknown_tool"),
    ('{"tool_uses": [', "unknown_tool"),
    ('[{"tool_uses": [1]}]', "unknown_tool"),
])
def test_chat_text_that_is_no_wrapper_stays_the_wrapper_call(text: str, reason: str) -> None:
    """A wrapper whose text is not a strict JSON object with a non-empty ``tool_uses`` array
    is not unwrapped: the call keeps its own id and fails like any call to an unregistered
    name."""
    emits = run(chat_wrapper_run(text, [chat_tool("weather", CITY)]))
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [("call_w", reason)]


def test_chat_wrapper_entries_that_are_malformed_get_their_own_outcome() -> None:
    """Entries without a usable ``recipient_name`` fail ``missing_id_or_name``; one without
    ``parameters`` has empty text, read as ``{}``; a name outside the ``functions.``
    namespace is taken as it is."""
    text = orjson.dumps({"tool_uses": [
        {"parameters": {"city": "Rome"}}, 7, {"recipient_name": "functions.ping"},
        {"recipient_name": "ping", "parameters": {}}]}).decode()
    emits = run(chat_wrapper_run(text, [chat_tool("ping", {"type": "object"})]))
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("call_w#0", "missing_id_or_name"), ("call_w#1", "missing_id_or_name")]
    assert [(c["call_id"], c["arguments"]) for c in committed(emits)] == [
        ("call_w#2", {}), ("call_w#3", {})]


def test_chat_wrapper_with_more_entries_than_the_run_may_hold_fails_whole() -> None:
    """A wrapper with more entries than ``4 x max_tool_calls_in_flight_assemble`` calls
    is not unwrapped: the wrapper fails ``too_many_tool_calls`` under its own id."""
    text = wrapper_text(*[("functions.ping", {})] * 9)
    emits = run(chat_wrapper_run(text, [chat_tool("ping", {})]),
                max_tool_calls_in_flight_assemble=2)
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("call_w", "too_many_tool_calls")]


def test_chat_derived_id_equal_to_a_real_id_fails_both() -> None:
    """A real call whose id equals a derived one (``call_w#0``) makes that id ambiguous:
    both calls fail ``duplicate_call_id``, the other derived call commits."""
    text = wrapper_text(("functions.ping", {}), ("functions.ping", {}))
    chunks = [*chat_call_chunks(0, "call_w", "multi_tool_use.parallel", text),
              *chat_call_chunks(1, "call_w#0", "ping", "{}"),
              chat_chunk(finish_reason="tool_calls")]
    emits = run(chat_run("r1", [chat_tool("ping", {})], chunks))
    assert sorted((e["tool_call_id"], e["reason"]) for e in errors(emits)) == [
        ("call_w#0", "duplicate_call_id"), ("call_w#0", "duplicate_call_id")]
    assert [c["call_id"] for c in committed(emits)] == ["call_w#1"]


def test_chat_wrapper_cut_by_a_stream_error_fails_under_its_own_id() -> None:
    """A wrapper still open when the stream fails was never complete: it is not unwrapped,
    and its own id gets the one ``stream_error``."""
    text = wrapper_text(("functions.ping", {}))
    chunks = chat_call_chunks(0, "call_w", "multi_tool_use.parallel", text)
    emits = run(chat_run("r1", [chat_tool("ping", {})],
                         [*chunks, {"v": 1, "type": "stream.error", "error": "reset"}],
                         end=False))
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("call_w", "stream_error")]
