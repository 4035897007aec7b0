"""OpenAI Responses API streaming.

What the API sends (platform.openai.com, "Responses: streaming events"):
``response.created`` and ``response.in_progress``; for each output item a
``response.output_item.added`` at its ``output_index``, item events in between, and a
``response.output_item.done`` with the finished item; then one of ``response.completed``,
``response.incomplete`` (``incomplete_details.reason``, e.g. ``max_output_tokens``) or
``response.failed``; an ``error`` event may end the stream instead.

A client tool call is an item of type ``function_call``: ``id`` is the *item* id
(``fc_...``), ``call_id`` is the id the tool result must pair with, and is the one a
committed call carries (contract rule 2). Its text streams as
``response.function_call_arguments.delta`` and is restated whole by
``response.function_call_arguments.done`` and by the finished item; the restated text is
the provider's own and replaces the concatenated deltas, so that the validator and the
runner see exactly what the provider said.

Calls are keyed by ``output_index``, never by item id: gateways have been seen rotating item
ids between the events of one item. ``response.output_item.done`` ends a call's text
(block-level early commit for allowed tools, rule 4); ``response.completed`` completes the
message; ``response.incomplete`` is truncation (rule 5). Built-in tool items
(``web_search_call`` and friends) and the ``multi_tool_use.parallel`` wrapper are not
unwrapped: the first are server-side (rule 6), the second is a call to a tool named
``parallel`` that the run did not register, and fails ``unknown_tool``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from worker.core import ops as op

_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_RESPONSE_EVENTS = frozenset({"response.created", "response.in_progress", *_TERMINAL})


class OpenAIResponses(op.Adapter):
    """Adapter for ``openai.responses``."""

    completes_on_stream_end: ClassVar[bool] = False

    def __init__(self) -> None:
        self._items: dict[int, dict[str, Any]] = {}
        self._index_of: dict[str, int] = {}
        self._text: dict[int, list[str]] = {}
        self._response: dict[str, Any] = {}

    def feed(self, event: dict[str, Any]) -> list[op.Op]:
        kind = event.get("type")
        if kind == "response.output_text.delta":  # the deltas first: nearly every event
            index = event.get("output_index")
            if type(index) is not int:
                index = self._index_of[event["item_id"]]
            delta = event["delta"]
            if type(delta) is not str:
                raise ValueError("expected a string")
            text = self._text.get(index)
            if text is None:  # not setdefault: that would build a list for every delta
                text = self._text[index] = []
            text.append(delta)
            return []
        if kind == "response.function_call_arguments.delta":
            return [op.AppendArgs(self._key(event), _str(event["delta"]))]
        if kind in _RESPONSE_EVENTS:
            return self._response_event(kind, event.get("response") or {})
        if kind == "response.output_item.added":
            return self._added(event["output_index"], event["item"])
        if kind == "response.function_call_arguments.done":
            return [op.SetArgs(self._key(event), _str(event["arguments"]))]
        if kind == "response.output_item.done":
            return self._done(event["output_index"], event["item"])
        if kind == "error":
            return [op.UpstreamError(f"provider error event: {_safe(event.get('code'))}")]
        return []

    # The raw event's fields are typed Any, not what they should be: under mypyc a parameter
    # or return typed int turns ``true`` into 1, and one typed dict raises TypeError at the
    # call, where the interpreter reads the value as it is (checked below, or failing as is).
    def _response_event(self, kind: str, response: Any) -> list[op.Op]:
        self._response = {k: response[k] for k in ("id", "model", "status")
                          if isinstance(response.get(k), str)}
        if kind == "response.completed":
            self._adopt(response.get("output"))
            return [op.Complete()]
        if kind == "response.incomplete":
            self._adopt(response.get("output"))
            return [op.Truncated(), op.Complete()]
        if kind == "response.failed":
            error = response.get("error") or {}
            return [op.UpstreamError(f"response.failed: {_safe(error.get('code'))}")]
        return []

    def _adopt(self, output: Any) -> None:
        """Take the terminal event's ``output`` as the items' final form, where it has one."""
        if isinstance(output, list):
            for position, item in enumerate(output):
                if isinstance(item, dict):
                    self._items[position] = op.bounded(item)

    def _added(self, index: Any, item: Any) -> list[op.Op]:
        if not op.is_index(index) or not isinstance(item, dict):
            raise ValueError("output_item.added without output_index or item")
        self._items[index] = _kept(item)
        if isinstance(item.get("id"), str):
            self._index_of[item["id"]] = index
        if item.get("type") != "function_call":
            return []
        ops: list[op.Op] = [op.OpenCall(str(index), index, None, _text(item.get("call_id")),
                                        _text(item.get("name")))]
        if isinstance(item.get("arguments"), str) and item["arguments"]:
            ops.append(op.SetArgs(str(index), item["arguments"]))
        return ops

    def _done(self, index: Any, item: Any) -> list[op.Op]:
        if not op.is_index(index) or not isinstance(item, dict):
            raise ValueError("output_item.done without output_index or item")
        self._items[index] = _kept(item)
        if item.get("type") != "function_call":
            return []
        key = str(index)
        ops: list[op.Op] = [op.OpenCall(key, index, None, _text(item.get("call_id")),
                                        _text(item.get("name")))]
        if isinstance(item.get("arguments"), str):
            ops.append(op.SetArgs(key, item["arguments"]))
        ops.append(op.CloseCall(key))
        return ops

    def _index(self, event: dict[str, Any]) -> Any:  # an int, bool included
        index = event.get("output_index")
        if type(index) is int:  # an output index, not a bool
            return index
        return self._index_of[event["item_id"]]

    def _key(self, event: dict[str, Any]) -> str:
        return str(self._index(event))

    def final(self, calls: Sequence[op.CallView]) -> op.FinalMessage:
        by_key = {c.key: c for c in calls}
        output = []
        for index, item in sorted(self._items.items()):
            item = dict(item)  # a key or two is set below; the rest is the event's own
            call = by_key.get(str(index))
            if call is not None:
                item["arguments"] = call.text or ""
                item["call_id"] = call.tool_call_id
            elif item.get("type") == "message" and index in self._text and not item.get("content"):
                item["content"] = [{"type": "output_text", "text": "".join(self._text[index]),
                                    "annotations": []}]
            output.append(item)
        return {**self._response, "output": output}, None


def _kept(item: dict[str, Any]) -> dict[str, Any]:
    """What is kept of an output item for the final message. A function call's arguments are
    its call's text, held (and counted against the budgets) once, by the assembler: the final
    message writes them back, so what is kept has the key and not the text."""
    if item.get("type") == "function_call" and "arguments" in item:
        item = {**item, "arguments": ""}
    return op.bounded(item)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _text(value: Any) -> str | None:
    """A non-empty string, else None: an id or name of another type is no id or name."""
    return value if isinstance(value, str) and value else None


def _safe(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= 64 else "unknown"
