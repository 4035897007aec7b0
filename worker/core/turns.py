"""The next turn, ready to send: tool results in the provider's own format (issue 36, item 5).

When every call of a run has its one result, the worker writes one **turn record**
(``llm.turns``, ``schemas/turn.schema.json``, :func:`turn_record`): the messages or items an
agent loop appends after the run's final message, so that its next request is its history +
the final message + these, and every tool call id of the final message has exactly one result
(a call dropped from the message, ``drop_with_protocol_repair``, none). This module only
*formats*: which result pairs with which call, and when a run's turn is complete, is the
worker's to decide. It is pure (no I/O), and not on the per-event path (once per turn).

:func:`tool_messages` turns :class:`Answer` s (in the order of the calls in the final
message) into, per provider:

* ``openai.chat``: one ``{"role": "tool", "tool_call_id", "content"}`` per answer (a custom
  tool call's too: chat has one tool message for both);
* ``openai.responses``: one input item per answer, the one that answers the call's item type
  (below);
* ``anthropic.messages``: ONE ``{"role": "user", "content": [tool_result blocks]}``: every
  ``tool_result`` of a turn in the one user message that follows it;
* ``bedrock.converse``: ONE ``{"role": "user", "content": [{"toolResult": ...}]}``, the same;
* ``google.gemini``: ONE ``{"role": "user", "parts": [{"functionResponse": ...}]}``.

Responses items by the call's kind (:attr:`Answer.kind`: the call kind its committed record
and outcome carry, ``ops.CALL_KINDS``, or the tool's identity kind, ``identity.KINDS``):

* ``function`` (and ``mcp``: a tool of an MCP ``tools/list`` is called by a function call):
  ``{"type": "function_call_output", "call_id", "output"}``;
* ``custom``: ``custom_tool_call_output``, the same fields;
* ``shell_call`` / ``shell``: ``shell_call_output``, ``output`` the list of ``{"stdout",
  "stderr", "outcome"}`` the runner answered (``examples/shell_tool.py``); any other answer
  is one entry, its text as ``stdout`` with exit code 0, or for an error as ``stderr`` with
  exit code 1;
* ``apply_patch_call`` / ``apply_patch``: ``apply_patch_call_output``, ``status``
  ``completed`` or, for an error, ``failed``, and the text as ``output``;
* ``local_shell_call`` / ``local_shell``: ``local_shell_call_output``, the call's id as ``id``
  (that item has no ``call_id``), the text as ``output``;
* ``computer_call`` / ``computer``: ``computer_call_output`` with the screenshot the runner
  answered (a JSON object with ``image_url`` or ``file_id``, or a ``data:image/``,
  ``https://`` or ``http://`` URL as the text). An error, or any other answer, has no
  screenshot to give: the item then has ``{"type": "computer_screenshot"}`` alone, which
  OpenAI may refuse: the agent loop takes a screenshot itself for a call whose outcome
  ``is_error`` (Latch cannot). ``acknowledged_safety_checks`` is never set: acknowledging a
  ``pending_safety_checks`` is a person's or the agent loop's decision;
* ``mcp_approval_request``: ``{"type": "mcp_approval_response", "approval_request_id",
  "approve"}``: the runner's ``{"approve": bool, "reason"?}`` when it answered one, else
  ``approve`` is not ``is_error``, and a denial's ``reason`` is the error text.

Error results: chat and Responses have no error flag (the text says it, the reason first);
Anthropic ``is_error: true``, Bedrock ``status: "error"``, Gemini ``{"error": text}`` in place
of ``{"output": ...}``. Structured content (an MCP ``structuredContent`` object, kept by the
runner) is sent where the provider takes JSON: Bedrock a ``{"json": ...}`` block, Gemini the
``output`` value; elsewhere the text. Empty text: Anthropic leaves ``content`` out and Bedrock
sends ``{"json": {}}`` (both refuse an empty text block). Gemini: ``id`` only when the call has
one (:attr:`Answer.call_id` non-empty); Latch writes its own ``latch-<candidate>-<n>-<run_id>``
into each id-less ``functionCall`` of the final message, and the response carries that same
id, since the history the loop sends holds it. docs/decisions/0025-turn-record.md has the
reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

__all__ = ["OUTCOMES", "PROVIDERS", "Answer", "TurnEntry", "tool_messages", "turn_record"]

CHAT, RESPONSES, ANTHROPIC, BEDROCK, GEMINI = (
    "openai.chat", "openai.responses", "anthropic.messages", "bedrock.converse", "google.gemini")
PROVIDERS = (CHAT, RESPONSES, ANTHROPIC, BEDROCK, GEMINI)
#: What became of each call of a run's final message (``schemas/turn.schema.json``).
ANSWERED, TOOL_TIMEOUT, RESULT_TOO_LARGE, RESULT_SCHEMA_INVALID, FAILED, DROPPED = (
    "answered", "tool_timeout", "result_too_large", "result_schema_invalid", "failed", "dropped")
OUTCOMES = (ANSWERED, TOOL_TIMEOUT, RESULT_TOO_LARGE, RESULT_SCHEMA_INVALID, FAILED, DROPPED)

#: The Responses item kind a kind's call is answered as: call kinds (``ops.CALL_KINDS``) and
#: identity kinds (``identity.KINDS``); any other kind is answered as a function call.
_RESPONSES_KINDS = {
    "custom": "custom", "computer_call": "computer", "computer": "computer",
    "local_shell_call": "local_shell", "local_shell": "local_shell",
    "shell_call": "shell", "shell": "shell", "apply_patch_call": "apply_patch",
    "apply_patch": "apply_patch", "mcp_approval_request": "approval",
}
_SCREENSHOT_URLS = ("data:image/", "https://", "http://")


class Answer(NamedTuple):
    """One call's result, as the turn sends it back."""

    #: The call's id as the final message carries it (Gemini: ``""`` when it has none).
    call_id: str
    #: The tool's name as in the final message.
    name: str
    #: The call's kind (module docstring): ``function``, ``custom``, a Responses item kind.
    kind: str
    is_error: bool
    #: The result text, or the error text.
    content: str
    #: An MCP ``structuredContent`` JSON value, when the runner kept one.
    structured: object | None = None


class TurnEntry(NamedTuple):
    """What became of one call of the final message (an entry of the record's ``outcomes``)."""

    #: The call's ``tool_call_id`` (its outcome's in the final message).
    tool_call_id: str
    name: str
    #: One of :data:`OUTCOMES`.
    outcome: str
    #: None for ``answered``; the error reason code otherwise.
    reason: str | None
    #: The result sent for it; None for ``dropped`` (no message).
    answer: Answer | None
    #: The result content's UTF-8 byte size (for ``result_too_large``, the refused one's);
    #: None when there was none.
    size: int | None


def tool_messages(provider: str, answers: Sequence[Answer]) -> list[dict[str, Any]]:
    """The messages (items) an agent loop appends after the final message, answering
    ``answers`` in their order (the order of the calls in the final message); ``[]`` for no
    answer. ValueError for a provider Latch does not know."""
    if not answers:
        return []
    if provider == CHAT:
        return [{"role": "tool", "tool_call_id": a.call_id, "content": a.content}
                for a in answers]
    if provider == RESPONSES:
        return [_responses_item(a) for a in answers]
    if provider == ANTHROPIC:
        return [{"role": "user", "content": [_tool_result(a) for a in answers]}]
    if provider == BEDROCK:
        return [{"role": "user", "content": [{"toolResult": _bedrock_result(a)}
                                             for a in answers]}]
    if provider == GEMINI:
        return [{"role": "user", "parts": [{"functionResponse": _function_response(a)}
                                           for a in answers]}]
    raise ValueError(f"unknown provider {provider!r}")


def turn_record(run_id: str, tenant: str | None, provider: str, final_key: str,
                entries: Sequence[TurnEntry]) -> dict[str, Any]:
    """The turn record of a run (``schemas/turn.schema.json``): ``entries`` one per call id of
    its final message, in order; ``final_key`` its final message's ``idempotency_key``. The
    messages answer the entries that have an answer."""
    answers = [e.answer for e in entries if e.answer is not None]
    outcomes = [{"tool_call_id": e.tool_call_id, "name": e.name, "outcome": e.outcome,
                 "reason": e.reason,
                 "is_error": None if e.answer is None else e.answer.is_error, "size": e.size}
                for e in entries]
    return {"v": 1, "run_id": run_id, "tenant": tenant, "provider": provider,
            "final_idempotency_key": final_key,
            "messages": tool_messages(provider, answers), "outcomes": outcomes}


# -- the providers' shapes ----------------------------------------------------------------


def _tool_result(answer: Answer) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": answer.call_id}
    if answer.content:
        block["content"] = answer.content
    if answer.is_error:
        block["is_error"] = True
    return block


def _bedrock_result(answer: Answer) -> dict[str, Any]:
    structured = answer.structured
    if isinstance(structured, dict) and not answer.is_error:
        content: list[dict[str, Any]] = [{"json": structured}]
    elif answer.content:
        content = [{"text": answer.content}]
    else:
        content = [{"json": {}}]
    result: dict[str, Any] = {"toolUseId": answer.call_id, "content": content}
    if answer.is_error:
        result["status"] = "error"
    return result


def _function_response(answer: Answer) -> dict[str, Any]:
    if answer.is_error:
        response: dict[str, Any] = {"error": answer.content}
    elif answer.structured is not None:
        response = {"output": answer.structured}
    else:
        response = {"output": answer.content}
    body: dict[str, Any] = {"name": answer.name, "response": response}
    if answer.call_id:
        body["id"] = answer.call_id
    return body


def _responses_item(answer: Answer) -> dict[str, Any]:
    kind = _RESPONSES_KINDS.get(answer.kind, "function")
    if kind == "function":
        return {"type": "function_call_output", "call_id": answer.call_id,
                "output": answer.content}
    if kind == "custom":
        return {"type": "custom_tool_call_output", "call_id": answer.call_id,
                "output": answer.content}
    if kind == "shell":
        return {"type": "shell_call_output", "call_id": answer.call_id,
                "output": _shell_output(answer)}
    if kind == "apply_patch":
        return {"type": "apply_patch_call_output", "call_id": answer.call_id,
                "status": "failed" if answer.is_error else "completed",
                "output": answer.content}
    if kind == "local_shell":
        return {"type": "local_shell_call_output", "id": answer.call_id,
                "output": answer.content}
    if kind == "computer":
        return {"type": "computer_call_output", "call_id": answer.call_id,
                "output": _screenshot(answer)}
    return _approval(answer)


def _json(answer: Answer) -> object:
    """The answer's structured value, else its text parsed as JSON (None when it is none)."""
    if answer.structured is not None:
        return answer.structured
    text = answer.content
    if not text or text[0] not in "[{":
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _shell_output(answer: Answer) -> list[dict[str, Any]]:
    if not answer.is_error:
        given = _json(answer)
        if isinstance(given, list) and given:
            chunks = [_shell_chunk(c) for c in given]
            if all(c is not None for c in chunks):
                return [c for c in chunks if c is not None]
    if answer.is_error:
        return [{"stdout": "", "stderr": answer.content,
                 "outcome": {"type": "exit", "exit_code": 1}}]
    return [{"stdout": answer.content, "stderr": "",
             "outcome": {"type": "exit", "exit_code": 0}}]


def _shell_chunk(chunk: object) -> dict[str, Any] | None:
    """A ``{"stdout", "stderr", "outcome"}`` entry as ``shell_call_output`` takes it, or None."""
    if not isinstance(chunk, dict):
        return None
    stdout, stderr, outcome = chunk.get("stdout"), chunk.get("stderr"), chunk.get("outcome")
    if not (isinstance(stdout, str) and isinstance(stderr, str) and isinstance(outcome, dict)):
        return None
    kind = outcome.get("type")
    if kind == "timeout":
        return {"stdout": stdout, "stderr": stderr, "outcome": {"type": "timeout"}}
    code = outcome.get("exit_code")
    if kind == "exit" and isinstance(code, int) and not isinstance(code, bool):
        return {"stdout": stdout, "stderr": stderr,
                "outcome": {"type": "exit", "exit_code": code}}
    return None


def _screenshot(answer: Answer) -> dict[str, Any]:
    shot: dict[str, Any] = {"type": "computer_screenshot"}
    if answer.is_error:
        return shot
    given = _json(answer)
    if isinstance(given, dict):
        for field in ("image_url", "file_id"):
            value = given.get(field)
            if isinstance(value, str) and value:
                shot[field] = value
                return shot
    text = answer.content.strip()
    if text.startswith(_SCREENSHOT_URLS):
        shot["image_url"] = text
    return shot


def _approval(answer: Answer) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "mcp_approval_response",
                            "approval_request_id": answer.call_id}
    given = None if answer.is_error else _json(answer)
    if isinstance(given, dict) and isinstance(given.get("approve"), bool):
        item["approve"] = given["approve"]
        reason = given.get("reason")
        if isinstance(reason, str) and reason:
            item["reason"] = reason
        return item
    item["approve"] = not answer.is_error
    if answer.is_error and answer.content:
        item["reason"] = answer.content
    return item
