"""``worker.core.providers.gemini``: the Gemini adapter: Google's OpenAPI-subset schemas and
tool lists in both spellings, streamed calls ended by the next one, candidates kept apart,
parallel whole calls, and what happens when a stream breaks its own protocol. The
``partialArgs`` builder is ``test_gemini_args.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import (
    EMPTY_SCHEMA,
    GEMINI,
    PATH_SCHEMA,
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
from worker.core.tools import client_tools, openapi_schema

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


def test_gemini_openapi_parameters_decide_the_schema() -> None:
    """A call whose arguments break a tool's OpenAPI-subset ``parameters`` fails
    schema_invalid: the converted schema is the one applied."""
    tools = [{"functionDeclarations": [{"name": "f", "parameters": {
        "type": "OBJECT", "required": ["n"], "properties": {"n": {"type": "INTEGER"}}}}]}]
    emits = feed(Assembler(), run_envelopes("r1", GEMINI, tools, gemini_calls(
        [("c1", "f", '{"n": "one"}'), ("c2", "f", '{"n": 1}')])))
    assert [e["reason"] for e in errors(emits)] == ["schema_invalid"]
    assert [c["call_id"] for c in committed(emits)] == ["c2"]


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
