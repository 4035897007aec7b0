"""The five fixture classes, for each provider: single tool, two parallel tools, a tool
with no arguments, oversize arguments, and a cancel mid-stream.

Each stream is hand-made with ``tests/builders.py`` in the provider's own event format and
fed through ``Assembler.feed_record``; the same expectations hold for all five providers
(Bedrock: the SDK's event objects; Gemini: calls whose arguments stream as ``partialArgs``).
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    EMPTY_SCHEMA,
    GEMINI,
    NEW_PROVIDERS,
    PATH_SCHEMA,
    PROVIDERS,
    anthropic_message_start,
    anthropic_tail,
    anthropic_tool_block,
    bedrock_tool_block,
    cancel,
    chat_chunk,
    chat_tool_delta,
    check_outputs,
    committed,
    errors,
    feed,
    finals,
    gemini_calls,
    outcome_ids,
    provider_calls,
    provider_run,
    responses_call,
    responses_head,
    responses_tail,
    run_envelopes,
    split,
    tools_for,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic

TOOLS = {"read_file": PATH_SCHEMA, "get_time": EMPTY_SCHEMA,
         "write_file": {"type": "object", "required": ["path", "text"],
                        "properties": {"path": {"type": "string"},
                                       "text": {"type": "string"}}}}
pytestmark = pytest.mark.parametrize("provider", (*PROVIDERS, *NEW_PROVIDERS))


def final_call_text(provider: str, final: dict[str, Any]) -> list[tuple[str, Any]]:
    """(call id, arguments as the final message holds them), in message order."""
    message = final["message"]
    if provider == CHAT:
        return [(c["id"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    if provider == ANTHROPIC:
        return [(b["id"], b["input"]) for b in message["content"] if b["type"] == "tool_use"]
    if provider == BEDROCK:
        return [(b["toolUse"]["toolUseId"], b["toolUse"]["input"]) for b in message["content"]
                if "toolUse" in b]
    if provider == GEMINI:
        return [(p["functionCall"]["id"], p["functionCall"]["args"]) for p in message["parts"]
                if "functionCall" in p]
    return [(i["call_id"], i["arguments"]) for i in message["output"]
            if i["type"] == "function_call"]


def run(provider: str, calls: list[tuple[str, str, str]], **settings: Any) -> list[Emit]:
    emits = feed(Assembler(AssembleSettings(**settings)),
                 provider_run(provider, "r1", TOOLS, calls))
    check_outputs(emits)
    return emits


class TestSingleTool:
    """One call to one registered tool."""

    def test_commits_once_with_its_arguments(self, provider: str) -> None:
        """The call commits once with its parsed arguments, its provider id and index 0,
        then the final message completes the run and holds the call."""
        emits = run(provider, [("call_1", "read_file", '{"path": "/etc/hosts"}')])
        assert [e.topic for e in emits] == [Topic.COMMITTED, Topic.AUDIT, Topic.FINAL]
        [call] = committed(emits)
        assert (call["call_id"], call["name"], call["index"], call["arguments"]) == (
            "call_1", "read_file", 0, {"path": "/etc/hosts"})
        assert call["provider"] == provider and call["run_id"] == "r1"
        [final] = finals(emits)
        assert final["status"] == "completed"
        [(call_id, args)] = final_call_text(provider, final)
        assert call_id == "call_1"
        assert args in ('{"path": "/etc/hosts"}', {"path": "/etc/hosts"})


class TestTwoParallelTools:
    """Two calls in one message, their fragments interleaved where the provider allows."""

    def events(self, provider: str) -> list[dict[str, Any]]:
        a = ("call_a", "read_file", '{"path": "/a"}')
        b = ("call_b", "write_file", '{"path": "/b", "text": "hello, world"}')
        if provider == CHAT:
            first = [chat_chunk([chat_tool_delta(0, a[0], a[1], "")]),
                     chat_chunk([chat_tool_delta(1, b[0], b[1], "")])]
            pa, pb = split(a[2], 4), split(b[2], 4)
            body = [chat_chunk([chat_tool_delta(i, arguments=p)])
                    for pair in zip(pa, pb, strict=True)
                    for i, p in enumerate(pair)]
            return [*first, *body, chat_chunk(finish_reason="tool_calls")]
        if provider == ANTHROPIC:
            return [anthropic_message_start(), *anthropic_tool_block(0, *a),
                    *anthropic_tool_block(1, *b), *anthropic_tail()]
        if provider == BEDROCK:  # the two blocks' deltas interleaved
            ba, bb = bedrock_tool_block(0, *a), bedrock_tool_block(1, *b)
            return [ba[0], bb[0], *(x for pair in zip(ba[1:], bb[1:], strict=False) for x in pair),
                    *bb[len(ba):], {"messageStop": {"stopReason": "tool_use"}}]
        if provider == GEMINI:  # Gemini streams one call after the other
            return gemini_calls([a, b])
        ia, ib = responses_call(0, *a, pieces=4), responses_call(1, *b, pieces=4)
        return [*responses_head(), ia[0], ib[0],
                *(x for pair in zip(ia[1:], ib[1:], strict=True) for x in pair),
                responses_tail()]

    def test_both_commit_in_index_order(self, provider: str) -> None:
        """Both calls commit with their own arguments, index 0 before index 1."""
        emits = feed(Assembler(), run_envelopes("r1", provider, tools_for(provider, TOOLS),
                                                self.events(provider)))
        check_outputs(emits)
        got = [(c["call_id"], c["index"], c["arguments"]) for c in committed(emits)]
        assert got == [("call_a", 0, {"path": "/a"}),
                       ("call_b", 1, {"path": "/b", "text": "hello, world"})]
        assert errors(emits) == []
        assert [c[0] for c in final_call_text(provider, finals(emits)[0])] == [
            "call_a", "call_b"]


class TestNoArgumentTool:
    """A tool that takes no arguments: the provider sends ``{}`` or nothing at all."""

    @pytest.mark.parametrize("text", ["", "{}"], ids=["empty", "braces"])
    def test_commits_empty_object(self, provider: str, text: str) -> None:
        """Empty text and ``{}`` both commit ``{}`` (rule 3)."""
        emits = run(provider, [("call_1", "get_time", text)])
        assert [c["arguments"] for c in committed(emits)] == [{}]


class TestOversizeArguments:
    """Arguments longer than ``max_tool_argument_bytes``."""

    def test_fails_without_quoting_and_others_commit(self, provider: str) -> None:
        """The oversize call fails ``arguments_exceed_max_bytes`` with content that names
        the limit and holds none of its text; the other call of the run still commits."""
        big = '{"path": "/big", "text": "@"}'.replace("@", "SECRETPAYLOAD" * 100)
        emits = run(provider, [("call_big", "write_file", big),
                               ("call_ok", "read_file", '{"path": "/ok"}')],
                    max_tool_argument_bytes=256)
        assert outcome_ids(emits) == ["call_big", "call_ok"]
        [error] = errors(emits)
        assert (error["tool_call_id"], error["reason"], error["state"]) == (
            "call_big", "arguments_exceed_max_bytes", "failed")
        assert "256" in error["content"] and "SECRETPAYLOAD" not in error["content"]
        assert [c["call_id"] for c in committed(emits)] == ["call_ok"]


class TestMidStreamCancel:
    """A cancel that arrives while a call's arguments are still streaming."""

    def test_cancels_and_ignores_the_rest(self, provider: str) -> None:
        """The partial call gets one ``cancelled`` error result at the cancel, the run ends
        ``cancelled``, and the rest of the stream (its end included) changes nothing."""
        text = '{"path": "/a", "text": "long text here"}'
        events = provider_calls(provider, [("call_1", "write_file", text)], pieces=6)
        envs = run_envelopes("r1", provider, tools_for(provider, TOOLS), events)
        fragments = [i for i, env in enumerate(envs) if _fragment(env) is not None]
        assert len(fragments) >= 6  # Gemini cuts each string value into up to six
        cut = fragments[2] + 1  # three of six fragments have arrived
        asm = Assembler()
        head = envs[:cut]
        assert feed(asm, head) == []
        at_cancel = feed(asm, [cancel("r1")])
        check_outputs(at_cancel)
        assert [(e["tool_call_id"], e["state"], e["reason"]) for e in errors(at_cancel)] == [
            ("call_1", "cancelled", "cancelled")]
        assert committed(at_cancel) == []
        assert finals(at_cancel)[0]["status"] == "cancelled"
        assert feed(asm, envs[cut:]) == []


def _fragment(env: dict[str, Any]) -> str | None:
    """The non-empty argument fragment an envelope carries, if any."""
    event = env.get("event") or {}
    delta = (event.get("contentBlockDelta") or {}).get("delta") or {}
    if (delta.get("toolUse") or {}).get("input"):
        return str(delta["toolUse"]["input"])
    for candidate in event.get("candidates", []):
        for part in candidate["content"]["parts"]:
            if part.get("functionCall", {}).get("partialArgs"):
                return str(part["functionCall"]["partialArgs"])
    if event.get("type") == "content_block_delta":
        return event["delta"].get("partial_json") or None
    if event.get("type") == "response.function_call_arguments.delta":
        return event["delta"] or None
    for choice in event.get("choices", []):
        for entry in choice["delta"].get("tool_calls", []):
            return entry.get("function", {}).get("arguments") or None
    return None
