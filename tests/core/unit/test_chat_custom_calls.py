"""Chat Completions custom (free-form) tool calls (issue 33, item 2).

A model with a custom tool streams its call in ``delta.tool_calls[]`` as
``{"index", "id", "type": "custom", "custom": {"name", "input"}}``, the input text in pieces
(openai-python #2530; ``ChatCompletionMessageCustomToolCall`` for the whole message). It is
committed as Responses' custom calls are: ``kind: custom``, the whole ``input`` text, never
parsed, under the one name of a tool the run declared as chat's custom tool shape; the final
message writes it back in chat's own shape.
"""

from __future__ import annotations

from typing import Any

from builders import (
    chat_call_chunks,
    chat_chunk,
    chat_custom_chunks,
    chat_custom_tool,
    chat_run,
    chat_tool,
    chat_tool_delta,
    checked_run,
    committed,
    errors,
    finals,
)

from worker.core import ops as op
from worker.core.providers.openai_chat import OpenAIChat

GRAMMAR = {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}}
CODE = 'print("hi")\nimport os; os.listdir(".")'
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
END = chat_chunk(finish_reason="tool_calls")


def test_a_custom_call_in_pieces_commits_its_whole_input() -> None:
    """The input pieces make one committed call: ``kind: custom``, ``input`` the whole text
    (not JSON, never parsed: the grammar is not enforced), no ``arguments``; the final message
    has the call in chat's custom shape."""
    emits = checked_run(chat_run("r1", [chat_custom_tool("code_exec", GRAMMAR)],
                                 [*chat_custom_chunks(0, "call_c", "code_exec", CODE,
                                                      pieces=5), END]))
    [call] = committed(emits)
    assert (call["kind"], call["call_id"], call["name"], call["input"]) == (
        "custom", "call_c", "code_exec", CODE)
    assert "arguments" not in call
    [final] = finals(emits)
    assert final["message"]["tool_calls"] == [
        {"id": "call_c", "type": "custom", "custom": {"name": "code_exec", "input": CODE}}]
    assert [o["kind"] for o in final["outcomes"]] == ["custom"]


def test_a_custom_and_a_function_call_in_parallel() -> None:
    """A custom call at index 0 and a function call at index 1, their pieces interleaved:
    each commits with its own text and shape, in index order."""
    custom = chat_custom_chunks(0, "call_c", "code_exec", CODE, pieces=3)
    function = chat_call_chunks(1, "call_f", "weather", '{"city": "Paris"}', pieces=3)
    chunks = [c for pair in zip(custom, function, strict=True) for c in pair]
    emits = checked_run(chat_run("r1", [chat_custom_tool("code_exec"),
                                        chat_tool("weather", CITY)], [*chunks, END]))
    assert [(c.get("kind"), c["call_id"], c.get("input"), c.get("arguments"))
            for c in committed(emits)] == [("custom", "call_c", CODE, None),
                                           (None, "call_f", None, {"city": "Paris"})]
    [final] = finals(emits)
    assert [(t["type"], t["id"]) for t in final["message"]["tool_calls"]] == [
        ("custom", "call_c"), ("function", "call_f")]


def test_a_custom_call_without_its_custom_tool_fails_unknown_tool() -> None:
    """Unregistered, or registered only as a function tool of the same name: the custom call
    fails ``unknown_tool`` (its error never quoting the input), and the function tool is not
    found by it."""
    for tools in ([], [chat_tool("code_exec", {})]):
        emits = checked_run(chat_run("r1", tools, [*chat_custom_chunks(
            0, "call_c", "code_exec", "rm -rf /x"), END]))
        [error] = errors(emits)
        assert (error["kind"], error["name"], error["reason"]) == (
            "custom", "code_exec", "unknown_tool")
        assert "rm -rf" not in error["content"]
        assert committed(emits) == []


def test_a_function_call_does_not_find_a_custom_tool() -> None:
    """A function call named like a custom tool (and nothing else registered) fails
    ``unknown_tool``: a custom registration does not take JSON arguments."""
    emits = checked_run(chat_run("r1", [chat_custom_tool("code_exec")], [
        *chat_call_chunks(0, "call_f", "code_exec", "{}"), END]))
    assert [(e.get("kind"), e["reason"]) for e in errors(emits)] == [(None, "unknown_tool")]


def test_a_function_and_a_custom_tool_of_one_name_are_ambiguous() -> None:
    """A run that declares ``code_exec`` as a function and as a custom tool: both calls of
    that name fail ``ambiguous_tool``; a third tool's call commits."""
    tools = [chat_tool("code_exec", {}), chat_custom_tool("code_exec"),
             chat_tool("weather", CITY)]
    emits = checked_run(chat_run("r1", tools, [
        *chat_custom_chunks(0, "call_c", "code_exec", CODE),
        *chat_call_chunks(1, "call_f", "code_exec", "{}"),
        *chat_call_chunks(2, "call_w", "weather", '{"city": "X"}'), END]))
    assert sorted((e["tool_call_id"], e["reason"]) for e in errors(emits)) == [
        ("call_c", "ambiguous_tool"), ("call_f", "ambiguous_tool")]
    assert [c["call_id"] for c in committed(emits)] == ["call_w"]


def test_a_fragment_of_the_other_shape_is_no_part_of_the_call() -> None:
    """A ``function.arguments`` fragment at a custom call's index (or ``custom.input`` at a
    function call's) does not join its text: it opens an id-less call of its own, which fails
    ``missing_id_or_name``; the call at that index commits its own text."""
    emits = checked_run(chat_run("r1", [chat_custom_tool("code_exec"),
                                        chat_tool("weather", CITY)], [
        *chat_custom_chunks(0, "call_c", "code_exec", CODE),
        chat_chunk([chat_tool_delta(0, arguments='{"x": 1}')]),
        *chat_call_chunks(1, "call_f", "weather", '{"city": "X"}'),
        chat_chunk([{"index": 1, "custom": {"input": "junk"}}]), END]))
    assert [(c["call_id"], c.get("input"), c.get("arguments")) for c in committed(emits)] == [
        ("call_c", CODE, None), ("call_f", None, {"city": "X"})]
    assert [e["reason"] for e in errors(emits)] == ["missing_id_or_name"] * 2


def _ops(ops: list[op.Op] | None) -> Any:
    if ops is None:
        return None
    return [(type(o).__name__, getattr(o, "key", None), getattr(o, "text", None),
             getattr(o, "kind", None)) for o in ops]


def test_the_function_fast_path_never_takes_a_custom_call() -> None:
    """``fast`` of a ``function.arguments`` piece (what ``worker.core._peek`` calls
    ``CHAT_ARGS``) at a custom call's index says None (the general path decides), and at a
    function call's index appends, as the general path does."""
    adapter = OpenAIChat()
    adapter.feed(chat_custom_chunks(0, "call_c", "code_exec", "")[0])
    adapter.feed(chat_call_chunks(1, "call_f", "weather", "")[0])
    assert adapter.fast(op.CHAT_ARGS, 0, '{"x": 1}') is None
    fast = adapter.fast(op.CHAT_ARGS, 1, '{"a"')
    general = OpenAIChat()
    general.feed(chat_custom_chunks(0, "call_c", "code_exec", "")[0])
    general.feed(chat_call_chunks(1, "call_f", "weather", "")[0])
    assert _ops(fast) == _ops(general.feed(chat_chunk([chat_tool_delta(1, arguments='{"a"')])))
