"""Anthropic Messages streaming.

What the API sends (docs.anthropic.com, "Streaming Messages"): ``message_start`` with an
empty ``content``; then for each content block a ``content_block_start`` (with its
``index`` and the block's skeleton), ``content_block_delta`` events (``text_delta``,
``thinking_delta``, ``signature_delta``, ``input_json_delta`` with ``partial_json``,
``citations_delta``) and a ``content_block_stop``; then ``message_delta`` with the
``stop_reason`` and ``message_stop``. ``ping`` may appear anywhere; an ``error`` event
(``overloaded_error`` and the like) may replace the rest of the stream.

How Latch reads it:

* a ``tool_use`` block is a client call keyed by its content block index; its text is the
  concatenated ``partial_json``; a block whose ``input`` is already complete at the start
  and that gets no deltas uses that input;
* ``server_tool_use``, ``mcp_tool_use`` and the ``*_tool_result`` blocks run at Anthropic:
  they are kept for the final message and never committed (contract rule 6);
* ``content_block_stop`` ends a call's text (block-level early commit, rule 4, happens only
  for allowed tools); ``message_stop`` completes the message;
* ``stop_reason`` decides the message's calls (:func:`message_stop`): ``end_turn``,
  ``tool_use``, ``stop_sequence`` let them commit at ``message_stop``; ``max_tokens`` and
  ``model_context_window_exceeded`` are truncation (rule 5); ``refusal`` (Anthropic's
  classifiers stopped the message) fails them ``content_filtered``; ``pause_turn`` fails them
  ``turn_paused`` and leaves them out of the final message, which is sent back as it is (a
  ``server_tool_use`` block without its result included) for the turn to go on; a reason
  this version does not know fails them ``upstream_error``. A call committed early (its
  block's stop, rule 4) before such a stop keeps its outcome. An ``error`` event fails the
  open calls ``upstream_error``;
* a ``message_start`` repeated with the same id, and a ``content_block_start`` repeated for
  a block still open with the same type, id and name (both seen from some proxies), are
  ignored.

What breaks the protocol (``ops.ProtocolError``; docs/providers.md, "Protocol breaks"): a second
``message_start`` with another id (a spliced stream); any other ``content_block_start`` for
an index already started; a delta for an index never started or already stopped; a
``content_block_stop`` for an index never started or already stopped. From then on nothing
more is kept for the final message (the two messages' text is never joined), and each
``tool_use`` block still started opens a call under its own late key, which fails at once:
every call id the stream carried gets one outcome.

An ``index`` is an integer >= 0 at every event that carries one (start, delta, stop): ``true``
or ``1.0`` is no block 1, and the event goes to the DLQ (``invalid_envelope``), as
``worker.core._peek`` leaves it to this path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from worker.core import keys, strictjson
from worker.core import ops as op
from worker.core.model import Reason, RunStatus

COMPLETING_STOPS = frozenset({"end_turn", "tool_use", "stop_sequence"})
TRUNCATING_STOPS = frozenset({"max_tokens", "model_context_window_exceeded"})
_TEXT_DELTAS = {"text_delta": ("text", "text"), "thinking_delta": ("thinking", "thinking")}


@dataclass(slots=True)
class _Block:
    body: dict[str, Any]
    #: The buffer key of a client call (a ``tool_use`` block), else None.
    key: str | None = None
    text: list[str] = field(default_factory=list)
    #: A client call's ``input`` from its start, when a non-empty object: its JSON text, or
    #: why it has no one meaning (``Adapter.arguments_text``); used when no delta streams.
    start_args: str | strictjson.ParseError | None = None
    #: ``partial_json`` of a block that is not a client call (a call's text is its buffer's).
    json: list[str] = field(default_factory=list)
    streamed: bool = False
    stopped: bool = False


class AnthropicMessages(op.Adapter):
    """Adapter for ``anthropic.messages``."""

    peeked: ClassVar[bool] = True  # (fast)
    completes_on_stream_end: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self._message: dict[str, Any] | None = None
        #: The first ``message_start``'s id ("" when it had none).
        self._message_id = ""
        self._blocks: dict[int, _Block] = {}
        #: Indexes whose ``content_block_start`` was refused (the DLQ): their deltas and stop
        #: are refused too, never taken for a protocol break.
        self._refused: set[int] = set()
        self._stop_reason: str | None = None

    def feed(self, event: dict[str, Any]) -> list[op.Op]:
        kind = _str_or_empty(event.get(keys.TYPE))  # (orjson's key objects: worker/core/keys.py)
        if kind == "content_block_delta":  # first: nearly every event is one
            index: Any = event.get(keys.INDEX)
            if type(index) is not int or index < 0:  # op.is_index, inline: true and 1.0 are
                raise ValueError("content_block_delta without an index")  # no block 1
            block = self._blocks.get(index)
            if block is None or block.stopped or self.broken:
                return self._misplaced("content_block_delta", block, index)
            delta = event[keys.DELTA]
            if not isinstance(delta, dict):  # checked, and then read as a dict when compiled
                raise ValueError("content_block_delta without a delta object")
            if _str_or_empty(delta.get(keys.TYPE)) == "text_delta":  # and nearly every delta this
                text = delta[keys.TEXT]
                if type(text) is not str:  # the final message joins it: refuse it here
                    raise ValueError("text_delta is not a string")
                return self._keep_text(block, text)
            return self._delta(block, delta)
        if kind == "message_start":
            return self._message_start(event.get("message") or {})
        if kind == "content_block_start":
            return self._start(event["index"], event["content_block"])
        if kind == "content_block_stop":
            index = event.get("index")
            if not op.is_index(index):  # read as content_block_start and the deltas read it
                raise ValueError("content_block_stop without an index")
            block = self._blocks.get(index)
            if block is None or block.stopped or self.broken:
                return self._misplaced("content_block_stop", block, index)
            return self._stop(index, block)
        if self.broken and kind == "message_delta":  # the spliced message's: not kept
            return []
        if kind == "message_delta":
            stop = (event.get("delta") or {}).get("stop_reason")
            if isinstance(stop, str):
                self._stop_reason = stop
                stopped = message_stop(stop)
                if stopped is not None:
                    return [stopped]
            return []
        if kind == "message_stop":
            return [op.Complete()]
        if kind == "error":
            error = event.get("error") or {}
            return [op.UpstreamError(f"provider error event: {_safe(error.get('type'))}")]
        return []  # ping, and event types this version does not know

    def fast(self, kind: int, index: int, text: str) -> list[op.Op] | None:
        """``feed`` of a ``text_delta`` or an ``input_json_delta`` of a client call's block."""
        block = self._blocks.get(index)
        if block is None or block.stopped or self.broken:
            return None  # feed says what is misplaced
        if kind == op.ANTHROPIC_TEXT:
            return self._keep_text(block, text)
        if kind == op.ANTHROPIC_JSON and block.key is not None:
            block.streamed = True
            return [op.AppendArgs(block.key, text)]
        return None

    def _keep_text(self, block: _Block, text: str) -> list[op.Op]:
        """Keep a ``text_delta``'s text for its block: no op."""
        block.text.append(text)
        self.kept += len(text) if text.isascii() else op.utf8_len(text)
        return op.NO_OPS

    # The raw event's fields are typed Any, not what they should be: under mypyc a parameter
    # typed int turns ``true`` into 1, and one typed dict raises TypeError at the call, where
    # the interpreter reads the value as it is (checked below, or failing as it would).
    def _message_start(self, message: Any) -> list[op.Op]:
        if not isinstance(message, dict):
            raise ValueError("message_start without a message object")
        message_id = message.get("id")
        message_id = message_id if isinstance(message_id, str) else ""
        if self._message is None:
            self._message = {k: message[k] for k in ("id", "model")
                             if isinstance(message.get(k), str)}
            self.kept += op.json_len(self._message)
            self._message_id = message_id
            return []
        if self.broken or message_id == self._message_id:
            return []  # a proxy's repeat: nothing to undo
        return [self.protocol_error("a second message_start with another id: the stream was "
                                    "spliced")]

    def _misplaced(self, kind: str, block: _Block | None, index: Any) -> list[op.Op]:
        """A delta or stop for a block that was never started or is already stopped."""
        if self.broken:  # after a break nothing is kept or checked
            return []
        if block is None and index in self._refused:
            raise ValueError(f"{kind} for a block whose start was refused")
        where = "a block never started" if block is None else "a block already stopped"
        return [self.protocol_error(f"{kind} for {where}")]

    def _start(self, index: Any, body: Any) -> list[op.Op]:
        if not op.is_index(index):
            raise ValueError("content_block_start without index or content_block")
        try:
            return self._start_block(index, body)
        except (ValueError, op.EventRefused):
            if not self.broken and index not in self._blocks:
                self._refused.add(index)
            raise

    def _start_block(self, index: Any, body: Any) -> list[op.Op]:
        if not isinstance(body, dict):
            raise ValueError("content_block_start without index or content_block")
        kind = body.get("type")
        if not self.broken:
            body = op.bounded(body)  # refused (the DLQ) before anything else is decided
        if self.broken or index in self._blocks:
            if not self.broken and _repeats(self._blocks[index], body):
                return []  # a proxy's repeat of the start of a block still open
            ops: list[op.Op] = [] if self.broken else [
                self.protocol_error("content_block_start for an index already started")]
            if kind == "tool_use":  # its own call, which fails at once: one outcome per id
                ops.append(op.OpenCall(self.late_key(), index, None, _text(body.get("id")),
                                       _text(body.get("name"))))
            return ops
        if kind in ("text", "thinking") and not isinstance(body.get(kind, ""), str):
            raise ValueError(f"a {kind} block whose {kind} is not a string")
        self.kept += op.json_len(body) + op.STATE_BYTES  # the block: its body and its state
        if kind != "tool_use":
            self._blocks[index] = _Block(_own(body))
            return []
        block = self._blocks[index] = _Block(_own(body), str(index))
        start_input = body.get("input")
        if isinstance(start_input, dict) and start_input:  # read now, from this event's record
            block.start_args = self.arguments_text(start_input)
        return [op.OpenCall(str(index), index, None, _text(body.get("id")),
                            _text(body.get("name")))]

    def _delta(self, block: _Block, delta: dict[str, Any]) -> list[op.Op]:
        kind = delta.get(keys.TYPE)
        if kind in _TEXT_DELTAS:
            text = delta[_TEXT_DELTAS[kind][1]]
            if not isinstance(text, str):  # the final message joins it: refuse it here
                raise ValueError(f"{kind} is not a string")
            block.text.append(text)
            self.kept += op.utf8_len(text)
        elif kind == "signature_delta":
            if "signature" in block.body:  # replaced: the old one is no longer kept
                self.kept -= op.json_len(block.body["signature"])
            block.body["signature"] = op.bounded(delta["signature"])
            self.kept += op.json_len(block.body["signature"])
        elif kind == "citations_delta":
            citation = op.bounded(delta["citation"])
            block.body.setdefault("citations", []).append(citation)
            self.kept += op.json_len(citation)
        elif kind == "input_json_delta":
            fragment = delta[keys.PARTIAL_JSON]
            if not isinstance(fragment, str):
                raise ValueError("partial_json is not a string")
            block.streamed = True
            if block.key is not None:  # held (and counted) once, by the call
                return [op.AppendArgs(block.key, fragment)]
            block.json.append(fragment)
            self.kept += op.utf8_len(fragment)
        return []

    def _stop(self, index: Any, block: _Block) -> list[op.Op]:
        block.stopped = True
        if block.body.get("type") != "tool_use":
            return []
        start_args = block.start_args
        if not block.streamed and start_args is not None:
            if isinstance(start_args, strictjson.ParseError):
                return [op.RefuseArgs(str(index), start_args.message), op.CloseCall(str(index))]
            return [op.SetArgs(str(index), start_args), op.CloseCall(str(index))]
        return [op.CloseCall(str(index))]

    def final(self, calls: Sequence[op.CallView]) -> op.FinalMessage:
        by_key = {c.key: c for c in calls}
        # A dropped call (drop_with_protocol_repair) has no tool_use block.
        content = [self._render(i, b, by_key.get(str(i))) for i, b in sorted(self._blocks.items())
                   if not _dropped(by_key.get(str(i)))]
        message: dict[str, Any] = {**(self._message or {}), "role": "assistant",
                                   "content": content, "stop_reason": self._stop_reason}
        return message, None

    @staticmethod
    def _render(index: int, block: _Block, call: op.CallView | None) -> dict[str, Any]:
        body = dict(block.body)
        kind = body.get("type")
        if kind in ("text", "thinking"):
            body[kind] = body.get(kind, "") + "".join(block.text)
        if call is not None:
            body["id"] = call.tool_call_id
            # A call that failed before it was parsed (unknown tool, truncated...) still shows
            # the input the provider sent, when its text is a strict JSON object.
            value = call.arguments if call.parsed else strictjson.parse(call.text or "")
            body["input"] = value if isinstance(value, dict) else {}
        elif block.json:
            try:
                value = orjson.loads("".join(block.json))
            except orjson.JSONDecodeError:
                value = {}
            # Nested deeper than Latch keeps (strictjson.MAX_DEPTH): the final message could
            # not be written back.
            body["input"] = {} if strictjson.nested_deeper(value) else value
        return body


def message_stop(reason: str) -> op.Stopped | None:
    """What ``message_delta``'s ``stop_reason`` does to the message's calls (docs/contract.md,
    "Stop and incomplete reasons"): None, they may commit; else the stop that fails each call
    not yet decided."""
    if reason in COMPLETING_STOPS:
        return None
    if reason in TRUNCATING_STOPS:
        return op.Truncated()
    if reason == "refusal":
        return op.content_stop(None, "stop_reason refusal")
    if reason == "pause_turn":  # sent back as it is to go on: its calls come again then
        return op.Stopped(None, Reason.TURN_PAUSED, "stop_reason pause_turn: the provider "
                          "paused the turn, which goes on when the message is sent back; the "
                          "model makes the call again then", RunStatus.COMPLETED)
    return op.Stopped(None, Reason.UPSTREAM_ERROR,
                      f"stop_reason {_safe(reason)} is not one this version knows")


def _dropped(call: op.CallView | None) -> bool:
    return call is not None and call.dropped


def _repeats(block: _Block, body: dict[str, Any]) -> bool:
    """Whether ``body`` restarts ``block`` as it started: still open, same type, id and name."""
    return not block.stopped and all(body.get(k) == block.body.get(k)
                                     for k in ("type", "id", "name"))


def _own(body: dict[str, Any]) -> dict[str, Any]:
    """A copy of a block's body that the adapter may change where it does: its top-level keys
    (``signature``) and its ``citations`` list. The rest is the event's own, never changed."""
    body = dict(body)
    if isinstance(body.get("citations"), list):
        body["citations"] = list(body["citations"])
    return body


def _str_or_empty(value: Any) -> str:
    """A type field: the string, else "" (no event or delta type is empty)."""
    return value if isinstance(value, str) else ""


def _text(value: Any) -> str | None:
    """A non-empty string, else None: an id or name of another type is no id or name."""
    return value if isinstance(value, str) and value else None


def _safe(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= 64 else "unknown"
