"""Google Gemini (Gemini API and Vertex AI) ``streamGenerateContent``.

What the API sends (Gemini API reference, ``GenerateContentResponse``; Vertex AI the same
JSON): a sequence of responses, each with ``candidates[]`` (``index``, ``content.parts[]``,
``finishReason`` on the candidate's last chunk), ``usageMetadata``, ``modelVersion`` and
``responseId``; a blocked prompt answers with ``promptFeedback.blockReason`` and no candidate;
an error mid-stream is an ``{"error": {"code", "message", "status"}}`` chunk.

A part is text (``thought: true`` for a thought summary), any other kind Gemini defines
(``executableCode``, ``codeExecutionResult``, ``inlineData``...: kept for the final message),
or a ``functionCall``, which comes in one of two shapes:

* **whole**: ``{"name", "args", "id"?}`` in one part (``args`` already parsed; missing means
  ``{}``, rule 3);
* **streamed** (``streamFunctionCallArguments``): a part ``{"name", "willContinue": true}``,
  then parts ``{"partialArgs": [...], "willContinue": ...}`` without a name. The call ends at a
  part without ``willContinue``, at an empty ``functionCall: {}``, at the next named call of
  the candidate, or at the end of the stream. Its arguments are held opaque, as records, and
  built and checked when the call is complete (:mod:`worker.core.providers.gemini_args`).

A whole ``functionCall`` without an id that repeats, name and arguments the same, one an
earlier chunk of its candidate held is that call again, not a second one (Gemini has been seen
sending a chunk's calls again in a later chunk): it is not opened. Calls of one chunk are
never repeats of each other; one with an id is never taken for a repeat (the latch sees ids).

Keys and ids: a call is keyed ``"<candidate>.<n>"``, its ``index`` is ``n`` (its position among
the candidate's calls) and its ``choice`` the candidate's index. Gemini sends no call id unless
asked (Vertex's ``id``); a call without one gets ``latch-<candidate>-<n>-<run_id>``: the same
on every replay, and written into the final message's ``functionCall.id`` so that the runner's
``functionResponse`` can carry it. Gemini pairs a ``functionResponse`` with its call by
``name`` and by order (the responses in the order of the calls), and by ``id`` when the call
had one: a runner answers each committed call or error result with a ``functionResponse`` of
the same ``name`` and ``id``, in ``index`` order.

The ``thoughtSignature`` of a part is kept on that part in the final message (Gemini 3 refuses
a function call sent back without the signature it came with).

Ends: ``finishReason`` arrives on a chunk that a usage chunk may follow, so the run ends at
``stream.end`` (``Adapter.end``), which reads each candidate's reason: ``STOP`` completes;
``MAX_TOKENS`` truncates that candidate's calls (rule 5); ``SAFETY``, ``RECITATION``,
``BLOCKLIST``, ``PROHIBITED_CONTENT``, ``SPII``, ``MODEL_ARMOR`` (Vertex) and the ``IMAGE_*``
filters but ``IMAGE_OTHER`` fail the open calls ``content_filtered``;
``MALFORMED_FUNCTION_CALL``, ``UNEXPECTED_TOOL_CALL`` and ``MALFORMED_RESPONSE`` fail them
``malformed_output``; ``TOO_MANY_TOOL_CALLS`` fails them ``too_many_tool_calls``; any other
reason (``OTHER``, ``LANGUAGE``, ``IMAGE_OTHER``, ``NO_IMAGE``, ``FINISH_REASON_UNSPECIFIED``,
one this version does not know) fails them ``upstream_error``. A stream that ends
without a ``finishReason`` for each candidate fails ``stream_error``.

What breaks the protocol (``ops.ProtocolError``; docs/providers.md, "Protocol breaks"): a part after
its candidate's ``finishReason``, or a ``functionCall`` without a name (``partialArgs``, an id)
while no call of the candidate streams. From the break on no part is kept for the final
message; each ``functionCall`` still seen with a name or an id opens under a late key (it fails
at once: one outcome per id), and the run fails ``protocol_error`` at ``stream.end``.

Spellings: every field is read in camelCase and in the snake_case that the proto JSON mapping
also accepts (``function_call``, ``partial_args``, ``will_continue``, ``finish_reason``,
``thought_signature``, ``prompt_feedback``, ``block_reason``; ``json_path`` and the
``*_value`` fields of a ``PartialArg`` in :mod:`worker.core.providers.gemini_args`): one
dictionary lookup more per field, whatever the input. An object that carries both spellings of
one field is refused, as protobuf's JSON parser refuses it (the event goes to the DLQ). The
final message is written in camelCase; parts Latch does not interpret are kept as sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

import orjson

from worker.core import ops as op
from worker.core import strictjson
from worker.core.model import Reason
from worker.core.providers import gemini_args

_FILTERED = frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII",
                       "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION",
                       "MODEL_ARMOR"})
_MALFORMED = frozenset({"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "MALFORMED_RESPONSE"})
_TEXT_KEYS = frozenset({"text", "thought", "thoughtSignature", "thought_signature"})


class _Text:
    """Consecutive text parts of one kind (thought or not), joined for the final message."""

    __slots__ = ("pieces", "signature", "thought")

    def __init__(self, thought: bool) -> None:
        self.thought = thought
        self.pieces: list[str] = []
        self.signature: str | None = None

    def render(self) -> dict[str, Any]:
        part: dict[str, Any] = {"text": "".join(self.pieces)}
        if self.thought:
            part["thought"] = True
        if self.signature is not None:
            part["thoughtSignature"] = self.signature
        return part


class _Candidate:
    __slots__ = ("calls", "chunk", "earlier", "finish", "now", "parts", "signatures",
                 "streaming")

    def __init__(self) -> None:
        #: The parts in stream order: text runs, other parts as sent, a call's buffer key.
        self.parts: list[_Text | dict[str, Any] | str] = []
        self.calls = 0
        #: The key of the streamed call still taking ``partialArgs``, if any.
        self.streaming: str | None = None
        self.finish: str | None = None
        self.signatures: dict[str, str] = {}
        #: The whole id-less calls (digests of name and arguments) of the chunks before
        #: ``chunk``, and of chunk ``chunk``, each with how many times one chunk held it.
        self.earlier: dict[bytes, int] = {}
        self.now: dict[bytes, int] = {}
        self.chunk = 0

    def repeats(self, digest: bytes, chunk: int) -> bool:
        """Whether a whole id-less call (``digest``) of chunk ``chunk`` repeats one that an
        earlier chunk held: the n-th such call of a chunk repeats when an earlier chunk held
        it n times or more. Counted either way."""
        if chunk != self.chunk:  # a new chunk: the last one's calls are now earlier
            for seen, count in self.now.items():
                if count > self.earlier.get(seen, 0):
                    self.earlier[seen] = count
            self.now, self.chunk = {}, chunk
        count = self.now.get(digest, 0) + 1
        self.now[digest] = count
        return count <= self.earlier.get(digest, 0)


class Gemini(op.Adapter):
    """Adapter for ``google.gemini``."""

    completes_on_stream_end: ClassVar[bool] = False
    parses_own_arguments: ClassVar[bool] = True

    def __init__(self, run_id: str = "") -> None:
        super().__init__()
        self._run_id = run_id
        self._candidates: dict[int, _Candidate] = {}
        #: The events fed so far (each chunk's number, for ``_Candidate.repeats``).
        self._chunks = 0

    def feed(self, event: dict[str, Any]) -> list[op.Op]:
        self._chunks += 1
        candidates = event.get("candidates")
        if candidates is None:
            return self._other(event)
        if not isinstance(candidates, list):
            raise ValueError("candidates is not an array")
        ops: list[op.Op] = []
        for position, candidate in enumerate(candidates):
            if not isinstance(candidate, dict):
                raise ValueError("a candidate that is not an object")
            index = candidate.get("index", position)
            if not op.is_index(index):
                raise ValueError("a candidate index that is not an integer >= 0")
            if index not in self._candidates:  # a new candidate: counted, and bounded
                if len(self._candidates) >= self.max_choices:
                    ops.append(self.too_many_choices())
                    return ops
                if self._candidates:  # (the first is part of an open run's own cost)
                    self.kept += op.STATE_BYTES
                self._candidates[int(index)] = _Candidate()
            ops += self._candidate(int(index), candidate)
        return ops

    def _other(self, event: dict[str, Any]) -> list[op.Op]:
        error = event.get("error")
        if isinstance(error, dict):
            return [op.UpstreamError(f"provider error: {_safe(error.get('status'))}")]
        feedback = _field(event, "promptFeedback", "prompt_feedback")
        block = (_field(feedback, "blockReason", "block_reason") if isinstance(feedback, dict)
                 else None)
        if isinstance(block, str):
            return [op.UpstreamError(f"the prompt was blocked: {_safe(block)}",
                                     Reason.CONTENT_FILTERED)]
        return []  # a usage-only chunk

    def _candidate(self, index: int, body: dict[str, Any]) -> list[op.Op]:
        candidate = self._candidates[index]
        content = body.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        ops: list[op.Op] = []
        if parts:
            if not isinstance(parts, list):
                raise ValueError("parts is not an array")
            if candidate.finish is not None and not self.broken:
                ops.append(self.protocol_error(
                    f"content for candidate {index} after its finishReason"))
            for part in parts:
                ops += self._part(index, candidate, part)
        finish = _field(body, "finishReason", "finish_reason")
        if isinstance(finish, str):
            old = candidate.finish  # kept for the final message: counted
            self.kept += op.utf8_len(finish) - (0 if old is None else op.utf8_len(old))
            candidate.finish = finish
        return ops

    def _part(self, index: int, candidate: _Candidate, part: Any) -> list[op.Op]:
        if not isinstance(part, dict):
            raise ValueError("a part that is not an object")
        call = _field(part, "functionCall", "function_call")
        if call is None:
            if not self.broken:  # after a break nothing is kept
                self.kept += self._keep(candidate, part)
            return []
        if not isinstance(call, dict):
            raise ValueError("functionCall is not an object")
        if self.broken:
            return self._late_call(index, candidate, call)
        partial = _field(call, "partialArgs", "partial_args")
        if partial is not None and not isinstance(partial, list):
            raise ValueError("partialArgs is not an array")
        more = _field(call, "willContinue", "will_continue") is True
        name = _text(call.get("name"))
        ops: list[op.Op] = []
        if candidate.streaming is not None:
            key = candidate.streaming
            if name is None:  # the streamed call goes on, or ends here
                ops += self._records(key, partial)
                if not more:
                    candidate.streaming = None
                    ops.append(op.CloseCall(key))
                return ops
            candidate.streaming = None  # a new call: the streamed one ended before it
            ops.append(op.CloseCall(key))
        if name is None:
            if call:  # partialArgs, or an id, with no call streaming
                return [self.protocol_error("a functionCall part without a name while no call "
                                            "streams"), *self._late_call(index, candidate, call)]
            return ops  # an empty functionCall {} that ends nothing
        if partial is None and not more and self._repeated(candidate, call, name):
            return ops  # the same whole call again, from a later chunk: one call
        return ops + self._open(index, candidate, part, call, name, partial, more)

    def _repeated(self, candidate: _Candidate, call: dict[str, Any], name: str) -> bool:
        """Whether a whole ``functionCall`` without an id repeats, name and arguments the same,
        one that an earlier chunk of the candidate held (``_Candidate.repeats``): Gemini has
        been seen sending a chunk's calls again in a later chunk (allenhutchison/obsidian-gemini
        #230, #441), and without an id nothing else tells the repeat from a second call. Kept
        as a SHA-256 digest of the name and the arguments' JSON text (32 bytes a call)."""
        if call.get("id") is not None:  # an id tells calls apart: the latch decides
            return False
        args = call.get("args")
        text = "{}" if args is None else self.arguments_text(args, orjson.OPT_SORT_KEYS)
        if not isinstance(text, str):  # refused arguments: the call fails on its own
            return False
        digest = hashlib.sha256(f"{name}\0{text}".encode("utf-8", "surrogatepass")).digest()
        self.kept += 64  # (at most one entry more: counted)
        return candidate.repeats(digest, self._chunks)

    def _open(self, index: int, candidate: _Candidate, part: dict[str, Any],
              call: dict[str, Any], name: str, partial: list[Any] | None,
              more: bool) -> list[op.Op]:
        n = candidate.calls
        candidate.calls += 1
        key = f"{index}.{n}"
        call_id = _text(call.get("id")) or f"latch-{index}-{n}-{self._run_id}"
        candidate.parts.append(key)
        signature = _field(part, "thoughtSignature", "thought_signature")
        if isinstance(signature, str):
            candidate.signatures[key] = signature
            self.kept += op.utf8_len(signature)
        ops: list[op.Op] = [op.OpenCall(key, n, index, call_id, name)]
        if partial is not None or more:  # streamed
            ops += self._records(key, partial)
            if more:
                candidate.streaming = key
                return ops
        elif call.get("args") is not None:  # whole: the parsed args, as strict as JSON text
            text = self.arguments_text(call["args"])
            ops.append(op.RefuseArgs(key, text.message) if isinstance(text, strictjson.ParseError)
                       else op.SetArgs(key, text))
        ops.append(op.CloseCall(key))
        return ops

    def _records(self, key: str, partial: list[Any] | None) -> list[op.Op]:
        """The buffer records of a part's ``partialArgs``. Their paths and values are parsed
        values too: from a record in which a key repeats or an integer is beyond 64 bits
        (``strictjson.one_meaning``), the part gives one record that ``gemini_args.build``
        refuses, so the call fails ``invalid_json`` as it would for such text."""
        if not partial:
            return []
        problem = strictjson.one_meaning(self.record) if self.record else None
        if problem is not None:
            return [op.AppendArgs(key, gemini_args.refused(problem.message))]
        return [op.AppendArgs(key, gemini_args.record(p)) for p in partial]

    def _late_call(self, index: int, candidate: _Candidate, call: dict[str, Any]) -> list[op.Op]:
        """A ``functionCall`` at or after a protocol break: nothing of it is kept; one with a
        name or an id opens its own call under a late key, which fails at once (an id-less
        one gets the candidate's next ``latch-`` id)."""
        name, call_id = _text(call.get("name")), _text(call.get("id"))
        if name is None and call_id is None:
            return []
        candidate.streaming = None
        n = candidate.calls
        candidate.calls += 1
        return [op.OpenCall(self.late_key(), n, index,
                            call_id or f"latch-{index}-{n}-{self._run_id}", name)]

    @staticmethod
    def _keep(candidate: _Candidate, part: dict[str, Any]) -> int:
        """Keep a part that is not a call for the final message (text runs are joined); the
        bytes kept."""
        text = part.get("text")
        if not isinstance(text, str) or not part.keys() <= _TEXT_KEYS:
            candidate.parts.append(op.bounded(part))
            return op.json_len(part)
        thought = part.get("thought") is True
        signature = _field(part, "thoughtSignature", "thought_signature")
        last = candidate.parts[-1] if candidate.parts else None
        if not (isinstance(last, _Text) and last.thought == thought and last.signature is None):
            if not text and not isinstance(signature, str):
                return 0  # an empty text part carries nothing
            last = _Text(thought)
            candidate.parts.append(last)
        last.pieces.append(text)
        if isinstance(signature, str):
            last.signature = signature
            return op.utf8_len(text) + op.utf8_len(signature)
        return op.utf8_len(text)

    def parse_arguments(self, text: str) -> Any | strictjson.ParseError:
        if gemini_args.is_records(text):
            return gemini_args.build(text)
        return strictjson.parse(text)

    def end(self) -> list[op.Op]:
        if not self._candidates:
            return []  # nothing finished: the run fails stream_error
        ops: list[op.Op] = []
        for index, candidate in sorted(self._candidates.items()):
            reason = candidate.finish
            if reason is None:
                return []
            if reason == "MAX_TOKENS":
                ops.append(op.Truncated(index))
            elif reason != "STOP":
                return [_failure(index, reason)]
        return [*ops, op.Complete()]

    def final(self, calls: Sequence[op.CallView]) -> op.FinalMessage:
        by_key = {c.key: c for c in calls}
        contents = {index: {"role": "model", "parts": self._render(c, by_key)}
                    for index, c in sorted(self._candidates.items())}
        message = next(iter(contents.values()), {"role": "model", "parts": []})
        if len(contents) <= 1:
            return message, None
        choices = [{"index": index, "message": content,
                    "finish_reason": self._candidates[index].finish}
                   for index, content in contents.items()]
        return contents.get(0, message), choices

    def _render(self, candidate: _Candidate, calls: dict[str, op.CallView]
                ) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        carried: str | None = None  # the thoughtSignature of a dropped call, for the next call kept
        for item in candidate.parts:
            if isinstance(item, _Text):
                parts.append(item.render())
            elif isinstance(item, dict):
                parts.append(item)
            elif (call := calls.get(item)) is not None and call.dropped:
                # drop_with_protocol_repair: no part; Gemini checks the signature on the first
                # functionCall part of a step, so the next call kept takes it over
                carried = candidate.signatures.get(item, carried)
            else:
                part = self._call_part(item, call, candidate)
                if carried is not None and "thoughtSignature" not in part:
                    part["thoughtSignature"] = carried
                carried = None
                parts.append(part)
        return parts

    def _call_part(self, key: str, call: op.CallView | None,
                   candidate: _Candidate) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if call is not None:
            value = call.arguments if call.parsed else (
                self.parse_arguments(call.text) if call.text else {})
            body = {"id": call.tool_call_id, "name": call.name,
                    "args": value if isinstance(value, dict) else {}}
        part: dict[str, Any] = {"functionCall": body}
        if key in candidate.signatures:
            part["thoughtSignature"] = candidate.signatures[key]
        return part


def _failure(index: int, reason: str) -> op.UpstreamError:
    detail = f"finishReason {_safe(reason)} on candidate {index}"
    if reason in _FILTERED:
        return op.UpstreamError(f"{detail}: the provider stopped it for its content",
                                Reason.CONTENT_FILTERED)
    if reason in _MALFORMED:
        return op.UpstreamError(f"{detail}: the provider found a function call malformed",
                                Reason.MALFORMED_OUTPUT)
    if reason == "TOO_MANY_TOOL_CALLS":
        return op.UpstreamError(detail, Reason.TOO_MANY_TOOL_CALLS)
    return op.UpstreamError(detail)


def _field(body: dict[str, Any], camel: str, snake: str) -> Any:
    """A field in either JSON spelling (None when absent); both spellings at once are refused.
    """
    if snake in body:
        if camel in body:
            raise op.EventRefused(f"both {camel} and {snake} in one object")
        return body[snake]
    return body.get(camel)


def _text(value: Any) -> str | None:
    """A non-empty string, else None: an id or name of another type is no id or name."""
    return value if isinstance(value, str) and value else None


def _safe(value: Any) -> str:
    return value if isinstance(value, str) and len(value) <= 64 else "unknown"
