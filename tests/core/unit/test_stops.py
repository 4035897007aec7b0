"""Stop and incomplete reasons, provider by provider (issue 33; docs/contract.md,
"Stop and incomplete reasons"), and the field checks that came with them.

Each provider's documented stop reasons do one defined thing to the calls of their message
(or choice): they commit, they fail with a named reason (``truncated``, ``content_filtered``,
``malformed_output``, ``too_many_tool_calls``, ``upstream_error``), or they are left for the
turn that goes on (``turn_paused``). A call the provider said it stopped for its content is
never committed; a call committed early (block-level early commit) before such a stop keeps
its outcome, and the run still fails.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    PATH_SCHEMA,
    RESPONSES,
    anthropic_calls,
    anthropic_message_start,
    anthropic_tail,
    anthropic_text_block,
    anthropic_tool_block,
    bedrock_calls,
    bedrock_tool_block,
    chat_call_chunks,
    chat_calls,
    chat_chunk,
    chat_tool_delta,
    check_outputs,
    check_schemas,
    committed,
    errors,
    feed,
    finals,
    gemini_calls,
    gemini_chunk,
    responses_calls,
    run_envelopes,
    tools_for,
)

from worker.core import Assembler, AssembleSettings, Emit

TOOLS = {"read_file": PATH_SCHEMA}
ARGS = '{"path": "/a"}'
CALL = [("c1", "read_file", ARGS)]
EARLY = {"execute_before_stream_end": True, "allow_pipelined_execute": ("read_file",)}


def run(provider: str, events: list[dict[str, Any]], **settings: Any) -> list[Emit]:
    """One run of ``provider`` through a fresh assembler; every output fits its schema."""
    emits = feed(Assembler(AssembleSettings(**settings)),
                 run_envelopes("r1", provider, tools_for(provider, TOOLS), events))
    check_outputs(emits)
    check_schemas(emits)
    return emits


def result(emits: list[Emit]) -> tuple[list[str], str]:
    """Each call's ``committed`` or error reason, in order, and the run's status."""
    outcome = [c and "committed" for c in (v["call_id"] for v in committed(emits))]
    outcome += [e["reason"] for e in errors(emits)]
    [final] = finals(emits)
    return outcome, final["status"]


def responses_incomplete(reason: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": "resp_1", "object": "response", "status": "incomplete",
                            "output": []}
    if reason is not None:
        body["incomplete_details"] = {"reason": reason}
    return {"type": "response.incomplete", "response": body}


# -- OpenAI Chat Completions ------------------------------------------------------------------

CHAT_FINISHES = [
    ("stop", ["committed"], "completed"),
    ("tool_calls", ["committed"], "completed"),
    ("function_call", ["committed"], "completed"),
    ("length", ["truncated"], "truncated"),
    ("model_length", ["truncated"], "truncated"),  # Mistral
    ("model_context_window_exceeded", ["truncated"], "truncated"),  # Zhipu GLM
    ("content_filter", ["content_filtered"], "failed"),
    ("sensitive", ["content_filtered"], "failed"),  # Zhipu GLM's safety review
    ("error", ["upstream_error"], "failed"),  # OpenRouter, Mistral
    ("network_error", ["upstream_error"], "failed"),  # Zhipu GLM
    ("insufficient_system_resource", ["upstream_error"], "failed"),  # DeepSeek
    ("some_future_reason", ["upstream_error"], "failed"),
]


@pytest.mark.parametrize(("finish", "outcome", "status"), CHAT_FINISHES,
                         ids=[f for f, _, _ in CHAT_FINISHES])
def test_chat_finish_reasons(finish: str, outcome: list[str], status: str) -> None:
    """A complete, valid call whose choice ends with ``finish``: commits, or fails with the
    reason the table gives; the run's status says the most severe stop."""
    assert result(run(CHAT, chat_calls(CALL, finish_reason=finish))) == (outcome, status)


def test_chat_content_filter_fails_only_its_own_choice() -> None:
    """``n = 2``: choice 0 ends ``content_filter``, choice 1 ``tool_calls``. Only choice 0's
    call fails (``content_filtered``); choice 1's commits, as ``length`` is per choice too."""
    events = [*chat_call_chunks(0, "c0", "read_file", ARGS, choice=0),
              *chat_call_chunks(0, "c1", "read_file", ARGS, choice=1),
              chat_chunk(finish_reason="content_filter", choice=0),
              chat_chunk(finish_reason="tool_calls", choice=1)]
    emits = run(CHAT, events)
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("c0", "content_filtered")]
    assert finals(emits)[0]["status"] == "failed"


def test_chat_a_refusal_fails_the_calls_of_its_choice() -> None:
    """A ``delta.refusal`` (the model refused) in a choice that also streams a complete call
    and ends ``tool_calls``: the call fails ``content_filtered``; the refusal is in the final
    message. A ``"refusal": null`` (OpenAI sends it on the first delta) is no refusal."""
    refused = chat_chunk(choice=0)
    refused["choices"][0]["delta"] = {"refusal": "I can't help with that."}
    emits = run(CHAT, [*chat_calls(CALL)[:-1], refused, chat_chunk(finish_reason="tool_calls")])
    assert result(emits) == (["content_filtered"], "failed")
    assert finals(emits)[0]["message"]["refusal"] == "I can't help with that."
    null = chat_chunk(choice=0)
    null["choices"][0]["delta"] = {"role": "assistant", "content": None, "refusal": None}
    assert result(run(CHAT, [null, *chat_calls(CALL)])) == (["committed"], "completed")


def test_chat_a_finish_reason_on_every_chunk_keeps_the_first_stop() -> None:
    """A server that repeats ``finish_reason`` (first ``content_filter``, then ``stop``) on
    later chunks: the first stop of the choice stands."""
    events = [*chat_calls(CALL, finish_reason="content_filter"),
              chat_chunk(finish_reason="stop")]
    assert result(run(CHAT, events)) == (["content_filtered"], "failed")


# -- Anthropic Messages -----------------------------------------------------------------------

ANTHROPIC_STOPS = [
    ("end_turn", ["committed"], "completed"),
    ("tool_use", ["committed"], "completed"),
    ("stop_sequence", ["committed"], "completed"),
    ("max_tokens", ["truncated"], "truncated"),
    ("model_context_window_exceeded", ["truncated"], "truncated"),
    ("refusal", ["content_filtered"], "failed"),
    ("pause_turn", ["turn_paused"], "completed"),
    ("some_future_reason", ["upstream_error"], "failed"),
]


@pytest.mark.parametrize(("stop", "outcome", "status"), ANTHROPIC_STOPS,
                         ids=[s for s, _, _ in ANTHROPIC_STOPS])
def test_anthropic_stop_reasons(stop: str, outcome: list[str], status: str) -> None:
    """A complete, valid ``tool_use`` block in a message that ends with ``stop``."""
    assert result(run(ANTHROPIC, anthropic_calls(CALL, stop_reason=stop))) == (outcome, status)


def test_anthropic_refusal_after_an_early_commit_keeps_the_commit() -> None:
    """With block-level early commit, the call commits at its ``content_block_stop``, before
    ``stop_reason: refusal`` arrives: the commit stands (a committed call is never taken
    back), nothing else is emitted for it, and the run fails. Early commit trades this: a
    tool in ``allow_pipelined_execute`` may run before the provider's stop is known."""
    emits = run(ANTHROPIC, anthropic_calls(CALL, stop_reason="refusal"), **EARLY)
    assert [c["call_id"] for c in committed(emits)] == ["c1"] and not errors(emits)
    assert finals(emits)[0]["status"] == "failed"
    # a call still streaming when the refusal comes fails
    events = [anthropic_message_start(),
              *anthropic_tool_block(0, "c1", "read_file", ARGS),
              *anthropic_tool_block(1, "c2", "read_file", ARGS, stop=False),
              *anthropic_tail("refusal")]
    emits = run(ANTHROPIC, events, **EARLY)
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("c2", "content_filtered")]


def test_anthropic_pause_turn_with_a_dangling_server_tool_use() -> None:
    """Field check (c): a message paused (``pause_turn``) while a ``server_tool_use`` block
    has no result yet, with a client call too. The client call fails ``turn_paused``
    (``dropped``); the final message is the message to send back as it is for the turn to go
    on: its text and the ``server_tool_use`` block with its input, no client block, status
    ``completed``, ``stop_reason: pause_turn``."""
    events = [anthropic_message_start(), *anthropic_text_block(0, "searching"),
              *anthropic_tool_block(1, "srvtoolu_1", "web_search", '{"query": "q"}',
                                    kind="server_tool_use"),
              *anthropic_tool_block(2, "c1", "read_file", ARGS), *anthropic_tail("pause_turn")]
    emits = run(ANTHROPIC, events)
    [error] = errors(emits)
    assert (error["tool_call_id"], error["reason"], error["dropped"]) == (
        "c1", "turn_paused", True)
    [final] = finals(emits)
    assert final["status"] == "completed"
    assert final["message"]["stop_reason"] == "pause_turn"
    assert final["message"]["content"] == [
        {"type": "text", "text": "searching"},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
         "input": {"query": "q"}}]


# -- OpenAI Responses -------------------------------------------------------------------------

RESPONSES_INCOMPLETE = [
    ("max_output_tokens", "truncated", "truncated"),
    ("content_filter", "content_filtered", "failed"),
    (None, "truncated", "truncated"),
    ("some_future_reason", "truncated", "truncated"),
]


@pytest.mark.parametrize(("reason", "outcome", "status"), RESPONSES_INCOMPLETE,
                         ids=[str(r) for r, _, _ in RESPONSES_INCOMPLETE])
def test_responses_incomplete_reasons(reason: str | None, outcome: str, status: str) -> None:
    """A complete, valid ``function_call`` item, then ``response.incomplete`` with
    ``incomplete_details.reason``: ``content_filter`` fails it ``content_filtered``; the rest
    (the response says it is incomplete) ``truncated``. ``response.completed`` commits."""
    events = [*responses_calls(CALL, terminal=None), responses_incomplete(reason)]
    assert result(run(RESPONSES, events)) == ([outcome], status)
    assert result(run(RESPONSES, responses_calls(CALL))) == (["committed"], "completed")


def test_responses_content_filter_after_an_early_commit_keeps_the_commit() -> None:
    """The call commits at its ``output_item.done`` (early commit); the response then ends
    ``incomplete`` for ``content_filter``: the commit stands, the run fails."""
    events = [*responses_calls(CALL, terminal=None), responses_incomplete("content_filter")]
    emits = run(RESPONSES, events, **EARLY)
    assert [c["call_id"] for c in committed(emits)] == ["c1"] and not errors(emits)
    assert finals(emits)[0]["status"] == "failed"


def _message_item(index: int, part: dict[str, Any]) -> list[dict[str, Any]]:
    item = {"type": "message", "id": f"msg_{index}", "role": "assistant",
            "status": "completed", "content": [part]}
    return [{"type": "response.output_item.added", "output_index": index,
             "item": {**item, "status": "in_progress", "content": []}},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def test_responses_a_refusal_fails_the_calls() -> None:
    """A ``refusal`` content part, streamed (``response.refusal.delta``) or only in the
    finished message item, in a response that also carries a complete call and completes:
    the call fails ``content_filtered``. An ``output_text`` part is no refusal."""
    refusal = {"type": "refusal", "refusal": "I can't help with that."}
    streamed = [{"type": "response.refusal.delta", "output_index": 1, "item_id": "msg_1",
                 "content_index": 0, "delta": "I can't"}]
    calls = responses_calls(CALL)
    for extra in (streamed, _message_item(1, refusal)):
        events = [*calls[:-1], *extra, calls[-1]]
        assert result(run(RESPONSES, events)) == (["content_filtered"], "failed")
    text = _message_item(1, {"type": "output_text", "text": "ok", "annotations": []})
    assert result(run(RESPONSES, [*calls[:-1], *text, calls[-1]])) == (
        ["committed"], "completed")


# -- Bedrock ConverseStream and Gemini ----------------------------------------------------------

BEDROCK_STOPS = [
    ("end_turn", "committed", "completed"), ("tool_use", "committed", "completed"),
    ("stop_sequence", "committed", "completed"), ("max_tokens", "truncated", "truncated"),
    ("model_context_window_exceeded", "truncated", "truncated"),
    ("guardrail_intervened", "content_filtered", "failed"),
    ("content_filtered", "content_filtered", "failed"),
    ("malformed_tool_use", "malformed_output", "failed"),
    ("malformed_model_output", "malformed_output", "failed"),
    ("some_future_reason", "upstream_error", "failed"),
]


@pytest.mark.parametrize(("stop", "outcome", "status"), BEDROCK_STOPS,
                         ids=[s for s, _, _ in BEDROCK_STOPS])
def test_bedrock_stop_reasons(stop: str, outcome: str, status: str) -> None:
    """A complete, valid ``toolUse`` block in a message whose ``messageStop`` says ``stop``."""
    assert result(run(BEDROCK, bedrock_calls(CALL, stop_reason=stop))) == ([outcome], status)


def test_bedrock_guardrail_after_an_early_commit_keeps_the_commit() -> None:
    """The call commits at its ``contentBlockStop`` (early commit); ``guardrail_intervened``
    comes after: the commit stands and the run fails."""
    emits = run(BEDROCK, bedrock_calls(CALL, stop_reason="guardrail_intervened"), **EARLY)
    assert [c["call_id"] for c in committed(emits)] == ["c1"] and not errors(emits)
    assert finals(emits)[0]["status"] == "failed"


#: Every ``FinishReason`` of the Gemini API (google-genai ``types.FinishReason``) and Vertex
#: AI's ``MODEL_ARMOR``, with what it does to a complete call of its candidate.
GEMINI_FINISHES = {
    "STOP": "committed", "MAX_TOKENS": "truncated",
    **dict.fromkeys(["SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII",
                     "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION",
                     "MODEL_ARMOR"], "content_filtered"),
    **dict.fromkeys(["MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "MALFORMED_RESPONSE"],
                    "malformed_output"),
    "TOO_MANY_TOOL_CALLS": "too_many_tool_calls",
    **dict.fromkeys(["FINISH_REASON_UNSPECIFIED", "LANGUAGE", "OTHER", "NO_IMAGE",
                     "IMAGE_OTHER", "MISSING_THOUGHT_SIGNATURE", "SOME_FUTURE_REASON"],
                    "upstream_error"),
}


@pytest.mark.parametrize(("finish", "outcome"), GEMINI_FINISHES.items(),
                         ids=list(GEMINI_FINISHES))
def test_gemini_finish_reasons(finish: str, outcome: str) -> None:
    """A complete, valid call of a candidate whose ``finishReason`` is ``finish``."""
    status = {"committed": "completed", "truncated": "truncated"}.get(outcome, "failed")
    assert result(run(GEMINI, gemini_calls(CALL, finish_reason=finish))) == ([outcome], status)


# -- field checks -----------------------------------------------------------------------------


def _whole(name: str, args: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"functionCall": {"name": name, "args": args, **more}}


def _gemini_outcomes(chunks: list[dict[str, Any]]) -> list[tuple[str, str]]:
    emits = run(GEMINI, [*chunks, gemini_chunk([{"text": ""}], finish_reason="STOP")])
    return ([(c["call_id"], "committed") for c in committed(emits)]
            + [(e["tool_call_id"], e["reason"]) for e in errors(emits)])


def test_gemini_a_whole_call_repeated_by_a_later_chunk_is_one_call() -> None:
    """Field check (a): an id-less whole ``functionCall`` that a later chunk of the same
    candidate repeats (name and arguments the same; without its ``thoughtSignature``) is one
    call, not two: the final message has one part."""
    first = _whole("read_file", {"path": "/a"})
    first["thoughtSignature"] = "sig"
    again = _whole("read_file", {"path": "/a"})
    emits = run(GEMINI, [gemini_chunk([first]), gemini_chunk([again]),
                         gemini_chunk([{"text": ""}], finish_reason="STOP")])
    assert [c["call_id"] for c in committed(emits)] == ["latch-0-0-r1"]
    assert finals(emits)[0]["message"]["parts"] == [
        {"functionCall": {"id": "latch-0-0-r1", "name": "read_file",
                          "args": {"path": "/a"}}, "thoughtSignature": "sig"}]


def test_gemini_what_is_not_a_repeat() -> None:
    """Two identical calls in one chunk are two calls (parallel calls), and a later chunk that
    holds the pair again repeats both and adds nothing; a later chunk with three adds one.
    Other arguments, another name, or an id make another call (two calls with one id both
    fail ``duplicate_call_id``: the latch, not a guess, decides ids)."""
    a = _whole("read_file", {"path": "/a"})
    assert [o for _, o in _gemini_outcomes([gemini_chunk([a, a]), gemini_chunk([a, a])])] == [
        "committed", "committed"]
    assert len(_gemini_outcomes([gemini_chunk([a, a]), gemini_chunk([a, a, a])])) == 3
    b = _whole("read_file", {"path": "/b"})
    assert len(_gemini_outcomes([gemini_chunk([a]), gemini_chunk([b])])) == 2
    with_id = _whole("read_file", {"path": "/a"}, id="v1")
    assert _gemini_outcomes([gemini_chunk([with_id]), gemini_chunk([with_id])]) == [
        ("v1", "duplicate_call_id"), ("v1", "duplicate_call_id")]


def test_bedrock_tool_input_after_its_block_stop_is_a_protocol_break() -> None:
    """Field check (b): a ``toolUse`` delta after the block's ``contentBlockStop`` fails the
    call ``protocol_error`` (not joined, not committed): the stop said the input was whole,
    and a text that goes on after it is one no reader of the protocol would build."""
    events = [{"messageStart": {"role": "assistant"}},
              *bedrock_tool_block(0, "c1", "read_file", ARGS),
              {"contentBlockDelta": {"contentBlockIndex": 0,
                                     "delta": {"toolUse": {"input": '{"path": "/b"}'}}}},
              {"messageStop": {"stopReason": "tool_use"}}]
    assert result(run(BEDROCK, events)) == (["protocol_error"], "failed")


def _cumulative(texts: list[str]) -> list[dict[str, Any]]:
    """Chat chunks of one call whose every fragment is the whole text so far."""
    head = chat_chunk([chat_tool_delta(0, "c1", "read_file", "")])
    return [head, *(chat_chunk([chat_tool_delta(0, arguments=t)]) for t in texts),
            chat_chunk(finish_reason="tool_calls")]


def test_cumulative_argument_fragments_are_refused() -> None:
    """Field check (d): a server that re-sends the whole arguments so far on each chunk
    (DeepSeek, Qianfan behind some gateways: BerriAI/litellm#20480): the joined text
    (``{"path": "/{"path": "/a"{"path": "/a"}``) never parses, so the call fails
    ``invalid_json`` and never runs, without quoting the text. The same holds when the first
    fragment is the whole text and is sent again with more."""
    for texts in (['{"path": "/', '{"path": "/a"', '{"path": "/a"}'],
                  ['{"path": "/a"', '{"path": "/a"', '{"path": "/a"}'],
                  ['{"path": "/a"}', '{"path": "/a"}']):
        emits = run(CHAT, _cumulative(texts))
        [error] = errors(emits)
        assert error["reason"] == "invalid_json"
        assert not committed(emits)
        assert "/a" not in error["content"]


def test_a_delta_that_starts_like_the_first_is_a_delta() -> None:
    """What a fragment looks like never decides: a delta stream whose second fragment starts
    with the whole first one is joined, and commits the text the model sent (the same outcome
    as the whole text, as for any other cut)."""
    text = '{"a": {"a": 1}}'
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    events = [chat_chunk([chat_tool_delta(0, "c1", "f", "")]),
              *(chat_chunk([chat_tool_delta(0, arguments=p)]) for p in ['{"a": ', '{"a": 1}}']),
              chat_chunk(finish_reason="tool_calls")]
    emits = feed(Assembler(AssembleSettings()), run_envelopes("r1", CHAT, tools, events))
    assert [c["arguments"] for c in committed(emits)] == [orjson.loads(text)]


def test_fragments_that_only_look_alike_are_joined() -> None:
    """Delta fragments equal to the first (a text that repeats itself, cut into equal pieces)
    are not taken for re-sends; nor is any fragment of a free-form (custom) call."""
    text = '{"a": {"a": {}}}'
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    events = [chat_chunk([chat_tool_delta(0, "c1", "f", "")]),
              *(chat_chunk([chat_tool_delta(0, arguments=p)]) for p in
                ['{"a": ', '{"a": ', '{}}}']),
              chat_chunk(finish_reason="tool_calls")]
    emits = feed(Assembler(AssembleSettings()), run_envelopes("r1", CHAT, tools, events))
    assert [c["arguments"] for c in committed(emits)] == [orjson.loads(text)]

