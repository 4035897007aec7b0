"""Conformance of ``bedrock.converse`` and ``google.gemini`` over real recorded streams.

Every file of these two providers under ``../shared/fixtures/providers`` (its README lists
them) runs through the code path of ``latch assemble --from-sse`` (``fixtures_lib.run_capture``),
and the outcomes below are written by hand from reading each file:

* vercel-ai ``amazon-bedrock``: ``amazon-bedrock-json-with-tools.1`` (three tool blocks at
  indexes 1, 2, 4 between text blocks without a ``contentBlockStart``, no ``metadata``),
  ``amazon-bedrock-tool-call.1`` (input over two deltas, ``metadata`` before ``messageStop``),
  ``amazon-bedrock-tool-no-args`` (``input: ""``, an empty ``start``), and
  ``issue-11409-kimi-k2-thinking-glob-search`` (empty text blocks, reasoning deltas, an id
  ``functions.glob_search:0``, ``messageStop`` before ``metadata``);
* pydantic-ai ``test_bedrock_streaming_error.yaml``: the stream request answered HTTP 400;
* vercel-ai ``google``: ``google-tool-call`` (a whole call with parsed ``args``, no id, a
  ``thoughtSignature``), ``google-stream-no-args-tool-call`` (a whole call without ``args``,
  then three streamed calls ended by ``functionCall: {}``), and
  ``google-stream-tool-call-array-arguments-missing-terminal-function-call`` (nested array
  paths, the call ending at a part without ``willContinue``).

Derived variants change one thing in a real stream (or splice two) and say what. The fixtures
are read in place (Apache-2.0 / MIT, LICENSE beside each folder); a missing file fails, never
skips.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for fixtures_lib

from fixtures_lib import (
    PYDANTIC,
    VERCEL,
    check_run,
    fixture,
    load_events,
    only_final,
    run_capture,
    run_events,
    summary,
    topic,
)

from worker.core import Assembler
from worker.tools import capture

BEDROCK = "bedrock.converse"
GEMINI = "google.gemini"
_BR = f"{VERCEL}/amazon-bedrock/src/__fixtures__"
_GO = f"{VERCEL}/google/src/__fixtures__"
BEDROCK_JSON_TOOLS = f"{_BR}/amazon-bedrock-json-with-tools.1.chunks.txt"
BEDROCK_TOOL_CALL = f"{_BR}/amazon-bedrock-tool-call.1.chunks.txt"
BEDROCK_NO_ARGS = f"{_BR}/amazon-bedrock-tool-no-args.chunks.txt"
BEDROCK_KIMI = f"{_BR}/issue-11409-kimi-k2-thinking-glob-search.chunks.txt"
BEDROCK_HTTP_400 = f"{PYDANTIC}/test_bedrock/test_bedrock_streaming_error.yaml"
GEMINI_TOOL_CALL = f"{_GO}/google-tool-call.chunks.txt"
GEMINI_NO_ARGS = f"{_GO}/google-stream-no-args-tool-call.chunks.txt"
GEMINI_ARRAYS = (
    f"{_GO}/google-stream-tool-call-array-arguments-missing-terminal-function-call.chunks.txt")
FILES = {BEDROCK: [BEDROCK_JSON_TOOLS, BEDROCK_TOOL_CALL, BEDROCK_NO_ARGS, BEDROCK_KIMI],
         GEMINI: [GEMINI_TOOL_CALL, GEMINI_NO_ARGS, GEMINI_ARRAYS]}
OBJ: dict[str, Any] = {"type": "object"}


def bedrock_tools(schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``toolConfig.tools`` array, plus a ``systemTool`` that must never register."""
    return [*({"toolSpec": {"name": n, "description": n, "inputSchema": {"json": s}}}
              for n, s in schemas.items()), {"systemTool": {"name": "nova_grounding"}}]


def gemini_tools(schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """A Gemini ``tools`` array: the declarations, plus a built-in tool."""
    return [{"functionDeclarations": [{"name": n, "parametersJsonSchema": s}
                                      for n, s in schemas.items()]}, {"googleSearch": {}}]


def test_every_file_is_present() -> None:
    """Each Bedrock and Gemini fixture this file covers is there (fails, never skips)."""
    for relative in [*FILES[BEDROCK], *FILES[GEMINI], BEDROCK_HTTP_400]:
        assert fixture(relative).stat().st_size > 0


# =========================================================================================
# Bedrock ConverseStream
# =========================================================================================


def test_bedrock_three_tool_blocks_with_index_gaps() -> None:
    """json-with-tools: three client calls at content block indexes 1, 2 and 4 commit in index
    order with their own arguments (never concatenated across blocks), and the final message
    keeps the two text blocks that came without a contentBlockStart, in index order. The run
    completes at stream end although no metadata event came."""
    tools = bedrock_tools({"tool-a": OBJ, "tool-b": OBJ, "json": OBJ})
    lines = run_capture(BEDROCK, fixture(BEDROCK_JSON_TOOLS), tools)
    check_run(BEDROCK, lines)
    assert summary(lines) == [("committed", "tool-1", "tool-a", 1, {"a": "1"}),
                              ("committed", "tool-2", "tool-b", 2, {"b": "2"}),
                              ("committed", "json-tool-id", "json", 4, {"final": "result"})]
    final = only_final(lines)
    assert final["status"] == "completed"
    assert final["message"] == {"role": "assistant", "content": [
        {"text": "Multiple tools."},
        {"toolUse": {"toolUseId": "tool-1", "name": "tool-a", "input": {"a": "1"}}},
        {"toolUse": {"toolUseId": "tool-2", "name": "tool-b", "input": {"b": "2"}}},
        {"text": "Final JSON."},
        {"toolUse": {"toolUseId": "json-tool-id", "name": "json", "input": {"final": "result"}}},
    ]}


def test_bedrock_unregistered_tool_fails_alone() -> None:
    """Derived (json-with-tools, tool-b not registered): tool-b fails unknown_tool, the other
    two still commit, and the final message still shows tool-b's input."""
    lines = run_capture(BEDROCK, fixture(BEDROCK_JSON_TOOLS),
                        bedrock_tools({"tool-a": OBJ, "json": OBJ}))
    check_run(BEDROCK, lines)
    assert [s[0] + ":" + str(s[4]) for s in summary(lines)] == [
        "committed:{'a': '1'}", "error:unknown_tool", "committed:{'final': 'result'}"]
    content = only_final(lines)["message"]["content"]
    assert content[2] == {"toolUse": {"toolUseId": "tool-2", "name": "tool-b",
                                      "input": {"b": "2"}}}


def test_bedrock_input_over_two_deltas_and_metadata_first() -> None:
    """tool-call.1: the input arrives as two fragments of one string; joined they are the
    strict object the schema takes; metadata before messageStop changes nothing."""
    tools = bedrock_tools({"test-tool": {"type": "object", "required": ["value"],
                                         "properties": {"value": {"type": "string"}}}})
    lines = run_capture(BEDROCK, fixture(BEDROCK_TOOL_CALL), tools)
    check_run(BEDROCK, lines)
    assert summary(lines) == [("committed", "tool-use-id", "test-tool", 0,
                               {"value": "Sparkle Day"})]
    assert only_final(lines)["status"] == "completed"


def test_bedrock_schema_violation_quotes_no_value() -> None:
    """Derived (tool-call.1, a schema that wants an integer): schema_invalid, and the error
    content names the keyword, never the value."""
    tools = bedrock_tools({"test-tool": {"type": "object",
                                         "properties": {"value": {"type": "integer"}}}})
    lines = run_capture(BEDROCK, fixture(BEDROCK_TOOL_CALL), tools)
    check_run(BEDROCK, lines)
    [error] = topic(lines, "errors")
    assert error["reason"] == "schema_invalid" and "Sparkle" not in error["content"]


@pytest.mark.parametrize(("stop", "status", "reason"), [
    ("max_tokens", "truncated", "truncated"),
    ("model_context_window_exceeded", "truncated", "truncated"),
    ("guardrail_intervened", "failed", "content_filtered"),
    ("content_filtered", "failed", "content_filtered"),
    ("malformed_tool_use", "failed", "malformed_output"),
    ("malformed_model_output", "failed", "malformed_output"),
    ("some_future_reason", "failed", "upstream_error"),
])
def test_bedrock_stop_reasons(stop: str, status: str, reason: str) -> None:
    """Derived (tool-call.1 with another stopReason): a truncating stop fails the complete
    call truncated; a filtering or malformed stop fails it with a reason that says so; a stop
    reason this version does not know fails it upstream_error. The run's status says it."""
    events = [copy.deepcopy(e) for e in load_events(fixture(BEDROCK_TOOL_CALL))]
    events[-1]["messageStop"]["stopReason"] = stop
    lines = run_events(BEDROCK, events, bedrock_tools({"test-tool": OBJ}))
    [error] = topic(lines, "errors")
    assert (error["tool_call_id"], error["reason"]) == ("tool-use-id", reason)
    assert only_final(lines)["status"] == status
    assert not topic(lines, "dlq")


@pytest.mark.parametrize("exception", [
    "internalServerException", "modelStreamErrorException", "throttlingException",
    "validationException", "serviceUnavailableException"])
def test_bedrock_exception_member_fails_the_open_calls(exception: str) -> None:
    """Derived (json-with-tools cut after tool-2's delta, then an exception member as the
    service sends it mid-stream): tool-1 (its block stopped) and tool-2 (still open) each
    fail upstream_error, whose content names the exception and never quotes its message;
    nothing commits, nothing goes to the DLQ, and the run fails."""
    events = [*load_events(fixture(BEDROCK_JSON_TOOLS))[:6],
              {exception: {"message": "SECRET-DETAIL"}}]
    lines = run_events(BEDROCK, events, bedrock_tools({"tool-a": OBJ, "tool-b": OBJ}))
    assert summary(lines) == [("error", "tool-1", "tool-a", 1, "upstream_error"),
                              ("error", "tool-2", "tool-b", 2, "upstream_error")]
    assert all(exception in e["content"] and "SECRET" not in e["content"]
               for e in topic(lines, "errors"))
    assert not topic(lines, "dlq") and only_final(lines)["status"] == "failed"


def test_bedrock_no_argument_tool() -> None:
    """tool-no-args: ``input: ""`` means ``{}`` (rule 3), which a schema with no properties
    takes; the text block after an empty ``start`` is kept."""
    tools = bedrock_tools({"updateIssueList": {"type": "object", "properties": {},
                                               "additionalProperties": False}})
    lines = run_capture(BEDROCK, fixture(BEDROCK_NO_ARGS), tools)
    check_run(BEDROCK, lines)
    assert summary(lines) == [("committed", "tool-use-id", "updateIssueList", 1, {})]
    assert only_final(lines)["message"]["content"] == [
        {"text": "I'll update the issue list for you."},
        {"toolUse": {"toolUseId": "tool-use-id", "name": "updateIssueList", "input": {}}}]


def test_bedrock_kimi_reasoning_and_stop_before_metadata() -> None:
    """issue-11409 (Kimi K2 on Bedrock): the call with id ``functions.glob_search:0`` commits
    from its two fragments; messageStop before metadata is fine (the metadata event is not a
    late event: the run ends at stream.end); the four reasoning deltas are one reasoningText;
    the three empty text blocks are left out of the final message."""
    tools = bedrock_tools({"glob_search": {"type": "object", "required": ["pattern"],
                                           "properties": {"pattern": {"type": "string"}}}})
    lines = run_capture(BEDROCK, fixture(BEDROCK_KIMI), tools)
    check_run(BEDROCK, lines)
    assert summary(lines) == [("committed", "functions.glob_search:0", "glob_search", 3,
                               {"pattern": "**/*cursor*"})]
    final = only_final(lines)
    assert final["status"] == "completed"
    [reasoning, tool] = final["message"]["content"]
    text = reasoning["reasoningContent"]["reasoningText"]["text"]
    assert text.startswith(" The user wants me to:\n1. First call `glob_search`")
    assert text.endswith("Let me start with step 1.")
    assert tool["toolUse"]["toolUseId"] == "functions.glob_search:0"


def test_bedrock_stream_without_message_stop_fails() -> None:
    """Derived (issue-11409 without its messageStop): the stream ended before the provider's
    end, so the complete-looking call fails stream_error and the run fails."""
    events = [e for e in load_events(fixture(BEDROCK_KIMI)) if "messageStop" not in e]
    lines = run_events(BEDROCK, events, bedrock_tools({"glob_search": OBJ}))
    assert summary(lines) == [("error", "functions.glob_search:0", "glob_search", 3,
                               "stream_error")]
    assert only_final(lines)["status"] == "failed"


def test_bedrock_http_400_cassette_is_a_stream_error() -> None:
    """pydantic-ai test_bedrock_streaming_error.yaml: the stream request was answered HTTP 400
    with a JSON body, not an event stream. The capture is a run that fails stream_error with
    no call, no DLQ record and the error naming the status."""
    path = fixture(BEDROCK_HTTP_400)
    events, _ = capture.provider_events(path.read_text(encoding="utf-8"), str(path))
    envelopes = capture.envelopes(BEDROCK, events, [])
    assert [e["type"] for e in envelopes if isinstance(e, dict)] == ["run.start",
                                                                     "stream.error"]
    assert envelopes[-1]["error"] == "HTTP 400"
    asm = Assembler()
    out = [e.as_line() for env in envelopes for e in asm.feed_record(None, orjson.dumps(env))]
    assert [line["topic"] for line in out] == ["final"]
    assert out[0]["value"]["status"] == "failed" and out[0]["value"]["outcomes"] == []


# =========================================================================================
# Gemini streamGenerateContent
# =========================================================================================


def test_gemini_whole_call_with_signature() -> None:
    """google-tool-call: one whole functionCall with parsed args and no id commits with the
    deterministic id ``latch-0-0-<run_id>`` at index 0 of candidate 0; the final message keeps
    the part's thoughtSignature and writes the same id into functionCall.id; the empty text
    part of the last chunk is left out."""
    tools = gemini_tools({"weather": {"type": "object", "required": ["location"],
                                      "properties": {"location": {"type": "string"}}}})
    lines = run_capture(GEMINI, fixture(GEMINI_TOOL_CALL), tools, run_id="r-7")
    check_run(GEMINI, lines, "r-7")
    assert summary(lines) == [("committed", "latch-0-0-r-7", "weather", 0,
                               {"location": "San Francisco"})]
    final = only_final(lines)
    assert final["status"] == "completed"
    [part] = final["message"]["parts"]
    assert part["functionCall"] == {"id": "latch-0-0-r-7", "name": "weather",
                                    "args": {"location": "San Francisco"}}
    assert part["thoughtSignature"].startswith("EqUCCqICAb4+")
    assert topic(lines, "committed")[0]["choice"] == 0


def test_gemini_no_args_and_three_streamed_calls() -> None:
    """google-stream-no-args-tool-call: read_theme (a whole call without args) commits ``{}``;
    the three streamed read_screen calls each build ``{"id": X}`` from a string in two pieces
    ("A" + "") and end at their ``functionCall: {}``: four calls, none dropped, none merged,
    each with its own deterministic id, in stream order. The thought part and the signature
    of read_theme's part are kept."""
    tools = gemini_tools({"read_theme": {"type": "object", "properties": {},
                                         "additionalProperties": False},
                          "read_screen": {"type": "object", "required": ["id"],
                                          "properties": {"id": {"type": "string"}},
                                          "additionalProperties": False}})
    lines = run_capture(GEMINI, fixture(GEMINI_NO_ARGS), tools)
    check_run(GEMINI, lines)
    assert summary(lines) == [
        ("committed", "latch-0-0-capture", "read_theme", 0, {}),
        ("committed", "latch-0-1-capture", "read_screen", 1, {"id": "A"}),
        ("committed", "latch-0-2-capture", "read_screen", 2, {"id": "B"}),
        ("committed", "latch-0-3-capture", "read_screen", 3, {"id": "C"}),
    ]
    parts = only_final(lines)["message"]["parts"]
    assert parts[0]["thought"] is True and parts[0]["text"].startswith("**Processing")
    assert "thoughtSignature" in parts[1]
    assert [p["functionCall"]["args"] for p in parts[1:]] == [{}, {"id": "A"}, {"id": "B"},
                                                             {"id": "C"}]
    assert len(parts) == 5


def test_gemini_nested_arrays_without_terminal_call() -> None:
    """google-stream-tool-call-array-arguments-missing-terminal-function-call: the partialArgs
    paths ``$.operations[0].action`` ... ``$.operations[1].price`` build two objects of an
    array; the call ends at the part without willContinue (no ``functionCall: {}`` comes), and
    commits once, with number values as numbers."""
    item = {"type": "object", "required": ["action", "description", "itemid", "price"],
            "properties": {"action": {"type": "string"}, "description": {"type": "string"},
                           "itemid": {"type": "string"}, "price": {"type": "number"}}}
    tools = gemini_tools({"writeItems": {"type": "object", "required": ["operations"],
                                         "properties": {"operations": {"type": "array",
                                                                       "items": item}}}})
    lines = run_capture(GEMINI, fixture(GEMINI_ARRAYS), tools)
    check_run(GEMINI, lines)
    assert summary(lines) == [("committed", "latch-0-0-capture", "writeItems", 0, {
        "operations": [
            {"action": "add", "description": "Fresh red apple", "itemid": "apple_001",
             "price": 0.5},
            {"action": "add", "description": "Ripe yellow banana", "itemid": "banana_001",
             "price": 0.3}]})]


WRITE_ITEMS_RESULT = [("committed", "latch-0-0-capture", "writeItems", 0, {"operations": [
    {"action": "add", "description": "Fresh red apple", "itemid": "apple_001", "price": 0.5},
    {"action": "add", "description": "Ripe yellow banana", "itemid": "banana_001",
     "price": 0.3}]})]


@pytest.mark.parametrize("variant", ["partial-args-in-the-finish-chunk",
                                     "will-continue-at-the-finish"])
def test_gemini_call_still_streaming_at_the_last_chunk_is_never_lost(variant: str) -> None:
    """Derived (the same file), the quirk "a call lost when the last chunk still carries
    partialArgs": the last partialArgs part moved into the chunk that carries
    ``finishReason: STOP``, or left saying ``willContinue: true`` when the finish comes. Either
    way the call ends at the stream's end and commits the same object, once."""
    events = [copy.deepcopy(e) for e in load_events(fixture(GEMINI_ARRAYS))]
    last_part = events[-2]["candidates"][0]["content"]["parts"][0]
    assert "partialArgs" in last_part["functionCall"]
    if variant == "partial-args-in-the-finish-chunk":
        events.pop()
        events[-1]["candidates"][0]["finishReason"] = "STOP"
    else:
        last_part["functionCall"]["willContinue"] = True
    lines = run_events(GEMINI, events, gemini_tools({"writeItems": OBJ}))
    check_run(GEMINI, lines)
    assert summary(lines) == WRITE_ITEMS_RESULT
    assert only_final(lines)["status"] == "completed"


def test_gemini_parallel_calls_in_one_chunk_are_each_a_call() -> None:
    """Derived (google-stream-no-args-tool-call, every functionCall part of the file put in
    one chunk, as Vertex sends parallel calls: several parts of one candidate), the quirk
    "parallel Vertex calls reduced to the first": the four calls are still four, in part
    order, each with its own id and arguments, as from the file itself."""
    events = load_events(fixture(GEMINI_NO_ARGS))
    parts = [p for e in events[1:-1] for p in e["candidates"][0]["content"]["parts"]]
    assert len(parts) == 13 and all("functionCall" in p for p in parts)
    one = copy.deepcopy(events[1])
    one["candidates"][0]["content"]["parts"] = parts
    lines = run_events(GEMINI, [events[0], one, events[-1]],
                       gemini_tools({"read_theme": OBJ, "read_screen": OBJ}))
    check_run(GEMINI, lines)
    assert summary(lines) == [
        ("committed", "latch-0-0-capture", "read_theme", 0, {}),
        ("committed", "latch-0-1-capture", "read_screen", 1, {"id": "A"}),
        ("committed", "latch-0-2-capture", "read_screen", 2, {"id": "B"}),
        ("committed", "latch-0-3-capture", "read_screen", 3, {"id": "C"})]


def test_gemini_nested_arrays_under_max_tokens() -> None:
    """Derived (the same file, finishReason MAX_TOKENS): the complete-looking call fails
    truncated (rule 5) and the run is truncated."""
    events = [copy.deepcopy(e) for e in load_events(fixture(GEMINI_ARRAYS))]
    events[-1]["candidates"][0]["finishReason"] = "MAX_TOKENS"
    lines = run_events(GEMINI, events, gemini_tools({"writeItems": OBJ}))
    assert [s[4] for s in summary(lines)] == ["truncated"]
    assert only_final(lines)["status"] == "truncated"


@pytest.mark.parametrize(("finish", "reason"), [
    ("SAFETY", "content_filtered"), ("RECITATION", "content_filtered"),
    ("BLOCKLIST", "content_filtered"), ("PROHIBITED_CONTENT", "content_filtered"),
    ("SPII", "content_filtered"), ("IMAGE_SAFETY", "content_filtered"),
    ("IMAGE_PROHIBITED_CONTENT", "content_filtered"), ("IMAGE_RECITATION", "content_filtered"),
    ("MALFORMED_FUNCTION_CALL", "malformed_output"), ("UNEXPECTED_TOOL_CALL", "malformed_output"),
    ("MALFORMED_RESPONSE", "malformed_output"),
    ("TOO_MANY_TOOL_CALLS", "too_many_tool_calls"), ("OTHER", "upstream_error"),
    ("LANGUAGE", "upstream_error"), ("SOME_FUTURE_REASON", "upstream_error"),
])
def test_gemini_failing_finish_reasons(finish: str, reason: str) -> None:
    """Derived (google-tool-call with another finishReason): the call fails with a reason
    that names the kind of stop, and the run fails."""
    events = [copy.deepcopy(e) for e in load_events(fixture(GEMINI_TOOL_CALL))]
    events[-1]["candidates"][0]["finishReason"] = finish
    lines = run_events(GEMINI, events, gemini_tools({"weather": OBJ}))
    assert [s[4] for s in summary(lines)] == [reason]
    assert only_final(lines)["status"] == "failed"


def test_gemini_error_chunk_mid_stream_fails_the_open_calls() -> None:
    """Derived (google-stream-no-args-tool-call cut inside the first read_screen call, then
    the ``error`` object Gemini streams when it fails): read_theme (complete) and read_screen
    (still streaming) each fail upstream_error naming the status, never the message; no DLQ,
    and the run fails."""
    events = [*load_events(fixture(GEMINI_NO_ARGS))[:4],
              {"error": {"code": 500, "message": "SECRET-DETAIL", "status": "INTERNAL"}}]
    lines = run_events(GEMINI, events, gemini_tools({"read_theme": OBJ, "read_screen": OBJ}))
    assert summary(lines) == [("error", "latch-0-0-capture", "read_theme", 0, "upstream_error"),
                              ("error", "latch-0-1-capture", "read_screen", 1, "upstream_error")]
    assert all("INTERNAL" in e["content"] and "SECRET" not in e["content"]
               for e in topic(lines, "errors"))
    assert not topic(lines, "dlq") and only_final(lines)["status"] == "failed"


def test_gemini_blocked_prompt_fails_content_filtered() -> None:
    """Derived (google-stream-no-args-tool-call after read_theme, then a chunk whose
    ``promptFeedback.blockReason`` is PROHIBITED_CONTENT): the call fails content_filtered and
    the run fails."""
    events = [*load_events(fixture(GEMINI_NO_ARGS))[:2],
              {"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}]
    lines = run_events(GEMINI, events, gemini_tools({"read_theme": OBJ}))
    assert summary(lines) == [("error", "latch-0-0-capture", "read_theme", 0,
                               "content_filtered")]
    assert only_final(lines)["status"] == "failed"


def test_gemini_missing_finish_reason_fails() -> None:
    """Derived (google-tool-call without its last chunk): no finishReason came, so the stream
    ended before the provider's end and the call fails stream_error."""
    events = load_events(fixture(GEMINI_TOOL_CALL))[:-1]
    lines = run_events(GEMINI, events, gemini_tools({"weather": OBJ}))
    assert [s[4] for s in summary(lines)] == ["stream_error"]


def test_bedrock_spliced_streams_fail_protocol_error() -> None:
    """Derived (tool-call.1, then json-with-tools, as a proxy that splices two streams): the
    second stream's first event, a text delta after messageStop, breaks the protocol.
    tool-use-id, complete before the break, fails protocol_error at it; tool-1, tool-2 and
    json-tool-id, started after it, each get their own protocol_error outcome; nothing is
    committed or sent to the DLQ, the final message keeps the first stream's content only, and
    the run fails."""
    events = load_events(fixture(BEDROCK_TOOL_CALL)) + load_events(fixture(BEDROCK_JSON_TOOLS))
    tools = bedrock_tools({"test-tool": OBJ, "tool-a": OBJ, "tool-b": OBJ, "json": OBJ})
    lines = run_events(BEDROCK, events, tools)
    assert not topic(lines, "dlq")
    assert summary(lines) == [("error", "tool-use-id", "test-tool", 0, "protocol_error"),
                              ("error", "tool-1", "tool-a", 1, "protocol_error"),
                              ("error", "tool-2", "tool-b", 2, "protocol_error"),
                              ("error", "json-tool-id", "json", 4, "protocol_error")]
    final = only_final(lines)
    assert final["status"] == "failed"
    assert final["message"]["content"] == [{"toolUse": {
        "toolUseId": "tool-use-id", "name": "test-tool", "input": {"value": "Sparkle Day"}}}]


def test_gemini_spliced_streams_fail_protocol_error() -> None:
    """Derived (google-stream-no-args-tool-call, then google-tool-call): the second stream's
    weather call comes after candidate 0's finishReason, a protocol break. The four calls
    before it fail protocol_error; weather gets its own outcome under the candidate's next
    id, ``latch-0-4-capture``; nothing is committed, the final message keeps the first
    stream's parts only, and the run fails."""
    events = load_events(fixture(GEMINI_NO_ARGS)) + load_events(fixture(GEMINI_TOOL_CALL))
    lines = run_events(GEMINI, events, gemini_tools(
        {"read_theme": OBJ, "read_screen": OBJ, "weather": OBJ}))
    assert not topic(lines, "dlq")
    assert summary(lines) == [
        ("error", f"latch-0-{n}-capture", name, n, "protocol_error")
        for n, name in enumerate(["read_theme", "read_screen", "read_screen", "read_screen",
                                  "weather"])]
    final = only_final(lines)
    assert final["status"] == "failed"
    assert [p["functionCall"]["name"] for p in final["message"]["parts"]
            if "functionCall" in p] == ["read_theme", "read_screen", "read_screen",
                                        "read_screen"]


@pytest.mark.parametrize(("provider", "relative"),
                         [(p, f) for p, files in FILES.items() for f in files])
def test_redelivered_envelopes_change_nothing(provider: str, relative: str) -> None:
    """Every file, every envelope delivered twice in a row (a consumer that re-reads after a
    crash): the output is the same as delivered once, and every copy is counted a duplicate
    (these two providers end their runs at ``stream.end``, so the copies after it are too)."""
    events = load_events(fixture(relative))
    once = run_events(provider, events, [])
    assembler = Assembler()
    twice = [e.as_line() for envelope in capture.envelopes(provider, events, [])
             for _ in range(2) for e in assembler.feed_record(None, orjson.dumps(envelope))]
    assert twice == once
    assert assembler.stats["duplicates"] == len(events) + 2


@pytest.mark.parametrize(("provider", "relative"),
                         [(p, f) for p, files in FILES.items() for f in files])
def test_every_file_without_tools_fails_unknown_tool_only(provider: str, relative: str) -> None:
    """Every file run with no tool registered: each call fails unknown_tool (none commits, none
    is dropped), and the run's invariants hold (one outcome per call id, no DLQ)."""
    lines = run_capture(provider, fixture(relative), [])
    check_run(provider, lines)
    assert topic(lines, "committed") == []
    assert {e["reason"] for e in topic(lines, "errors")} == {"unknown_tool"}


# =========================================================================================
# latch assemble --from-sse, as a subprocess, on the real files
# =========================================================================================


def _cli(provider: str, path: Path, tools: list[Any], tmp_path: Path) -> list[dict[str, Any]]:
    tools_file = tmp_path / "tools.json"
    tools_file.write_bytes(orjson.dumps(tools))
    done = subprocess.run([sys.executable, "-m", "worker", "assemble", "--from-sse", provider,
                           "--tools", str(tools_file), str(path)],
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return [orjson.loads(line) for line in done.stdout.splitlines()]


def test_cli_reads_gemini_as_json_lines_sse_and_a_json_array(tmp_path: Path) -> None:
    """``latch assemble --from-sse google.gemini`` on google-stream-no-args-tool-call as
    recorded (JSON Lines), as the SSE that ``alt=sse`` sends (``data:`` lines, CRLF) and as
    the one JSON array streamGenerateContent sends without it: the same lines each time, equal
    to the in-process run, four committed calls and a completed final."""
    tools = gemini_tools({"read_theme": OBJ, "read_screen": OBJ})
    path = fixture(GEMINI_NO_ARGS)
    payloads = [line for line in path.read_bytes().splitlines() if line.strip()]
    sse = tmp_path / "gemini.sse"
    sse.write_bytes(b"".join(b"data: " + p + b"\r\n\r\n" for p in payloads))
    array = tmp_path / "gemini.json"
    array.write_bytes(b"[" + b",\r\n".join(payloads) + b"]")
    outputs = [_cli(GEMINI, p, tools, tmp_path) for p in (path, sse, array)]
    assert outputs[0] == outputs[1] == outputs[2] == run_capture(GEMINI, path, tools)
    assert [line["topic"] for line in outputs[0]] == ["committed", "audit"] * 4 + ["final"]
    assert only_final(outputs[0])["status"] == "completed"


def test_cli_reads_the_bedrock_sdk_events_as_recorded(tmp_path: Path) -> None:
    """``latch assemble --from-sse bedrock.converse`` on json-with-tools (JSON Lines of the
    SDK's event objects, as recorded): exit 0 and the lines of the in-process run, three
    committed calls then the final (the binary and cassette forms: tests/tools/unit/
    test_eventstream.py)."""
    tools = bedrock_tools({"tool-a": OBJ, "tool-b": OBJ, "json": OBJ})
    lines = _cli(BEDROCK, fixture(BEDROCK_JSON_TOOLS), tools, tmp_path)
    assert lines == run_capture(BEDROCK, fixture(BEDROCK_JSON_TOOLS), tools)
    assert [line["topic"] for line in lines] == ["committed", "audit"] * 3 + ["final"]
