"""``worker.core.providers.bedrock_converse``: the Bedrock ConverseStream adapter's tool list,
its reasoning and server-tool blocks kept for the final message, and what happens when a
stream breaks its own protocol.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from builders import (
    BEDROCK,
    PATH_SCHEMA,
    bedrock_calls,
    bedrock_tool_block,
    check_outputs,
    committed,
    dlq,
    errors,
    feed,
    finals,
    run_envelopes,
    tools_for,
)

from worker.core import Assembler
from worker.core.tools import client_tools


def test_bedrock_tools_skip_system_tools() -> None:
    """toolSpec entries register with inputSchema.json; systemTool and cachePoint do not."""
    tools = [{"toolSpec": {"name": "a", "inputSchema": {"json": PATH_SCHEMA}}},
             {"toolSpec": {"name": "b"}}, {"systemTool": {"name": "nova_grounding"}},
             {"cachePoint": {"type": "default"}}]
    assert client_tools(BEDROCK, tools) == {"a": PATH_SCHEMA, "b": {}}


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
