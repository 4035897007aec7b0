"""The result records a runner publishes on ``tool.calls.results``
(``schemas/tool-result.schema.json``): one per committed call, whatever its tool returned or
raised (:mod:`worker.client.runner` decides when, this module what)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["MAX_RESULT_BYTES", "ToolResult", "answer", "content_of", "escaped", "failure",
           "outcome_of", "result_record"]

#: The most bytes a result's content may hold, JSON-escaped as the record carries it (the
#: results topic takes ~1 MB records).
MAX_RESULT_BYTES = 900_000


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's result that says more than a return value can: whether it is an error, and a
    structured value beside the text (an MCP tool's ``isError`` and ``structuredContent``,
    :mod:`worker.client.mcp`). A tool function may return one; the runner sends it as the
    result's ``is_error``, ``content`` and ``structured``."""

    content: str
    is_error: bool = False
    #: Any JSON value (None: the tool gave none; the record then has no ``structured``).
    structured: Any = None


def result_record(call: Mapping[str, Any], is_error: bool, content: str,
                  structured: Any = None) -> dict[str, Any]:
    """The ``tool.calls.results`` value answering the committed ``call`` (``structured``: the
    MCP tool's ``structuredContent``, when it gave one; None: left out)."""
    record = {"v": 1, "run_id": call["run_id"], "tenant": call["tenant"],
              "provider": call["provider"], "tool_call_id": call["call_id"],
              "name": call["name"], "idempotency_key": call["idempotency_key"],
              "is_error": is_error, "content": content}
    if structured is not None:
        record["structured"] = structured
    return record


def outcome_of(result: Any) -> tuple[bool, str, Any]:
    """A tool's return value as ``(is_error, content, structured)``: a :class:`ToolResult` as
    it says (its content a plain ``str``), anything else as :func:`content_of` (no structured
    value)."""
    if isinstance(result, ToolResult):
        if not isinstance(result.content, str):
            return True, "the tool returned a ToolResult whose content is not text", None
        return bool(result.is_error), str.__str__(result.content), result.structured
    return (*content_of(result), None)


def content_of(result: Any) -> tuple[bool, str]:
    """A tool's return value as the result's content: a string as is, anything else as JSON
    (or an error result when it is not JSON)."""
    if isinstance(result, str):
        return False, str.__str__(result)  # a subclass's own __str__ is not asked
    try:
        return False, orjson.dumps(result).decode()
    except Exception as exc:  # orjson's TypeError; a lone surrogate is one, too
        return True, f"the tool returned a value that is not JSON ({type(exc).__name__})"


def escaped(text: str) -> str:
    """``text`` without lone surrogates (what Python decodes a non-UTF-8 file name to,
    ``os.fsdecode(b"\\xff")``): each becomes the six characters ``\\udcff``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def failure(exc: BaseException) -> str:
    """An exception as an error result's content: its type, then its message."""
    try:
        message = str(exc)
    except Exception:  # a __str__ that raises, or returns something other than a str
        return f"{type(exc).__name__} (its message could not be read)"
    return f"{type(exc).__name__}: {message}"[:2000]


def answer(call: Mapping[str, Any], is_error: bool, content: str, max_bytes: int,
           structured: Any = None) -> bytes:
    """The result record answering ``call``, as bytes: always one record. A lone surrogate
    in ``content`` is escaped; content whose JSON text (with ``structured``'s, when there is
    one) is over ``max_bytes`` becomes an error result (the record would not reach the
    results topic), and so does a ``structured`` value that is not JSON (its text never
    quoted)."""
    try:
        text = orjson.dumps(content)
    except TypeError:  # a lone surrogate: the only str orjson refuses
        content = escaped(content)
        text = orjson.dumps(content)
    size = len(text) - 2
    if structured is not None:
        try:
            size += len(orjson.dumps(structured))
        except TypeError as exc:  # not JSON (or an integer past 64 bits)
            is_error, structured = True, None
            content = f"the tool's structured result is not JSON ({type(exc).__name__})"
    if size > max_bytes:
        is_error, content = True, f"the tool's result is larger than {max_bytes} bytes"
        structured = None
    return orjson.dumps(result_record(call, is_error, content, structured))
