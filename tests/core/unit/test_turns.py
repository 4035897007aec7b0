"""The next turn's tool-result messages, per provider, and the turn record (issue 36, item 5;
``worker/core/turns.py``, ``schemas/turn.schema.json``).

Each provider's shape is pinned here by hand; that the shapes are what the providers' own
request types accept is ``tests/core/contract/test_turn_requests.py``'s. The property test
holds every record :func:`turn_record` can build (any provider, kind, outcome, text) to the
schema, and the schema to the pairing rule: one message per call but the dropped ones.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.identity import KINDS
from worker.core.ops import CALL_KINDS
from worker.core.turns import (
    OUTCOMES,
    PROVIDERS,
    Answer,
    TurnEntry,
    tool_messages,
    turn_record,
)
from worker.runtime.schemas import load_schema, validator

OK = Answer("call_1", "read_file", "function", False, "the file")
BAD = Answer("call_2", "write_file", "function", True, "tool_timeout: no result in 30 s")
SHELL_OUT = [{"stdout": "a\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
             {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}}]


def responses(answer: Answer) -> dict[str, Any]:
    [item] = tool_messages("openai.responses", [answer])
    return item


def test_no_answer_is_no_message() -> None:
    """No answer: ``[]`` for every provider (no empty user message)."""
    assert all(tool_messages(p, []) == [] for p in PROVIDERS)


def test_an_unknown_provider_is_refused() -> None:
    """A provider Latch does not know is a ValueError, never a guessed shape."""
    with pytest.raises(ValueError, match="unknown provider"):
        tool_messages("cohere.chat", [OK])


def test_chat_one_tool_message_per_answer() -> None:
    """Chat: one ``role: tool`` message per call, in order; an error is its text."""
    custom = Answer("call_3", "grep", "custom", False, "3 matches")
    assert tool_messages("openai.chat", [OK, BAD, custom]) == [
        {"role": "tool", "tool_call_id": "call_1", "content": "the file"},
        {"role": "tool", "tool_call_id": "call_2", "content": BAD.content},
        {"role": "tool", "tool_call_id": "call_3", "content": "3 matches"}]


def test_anthropic_one_user_message_of_tool_results() -> None:
    """Anthropic: ONE user message, a ``tool_result`` per call in order, ``is_error`` only on
    an error; empty text leaves ``content`` out (Anthropic refuses an empty text block)."""
    empty = Answer("toolu_3", "touch", "function", False, "")
    assert tool_messages("anthropic.messages", [OK, BAD, empty]) == [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "the file"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": BAD.content,
         "is_error": True},
        {"type": "tool_result", "tool_use_id": "toolu_3"}]}]


def test_bedrock_one_user_message_of_tool_results() -> None:
    """Bedrock: ONE user message of ``toolResult`` blocks; ``status: error`` on an error;
    structured content as a ``json`` block; empty text as ``{"json": {}}``."""
    mcp = Answer("t3", "lookup", "mcp", False, '{"n": 1}', {"n": 1})
    empty = Answer("t4", "touch", "function", False, "")
    [message] = tool_messages("bedrock.converse", [OK, BAD, mcp, empty])
    assert message == {"role": "user", "content": [
        {"toolResult": {"toolUseId": "call_1", "content": [{"text": "the file"}]}},
        {"toolResult": {"toolUseId": "call_2", "content": [{"text": BAD.content}],
                        "status": "error"}},
        {"toolResult": {"toolUseId": "t3", "content": [{"json": {"n": 1}}]}},
        {"toolResult": {"toolUseId": "t4", "content": [{"json": {}}]}}]}
    listed = Answer("t5", "rows", "mcp", False, "[1, 2]", [1, 2])  # (not an object: text)
    [message] = tool_messages("bedrock.converse", [listed])
    assert message["content"][0]["toolResult"]["content"] == [{"text": "[1, 2]"}]


def test_gemini_function_responses_with_the_id_when_there_is_one() -> None:
    """Gemini: ONE user content of ``functionResponse`` parts named as the calls,
    ``{"output"}`` or ``{"error"}``, structured output as the value; ``id`` only when the call
    has one."""
    no_id = Answer("", "lookup", "mcp", False, '{"n": 1}', {"n": 1})
    assert tool_messages("google.gemini", [OK, BAD, no_id]) == [{"role": "user", "parts": [
        {"functionResponse": {"name": "read_file", "response": {"output": "the file"},
                              "id": "call_1"}},
        {"functionResponse": {"name": "write_file", "response": {"error": BAD.content},
                              "id": "call_2"}},
        {"functionResponse": {"name": "lookup", "response": {"output": {"n": 1}}}}]}]


def test_responses_function_and_custom_outputs() -> None:
    """Responses: a function call (and an MCP ``tools/list`` tool's, a function call too) gets
    ``function_call_output``, a custom call ``custom_tool_call_output``."""
    assert responses(OK) == {"type": "function_call_output", "call_id": "call_1",
                             "output": "the file"}
    assert responses(OK._replace(kind="mcp"))["type"] == "function_call_output"
    assert responses(OK._replace(kind="custom")) == {
        "type": "custom_tool_call_output", "call_id": "call_1", "output": "the file"}


@pytest.mark.parametrize("kind", ["shell_call", "shell"])
def test_responses_shell_output(kind: str) -> None:
    """A shell call (by call kind or identity kind): the runner's ``{stdout, stderr,
    outcome}`` list as given; text as stdout with exit 0; an error as stderr with exit 1; a
    list with one malformed entry is text."""
    answer = Answer("call_sh", "shell", kind, False, json.dumps(SHELL_OUT))
    assert responses(answer) == {"type": "shell_call_output", "call_id": "call_sh",
                                 "output": SHELL_OUT}
    assert responses(answer._replace(content="plain"))["output"] == [
        {"stdout": "plain", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
    assert responses(answer._replace(is_error=True, content="boom"))["output"] == [
        {"stdout": "", "stderr": "boom", "outcome": {"type": "exit", "exit_code": 1}}]
    broken = json.dumps([*SHELL_OUT, {"stdout": 1, "stderr": "", "outcome": {"type": "exit"}}])
    assert responses(answer._replace(content=broken))["output"][0]["stdout"] == broken
    bool_code = json.dumps([{"stdout": "", "stderr": "",
                             "outcome": {"type": "exit", "exit_code": True}}])
    assert responses(answer._replace(content=bool_code))["output"][0]["stdout"] == bool_code


def test_responses_apply_patch_and_local_shell_outputs() -> None:
    """apply_patch: ``status`` completed or failed, the text as ``output``; local_shell: the
    call's id as ``id`` (its output item has no ``call_id``)."""
    patch = Answer("call_ap", "apply_patch", "apply_patch_call", False, "patched")
    assert responses(patch) == {"type": "apply_patch_call_output", "call_id": "call_ap",
                                "status": "completed", "output": "patched"}
    assert responses(patch._replace(is_error=True))["status"] == "failed"
    local = Answer("call_ls", "local_shell", "local_shell_call", False, '{"stdout": "x"}')
    assert responses(local) == {"type": "local_shell_call_output", "id": "call_ls",
                                "output": '{"stdout": "x"}'}


def test_responses_computer_output_is_the_screenshot_or_none() -> None:
    """A computer call: the runner's screenshot (``image_url`` or ``file_id`` object, or a
    URL as text); an error or any other answer has no screenshot to give."""
    shot = Answer("call_c", "computer", "computer_call", False,
                  '{"type": "computer_screenshot", "image_url": "data:image/png;base64,AA"}')
    assert responses(shot) == {"type": "computer_call_output", "call_id": "call_c", "output": {
        "type": "computer_screenshot", "image_url": "data:image/png;base64,AA"}}
    assert responses(shot._replace(content='{"file_id": "file_1"}'))["output"] == {
        "type": "computer_screenshot", "file_id": "file_1"}
    assert responses(shot._replace(content="https://x/s.png"))["output"]["image_url"] == \
        "https://x/s.png"
    assert responses(shot._replace(content="clicked"))["output"] == {
        "type": "computer_screenshot"}
    assert responses(shot._replace(is_error=True))["output"] == {"type": "computer_screenshot"}


def test_responses_mcp_approval_response() -> None:
    """An approval request: the runner's ``{"approve", "reason"?}``, else approved unless an
    error, whose text is the denial's reason."""
    answer = Answer("mcpr_1", "roll", "mcp_approval_request", False, '{"approve": false, '
                    '"reason": "not today"}')
    assert responses(answer) == {"type": "mcp_approval_response", "approval_request_id":
                                 "mcpr_1", "approve": False, "reason": "not today"}
    assert responses(answer._replace(content="ok")) == {
        "type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    assert responses(answer._replace(is_error=True, content="tool_timeout: 30 s")) == {
        "type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False,
        "reason": "tool_timeout: 30 s"}


def test_turn_record_answers_all_but_the_dropped() -> None:
    """The record: one outcome per call in order, messages only for the entries with an
    answer; the schema takes it, and refuses an answered outcome with a reason or a dropped
    one with ``is_error``."""
    entries = [
        TurnEntry("call_1", "read_file", "answered", None, OK, 8),
        TurnEntry("call_x", "edit", "dropped", "invalid_json", None, None),
        TurnEntry("call_2", "write_file", "tool_timeout", "tool_timeout", BAD, None),
    ]
    record = turn_record("r1", None, "openai.chat", "r1:final", entries)
    assert [m["tool_call_id"] for m in record["messages"]] == ["call_1", "call_2"]
    assert [(o["tool_call_id"], o["outcome"], o["is_error"]) for o in record["outcomes"]] == [
        ("call_1", "answered", False), ("call_x", "dropped", None),
        ("call_2", "tool_timeout", True)]
    check = validator("turn")
    assert check.is_valid(record), list(check.iter_errors(record))
    wrong = json.loads(json.dumps(record))
    wrong["outcomes"][0]["reason"] = "tool_timeout"
    assert not check.is_valid(wrong)
    wrong = json.loads(json.dumps(record))
    wrong["outcomes"][1]["is_error"] = True
    assert not check.is_valid(wrong)
    wrong = json.loads(json.dumps(record))
    wrong["messages"][0]["role"] = "user"
    assert not check.is_valid(wrong)


def test_turn_reasons_are_the_error_reasons_and_the_result_latchs() -> None:
    """The turn's reason codes are the error result's and the three of the result latch, so
    that the two lists cannot drift; its outcomes are :data:`OUTCOMES`."""
    turn = load_schema("turn")
    errors = load_schema("error-result")["$defs"]["reason"]["enum"]
    assert set(turn["$defs"]["reason"]["enum"]) == set(errors) | {
        "tool_timeout", "result_too_large", "result_schema_invalid"}
    item = turn["properties"]["outcomes"]["items"]
    assert tuple(item["properties"]["outcome"]["enum"]) == OUTCOMES


# -- any record -----------------------------------------------------------------------------

ERROR_REASONS = load_schema("error-result")["$defs"]["reason"]["enum"]
TEXT = st.text(max_size=40)
IDS = st.text(min_size=1, max_size=12)
STRUCTURED = st.none() | st.dictionaries(st.text(max_size=5), st.integers() | TEXT, max_size=3)


@st.composite
def entries(draw: st.DrawFn) -> TurnEntry:
    outcome = draw(st.sampled_from(OUTCOMES))
    call_id, name = draw(IDS), draw(IDS)
    kind = draw(st.sampled_from(sorted(set(KINDS) | set(CALL_KINDS))))
    if outcome == "dropped":
        return TurnEntry(call_id, name, outcome, draw(st.sampled_from(ERROR_REASONS)), None,
                         None)
    content = draw(TEXT | st.just(json.dumps(SHELL_OUT)) | st.just('{"approve": true}'))
    is_error = draw(st.booleans()) if outcome == "answered" else True
    answer = Answer(call_id, name, kind, is_error, content,
                    draw(STRUCTURED) if outcome == "answered" else None)
    reason = (None if outcome == "answered" else draw(st.sampled_from(ERROR_REASONS))
              if outcome == "failed" else outcome)
    size = len(content.encode()) if outcome == "answered" else draw(
        st.none() | st.integers(0, 2**40))
    return TurnEntry(call_id, name, outcome, reason, answer, size)


@settings(max_examples=300, deadline=None)
@given(provider=st.sampled_from(PROVIDERS), tenant=st.none() | TEXT,
       entries=st.lists(entries(), max_size=6))
def test_every_record_validates_and_pairs(provider: str, tenant: str | None,
                                          entries: list[TurnEntry]) -> None:
    """Whatever the provider, kinds, outcomes and texts: the record validates against
    ``schemas/turn.schema.json`` (as JSON, after a round trip), has one outcome per entry in
    order, and one tool result per entry that is not dropped, in order."""
    record = json.loads(json.dumps(turn_record("r1", tenant, provider, "r1:final", entries)))
    check = validator("turn")
    assert check.is_valid(record), [e.message for e in check.iter_errors(record)]
    assert [o["tool_call_id"] for o in record["outcomes"]] == [e.tool_call_id for e in entries]
    answered = [e.answer.call_id for e in entries if e.answer is not None]
    assert result_ids(provider, record["messages"]) == answered


def result_ids(provider: str, messages: list[dict[str, Any]]) -> list[str]:
    """The call ids the messages answer, in order (a Gemini call without an id: ``""``)."""
    if provider == "openai.chat":
        return [m["tool_call_id"] for m in messages]
    if provider == "openai.responses":
        return [m.get("call_id") or m.get("id") or m["approval_request_id"] for m in messages]
    if provider == "anthropic.messages":
        return [b["tool_use_id"] for m in messages for b in m["content"]]
    if provider == "bedrock.converse":
        return [b["toolResult"]["toolUseId"] for m in messages for b in m["content"]]
    return [p["functionResponse"].get("id", "") for m in messages for p in m["parts"]]
