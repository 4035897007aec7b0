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
message; ``response.incomplete`` fails the calls not yet decided by its
``incomplete_details.reason`` (:func:`incomplete_stop`): ``content_filter``,
``content_filtered``; ``max_output_tokens`` (or any other), ``truncated`` (rule 5). A
``refusal`` content part (``response.refusal.delta``/``.done``, or in a finished message item)
fails them ``content_filtered``: the model refused, and nothing of the response runs.

The items a client answers are calls too (``docs/decisions/0004-responses-client-items.md``):
``custom_tool_call`` (its ``input`` streams as ``response.custom_tool_call_input.delta`` and is
restated by ``.done`` and the finished item; committed as text), and ``computer_call``,
``local_shell_call`` and ``mcp_approval_request``, whose text is their finished item's own
fields as a JSON object; ``shell_call`` and ``apply_patch_call`` (issue 33), whose text is
``{"action"}`` or ``{"operation"}`` of their finished item (their
``response.shell_call_command.*`` events are not read: the finished item restates the
commands). A ``shell_call`` whose ``environment`` is a container (``container_reference``)
ran at OpenAI, in its hosted shell: no call (``tools.hosted_shell``). Every other item
(``web_search_call``, ``file_search_call``, ``code_interpreter_call``,
``image_generation_call``, ``mcp_call``, ``mcp_list_tools``, ``shell_call_output``,
``reasoning``, messages) runs at OpenAI or is content: kept for the final message, never a
call (rule 6). A function call named ``parallel`` or ``multi_tool_use.parallel`` is the
model's parallel wrapper, which the assembler unwraps when the run did not register that name.

The streamed items are the source of truth (``docs/decisions/0005-responses-streamed-items.md``):
the final message is made of them, and the terminal event's ``output`` adds nothing to it. It
is read only to check the calls: a call it lists that was never streamed, or with another
name or text than the streamed one, is a protocol break; an item it leaves out is not.

What breaks the protocol (``ops.ProtocolError``): a ``response.created`` after output items
(another response spliced in; not a change of response id, which gateways have been seen
rotating between the events of one response); an ``output_item.added`` at an
``output_index`` already added; an argument or input event, or an ``output_item.done``, for an
item never added (or of another type than the one added).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import orjson

from worker.core import keys, strictjson
from worker.core import ops as op
from worker.core.identity import RESPONSES_ITEM_NAMES
from worker.core.tools import hosted_shell, responses_tool_key

_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_RESPONSE_EVENTS = frozenset({"response.created", "response.in_progress", *_TERMINAL})
#: The model's refusal, streamed (a ``refusal`` content part of a message item).
_REFUSALS = frozenset({"response.refusal.delta", "response.refusal.done"})
#: The argument and input events, each with the one item type it is for (another type at its
#: output index is a protocol break).
_TEXT_DELTAS = {"response.function_call_arguments.delta": "function_call",
                "response.custom_tool_call_input.delta": "custom_tool_call"}
_TEXT_DONE = {"response.function_call_arguments.done": "arguments",
              "response.custom_tool_call_input.done": "input"}
_DONE_ITEMS = {"response.function_call_arguments.done": "function_call",
               "response.custom_tool_call_input.done": "custom_tool_call"}
#: The items that are client calls: their kind, and the field that holds a call's whole text
#: (None: the text is the item's own fields, see ``_item_text``).
_CALL_ITEMS: dict[str, tuple[str, str | None]] = {
    "function_call": (op.FUNCTION, "arguments"), "custom_tool_call": (op.CUSTOM, "input"),
    "computer_call": ("computer_call", None), "local_shell_call": ("local_shell_call", None),
    "mcp_approval_request": ("mcp_approval_request", None),
    "shell_call": ("shell_call", None), "apply_patch_call": ("apply_patch_call", None)}
#: What is not a client-answered item's text (the rest of its fields is).
_NOT_TEXT = frozenset({"type", "id", "call_id", "status"})
#: The client-answered items whose text is only these fields (not ``environment``,
#: ``caller`` or ``created_by``): what the runner needs to act.
_TEXT_FIELDS = {"shell_call": ("action",), "apply_patch_call": ("operation",)}
#: The type a hosted ``shell_call`` is added as: no call's (``_type``).
_HOSTED_SHELL = "shell_call (hosted)"


class OpenAIResponses(op.Adapter):
    """Adapter for ``openai.responses``."""

    peeked: ClassVar[bool] = True  # (fast)
    completes_on_stream_end: ClassVar[bool] = False
    wrapper_names: ClassVar[frozenset[str]] = frozenset({"parallel", "multi_tool_use.parallel"})

    def __init__(self) -> None:
        super().__init__()
        self._items: dict[int, dict[str, Any]] = {}
        #: The type each output index was added with.
        self._types: dict[int, Any] = {}
        self._index_of: dict[str, int] = {}
        self._text: dict[int, list[str]] = {}
        self._response: dict[str, Any] = {}
        #: A client call's id -> the output indexes of the calls streamed with it, in order
        #: (what the terminal event is checked with).
        self._call_at: dict[str, list[int]] = {}

    def feed(self, event: dict[str, Any]) -> list[op.Op]:
        kind = event.get(keys.TYPE)  # (orjson's key objects: worker/core/keys.py)
        if kind == "response.output_text.delta":  # the deltas first: nearly every event
            index = event.get(keys.OUTPUT_INDEX)
            if type(index) is not int or index < 0:  # absent: by item id; else refused
                index = self._item_index(event)
            delta = event[keys.DELTA]
            if type(delta) is not str:
                raise ValueError("expected a string")
            self._keep_text(index, delta)
            return op.NO_OPS
        if kind in _TEXT_DELTAS:
            fragment = _str(event[keys.DELTA])
            index = self._open_index(event, _TEXT_DELTAS[kind])
            if index is None:
                return self._misplaced(kind)
            return [op.AppendArgs(str(index), fragment)]
        if kind in _RESPONSE_EVENTS:
            return self._response_event(kind, event.get("response") or {})
        if kind == "response.output_item.added":
            return self._added(event["output_index"], event["item"])
        if kind in _TEXT_DONE:
            whole = _str(event[_TEXT_DONE[kind]])
            index = self._open_index(event, _DONE_ITEMS[kind])
            if index is None:
                return self._misplaced(kind)
            return [op.SetArgs(str(index), whole)]
        if kind == "response.output_item.done":
            return self._done(event["output_index"], event["item"])
        if kind == "error":
            return [op.UpstreamError(f"provider error event: {_safe(event.get('code'))}")]
        if kind in _REFUSALS:  # the model refused: none of the response's calls runs
            return [op.content_stop(None, "a refusal")]
        return []

    def fast(self, kind: int, index: int, text: str) -> list[op.Op] | None:
        """``feed`` of an ``output_text.delta``, or of an argument (input) delta of a
        ``function_call`` (``custom_tool_call``) item that was added (both by
        ``output_index``)."""
        if kind == op.RESPONSES_TEXT:
            self._keep_text(index, text)
            return op.NO_OPS
        if self.broken:
            return None
        added = self._types.get(index)
        if (kind == op.RESPONSES_ARGS and added == "function_call") or (
                kind == op.RESPONSES_INPUT and added == "custom_tool_call"):
            return [op.AppendArgs(str(index), text)]
        return None

    def _keep_text(self, index: Any, delta: str) -> None:
        """Keep an ``output_text.delta``'s text for its output item."""
        text = self._text.get(index)
        if text is None:  # not setdefault: that would build a list for every delta
            text = self._text[index] = []
            self.kept += op.STATE_BYTES  # an item's text: counted even while empty
        text.append(delta)
        self.kept += len(delta) if delta.isascii() else op.utf8_len(delta)

    # The raw event's fields are typed Any, not what they should be: under mypyc a parameter
    # or return typed int turns ``true`` into 1, and one typed dict raises TypeError at the
    # call, where the interpreter reads the value as it is (checked below, or failing as is).
    def _response_event(self, kind: str, response: Any) -> list[op.Op]:
        if not isinstance(response, dict):
            raise ValueError("a response event without a response object")
        if kind == "response.created" and self._types and not self.broken:
            # (not the id: gateways have been seen rotating it between the response's events)
            return [self.protocol_error("response.created after output items: another "
                                        "response was spliced into the stream")]
        if self.broken:  # perhaps another response's: nothing of it is kept or checked
            return self._terminal(kind, response)
        self.kept -= op.json_len(self._response) if self._response else 0
        self._response = {k: response[k] for k in ("id", "model", "status")
                          if isinstance(response.get(k), str)}
        self.kept += op.json_len(self._response)
        if kind == "response.completed":
            return [*self._check_output(response.get("output")), op.Complete()]
        return self._terminal(kind, response)

    @staticmethod
    def _terminal(kind: str, response: dict[str, Any]) -> list[op.Op]:
        if kind == "response.completed":
            return [op.Complete()]
        if kind == "response.incomplete":
            return [incomplete_stop(response.get("incomplete_details")), op.Complete()]
        if kind == "response.failed":
            error = response.get("error") or {}
            return [op.UpstreamError(f"response.failed: {_safe(error.get('code'))}")]
        return []

    def _check_output(self, output: Any) -> list[op.Op]:
        """Check ``response.completed``'s ``output`` against the streamed calls (module
        docstring): each call it lists must have been streamed with the same name and text."""
        ops: list[op.Op] = []
        for item in output if isinstance(output, list) else ():
            if not isinstance(item, dict) or _type(item) not in _CALL_ITEMS:
                continue
            call_id = _call_id(item)
            if call_id is None:  # nothing to pair it by, but an item id the stream named
                item_id = item.get("id")
                index = self._index_of.get(item_id) if isinstance(item_id, str) else None
                if index is None:
                    continue
            else:
                indexes = self._call_at.get(call_id)
                index = indexes.pop(0) if indexes else None
            streamed = self._items.get(index) if index is not None else None
            if streamed is None or any(item.get(k) != streamed.get(k) for k in ("type", "name")):
                if not self.broken:
                    ops.append(self.protocol_error(
                        "response.completed lists a call that was not streamed as it says"))
                kind, _ = _CALL_ITEMS[item["type"]]
                ops.append(op.OpenCall(self.late_key(), len(self._items), None, call_id,
                                       _text(item.get("name")), kind))
                continue
            ops.append(op.Restated(str(index), _item_text(item)))
        return ops

    def _misplaced(self, kind: str) -> list[op.Op]:
        """An argument or input event for an item never added, or added with another type."""
        if self.broken:
            return []
        return [self.protocol_error(f"{kind} for an item never added, or of another type")]

    def _added(self, index: Any, item: Any) -> list[op.Op]:
        if not op.is_index(index) or not isinstance(item, dict):
            raise ValueError("output_item.added without output_index or item")
        kept = _kept(item)
        kind = _type(item)
        if self.broken or index in self._types:
            ops: list[op.Op] = [] if self.broken else [
                self.protocol_error("output_item.added at an output_index already added")]
            if kind in _CALL_ITEMS:  # its own call, which fails at once: one outcome per id
                ops.append(self._open(self.late_key(), index, item))
            return ops
        self._items[index], self._types[index] = kept, kind
        self.kept += op.json_len(kept) + op.STATE_BYTES  # the item: its value and its state
        if isinstance(item.get("id"), str):
            self._index_of[item["id"]] = index
        if kind not in _CALL_ITEMS:
            return []
        ops = [self._open(str(index), index, item)]
        field = _CALL_ITEMS[kind][1]
        if field is not None and isinstance(item.get(field), str) and item[field]:
            ops.append(op.SetArgs(str(index), item[field]))
        return ops

    def _done(self, index: Any, item: Any) -> list[op.Op]:
        if not op.is_index(index) or not isinstance(item, dict):
            raise ValueError("output_item.done without output_index or item")
        kept = _kept(item)
        kind = _type(item)
        if self.broken or self._types.get(index, self) != kind:
            ops: list[op.Op] = [] if self.broken else [self.protocol_error(
                "output_item.done for an item never added" if index not in self._types
                else "output_item.done of another type than the item added")]
            if kind in _CALL_ITEMS and (self.broken or index not in self._types):
                ops.append(self._open(self.late_key(), index, item))
            return ops
        self.kept += op.json_len(kept) - op.json_len(self._items[index])  # replaces the added
        self._items[index] = kept
        if kind not in _CALL_ITEMS:
            return _refusal_parts(item)
        key = str(index)
        ops = [self._open(key, index, item)]
        field = _CALL_ITEMS[kind][1]
        if field is None:  # the item's own fields, parsed values: as strict as JSON text
            text = self.arguments_text(_item_fields(item), orjson.OPT_SORT_KEYS)
            ops.append(op.RefuseArgs(key, text.message) if isinstance(text, strictjson.ParseError)
                       else op.SetArgs(key, text))
        elif isinstance(item.get(field), str):
            ops.append(op.SetArgs(key, item[field]))
        ops.append(op.CloseCall(key))
        return ops

    def _open(self, key: str, index: int, item: dict[str, Any]) -> op.OpenCall:
        """The call an item of a ``_CALL_ITEMS`` type opens (or names again)."""
        kind, _ = _CALL_ITEMS[item["type"]]
        call_id, name = _call_id(item), _text(item.get("name"))
        if call_id is not None and not key.startswith("!"):
            indexes = self._call_at.setdefault(call_id, [])
            if index not in indexes:
                indexes.append(index)
        if kind == op.FUNCTION:
            return op.OpenCall(key, index, None, call_id, name)
        if kind == op.CUSTOM:
            tool = None if name is None else responses_tool_key(kind, name)
            return op.OpenCall(key, index, None, call_id, name, kind, tool)
        if kind == "mcp_approval_request":
            label = _text(item.get("server_label"))
            tool = None if label is None else responses_tool_key(kind, label)
            return op.OpenCall(key, index, None, call_id, name, kind, tool)
        return op.OpenCall(key, index, None, call_id, _CLIENT_ITEM_NAMES[kind], kind,
                           responses_tool_key(kind))

    def _open_index(self, event: dict[str, Any], item_type: str) -> int | None:
        """The output index an item event names (by ``output_index``, else by ``item_id``),
        when an item of ``item_type`` was added there; else None."""
        index = event.get(keys.OUTPUT_INDEX)
        if index is None:
            item_id = event.get(keys.ITEM_ID)
            index = self._index_of.get(item_id) if isinstance(item_id, str) else None
        elif not op.is_index(index):  # true, 1.0, "1" or -1: no output index 1 (issue 23)
            raise ValueError("an output_index that is not an integer >= 0")
        if self.broken or index is None or self._types.get(index) != item_type:
            return None
        return index

    def _item_index(self, event: dict[str, Any]) -> int:
        """The output index of an ``output_text.delta`` without an ``output_index`` (by its
        ``item_id``); one of another type, or negative, is refused."""
        if event.get(keys.OUTPUT_INDEX) is not None:
            raise ValueError("an output_index that is not an integer >= 0")
        index: int = self._index_of[event[keys.ITEM_ID]]
        return index

    def final(self, calls: Sequence[op.CallView]) -> op.FinalMessage:
        by_key = {c.key: c for c in calls}
        output = []
        children = op.unwrapped_calls(calls)
        for index, item in sorted(self._items.items()):
            item = dict(item)  # a key or two is set below; the rest is the event's own
            call = by_key.get(str(index))
            unwrapped = children.get(str(index))
            if unwrapped is not None:  # the parallel wrapper: its calls, in its place
                output += [_unwrapped_item(item, view) for view in unwrapped]
                continue
            if call is not None and call.dropped:  # drop_with_protocol_repair: no item
                continue
            if call is not None and item.get("type") in ("function_call", "custom_tool_call"):
                item[_CALL_ITEMS[item["type"]][1] or ""] = call.text or ""
                item["call_id"] = call.tool_call_id
            elif item.get("type") == "message" and index in self._text and not item.get("content"):
                item["content"] = [{"type": "output_text", "text": "".join(self._text[index]),
                                    "annotations": []}]
            output.append(item)
        return {**self._response, "output": output}, None


#: The name a committed ``computer_call`` or ``local_shell_call`` carries (its item has none):
#: the tool's name everywhere (``worker/core/identity.py``).
_CLIENT_ITEM_NAMES = RESPONSES_ITEM_NAMES


def _kept(item: dict[str, Any]) -> dict[str, Any]:
    """What is kept of an output item for the final message. A function call's arguments (a
    custom call's input) are its call's text, held (and counted against the budgets) once, by
    the assembler: the final message writes them back, so what is kept has the key and not
    the text."""
    kind = item.get("type")
    if kind == "function_call" and "arguments" in item:
        item = {**item, "arguments": ""}
    elif kind == "custom_tool_call" and "input" in item:
        item = {**item, "input": ""}
    return op.bounded(item)


def incomplete_stop(details: Any) -> op.Stopped:
    """What ``response.incomplete`` does to the response's calls (docs/contract.md, "Stop and
    incomplete reasons"): ``incomplete_details.reason`` ``content_filter`` fails them
    ``content_filtered``; ``max_output_tokens``, or any other (or none), ``truncated``."""
    reason = details.get("reason") if isinstance(details, dict) else None
    if reason == "content_filter":
        return op.content_stop(None, "incomplete_details.reason content_filter")
    return op.Truncated()


def _refusal_parts(item: dict[str, Any]) -> list[op.Op]:
    """The stop of a finished ``message`` item with a ``refusal`` content part, else none."""
    content = item.get("content")
    if item.get("type") == "message" and isinstance(content, list) and any(
            isinstance(part, dict) and part.get("type") == "refusal" for part in content):
        return [op.content_stop(None, "a refusal")]
    return []


def _item_text(item: dict[str, Any]) -> str:
    """A client call item's whole text: its ``arguments`` or ``input``, or for the items a
    client answers, their own fields but ``type``, ``id``, ``call_id`` and ``status`` as a JSON
    object (keys sorted, so the same fields are always the same text)."""
    field = _CALL_ITEMS[item["type"]][1]
    if field is not None:
        text = item.get(field)
        return text if isinstance(text, str) else ""
    return orjson.dumps(op.bounded(_item_fields(item)), option=orjson.OPT_SORT_KEYS).decode()


def _item_fields(item: dict[str, Any]) -> dict[str, Any]:
    """A client-answered item's own fields (but ``type``, ``id``, ``call_id``, ``status``), or
    those of ``_TEXT_FIELDS`` that it has: its arguments (``_item_text``)."""
    only = _TEXT_FIELDS.get(item["type"])
    if only is not None:
        return {k: item[k] for k in only if k in item}
    return {k: v for k, v in item.items() if k not in _NOT_TEXT}


def _type(item: dict[str, Any]) -> Any:
    """An output item's type, but :data:`_HOSTED_SHELL` for a ``shell_call`` that ran in a
    container at OpenAI (no call: the module docstring)."""
    kind = item.get("type")
    if kind == "shell_call" and hosted_shell(item.get("environment")):
        return _HOSTED_SHELL
    return kind


def _call_id(item: dict[str, Any]) -> str | None:
    """The id a client call item's answer pairs with: ``call_id``, but for an
    ``mcp_approval_request`` its item ``id`` (the ``approval_request_id`` of the answer)."""
    if item.get("type") == "mcp_approval_request":
        return _text(item.get("id"))
    return _text(item.get("call_id"))


def _unwrapped_item(wrapper: dict[str, Any], view: op.CallView) -> dict[str, Any]:
    """A ``function_call`` item for one call unwrapped from the parallel wrapper ``wrapper``:
    no item ``id`` (a derived ``fc_`` id would name no item OpenAI stored), the derived
    ``call_id``, the entry's name and argument text."""
    item = {"type": "function_call", "call_id": view.tool_call_id, "name": view.name,
            "arguments": view.text or ""}
    if isinstance(wrapper.get("status"), str):
        item["status"] = wrapper["status"]
    return item


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _text(value: Any) -> str | None:
    """A non-empty string, else None: an id or name of another type is no id or name."""
    return value if isinstance(value, str) and value else None


def _safe(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= 64 else "unknown"
