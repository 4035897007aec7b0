"""AWS Bedrock ConverseStream.

What the API sends (Bedrock API reference, ``ConverseStream``; the SDKs yield each event as a
one-member object named by its type, ``{"contentBlockDelta": {...}}``, which is what a gateway
publishes): an optional ``messageStart`` (``role``); for each content block, at its
``contentBlockIndex``, an optional ``contentBlockStart`` (``start.toolUse`` with ``toolUseId``,
``name`` and, for a tool Bedrock runs itself, ``type: "server_tool_use"``; ``start.toolResult``
for that tool's result), ``contentBlockDelta`` events (``delta.text``, ``delta.toolUse.input``
text fragments, ``delta.reasoningContent`` with ``text``, ``signature`` or ``redactedContent``,
``delta.toolResult[]``) and a ``contentBlockStop``; then ``messageStop`` with the
``stopReason`` and ``metadata`` (usage), in either order. Instead of any of them an exception
member may arrive (``internalServerException``, ``modelStreamErrorException``,
``throttlingException``, ``validationException``, ``serviceUnavailableException``).

How Latch reads it:

* a ``toolUse`` block without a ``type`` (or ``type: "tool_use"``) is a client call keyed by
  its content block index; its text is the concatenated ``input`` fragments (``""`` is no
  text: ``{}``, rule 3); ``contentBlockStop`` ends it (rule 4's early commit, when allowed);
* a ``server_tool_use`` block and a ``toolResult`` block are Bedrock's own: kept for the final
  message, never committed (rule 6);
* text blocks come without a ``contentBlockStart``, indexes may skip numbers (the final
  message keeps index order); empty text blocks are left out of the final message (Converse
  refuses a blank text block when the message is sent back);
* ``messageStop`` may precede ``metadata``, so the run ends at ``stream.end`` (``Adapter.end``),
  which then reads the stop reason: ``end_turn``, ``tool_use``, ``stop_sequence`` complete;
  ``max_tokens`` and ``model_context_window_exceeded`` truncate (rule 5);
  ``guardrail_intervened`` and ``content_filtered`` fail the open calls ``content_filtered``;
  ``malformed_tool_use`` and ``malformed_model_output`` fail them ``malformed_output``; a stop
  reason this version does not know fails them ``upstream_error``. A stream that ends without
  ``messageStop`` fails ``stream_error``;
* an exception member fails the open calls ``upstream_error`` at once, whatever else the
  event carries (an exception beside a delta ends the stream: the delta is not read);
* what breaks the protocol (``ops.ProtocolError``; docs/providers.md, "Protocol breaks"): a content
  block started twice, content after its block's stop or after ``messageStop``, a delta of
  another kind than its block, a second ``messageStart`` or ``messageStop``. From the break on
  nothing more is kept for the final message (no text of two messages is joined), each client
  ``toolUse`` still started opens under a late key (it fails at once: one outcome per id), and
  the run fails ``protocol_error`` at ``stream.end``.

The final message is a Converse ``Message``: ``{"role": "assistant", "content": [{"text"},
{"reasoningContent": {"reasoningText": {"text", "signature"}}} or {"reasoningContent":
{"redactedContent"}}, {"toolUse": {"toolUseId", "name", "input"}}, {"toolResult"}...]}``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any, ClassVar

from worker.core import ops as op
from worker.core import strictjson
from worker.core.model import Reason

COMPLETING_STOPS = frozenset({"end_turn", "tool_use", "stop_sequence"})
TRUNCATING_STOPS = frozenset({"max_tokens", "model_context_window_exceeded"})
FILTERED_STOPS = frozenset({"guardrail_intervened", "content_filtered"})
MALFORMED_STOPS = frozenset({"malformed_tool_use", "malformed_model_output"})


class _Block:
    """One content block: its kind (``text``, ``reasoning``, ``toolUse``, ``serverToolUse``,
    ``toolResult``, another start member's name, or ``pending`` until a delta says)."""

    __slots__ = ("body", "json", "key", "kind", "redacted", "results", "stopped", "text")

    def __init__(self, kind: str, body: dict[str, Any] | None = None,
                 key: str | None = None) -> None:
        self.kind = kind
        self.body: dict[str, Any] = body or {}
        #: The buffer key of a client call, else None.
        self.key = key
        self.text: list[str] = []
        #: ``input`` fragments of a server tool use (a client call's text is its buffer's).
        self.json: list[str] = []
        self.redacted: list[bytes] = []
        self.results: list[Any] = []
        self.stopped = False


class BedrockConverse(op.Adapter):
    """Adapter for ``bedrock.converse``."""

    completes_on_stream_end: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[int, _Block] = {}
        self._started = False
        self._stop: str | None = None

    def feed(self, event: dict[str, Any]) -> list[op.Op]:
        if len(event) != 1:  # an SDK event has one member: an exception is never read as
            for name in event:  # the delta (or start, stop) beside it
                if name.endswith("Exception"):
                    return [op.UpstreamError(f"provider exception: {_safe(name)}")]
        delta = event.get("contentBlockDelta")
        if delta is not None:  # first: nearly every event is one
            return self._delta(delta)
        start = event.get("contentBlockStart")
        if start is not None:
            return self._start(start)
        stop = event.get("contentBlockStop")
        if stop is not None:
            return self._block_stop(stop)
        if "messageStart" in event:
            if self.broken:
                return []
            if self._started or self._stop is not None or self._blocks:
                return [self.protocol_error("a second messageStart, or one after content")]
            self._started = True
            return []
        if "messageStop" in event:
            return self._message_stop(event["messageStop"])
        for name in event:
            if name.endswith("Exception"):
                return [op.UpstreamError(f"provider exception: {_safe(name)}")]
        return []  # metadata, and members this version does not know

    # The raw event's fields are typed Any, not what they should be (see anthropic_messages).
    def _start(self, event: Any) -> list[op.Op]:
        index, start = _index(event), event.get("start")
        if not isinstance(start, dict):
            raise ValueError("contentBlockStart without a start object")
        if self.broken or index in self._blocks or self._stop is not None:
            return self._late_start(index, start)
        tool = start.get("toolUse")
        if isinstance(tool, dict):
            kind = tool.get("type")
            body = {k: tool[k] for k in ("toolUseId", "name", "type")
                    if isinstance(tool.get(k), str)}
            self.kept += op.json_len(body) + op.STATE_BYTES  # the block: body and state
            if kind is not None and kind != "tool_use":  # server_tool_use: Bedrock runs it
                self._blocks[index] = _Block("serverToolUse", body)
                return []
            key = str(index)
            self._blocks[index] = _Block("toolUse", body, key)
            return [op.OpenCall(key, index, None, _text(tool.get("toolUseId")),
                                _text(tool.get("name")))]
        members = [k for k in start if isinstance(start[k], dict)]
        if not members:  # an empty start: a text or reasoning block, its deltas will say
            self._blocks[index] = _Block("pending")
            self.kept += op.STATE_BYTES
            return []
        name = "toolResult" if "toolResult" in members else members[0]
        self._blocks[index] = _Block(name, dict(op.bounded(start[name])))
        self.kept += op.json_len(self._blocks[index].body) + op.STATE_BYTES
        return []

    def _late_start(self, index: int, start: dict[str, Any]) -> list[op.Op]:
        """A block start that breaks the protocol (an index started twice, a block after
        ``messageStop``), or any start after a break: nothing of it is kept, and a client
        ``toolUse`` opens its own call under a late key, which fails at once."""
        ops: list[op.Op] = []
        if not self.broken:
            where = ("after messageStop" if self._stop is not None and index not in self._blocks
                     else "started twice")
            ops.append(self.protocol_error(f"content block {index} {where}"))
        tool = start.get("toolUse")
        if isinstance(tool, dict) and tool.get("type") in (None, "tool_use"):
            ops.append(op.OpenCall(self.late_key(), index, None, _text(tool.get("toolUseId")),
                                   _text(tool.get("name"))))
        return ops

    def _delta(self, event: Any) -> list[op.Op]:
        index, delta = _index(event), event.get("delta")
        if not isinstance(delta, dict):
            raise ValueError("contentBlockDelta without a delta object")
        if self.broken:  # after a break nothing is kept
            return []
        block = self._blocks.get(index)
        if block is None:  # text arrives without a contentBlockStart
            block = self._blocks[index] = _Block("pending")
            self.kept += op.STATE_BYTES
        if block.stopped or self._stop is not None:
            return [self.protocol_error(f"content for block {index} after its end")]
        text = delta.get("text")
        if text is not None:
            if type(text) is not str:
                raise ValueError("a text delta that is not a string")
            return self._text(block, "text", text)
        tool = delta.get("toolUse")
        if tool is not None:
            fragment = tool.get("input") if isinstance(tool, dict) else None
            if not isinstance(fragment, str):
                raise ValueError("a toolUse delta whose input is not a string")
            if block.key is not None:  # held (and counted) once, by the call
                return [op.AppendArgs(block.key, fragment)]
            if block.kind != "serverToolUse":
                return [self.protocol_error(f"tool input for block {index}, which is not a "
                                            "tool use")]
            block.json.append(fragment)
            self.kept += op.utf8_len(fragment)
            return []
        reasoning = delta.get("reasoningContent")
        if reasoning is not None:
            return self._reasoning(block, index, reasoning)
        results = delta.get("toolResult")
        if results is not None:
            if not isinstance(results, list):
                raise ValueError("a toolResult delta that is not an array")
            if block.kind == "pending":
                block.kind = "toolResult"
            if block.kind != "toolResult":
                return [self.protocol_error(f"a tool result for block {index}, which is not one")]
            block.results.extend(op.bounded(results))
            self.kept += op.json_len(results)
        return []  # citations, images: not kept in this version

    def _text(self, block: _Block, kind: str, text: str) -> list[op.Op]:
        if block.kind == "pending":
            block.kind = kind
        elif block.kind != kind:
            return [self.protocol_error(f"{kind} for a {block.kind} block")]
        block.text.append(text)
        self.kept += len(text) if text.isascii() else op.utf8_len(text)
        return []

    def _reasoning(self, block: _Block, index: int, reasoning: Any) -> list[op.Op]:
        if not isinstance(reasoning, dict):
            raise ValueError("a reasoningContent delta that is not an object")
        if "text" in reasoning:
            if not isinstance(reasoning["text"], str):
                raise ValueError("reasoning text that is not a string")
            return self._text(block, "reasoning", reasoning["text"])
        ops = self._text(block, "reasoning", "")
        if ops:
            return ops
        if isinstance(reasoning.get("signature"), str):
            if "signature" in block.body:  # replaced: the old one is no longer kept
                self.kept -= op.json_len(block.body["signature"])
            block.body["signature"] = reasoning["signature"]
            self.kept += op.json_len(block.body["signature"])
        elif "redactedContent" in reasoning:
            block.redacted.append(_bytes(reasoning["redactedContent"]))
            self.kept += len(block.redacted[-1])
        return []

    def _block_stop(self, event: Any) -> list[op.Op]:
        index = _index(event)
        block = self._blocks.get(index)
        if block is None or block.stopped or self.broken:  # a stop alone, or again, or after
            return []  # a break: it ends nothing new
        block.stopped = True
        return [op.CloseCall(block.key)] if block.key is not None else []

    def _message_stop(self, event: Any) -> list[op.Op]:
        reason = event.get("stopReason") if isinstance(event, dict) else None
        if not isinstance(reason, str):
            raise ValueError("messageStop without a stopReason string")
        if self.broken:
            return []
        if self._stop is not None:
            return [self.protocol_error("a second messageStop")]
        self._stop = reason
        return []

    def end(self) -> list[op.Op]:
        reason = self._stop
        if reason is None:
            return []  # the stream ended without messageStop: the run fails stream_error
        if reason in COMPLETING_STOPS:
            return [op.Complete()]
        if reason in TRUNCATING_STOPS:
            return [op.Truncated(), op.Complete()]
        if reason in FILTERED_STOPS:
            return [op.UpstreamError(f"stopReason {reason}: the provider stopped the message "
                                     "for its content", Reason.CONTENT_FILTERED)]
        if reason in MALFORMED_STOPS:
            return [op.UpstreamError(f"stopReason {reason}: the provider found the model's "
                                     "output malformed", Reason.MALFORMED_OUTPUT)]
        return [op.UpstreamError(f"stopReason {_safe(reason)} is not one this version knows")]

    def final(self, calls: Sequence[op.CallView]) -> op.FinalMessage:
        by_key = {c.key: c for c in calls}
        content = [part for _, block in sorted(self._blocks.items())
                   for part in _render(block, by_key)]
        return {"role": "assistant", "content": content}, None


def _render(block: _Block, calls: dict[str, op.CallView]) -> list[dict[str, Any]]:
    """The block as Converse content (none for an empty text block)."""
    kind = block.kind
    if kind in ("text", "pending"):
        text = "".join(block.text)
        return [{"text": text}] if text else []
    if kind == "reasoning":
        if block.redacted:
            blob = base64.b64encode(b"".join(block.redacted)).decode()
            return [{"reasoningContent": {"redactedContent": blob}}]
        body = {"text": "".join(block.text), **block.body}
        return [{"reasoningContent": {"reasoningText": body}}]
    if kind == "toolUse":
        call = calls.get(block.key or "")
        if call is not None and call.dropped:  # drop_with_protocol_repair: no toolUse block
            return []
        tool = dict(block.body)
        if call is not None:
            # A call that failed before it was parsed still shows the input the provider
            # sent, when its text is a strict JSON object.
            value = call.arguments if call.parsed else strictjson.parse(call.text or "")
            tool.update(toolUseId=call.tool_call_id, name=call.name,
                        input=value if isinstance(value, dict) else {})
        return [{"toolUse": tool}]
    if kind == "serverToolUse":
        return [{"toolUse": {**block.body, "input": _server_input(block.json)}}]
    if kind == "toolResult":
        return [{"toolResult": {**block.body, "content": _merged(block.results)}}]
    return [{kind: block.body}]


def _server_input(fragments: list[str]) -> Any:
    value = strictjson.parse("".join(fragments)) if fragments else {}
    return value if isinstance(value, dict) else {}


def _merged(results: list[Any]) -> list[Any]:
    """Tool result content with consecutive ``text`` pieces joined into one."""
    merged: list[Any] = []
    for item in results:
        if (isinstance(item, dict) and set(item) == {"text"} and isinstance(item["text"], str)
                and merged and set(merged[-1]) == {"text"}):
            merged[-1] = {"text": merged[-1]["text"] + item["text"]}
        else:
            merged.append(item)
    return merged


def _index(event: Any) -> int:
    index: Any = event.get("contentBlockIndex") if isinstance(event, dict) else None
    if not op.is_index(index):
        raise ValueError("an event without a contentBlockIndex")
    return int(index)


def _bytes(value: Any) -> bytes:
    """``redactedContent`` as a gateway publishes it: base64 text (JSON has no bytes)."""
    if not isinstance(value, str):
        raise ValueError("redactedContent that is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError("redactedContent that is not base64 text") from exc


def _text(value: Any) -> str | None:
    """A non-empty string, else None: an id or name of another type is no id or name."""
    return value if isinstance(value, str) and value else None


def _safe(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= 64 else "unknown"

