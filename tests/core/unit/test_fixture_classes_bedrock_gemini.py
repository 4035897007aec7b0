"""The five fixture classes for ``bedrock.converse`` and ``google.gemini``: single tool, two
parallel tools, a tool with no arguments, oversize arguments, and a cancel mid-stream.

The streams are hand-made with ``tests/builders.py`` in each provider's own format (Bedrock:
the SDK's event objects; Gemini: chunks whose calls stream their arguments as ``partialArgs``,
and, where said, whole calls) and fed through ``Assembler.feed_record``; the expectations are
those ``test_fixture_classes.py`` holds the other providers to.
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import (
    BEDROCK,
    EMPTY_SCHEMA,
    GEMINI,
    NEW_PROVIDERS,
    PATH_SCHEMA,
    bedrock_calls,
    bedrock_tool_block,
    cancel,
    check_outputs,
    committed,
    errors,
    feed,
    finals,
    gemini_call_chunks,
    gemini_calls,
    gemini_chunk,
    outcome_ids,
    provider_calls,
    provider_run,
    run_envelopes,
    tools_for,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic

TOOLS = {"read_file": PATH_SCHEMA, "get_time": EMPTY_SCHEMA,
         "write_file": {"type": "object", "required": ["path", "text"],
                        "properties": {"path": {"type": "string"},
                                       "text": {"type": "string"}}}}
pytestmark = pytest.mark.parametrize("provider", NEW_PROVIDERS)


def final_calls(provider: str, final: dict[str, Any]) -> list[tuple[str, Any]]:
    """(call id, arguments as the final message holds them), in message order."""
    message = final["message"]
    if provider == BEDROCK:
        return [(b["toolUse"]["toolUseId"], b["toolUse"]["input"]) for b in message["content"]
                if "toolUse" in b]
    return [(p["functionCall"]["id"], p["functionCall"]["args"]) for p in message["parts"]
            if "functionCall" in p]


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
        assert [e.topic for e in emits] == [Topic.COMMITTED, Topic.FINAL]
        [call] = committed(emits)
        assert (call["call_id"], call["name"], call["index"], call["arguments"]) == (
            "call_1", "read_file", 0, {"path": "/etc/hosts"})
        assert call["provider"] == provider
        [final] = finals(emits)
        assert final["status"] == "completed"
        assert final_calls(provider, final) == [("call_1", {"path": "/etc/hosts"})]

    def test_gemini_whole_call_commits_the_same(self, provider: str) -> None:
        """Gemini only: the same call sent whole (``args`` parsed, one part) commits exactly
        what the streamed one does."""
        if provider != GEMINI:
            return
        chunks = gemini_calls([("call_1", "read_file", '{"path": "/etc/hosts"}')],
                              streamed=False)
        emits = feed(Assembler(), run_envelopes("r1", GEMINI, tools_for(GEMINI, TOOLS), chunks))
        assert [c["arguments"] for c in committed(emits)] == [{"path": "/etc/hosts"}]


class TestTwoParallelTools:
    """Two calls in one message."""

    def events(self, provider: str) -> list[dict[str, Any]]:
        a = ("call_a", "read_file", '{"path": "/a"}')
        b = ("call_b", "write_file", '{"path": "/b", "text": "hello, world"}')
        if provider == BEDROCK:  # the blocks' deltas interleaved
            ba, bb = bedrock_tool_block(0, *a), bedrock_tool_block(1, *b)
            return [{"messageStart": {"role": "assistant"}}, ba[0], bb[0],
                    *(x for pair in zip(ba[1:], bb[1:], strict=False) for x in pair),
                    *bb[len(ba):], {"messageStop": {"stopReason": "tool_use"}}]
        return gemini_calls([a, b])

    def test_both_commit_in_index_order(self, provider: str) -> None:
        """Both calls commit with their own arguments, index 0 before index 1; the final
        message holds both, in order."""
        emits = feed(Assembler(), run_envelopes("r1", provider, tools_for(provider, TOOLS),
                                                self.events(provider)))
        check_outputs(emits)
        got = [(c["call_id"], c["index"], c["arguments"]) for c in committed(emits)]
        assert got == [("call_a", 0, {"path": "/a"}),
                       ("call_b", 1, {"path": "/b", "text": "hello, world"})]
        assert errors(emits) == []
        assert [c[0] for c in final_calls(provider, finals(emits)[0])] == ["call_a", "call_b"]


class TestNoArgumentTool:
    """A tool that takes no arguments: the provider sends ``{}`` or nothing at all."""

    @pytest.mark.parametrize("text", ["", "{}"], ids=["empty", "braces"])
    def test_commits_empty_object(self, provider: str, text: str) -> None:
        """Empty text (Bedrock ``input: ""``; Gemini no ``partialArgs``) and ``{}`` both
        commit ``{}`` (rule 3)."""
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
        fragments = [i for i, env in enumerate(envs) if _fragment(env)]
        assert len(fragments) >= 4
        cut = fragments[2] + 1
        asm = Assembler()
        assert feed(asm, envs[:cut]) == []
        at_cancel = feed(asm, [cancel("r1")])
        check_outputs(at_cancel)
        assert [(e["tool_call_id"], e["state"], e["reason"]) for e in errors(at_cancel)] == [
            ("call_1", "cancelled", "cancelled")]
        assert committed(at_cancel) == []
        assert finals(at_cancel)[0]["status"] == "cancelled"
        assert feed(asm, envs[cut:]) == []


def _fragment(env: dict[str, Any]) -> bool:
    """Whether an envelope carries a piece of a call's arguments."""
    event = env.get("event") or {}
    delta = (event.get("contentBlockDelta") or {}).get("delta") or {}
    if (delta.get("toolUse") or {}).get("input"):
        return True
    return any(part.get("functionCall", {}).get("partialArgs")
               for c in event.get("candidates", []) for part in c["content"]["parts"])


def test_builders_shapes(provider: str) -> None:
    """The builders make what the adapters' docstrings describe (a guard for the tests above):
    Bedrock's events are one-member objects; a Gemini streamed call opens with willContinue
    and ends with ``functionCall: {}``."""
    if provider == BEDROCK:
        events = bedrock_calls([("c", "read_file", "{}")])
        assert all(len(e) == 1 for e in events)
    else:
        chunks = gemini_call_chunks("c", "read_file", '{"path": "/a"}')
        assert chunks[0] == gemini_chunk([{"functionCall": {"name": "read_file", "id": "c",
                                                            "willContinue": True}}])
        assert chunks[-1] == gemini_chunk([{"functionCall": {}}])
