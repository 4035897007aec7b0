"""The next request, checked against each provider's own request types, offline (issue 36,
item 5; ``worker/core/turns.py``).

The agent loop's next request is its history + the run's final message + the turn record's
messages. For each provider, recorded streams of ``../shared/fixtures/providers/`` (and, for
the call kinds no recording has, streams built here) run through the core as ``latch
assemble --from-sse`` runs them (``fixtures_lib.run_events``, every tool the stream calls
registered without a schema, as ``test_sdk_accumulators.py`` does); each call of the final
message gets an answer (alternately a result and an error; a failed call its error result),
:func:`worker.core.turns.turn_record` builds the turn, and the request ``[a user message] +
[the final message] + the turn's messages`` is validated by:

* ``openai.chat``: ``list[ChatCompletionMessageParam]`` (openai-python), with pydantic's
  ``TypeAdapter``;
* ``openai.responses``: ``ResponseInputParam`` (openai-python), the same way;
* ``anthropic.messages``: ``list[MessageParam]`` (anthropic-sdk-python), the same way;
* ``bedrock.converse``: botocore's service model of ``bedrock-runtime``, operation ``Converse``,
  by botocore's own ``ParamValidator`` (what boto3 runs before it sends; no credentials);
* ``google.gemini``: google-genai's ``types.Content`` (pydantic, ``extra="forbid"``), from
  the JSON text, as the request would carry it.

A ``TypeAdapter`` over the SDKs' TypedDicts alone is lax: it ignores keys it does not know and
validates an ``Iterable`` field lazily, only when iterated (a string where a list of blocks
belongs passes). :func:`validated` therefore iterates every such field, and the turn's
messages must come back from validation *equal* to what was sent (no key ignored, nothing
coerced). Each validator gets a negative test: a wrong turn it must refuse.

The providers' pairing rules, which no request type checks, are checked here too: every tool
call id of the final message is answered exactly once, in the final message's order, and a
dropped call (``drop_with_protocol_repair``) not at all; Anthropic, Bedrock and Gemini get one
user message right after the assistant's; a Gemini response carries its call's name.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from anthropic.types import MessageParam
from botocore.validate import ParamValidator
from google.genai import types as genai
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputParam
from pydantic import TypeAdapter, ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for fixtures_lib

from builders import (
    apply_patch_call,
    chat_chunk,
    chat_custom_chunks,
    chat_custom_tool,
    item_events,
    provider_calls,
    responses_head,
    responses_tail,
    shell_call,
    tools_for,
)
from fixtures_lib import (
    ANTHROPIC_PY,
    OPENAI_PY,
    VERCEL,
    fixture,
    load_events,
    only_final,
    run_events,
)

from worker.core import AssembleSettings
from worker.core.turns import Answer, TurnEntry, turn_record

CHAT, RESPONSES, ANTHROPIC = "openai.chat", "openai.responses", "anthropic.messages"
BEDROCK, GEMINI = "bedrock.converse", "google.gemini"
PROVIDERS = (CHAT, RESPONSES, ANTHROPIC, BEDROCK, GEMINI)
_RESPONSES = f"{VERCEL}/openai/src/responses/__fixtures__"
_BR = f"{VERCEL}/amazon-bedrock/src/__fixtures__"
_GO = f"{VERCEL}/google/src/__fixtures__"

#: Recorded streams with client tool calls, per provider.
RECORDED: dict[str, list[str]] = {
    CHAT: [
        f"{OPENAI_PY}/f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin",
        f"{OPENAI_PY}/2018feb66ae13fcf5333d61b95849decc68d3f63bd38172889367e1afb1e04f7.bin",
        f"{VERCEL}/mistral/src/__fixtures__/mistral-incremental-tool-call.chunks.txt",
        f"{VERCEL}/groq/src/__fixtures__/groq-tool-call.chunks.txt",
        f"{VERCEL}/deepseek/src/chat/__fixtures__/deepseek-tool-call.chunks.txt",
    ],
    RESPONSES: [
        f"{_RESPONSES}/openai-reasoning-encrypted-content.1.chunks.txt",
        f"{_RESPONSES}/issue-19067-parallel-tool-call-wrapper.chunks.txt",
    ],
    ANTHROPIC: [
        f"{ANTHROPIC_PY}/lib/streaming/fixtures/tool_use_response.txt",
        f"{VERCEL}/anthropic/src/__fixtures__/anthropic-tool-no-args.chunks.txt",
    ],
    BEDROCK: [
        f"{_BR}/amazon-bedrock-json-with-tools.1.chunks.txt",
        f"{_BR}/amazon-bedrock-tool-call.1.chunks.txt",
        f"{_BR}/amazon-bedrock-tool-no-args.chunks.txt",
        f"{_BR}/issue-11409-kimi-k2-thinking-glob-search.chunks.txt",
    ],
    GEMINI: [
        f"{_GO}/google-tool-call.chunks.txt",
        f"{_GO}/google-stream-no-args-tool-call.chunks.txt",
        f"{_GO}/google-stream-tool-call-array-arguments-missing-terminal-function-call.chunks.txt",
    ],
}
CASES = [(p, path) for p, paths in RECORDED.items() for path in paths]
#: Recorded streams whose only tools ran at the provider (no client call, so no turn).
SERVER_ONLY = [
    (RESPONSES, f"{_RESPONSES}/openai-web-search-tool.1.chunks.txt"),
    (ANTHROPIC,
     f"{VERCEL}/anthropic/src/__fixtures__/anthropic-web-fetch-tool-20260209.1.chunks.txt"),
]

# -- the Responses items a client answers, and chat custom calls (no recording has them) ----

COMPUTER = {"type": "computer_call", "id": "cu_1", "call_id": "call_cu",
            "action": {"type": "click", "button": "left", "x": 10, "y": 20},
            "pending_safety_checks": [], "status": "completed"}
LOCAL_SHELL = {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_ls",
               "action": {"type": "exec", "command": ["ls"], "env": {}}, "status": "completed"}
APPROVAL = {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "zip1",
            "name": "create_short_url", "arguments": '{"url": "https://ai-sdk.dev"}'}
CUSTOM = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_ct", "name": "grep",
          "input": "pattern: TODO", "status": "completed"}
CLIENT_ITEMS = [COMPUTER, LOCAL_SHELL, APPROVAL, CUSTOM, shell_call("call_sh", ["ls", "pwd"]),
                apply_patch_call("call_ap", {"type": "delete_file", "path": "a.txt"})]
CLIENT_TOOLS = [{"type": "computer_use_preview", "display_width": 1024, "display_height": 768,
                 "environment": "browser"}, {"type": "local_shell"},
                {"type": "mcp", "server_label": "zip1", "require_approval": "always"},
                {"type": "custom", "name": "grep"}, {"type": "shell"}, {"type": "apply_patch"}]
#: What a runner answers each kind with when it succeeds (a shell its per-command output, a
#: computer its screenshot, an approval its decision).
KIND_RESULTS = {
    "shell_call": json.dumps([{"stdout": "a.txt\n", "stderr": "", "outcome": {
        "type": "exit", "exit_code": 0}}, {"stdout": "/tmp\n", "stderr": "",
                                           "outcome": {"type": "timeout"}}]),
    "computer_call": json.dumps({"type": "computer_screenshot",
                                 "image_url": "data:image/png;base64,iVBORw0KGgo="}),
    "mcp_approval_request": json.dumps({"approve": True}),
}


def _client_items_events() -> list[dict[str, Any]]:
    events = responses_head()
    for index, item in enumerate(CLIENT_ITEMS):
        events += item_events(index, item)
    return [*events, responses_tail(output=CLIENT_ITEMS)]


# -- building the request ------------------------------------------------------------------


def final_of(provider: str, events: list[dict[str, Any]], tools: list[Any] | None = None,
             settings: AssembleSettings | None = None) -> dict[str, Any]:
    """The run's final record, every tool its calls name registered without a schema (or
    ``tools``)."""
    if tools is None:
        first = run_events(provider, events, [])
        names = {o["name"] for o in only_final(first)["outcomes"] if o.get("name")}
        tools = tools_for(provider, dict.fromkeys(names))
    return only_final(run_events(provider, events, tools, settings))


def entries_for(final: dict[str, Any]) -> list[TurnEntry]:
    """An answer for each call of the final message, in its order: committed calls answered
    (every third an error result, every fourth with structured content), failed calls by
    their error result, dropped calls none."""
    entries = []
    for n, outcome in enumerate(final["outcomes"]):
        call_id, name, kind = outcome["tool_call_id"], outcome["name"], outcome.get(
            "kind", "function")
        if outcome.get("dropped"):
            entries.append(TurnEntry(call_id, name, "dropped", outcome["reason"], None, None))
            continue
        if outcome["state"] != "committed":
            answer = Answer(call_id, name, kind, True, f"{outcome['reason']}: the call failed")
            entries.append(TurnEntry(call_id, name, "failed", outcome["reason"], answer, None))
            continue
        if n % 3 == 2:
            answer = Answer(call_id, name, kind, True, "tool_timeout: no result in 30 s")
            entries.append(TurnEntry(call_id, name, "tool_timeout", "tool_timeout", answer,
                                     None))
            continue
        content = KIND_RESULTS.get(kind, f"result of {name}")
        structured = {"rows": n} if n % 4 == 3 and kind == "function" else None
        answer = Answer(call_id, name, kind, False, content, structured)
        entries.append(TurnEntry(call_id, name, "answered", None, answer,
                                 len(content.encode())))
    return entries


def assistant(provider: str, final: dict[str, Any]) -> list[dict[str, Any]]:
    """The final message as the agent loop sends it back: its role and content (the
    provider's response-only fields, Anthropic's ``id``/``model``/``stop_reason``, left out),
    Responses its output items."""
    message = final["message"]
    if provider == RESPONSES:
        return list(message["output"])
    if provider == CHAT:
        return [{k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}]
    if provider == GEMINI:
        return [{"role": message["role"], "parts": message["parts"]}]
    return [{"role": message["role"], "content": message["content"]}]


def user(provider: str) -> dict[str, Any]:
    text = "What is the weather in Paris?"
    if provider == BEDROCK:
        return {"role": "user", "content": [{"text": text}]}
    if provider == GEMINI:
        return {"role": "user", "parts": [{"text": text}]}
    return {"role": "user", "content": text}


# -- the validators -------------------------------------------------------------------------

ADAPTERS = {CHAT: TypeAdapter(list[ChatCompletionMessageParam]),
            RESPONSES: TypeAdapter(ResponseInputParam),
            ANTHROPIC: TypeAdapter(list[MessageParam])}
CONVERSE = botocore.session.get_session().get_service_model(
    "bedrock-runtime").operation_model("Converse").input_shape


def drained(value: Any) -> Any:
    """``value`` with every lazily validated iterable iterated (which validates it)."""
    if isinstance(value, dict):
        return {k: drained(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [drained(v) for v in value]
    if isinstance(value, Iterator):
        return [drained(v) for v in value]
    return value


def validated(provider: str, request: list[dict[str, Any]]) -> list[Any]:
    """The request as the provider's SDK validates it; raises when it refuses it."""
    if provider in ADAPTERS:
        return list(drained(ADAPTERS[provider].validate_python(request)))
    if provider == BEDROCK:
        report = ParamValidator().validate({"modelId": "anthropic.claude-sonnet-4-5",
                                            "messages": request}, CONVERSE)
        if report.has_errors():
            raise ValueError(report.generate_report())
        return request
    return [genai.Content.model_validate_json(json.dumps(m)).model_dump(
        mode="json", by_alias=True, exclude_none=True) for m in request]


def check_request(provider: str, final: dict[str, Any], record: dict[str, Any]) -> None:
    """The whole request validates, and the turn's messages come back from the validator as
    they were sent."""
    turn = record["messages"]
    request = [user(provider), *assistant(provider, final), *turn]
    back = validated(provider, json.loads(json.dumps(request)))
    assert back[len(back) - len(turn):] == turn


# -- the pairing rules ------------------------------------------------------------------------

_CLIENT_ITEMS = ("function_call", "custom_tool_call", "computer_call", "local_shell_call",
                 "shell_call", "apply_patch_call")


def call_ids(provider: str, final: dict[str, Any]) -> list[str]:
    """The client tool call ids of the final message, in its order."""
    message = final["message"]
    if provider == CHAT:
        return [c["id"] for c in message.get("tool_calls") or ()]
    if provider == RESPONSES:
        return [i["id"] if i["type"] == "mcp_approval_request" else i["call_id"]
                for i in message["output"]
                if i["type"] in _CLIENT_ITEMS or i["type"] == "mcp_approval_request"]
    if provider == ANTHROPIC:
        return [b["id"] for b in message["content"] if b["type"] == "tool_use"]
    if provider == BEDROCK:
        return [b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b]
    return [p["functionCall"]["id"] for p in message["parts"] if "functionCall" in p]


def answered_ids(provider: str, turn: list[dict[str, Any]]) -> list[str]:
    """The call ids the turn's messages answer, in order."""
    if provider == CHAT:
        return [m["tool_call_id"] for m in turn]
    if provider == RESPONSES:
        return [m.get("call_id") or m.get("id") or m["approval_request_id"] for m in turn]
    if provider == ANTHROPIC:
        return [b["tool_use_id"] for m in turn for b in m["content"]]
    if provider == BEDROCK:
        return [b["toolResult"]["toolUseId"] for m in turn for b in m["content"]]
    return [p["functionResponse"]["id"] for m in turn for p in m["parts"]]


def check_pairing(provider: str, final: dict[str, Any], record: dict[str, Any]) -> None:
    """Every call of the final message answered exactly once, in order; a dropped call not
    at all; one user message after the assistant's where the provider wants one."""
    turn = record["messages"]
    assert answered_ids(provider, turn) == call_ids(provider, final)
    dropped = {o["tool_call_id"] for o in final["outcomes"] if o.get("dropped")}
    assert not dropped & set(answered_ids(provider, turn))
    assert [o["tool_call_id"] for o in record["outcomes"]] == [
        o["tool_call_id"] for o in final["outcomes"]]
    if provider in (ANTHROPIC, BEDROCK, GEMINI) and turn:
        assert len(turn) == 1 and turn[0]["role"] == "user"
    if provider == GEMINI and turn:
        calls = [p["functionCall"] for p in final["message"]["parts"] if "functionCall" in p]
        responses = [p["functionResponse"] for p in turn[0]["parts"]]
        assert [c["name"] for c in calls] == [r["name"] for r in responses]


def record_for(provider: str, final: dict[str, Any]) -> dict[str, Any]:
    return turn_record(final["run_id"], final["tenant"], provider, final["idempotency_key"],
                       entries_for(final))


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize(("provider", "path"), CASES,
                         ids=[f"{p}:{Path(path).name}" for p, path in CASES])
def test_recorded_runs_next_request_validates(provider: str, path: str) -> None:
    """A recorded stream's final message and its turn make a request the provider's own
    request types accept, answering every call once, in order."""
    final = final_of(provider, load_events(fixture(path)))
    assert call_ids(provider, final), "a fixture without a client call tests nothing"
    record = record_for(provider, final)
    check_request(provider, final, record)
    check_pairing(provider, final, record)


@pytest.mark.parametrize(("provider", "path"), SERVER_ONLY,
                         ids=[f"{p}:{Path(path).name}" for p, path in SERVER_ONLY])
def test_server_tools_only_make_no_turn(provider: str, path: str) -> None:
    """A response whose tools all ran at the provider has no call to answer: the turn has no
    message and no outcome, and the history alone validates."""
    final = final_of(provider, load_events(fixture(path)))
    record = record_for(provider, final)
    assert call_ids(provider, final) == [] and record["messages"] == []
    assert record["outcomes"] == []
    check_request(provider, final, record)


def test_responses_client_items_next_request_validates() -> None:
    """Every Responses item a client answers (computer, local shell, MCP approval, custom,
    shell, apply_patch), committed and answered (and once more all failed): each gets its own
    output item, which ``ResponseInputParam`` accepts."""
    final = final_of(RESPONSES, _client_items_events(), CLIENT_TOOLS)
    assert [o["state"] for o in final["outcomes"]] == ["committed"] * len(CLIENT_ITEMS)
    record = record_for(RESPONSES, final)
    assert [m["type"] for m in record["messages"]] == [
        "computer_call_output", "local_shell_call_output", "mcp_approval_response",
        "custom_tool_call_output", "shell_call_output", "apply_patch_call_output"]
    check_request(RESPONSES, final, record)
    check_pairing(RESPONSES, final, record)
    failed = final_of(RESPONSES, _client_items_events(), [])
    assert {o["reason"] for o in failed["outcomes"]} == {"unknown_tool"}
    record = record_for(RESPONSES, failed)
    check_request(RESPONSES, failed, record)
    check_pairing(RESPONSES, failed, record)


def test_chat_custom_call_next_request_validates() -> None:
    """A chat custom tool call is answered by a ``role: tool`` message, as a function call."""
    chunks = [*chat_custom_chunks(0, "call_c", "grep", "pattern: TODO"),
              chat_chunk(finish_reason="tool_calls")]
    final = final_of(CHAT, chunks, [chat_custom_tool("grep")])
    assert final["outcomes"][0]["state"] == "committed"
    record = record_for(CHAT, final)
    check_request(CHAT, final, record)
    check_pairing(CHAT, final, record)


@pytest.mark.parametrize("provider", [CHAT, RESPONSES, ANTHROPIC, BEDROCK])
def test_dropped_call_gets_no_message(provider: str) -> None:
    """Under ``drop_with_protocol_repair`` a call failing ``invalid_json`` is left out of the
    final message and of the turn; the other calls' request still validates, each answered
    once. (Gemini streams values, not text: no call of it fails ``invalid_json``.)"""
    events = provider_calls(provider, [("call_ok", "read", '{"p": 1}'),
                                       ("call_bad", "read", '{"p": ')])
    final = final_of(provider, events, tools_for(provider, {"read": None}),
                     AssembleSettings(on_invalid_json="drop_with_protocol_repair"))
    assert [o.get("dropped", False) for o in final["outcomes"]] == [False, True]
    record = record_for(provider, final)
    assert record["outcomes"][1]["outcome"] == "dropped"
    check_request(provider, final, record)
    check_pairing(provider, final, record)
    assert call_ids(provider, final) == ["call_ok"]


# -- each validator refuses a wrong turn -------------------------------------------------------


def simple(provider: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run of five parallel calls, and its turn record: two answered, one timed out, one
    answered with structured content, one failed ``unknown_tool`` (its error result answers
    it). Both pass: the negative tests' baseline."""
    events = provider_calls(provider, [*((f"call_{n}", "read", f'{{"p": {n}}}')
                                         for n in range(1, 5)), ("call_5", "nope", "{}")])
    final = final_of(provider, events, tools_for(provider, {"read": None}))
    record = record_for(provider, final)
    check_request(provider, final, record)
    check_pairing(provider, final, record)
    return final, record


@pytest.mark.parametrize("provider", PROVIDERS)
def test_parallel_calls_next_request_validates(provider: str) -> None:
    """Five parallel calls, each outcome but dropped among them: one message per call (one
    user message of five results for Anthropic, Bedrock and Gemini), in order; errors marked
    as the provider marks them."""
    _, record = simple(provider)
    assert [o["outcome"] for o in record["outcomes"]] == [
        "answered", "answered", "tool_timeout", "answered", "failed"]
    assert [o["is_error"] for o in record["outcomes"]] == [False, False, True, False, True]
    assert error_marks(provider, record["messages"]) in (None, [False, False, True, False, True])


def error_marks(provider: str, turn: list[dict[str, Any]]) -> list[bool] | None:
    """Which results the provider's own error mark says are errors (chat and Responses have
    none: None)."""
    if provider == ANTHROPIC:
        return [b.get("is_error", False) for m in turn for b in m["content"]]
    if provider == BEDROCK:
        return [b["toolResult"].get("status") == "error" for m in turn for b in m["content"]]
    if provider == GEMINI:
        return ["error" in p["functionResponse"]["response"] for m in turn for p in m["parts"]]
    return None


WRONG_TURNS = {
    # a tool message without its tool_call_id
    CHAT: lambda turn: [{k: v for k, v in turn[0].items() if k != "tool_call_id"}, *turn[1:]],
    # a function_call_output without its output
    RESPONSES: lambda turn: [{"type": "function_call_output", "call_id": "call_1"}, *turn[1:]],
    # a tool_result block without its tool_use_id
    ANTHROPIC: lambda turn: [{"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}],
    # a toolResult without its toolUseId (botocore checks no enum: a wrong status passes)
    BEDROCK: lambda turn: [{"role": "user", "content": [{"toolResult": {
        "content": turn[0]["content"][0]["toolResult"]["content"]}}]}],
    # the output beside the response instead of in it
    GEMINI: lambda turn: [{"role": "user", "parts": [
        {"functionResponse": {"name": "read", "output": "x"}}]}],
}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_each_validator_refuses_a_wrong_turn(provider: str) -> None:
    """Each provider's validator refuses a turn of the wrong shape, so that a pass means
    something."""
    final, record = simple(provider)
    wrong = WRONG_TURNS[provider](record["messages"])
    request = [user(provider), *assistant(provider, final), *wrong]
    with pytest.raises((ValidationError, ValueError)):
        validated(provider, request)


def test_a_lazily_validated_wrong_list_is_refused() -> None:
    """A string where Responses wants a list of shell outputs passes a plain
    ``TypeAdapter.validate_python`` (an ``Iterable`` is validated when iterated), and
    :func:`validated` refuses it."""
    item = {"type": "shell_call_output", "call_id": "call_sh", "output": "ls"}
    ADAPTERS[RESPONSES].validate_python([item])  # lax
    with pytest.raises(ValidationError):
        validated(RESPONSES, [item])


def test_a_key_the_sdk_ignores_is_caught() -> None:
    """A key the SDK's TypedDict does not define is dropped by the validator, not refused:
    the equality of the turn before and after validation catches it."""
    final, record = simple(CHAT)
    record["messages"][0]["is_error"] = True  # no such field on a chat tool message
    with pytest.raises(AssertionError):
        check_request(CHAT, final, record)
