"""OpenAI Chat Completions streaming (``chat.completion.chunk``), and its look-alikes.

What the API sends (platform.openai.com, "Chat Completions: streaming"): each chunk has
``choices[]``, each choice an ``index`` and a ``delta``. A tool call starts with a
``delta.tool_calls[]`` entry that carries ``index``, ``id``, ``type`` and
``function.name``; later entries for the same ``index`` carry only
``function.arguments`` fragments. ``finish_reason`` arrives on the last chunk of each
choice; ``"length"`` means the output hit ``max_tokens``, ``"content_filter"`` that OpenAI's
content filters stopped the choice. The stream ends with ``data: [DONE]``, which the gateway
publishes as ``stream.end``: only that completes the message (contract rule 4).

Each choice's ``finish_reason`` decides its own calls (:func:`finish_stop`): ``stop``,
``tool_calls``, ``function_call`` let them commit; ``length`` (and compatible servers'
``model_length``, ``model_context_window_exceeded``) fails them ``truncated``;
``content_filter`` (GLM's ``sensitive``) and a ``delta.refusal`` fail them
``content_filtered``; ``error`` and any value this version does not know fail them
``upstream_error``. The other choices are not touched.

What OpenAI-compatible servers do instead, all seen in recorded streams and all handled:

* a whole call in one chunk, arguments included (groq, xai, mistral);
* no ``index`` at all (mistral): the call is keyed by its id, or opened anew;
* ``"id": ""`` and ``"name": ""`` on continuation chunks: empty means absent;
* id and name repeated on every chunk: never concatenated;
* the name arriving after the first argument fragments;
* a new id at an index already in use: a new call (rule 2), keyed ``"c.i#n"``;
* ``n > 1``: choices are kept apart, keyed by choice index first;
* every call at ``index: 0``, each with its own id (Ollama): each id is its own call, by the
  rule above;
* the model's ``multi_tool_use.parallel`` wrapper, a call to a tool the run did not register:
  the assembler unwraps it (docs/providers.md, "The parallel wrapper").

A custom (free-form) tool call (issue 33; openai-python ``ChatCompletionMessageCustomToolCall``,
not yet in the chunk types: openai-python #2530, openai-openapi #576) streams as an entry
``{"index", "id", "type": "custom", "custom": {"name", "input"}}`` and continues with
``{"index", "custom": {"input"}}``: an entry with a ``custom`` object and no ``function`` is
one (``kind: custom``, its tool looked up under ``custom:<name>``, its text the concatenated
``input``, never parsed). A continuation of the other shape than the call at its index (a
``function`` fragment for a custom call, or the reverse) is no part of it: it opens a call of
its own, as a new id does.

Chat has no start or stop event per call, so no misplaced one can break its protocol: an
argument fragment at an index never opened opens an id-less call (``missing_id_or_name``), and
an event after ``stream.end`` goes to the DLQ, like every provider's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from worker.core import keys, strictjson
from worker.core import ops as op
from worker.core.model import Reason
from worker.core.tools import responses_tool_key

#: The buffer keys ``"c.i"`` of the first choices' first tool indexes, made once: an open call's
#: key is nearly always one of these, not a string of its own per run.
_CALL_KEYS = [[f"{c}.{i}" for i in range(16)] for c in range(4)]


def _call_key(choice: int, index: int) -> str:
    """The buffer key of the call at tool ``index`` of choice ``choice`` (both >= 0)."""
    if choice < 4 and index < 16:
        return _CALL_KEYS[choice][index]
    return f"{choice}.{index}"


#: A tool index's slot: the buffer key of the call now at that index, and its id.
Slot = tuple[str, str | None]


@dataclass(slots=True)
class _Choice:
    """One choice of the stream: its text and its calls.

    Most streams call one tool per choice, at index 0, so index 0's slot and the first id a
    call is given are kept in fields, and the maps of the others are made at the first
    (an open run then holds no dict here: 368 bytes less, bench/bench_memory.py).
    """

    #: Made at their first text: an open choice without text holds no list.
    content: list[str] | None = None
    reasoning: list[str] | None = None
    refusal: list[str] | None = None
    finish_reason: str | None = None
    #: Tool index 0's slot, and the other indexes' (:meth:`slot`).
    slot0: Slot | None = None
    slots: dict[int, Slot] | None = None
    #: The slot that gave the first id, and each later id -> the first key given it
    #: (:meth:`key_for_id`).
    first_id: Slot | None = None
    by_id: dict[str, str] | None = None
    #: Every buffer key the choice opened, in order (:meth:`add_key`; None until the first).
    keys: list[str] | None = None

    def add_key(self, key: str) -> None:
        """List a buffer key the choice opened."""
        if self.keys is None:
            self.keys = [key]  # (a list of one, not one grown for four by append)
        else:
            self.keys.append(key)

    def slot(self, index: int) -> Slot | None:
        """The slot at a tool index, if one was opened there."""
        if index == 0:
            return self.slot0
        slots = self.slots
        return slots.get(index) if slots is not None else None

    def set_slot(self, index: int, slot: Slot) -> None:
        """Put a call at a tool index; the first call given an id keeps it (:meth:`key_for_id`)."""
        if index == 0:
            self.slot0 = slot
        elif self.slots is None:
            self.slots = {index: slot}
        else:
            self.slots[index] = slot
        call_id = slot[1]
        if call_id:
            first = self.first_id
            if first is None:
                self.first_id = slot
            elif first[1] != call_id:
                if self.by_id is None:
                    self.by_id = {call_id: slot[0]}
                else:
                    self.by_id.setdefault(call_id, slot[0])

    def key_for_id(self, call_id: str) -> str | None:
        """The first buffer key given ``call_id``."""
        first = self.first_id
        if first is not None and first[1] == call_id:
            return first[0]
        by_id = self.by_id
        return by_id.get(call_id) if by_id is not None else None

    def free_index(self) -> int:
        """The tool index after the highest in use."""
        if self.slots:
            return max(self.slots) + 1
        return 0 if self.slot0 is None else 1


#: What a choice without a delta, or an entry without a function, reads as (never changed).
_NO_DELTA: dict[str, Any] = {}


def _object(value: Any) -> dict[str, Any]:
    """``value``, which must be a JSON object (else the event goes to the DLQ)."""
    if not isinstance(value, dict):
        raise ValueError("expected an object")
    return value


def _array(value: Any) -> list[Any]:
    """``value``, which must be a JSON array (else the event goes to the DLQ)."""
    if not isinstance(value, list):
        raise ValueError("expected an array")
    return value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _index(value: Any) -> int | None:
    """A choice or tool index: None when absent (or null); anything but an integer >= 0 is
    refused (the event goes to the DLQ): ``true``, ``1.0`` or ``"1"`` is no index 1, and a
    negative one would be emitted as an order key. Every adapter reads an index so
    (issue 23), and ``worker.core._peek`` leaves such an event to this path."""
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise ValueError("an index that is not an integer >= 0")
    return value


class OpenAIChat(op.Adapter):
    """Adapter for ``openai.chat``."""

    peeked: ClassVar[bool] = True  # (fast)
    completes_on_stream_end: ClassVar[bool] = True
    wrapper_names: ClassVar[frozenset[str]] = frozenset({"multi_tool_use.parallel", "parallel"})

    def __init__(self) -> None:
        super().__init__()
        #: Choice 0 (nearly every stream's only one), and the others by index (made at the
        #: first): an open run holds no map for one choice.
        self._first: _Choice | None = None
        self._choices: dict[int, _Choice] | None = None
        #: The buffer keys of the custom calls (made at the first: most runs have none).
        self._custom: set[str] | None = None

    def feed(self, event: dict[str, Any]) -> list[op.Op]:
        # Each value read is checked for its JSON type before it is used, which also lets the
        # compiled core use dict and list operations on it (bench/bench_core.py).
        choices = event.get(keys.CHOICES)  # (orjson's key objects: worker/core/keys.py)
        if not choices:
            return []
        if not isinstance(choices, list):
            raise ValueError("expected an array")
        if len(choices) == 1 and self._text_delta(choices[0]):
            return op.NO_OPS
        return self._read_choices(choices)

    def fast(self, kind: int, index: int, text: str) -> list[op.Op] | None:
        """``feed`` of a chunk of choice 0 alone with a text delta (``_text_delta``), or with
        one more piece of a call's arguments whose slot is known (``_tool_call``)."""
        if kind == op.CHAT_TEXT:  # (peek: a non-empty content)
            return op.NO_OPS if self._first_text(text) else None
        if kind == op.CHAT_ARGS and text:
            choice = self._first
            slot = choice.slot(index) if choice is not None else None
            if slot is not None and (self._custom is None or slot[0] not in self._custom):
                return [op.AppendArgs(slot[0], text)]
        return None

    def _read_choices(self, choices: list[Any]) -> list[op.Op]:
        """The ops of a chunk's ``choices`` (each read in full: the general path)."""
        ops: list[op.Op] = []
        for raw in choices:
            if not isinstance(raw, dict):
                raise ValueError("expected an object")
            ci = raw.get(keys.INDEX, 0)
            if type(ci) is not int or ci < 0:  # absent, odd or negative: rare, and refused
                ci = _index(ci) or 0
            if ci == 0:
                choice = self._first
                if choice is None:
                    choice = self._first = self._open_choice()
            else:
                others = self._choices
                if others is None:
                    others = self._choices = {}
                choice = others.get(ci)
                if choice is None:  # not setdefault: that would build a _Choice every chunk
                    choice = self._open_choice()
                    if choice is not None:
                        others[ci] = choice
            if choice is None:  # one choice more than the run may open: it ends here
                ops.append(self.too_many_choices())
                return ops
            delta = raw.get(keys.DELTA) or _NO_DELTA
            if not isinstance(delta, dict):
                raise ValueError("expected an object")
            content = delta.get(keys.CONTENT)  # nearly every chunk: a text delta, and only that
            if type(content) is str and content:
                if choice.content is None:
                    choice.content = [content]
                else:
                    choice.content.append(content)
                self.kept += len(content) if content.isascii() else op.utf8_len(content)
            if len(delta) > (content is not None):  # more than the content: look further
                if "reasoning_content" in delta or "refusal" in delta:
                    self.kept += self._other_text(choice, delta)
                    if choice.refusal:  # the model refused: nothing of the choice runs
                        ops.append(op.content_stop(ci, "a refusal"))
                tool_calls = delta.get(keys.TOOL_CALLS)
                if tool_calls:
                    for entry in _array(tool_calls):
                        self._tool_call(ci, choice, _object(entry), ops)
            finish = raw.get(keys.FINISH_REASON)
            if type(finish) is str:
                old = choice.finish_reason  # kept for the final message: counted
                self.kept += op.utf8_len(finish) - (0 if old is None else op.utf8_len(old))
                choice.finish_reason = finish
                stop = finish_stop(ci, finish)
                if stop is not None:
                    ops.append(stop)
        return ops

    def _text_delta(self, raw: Any) -> bool:
        """Apply a lone choice that is nearly every chunk, choice 0 with a delta of a
        non-empty ``content`` and nothing else, no ``finish_reason``; False, and nothing
        done, for anything else (``feed``'s loop then reads it, to the same effect:
        tests/core/property/test_fast_paths.py)."""
        if not isinstance(raw, dict):
            return False
        delta = raw.get(keys.DELTA)
        if not isinstance(delta, dict) or len(delta) != 1:
            return False
        content = delta.get(keys.CONTENT)
        if type(content) is not str or not content or raw.get(keys.FINISH_REASON) is not None:
            return False
        ci = raw.get(keys.INDEX, 0)
        if type(ci) is not int or ci != 0:
            return False
        return self._first_text(content)

    def _first_text(self, content: str) -> bool:
        """Keep a text delta of choice 0; False, and nothing done, when choice 0 is not open
        and the run may open no more choices (``feed``'s loop then says so)."""
        choice = self._first
        if choice is None:
            choice = self._first = self._open_choice()
            if choice is None:
                return False
        if choice.content is None:
            choice.content = [content]
        else:
            choice.content.append(content)
        self.kept += len(content) if content.isascii() else op.utf8_len(content)
        return True

    def _open_choice(self) -> _Choice | None:
        """A new choice, its state counted in ``kept`` (``ops.STATE_BYTES``) but for the run's
        first (part of an open run's own cost, which ``max_open_runs`` bounds); None when the
        run has opened ``max_choices`` already."""
        opened = len(self._choices) if self._choices is not None else 0
        if self._first is not None:
            opened += 1
        if opened >= self.max_choices:
            return None
        if opened:
            self.kept += op.STATE_BYTES
        return _Choice()

    @staticmethod
    def _other_text(choice: _Choice, delta: Any) -> int:
        """Keep a delta's reasoning and refusal text; the bytes kept."""
        kept = 0
        text = delta.get("reasoning_content")
        if isinstance(text, str) and text:
            if choice.reasoning is None:
                choice.reasoning = []
            choice.reasoning.append(text)
            kept += op.utf8_len(text)
        text = delta.get("refusal")
        if isinstance(text, str) and text:
            if choice.refusal is None:
                choice.refusal = []
            choice.refusal.append(text)
            kept += op.utf8_len(text)
        return kept

    def _tool_call(self, ci: int, choice: _Choice, entry: dict[str, Any],
                   ops: list[op.Op]) -> None:
        """Append the ops of one ``delta.tool_calls[]`` entry to ``ops``."""
        function = entry.get(keys.FUNCTION)
        custom = entry.get("custom") if function is None else None
        if custom is not None:  # a custom tool call's: its input is its text
            fn = _object(custom)
            args = fn.get("input")
        else:
            fn = _object(function or _NO_DELTA)
            args = fn.get(keys.ARGUMENTS)
        index = entry.get(keys.INDEX)
        if (type(index) is int and type(args) is str and not entry.get(keys.ID)
                and not fn.get(keys.NAME)):
            slot = choice.slot(index)
            if slot is not None and self._is_custom(slot[0]) == (custom is not None):
                # a continuation chunk (nearly all): more text, no id or name
                if args:
                    ops.append(op.AppendArgs(slot[0], args))
                return
        call_id, name = _text(entry.get("id")), _text(fn.get("name"))
        if isinstance(args, dict) and custom is None:  # a gateway that already parsed the
            args = self.arguments_text(args)  # arguments: as strict as text (ParseError fails)
        key = self._key(ci, choice, index, call_id, custom is not None)
        if key is None:
            index = choice.free_index()
            key = self._new(ci, choice, index, call_id)
            ops.append(self._open(key, index, ci, call_id, name, custom is not None))
        elif choice.keys is None or key not in choice.keys:
            choice.add_key(key)
            ops.append(self._open(key, entry["index"], ci, call_id, name, custom is not None))
        elif call_id or name:  # a continuation chunk repeats neither: nothing to identify
            ops.append(op.Identify(key, call_id, name))
        if isinstance(args, str) and args:
            ops.append(op.AppendArgs(key, args))
        elif isinstance(args, strictjson.ParseError):
            ops.append(op.RefuseArgs(key, args.message))

    def _is_custom(self, key: str) -> bool:
        return self._custom is not None and key in self._custom

    def _open(self, key: str, index: int, ci: int, call_id: str | None, name: str | None,
              custom: bool) -> op.OpenCall:
        """The call an entry opens: a custom one is listed, and looks its tool up as such."""
        if not custom:
            return op.OpenCall(key, index, ci, call_id, name)
        if self._custom is None:
            self._custom = set()
        self._custom.add(key)
        return op.OpenCall(key, index, ci, call_id, name, op.CUSTOM,
                           responses_tool_key(op.CUSTOM, name or ""))

    def _key(self, ci: int, choice: _Choice, index: Any, call_id: str | None,
             custom: bool = False) -> str | None:
        """The buffer key this entry belongs to; a not-yet-listed key opens a call (as does an
        entry of the other shape than the call at its index: function or custom)."""
        index = _index(index)
        if index is None:
            key = choice.key_for_id(call_id) if call_id else None
            return None if key is not None and self._is_custom(key) != custom else key
        slot = choice.slot(index)
        if (slot is None or (call_id and slot[1] and call_id != slot[1])
                or self._is_custom(slot[0]) != custom):
            base = _call_key(ci, index)
            generation = sum(1 for k in choice.keys or () if k.split("#")[0] == base)
            key = base + (f"#{generation}" if generation else "")
            choice.set_slot(index, (key, call_id))
            return key
        if call_id and not slot[1]:
            choice.set_slot(index, (slot[0], call_id))
        return slot[0]

    @staticmethod
    def _new(ci: int, choice: _Choice, index: int, call_id: str | None) -> str:
        key = _call_key(ci, index)
        choice.set_slot(index, (key, call_id))
        choice.add_key(key)
        return key

    def final(self, calls: Sequence[op.CallView]) -> op.FinalMessage:
        by_key = {c.key: c for c in calls}
        children = op.unwrapped_calls(calls)
        messages: list[dict[str, Any]] = []
        choices = dict(self._choices or {})
        if self._first is not None:
            choices[0] = self._first
        for ci in sorted(choices) or [0]:
            choice = choices.get(ci, _Choice())
            message: dict[str, Any] = {"role": "assistant",
                                       "content": "".join(choice.content or ()) or None}
            if choice.reasoning:
                message["reasoning_content"] = "".join(choice.reasoning)
            if choice.refusal:
                message["refusal"] = "".join(choice.refusal)
            tool_calls = []
            for k in choice.keys or ():
                if k in by_key:
                    if not by_key[k].dropped:  # on_invalid_json: drop_with_protocol_repair
                        tool_calls.append(_tool_call_entry(by_key[k]))
                elif k in children:  # the parallel wrapper: its calls, in its place
                    tool_calls += [_tool_call_entry(view) for view in children[k]]
            if tool_calls:
                message["tool_calls"] = tool_calls
            messages.append({"index": ci, "message": message,
                             "finish_reason": choice.finish_reason})
        # The first choice's message is the final's ``message``: its entry in ``choices``
        # leaves it out, so that no text is written twice (the final message's size is bounded
        # by the text a run may hold, not twice that).
        first: dict[str, Any] = messages[0].pop("message")
        return first, (messages if len(messages) > 1 else None)


#: The ``finish_reason`` values that end a choice whose calls may run (OpenAI's; compatible
#: servers send the same), that truncate it (OpenAI ``length``; Mistral ``model_length``; Zhipu
#: GLM ``model_context_window_exceeded``), that stop it for its content (OpenAI
#: ``content_filter``; GLM ``sensitive``, its safety review), and that end it with an error
#: (OpenRouter and Mistral ``error``, GLM ``network_error``, DeepSeek
#: ``insufficient_system_resource``). Any other is a reason this version does not know.
COMPLETING_FINISHES = frozenset({"stop", "tool_calls", "function_call"})
TRUNCATING_FINISHES = frozenset({"length", "model_length", "model_context_window_exceeded"})
FILTERING_FINISHES = frozenset({"content_filter", "sensitive"})
ERROR_FINISHES = frozenset({"error", "network_error", "insufficient_system_resource"})


def finish_stop(ci: int, finish: str) -> op.Stopped | None:
    """What choice ``ci``'s ``finish_reason`` does to its calls: None, they may commit (or
    the value is empty: no reason); else the stop that fails them (docs/contract.md, "Stop and
    incomplete reasons"): per choice, as ``length`` always was."""
    if not finish or finish in COMPLETING_FINISHES:
        return None
    if finish in TRUNCATING_FINISHES:
        return op.Truncated(ci)
    if finish in FILTERING_FINISHES:
        return op.content_stop(ci, f"finish_reason {finish}")
    what = ("the provider ended the choice with an error" if finish in ERROR_FINISHES
            else "not one this version knows")
    return op.Stopped(ci, Reason.UPSTREAM_ERROR, f"finish_reason {_safe(finish)}: {what}")


def _safe(value: str) -> str:
    return value if len(value) <= 64 else "unknown"


def _tool_call_entry(call: op.CallView) -> dict[str, Any]:
    if call.kind == op.CUSTOM:  # (openai-python ChatCompletionMessageCustomToolCall)
        return {"id": call.tool_call_id, "type": "custom",
                "custom": {"name": call.name, "input": call.text or ""}}
    return {"id": call.tool_call_id, "type": "function",
            "function": {"name": call.name, "arguments": call.text or ""}}
