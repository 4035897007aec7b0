"""The result records a runner publishes on ``tool.calls.results``
(``schemas/tool-result.schema.json``): one per committed call, whatever its tool returned or
raised (:mod:`worker.client.runner` decides when, this module what)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["MAX_RESULT_BYTES", "answer", "content_of", "escaped", "failure", "result_record"]

#: The most bytes a result's content may hold, JSON-escaped as the record carries it (the
#: results topic takes ~1 MB records).
MAX_RESULT_BYTES = 900_000


def result_record(call: Mapping[str, Any], is_error: bool, content: str) -> dict[str, Any]:
    """The ``tool.calls.results`` value answering the committed ``call``."""
    return {"v": 1, "run_id": call["run_id"], "tenant": call["tenant"],
            "provider": call["provider"], "tool_call_id": call["call_id"],
            "name": call["name"], "idempotency_key": call["idempotency_key"],
            "is_error": is_error, "content": content}


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


def answer(call: Mapping[str, Any], is_error: bool, content: str, max_bytes: int) -> bytes:
    """The result record answering ``call``, as bytes: always one record. A lone surrogate
    in ``content`` is escaped; content whose JSON text is over ``max_bytes`` becomes an
    error result (the record would not reach the results topic)."""
    try:
        text = orjson.dumps(content)
    except TypeError:  # a lone surrogate: the only str orjson refuses
        content = escaped(content)
        text = orjson.dumps(content)
    if len(text) - 2 > max_bytes:
        is_error, content = True, f"the tool's result is larger than {max_bytes} bytes"
    return orjson.dumps(result_record(call, is_error, content))
