"""Unit tests of the Bedrock and Gemini pieces: the Gemini ``partialArgs`` builder and its
JSONPath reader, Google's OpenAPI-subset schemas, the tool lists of both providers, and what
happens when a stream breaks its own protocol."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from builders import (
    BEDROCK,
    EMPTY_SCHEMA,
    GEMINI,
    PATH_SCHEMA,
    bedrock_calls,
    bedrock_tool_block,
    check_outputs,
    committed,
    dlq,
    errors,
    feed,
    finals,
    gemini_calls,
    gemini_chunk,
    run_envelopes,
    tools_for,
)

from worker.core import Assembler
from worker.core.providers import gemini_args
from worker.core.strictjson import MAX_DEPTH, ParseError
from worker.core.tools import client_tools, openapi_schema


def records(*partials: dict[str, Any]) -> str:
    return "".join(gemini_args.record(p) for p in partials)


# -- JSONPath --------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "segments"), [
    ("$.a", ["a"]),
    ("$.operations[0].action", ["operations", 0, "action"]),
    ("$['a b']['c\\'d'][12]", ["a b", "c'd", 12]),
    ('$["x\\u0041\\n"]', ["xA\n"]),
    ("$._x1.é", ["_x1", "é"]),
])
def test_parse_path_reads_singular_queries(path: str, segments: list[Any]) -> None:
    """Names (shorthand and quoted, with RFC 9535 escapes) and indexes are read as segments."""
    assert gemini_args.parse_path(path) == segments


@pytest.mark.parametrize("path", [
    "a", "$.", "$.1a", "$[*]", "$..a", "$[-1]", "$[01]", "$[0:2]", "$[?@.a]", "$['a'",
    "$.a b", "$['\\x']", "$['\\ud800']", "$[1234567890123456]", "$.a\ud800", "$.\udfff",
])
def test_parse_path_refuses_everything_else(path: str) -> None:
    """Wildcards, descendants, slices, filters, negative or padded indexes, bad escapes and
    unterminated names are refused with a message (a string), never an exception."""
    assert isinstance(gemini_args.parse_path(path), str)


def test_parse_path_is_bounded() -> None:
    """A path deeper than MAX_DEPTH - 1 segments, or longer than MAX_PATH_CHARACTERS, is
    refused before any container is made."""
    assert isinstance(gemini_args.parse_path("$" + ".a" * MAX_DEPTH), str)
    assert gemini_args.parse_path("$" + ".a" * (MAX_DEPTH - 1)) == ["a"] * (MAX_DEPTH - 1)
    long = "$." + "a" * gemini_args.MAX_PATH_CHARACTERS
    assert "longer" in str(gemini_args.parse_path(long))


# -- building the arguments --------------------------------------------------------------------


def test_build_joins_strings_and_nests() -> None:
    """Strings continued with willContinue are joined; objects and arrays are made as the
    paths need them; numbers, booleans and null keep their types."""
    text = records({"jsonPath": "$.a.b", "stringValue": "he", "willContinue": True},
                   {"jsonPath": "$.a.b", "stringValue": "llo"},
                   {"jsonPath": "$.list[0]", "numberValue": 1},
                   {"jsonPath": "$.list[1].ok", "boolValue": True},
                   {"jsonPath": "$.none", "nullValue": "NULL_VALUE"},
                   {"json_path": "$.snake", "string_value": "s"})
    assert gemini_args.build(text) == {"a": {"b": "hello"}, "list": [1, {"ok": True}],
                                       "none": None, "snake": "s"}


@pytest.mark.parametrize(("partials", "why"), [
    ([{"jsonPath": "$.a", "stringValue": "x"}, {"jsonPath": "$['a']", "stringValue": "y"}],
     "duplicate key"),
    ([{"jsonPath": "$.a[1]", "numberValue": 1}], "beyond the next element"),
    ([{"jsonPath": "$.a", "numberValue": 1}, {"jsonPath": "$.a.b", "numberValue": 1}],
     "not an object or array"),
    ([{"jsonPath": "$.a[0]", "numberValue": 1}, {"jsonPath": "$.a.b", "numberValue": 1}],
     "member name applied to an array"),
    ([{"jsonPath": "$.a", "stringValue": "x", "willContinue": True}], "never finished"),
    ([{"jsonPath": "$.a", "stringValue": "x", "willContinue": True},
      {"jsonPath": "$.b", "stringValue": "y"}], "does not continue"),
    ([{"jsonPath": "$.a", "numberValue": 1, "willContinue": True},
      {"jsonPath": "$.a", "numberValue": 2}], "not a string"),
    ([{"jsonPath": "$", "numberValue": 1}], "whole arguments object"),
    ([{"jsonPath": "$[*]", "numberValue": 1}], "a selector other than"),
    ([{"jsonPath": "$.a"}], "0 values"),
    ([{"jsonPath": "$.a", "stringValue": "x", "numberValue": 1}], "2 values"),
    ([{"jsonPath": "$.a", "numberValue": "1"}], "wrong type"),
    ([{"stringValue": "x"}], "jsonPath"),
    (["not an object"], "not an object"),
])
def test_build_refuses_with_a_reason(partials: list[Any], why: str) -> None:
    """Every way a sequence of partial arguments fails to describe one strict object gives a
    ParseError (the call fails invalid_json), whose message says why and quotes no value."""
    result = gemini_args.build("".join(gemini_args.record(p) for p in partials))
    assert isinstance(result, ParseError), result
    assert why in result.message
    assert "'x'" not in result.message and '"x"' not in result.message


def test_build_is_never_longer_than_the_records() -> None:
    """What a record adds to the built JSON is never longer than the record (the counted
    bytes bound the built arguments)."""
    import orjson
    partials = [{"jsonPath": f"$.k{n}[0]['q']", "stringValue": "v" * n} for n in range(30)]
    text = records(*partials)
    assert len(orjson.dumps(gemini_args.build(text))) <= len(text.encode())


# -- Google's OpenAPI subset, and the tool lists ---------------------------------------------


def test_openapi_schema_converts_google_types() -> None:
    """Upper-case type names become JSON Schema's, nullable adds null (to an enum too), counts
    written as strings become integers, snake_case keywords are read, example is left out."""
    google = {"type": "OBJECT", "required": ["unit"], "example": {"x": 1}, "properties": {
        "unit": {"type": "STRING", "enum": ["c", "f"], "nullable": True},
        "tags": {"type": "ARRAY", "items": {"type": "STRING"}, "max_items": "3"},
        "n": {"type": "INTEGER", "minimum": 1, "format": "int32"},
        "either": {"any_of": [{"type": "NUMBER"}, {"type": "BOOLEAN"}]}}}
    assert openapi_schema(google) == {"type": "object", "required": ["unit"], "properties": {
        "unit": {"type": ["string", "null"], "enum": ["c", "f", None]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "n": {"type": "integer", "minimum": 1, "format": "int32"},
        "either": {"anyOf": [{"type": "number"}, {"type": "boolean"}]}}}


def test_gemini_tools_in_both_spellings() -> None:
    """functionDeclarations and function_declarations, parametersJsonSchema and
    parameters_json_schema and parameters all register; built-in tools do not."""
    tools = [{"functionDeclarations": [
                 {"name": "a", "parametersJsonSchema": {"type": "object"}},
                 {"name": "b", "parameters": {"type": "OBJECT"}}]},
             {"function_declarations": [
                 {"name": "c", "parameters_json_schema": {"type": "object"}}, {"name": "d"}]},
             {"googleSearch": {}}, {"codeExecution": {}}]
    assert client_tools(GEMINI, tools) == {"a": {"type": "object"}, "b": {"type": "object"},
                                           "c": {"type": "object"}, "d": {}}


def test_bedrock_tools_skip_system_tools() -> None:
    """toolSpec entries register with inputSchema.json; systemTool and cachePoint do not."""
    tools = [{"toolSpec": {"name": "a", "inputSchema": {"json": PATH_SCHEMA}}},
             {"toolSpec": {"name": "b"}}, {"systemTool": {"name": "nova_grounding"}},
             {"cachePoint": {"type": "default"}}]
    assert client_tools(BEDROCK, tools) == {"a": PATH_SCHEMA, "b": {}}


def test_gemini_openapi_parameters_decide_the_schema() -> None:
    """A call whose arguments break a tool's OpenAPI-subset ``parameters`` fails
    schema_invalid: the converted schema is the one applied."""
    tools = [{"functionDeclarations": [{"name": "f", "parameters": {
        "type": "OBJECT", "required": ["n"], "properties": {"n": {"type": "INTEGER"}}}}]}]
    emits = feed(Assembler(), run_envelopes("r1", GEMINI, tools, gemini_calls(
        [("c1", "f", '{"n": "one"}'), ("c2", "f", '{"n": 1}')])))
    assert [e["reason"] for e in errors(emits)] == ["schema_invalid"]
    assert [c["call_id"] for c in committed(emits)] == ["c2"]


def test_bedrock_reasoning_text_signature_and_redacted_content_are_kept() -> None:
    """reasoningContent deltas: two text pieces and a signature make one ``reasoningText``
    with both; two ``redactedContent`` pieces (base64, as the JSON payload carries bytes) are
    joined as bytes and written back as one base64 blob, not as two strings glued together;
    the tool call after them commits, and the final message keeps the three in index order."""
    def reasoning(index: int, body: dict[str, str]) -> dict[str, Any]:
        return {"contentBlockDelta": {"contentBlockIndex": index,
                                      "delta": {"reasoningContent": body}}}
    first, second = b"\x00\x01opaque-", b"part2\xff"
    events = [{"messageStart": {"role": "assistant"}},
              reasoning(0, {"text": "Let me "}), reasoning(0, {"text": "think."}),
              reasoning(0, {"signature": "SIG-1"}), {"contentBlockStop": {"contentBlockIndex": 0}},
              reasoning(1, {"redactedContent": base64.b64encode(first).decode()}),
              reasoning(1, {"redactedContent": base64.b64encode(second).decode()}),
              {"contentBlockStop": {"contentBlockIndex": 1}},
              *bedrock_tool_block(2, "c1", "read_file", '{"path": "/a"}'),
              {"messageStop": {"stopReason": "tool_use"}}]
    emits = feed(Assembler(), run_envelopes("r1", BEDROCK, tools_for(
        BEDROCK, {"read_file": PATH_SCHEMA}), events))
    check_outputs(emits)
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
    assert finals(emits)[0]["message"]["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "Let me think.", "signature": "SIG-1"}}},
        {"reasoningContent": {"redactedContent": base64.b64encode(first + second).decode()}},
        {"toolUse": {"toolUseId": "c1", "name": "read_file", "input": {"path": "/a"}}}]


# -- server-side tools, and streams that break their protocol ---------------------------------


def test_bedrock_server_tool_is_kept_not_committed() -> None:
    """A ``server_tool_use`` block and its ``toolResult`` appear in the final message only."""
    events = [
        {"contentBlockStart": {"contentBlockIndex": 0, "start": {"toolUse": {
            "toolUseId": "s1", "name": "web_search", "type": "server_tool_use"}}}},
        {"contentBlockDelta": {"contentBlockIndex": 0,
                               "delta": {"toolUse": {"input": '{"q": "x"}'}}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"contentBlockStart": {"contentBlockIndex": 1, "start": {"toolResult": {
            "toolUseId": "s1", "type": "web_search_result", "status": "success"}}}},
        {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolResult": [{"text": "a"}]}}},
        {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolResult": [{"text": "b"}]}}},
        {"contentBlockStop": {"contentBlockIndex": 1}},
        {"messageStop": {"stopReason": "end_turn"}}]
    tools = tools_for(BEDROCK, {"web_search": PATH_SCHEMA})
    emits = feed(Assembler(), run_envelopes("r1", BEDROCK, tools, events))
    assert committed(emits) == [] and errors(emits) == []
    [final] = finals(emits)
    assert final["status"] == "completed"
    assert final["message"]["content"] == [
        {"toolUse": {"toolUseId": "s1", "name": "web_search", "type": "server_tool_use",
                     "input": {"q": "x"}}},
        {"toolResult": {"toolUseId": "s1", "type": "web_search_result", "status": "success",
                        "content": [{"text": "ab"}]}}]


@pytest.mark.parametrize("breach", ["restart", "after_stop", "second_message", "late_block"])
def test_bedrock_broken_protocol_fails_every_call_once(breach: str) -> None:
    """A content block index reused, content after its block's stop, a second messageStart,
    or a block after messageStop: the run stays open to its end and fails protocol_error,
    every call either message opened gets exactly one outcome (protocol_error; a call started
    after the break under its own late key), nothing is committed, nothing goes to the DLQ,
    and nothing after the break is kept for the final message."""
    first = bedrock_calls([("c1", "read_file", '{"path": "/a"}')], stop_reason=None)[:-1]
    extra = {
        "restart": bedrock_tool_block(0, "c2", "read_file", '{"path": "/b"}'),
        "after_stop": [{"contentBlockDelta": {"contentBlockIndex": 0,
                                              "delta": {"toolUse": {"input": "x"}}}}],
        "second_message": [{"messageStart": {"role": "assistant"}},
                           *bedrock_tool_block(1, "c2", "read_file", '{"path": "/b"}')],
        "late_block": [{"messageStop": {"stopReason": "tool_use"}},
                       *bedrock_tool_block(1, "c2", "read_file", '{"path": "/b"}')],
    }[breach]
    emits = feed(Assembler(), run_envelopes("r1", BEDROCK, tools_for(BEDROCK,
                                            {"read_file": PATH_SCHEMA}), first + extra))
    check_outputs(emits)
    late = [] if breach == "after_stop" else [("c2", "protocol_error")]
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("c1", "protocol_error"), *late]
    assert committed(emits) == [] and dlq(emits) == []
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert [o["tool_call_id"] for o in final["outcomes"]] == ["c1", *(i for i, _ in late)]
    assert [next(iter(c)) for c in final["message"]["content"]] == ["toolUse"]
    assert final["message"]["content"][0]["toolUse"]["input"] == {"path": "/a"}


def test_gemini_partial_args_without_a_call_fail_the_run() -> None:
    """``partialArgs`` with no streamed call open (a spliced or broken stream): the call
    that was open fails protocol_error, the run stays open to its end and fails
    protocol_error, and the text after the break is not kept for the final message."""
    chunks = [gemini_chunk([{"functionCall": {"name": "read_file", "id": "c1",
                                              "args": {"path": "/a"}}}]),
              gemini_chunk([{"functionCall": {"partialArgs": [
                  {"jsonPath": "$.path", "stringValue": "/b"}]}}]),
              gemini_chunk([{"text": "spliced"}], finish_reason="STOP")]
    emits = feed(Assembler(), run_envelopes("r1", GEMINI, tools_for(
        GEMINI, {"read_file": PATH_SCHEMA}), chunks))
    check_outputs(emits)
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [("c1", "protocol_error")]
    assert committed(emits) == [] and dlq(emits) == []
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert [list(p) for p in final["message"]["parts"]] == [["functionCall"]]


@pytest.mark.parametrize("breach", ["after_finish", "nameless", "nameless_with_id"])
def test_gemini_broken_protocol_gives_every_carried_id_one_outcome(breach: str) -> None:
    """A part after its candidate's finishReason, or a nameless functionCall while no call
    streams: the run fails protocol_error at its end; the call before the break and every
    call the stream still carries (with its own id, or the next ``latch-`` id when it has
    none) get exactly one outcome, protocol_error; nothing is committed or sent to the DLQ."""
    late_call = {"name": "read_file", "args": {"path": "/b"}}
    chunks = [gemini_chunk([{"functionCall": {"name": "read_file", "id": "c1",
                                              "args": {"path": "/a"}}}])]
    late_ids = ["latch-0-1-r1"]
    if breach == "after_finish":
        chunks += [gemini_chunk([{"text": "x"}], finish_reason="STOP"),
                   gemini_chunk([{"functionCall": late_call}])]
    elif breach == "nameless":
        chunks += [gemini_chunk([{"functionCall": {"willContinue": True}}]),
                   gemini_chunk([{"functionCall": {**late_call, "id": "c3"}}]),
                   gemini_chunk([{"text": ""}], finish_reason="STOP")]
        late_ids = ["c3"]
    else:
        chunks += [gemini_chunk([{"functionCall": {"id": "c2", "partialArgs": []}}]),
                   gemini_chunk([{"functionCall": late_call}]),
                   gemini_chunk([{"text": ""}], finish_reason="STOP")]
        late_ids = ["c2", "latch-0-2-r1"]
    emits = feed(Assembler(), run_envelopes("r1", GEMINI, tools_for(
        GEMINI, {"read_file": PATH_SCHEMA}), chunks))
    check_outputs(emits)
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        (i, "protocol_error") for i in ["c1", *late_ids]]
    assert committed(emits) == [] and dlq(emits) == []
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert [o["tool_call_id"] for o in final["outcomes"]] == ["c1", *late_ids]


def test_gemini_new_call_ends_the_streamed_one() -> None:
    """A named functionCall while another call streams ends that call (its partial string
    never finished fails invalid_json) and opens the next, which commits."""
    chunks = [gemini_chunk([{"functionCall": {"name": "read_file", "id": "c1",
                                              "willContinue": True}}]),
              gemini_chunk([{"functionCall": {"willContinue": True, "partialArgs": [
                  {"jsonPath": "$.path", "stringValue": "/a", "willContinue": True}]}}]),
              gemini_chunk([{"functionCall": {"name": "read_file", "id": "c2",
                                              "args": {"path": "/b"}}}]),
              gemini_chunk([{"text": ""}], finish_reason="STOP")]
    emits = feed(Assembler(), run_envelopes("r1", GEMINI, tools_for(
        GEMINI, {"read_file": PATH_SCHEMA}), chunks))
    check_outputs(emits)
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [("c1", "invalid_json")]
    assert [c["call_id"] for c in committed(emits)] == ["c2"]


def test_gemini_two_candidates_keep_their_calls_apart() -> None:
    """candidateCount 2: each candidate's calls are keyed by (candidate, position), carry
    their candidate as ``choice``; MAX_TOKENS on one truncates only its calls; the final record
    holds one message per candidate."""
    def chunk(candidate: int, parts: list[dict[str, Any]], finish: str | None = None
              ) -> dict[str, Any]:
        return gemini_chunk(parts, finish_reason=finish, candidate=candidate)
    chunks = [chunk(0, [{"functionCall": {"name": "read_file", "args": {"path": "/a"}}}]),
              chunk(1, [{"functionCall": {"name": "read_file", "args": {"path": "/b"}}}]),
              chunk(0, [{"text": "done"}], "STOP"), chunk(1, [], "MAX_TOKENS")]
    emits = feed(Assembler(), run_envelopes("r9", GEMINI, tools_for(
        GEMINI, {"read_file": PATH_SCHEMA}), chunks))
    check_outputs(emits)
    assert [(c["call_id"], c["choice"]) for c in committed(emits)] == [("latch-0-0-r9", 0)]
    assert [(e["tool_call_id"], e["choice"], e["reason"]) for e in errors(emits)] == [
        ("latch-1-0-r9", 1, "truncated")]
    [final] = finals(emits)
    assert final["status"] == "truncated"
    assert [c["index"] for c in final["choices"]] == [0, 1]
    assert final["message"]["parts"][-1] == {"text": "done"}


def test_gemini_parallel_whole_calls_in_one_chunk() -> None:
    """Three whole functionCall parts without ids in one chunk (Vertex's parallel calls, the
    last one without ``args``): three calls in part order, none dropped or merged, each with
    its own deterministic id and arguments, all three in the final message."""
    chunks = [gemini_chunk([{"functionCall": {"name": "read_file", "args": {"path": "/a"}}},
                            {"functionCall": {"name": "read_file", "args": {"path": "/b"}}},
                            {"functionCall": {"name": "get_time"}}]),
              gemini_chunk([{"text": ""}], finish_reason="STOP")]
    emits = feed(Assembler(), run_envelopes("r1", GEMINI, tools_for(
        GEMINI, {"read_file": PATH_SCHEMA, "get_time": EMPTY_SCHEMA}), chunks))
    check_outputs(emits)
    assert [(c["call_id"], c["index"], c["arguments"]) for c in committed(emits)] == [
        ("latch-0-0-r1", 0, {"path": "/a"}), ("latch-0-1-r1", 1, {"path": "/b"}),
        ("latch-0-2-r1", 2, {})]
    [final] = finals(emits)
    assert [p["functionCall"]["id"] for p in final["message"]["parts"]] == [
        "latch-0-0-r1", "latch-0-1-r1", "latch-0-2-r1"]
