"""Strict JSON for argument text: RFC 8259 and nothing more, duplicate keys rejected.

Contract rule 1 forbids every kind of leniency: no trailing commas, comments, ``NaN``,
single quotes or repaired truncation. ``orjson`` is strict in all those ways and fast, so it
decides whether the text is JSON at all. It keeps the *last* of two equal keys silently,
though, and a runner whose parser keeps the *first* would then execute a value the
validator never saw. It also turns an integer beyond 64 bits into a rounded float, which
would commit a number the model never wrote. So a text that orjson accepts and that may hold
either (an object, an array, a float) is parsed a second time by the standard library with an
``object_pairs_hook`` that refuses a repeated key and a ``parse_int`` that refuses an integer
beyond 64 bits. Arguments are parsed once per call, at completion, so the second pass is cheap.

Arrays and objects nested deeper than :data:`MAX_DEPTH` levels are refused before the second
pass. The limit is Latch's own and fixed, so that the same text gets the same outcome
everywhere: without it, whether a deeply nested text passed would depend on how deep the
caller's stack is (the standard library parser and the JSON Schema validator recurse, and
raise ``RecursionError`` at a depth that depends on the caller), and a value that orjson reads
(up to 1024 levels) but cannot write back (beyond 254) would make the committed call
impossible to publish.

:func:`parse` never raises on bad text; it returns a :class:`ParseError` that holds a
position and a message safe to show (no argument text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

#: Deepest nesting of arrays and objects accepted in argument text (and, by
#: ``worker.core.envelope``, in an envelope); a value is one level, its members two.
MAX_DEPTH = 64


def nested_deeper(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` levels deep (iterative:
    no recursion, whatever the depth)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


@dataclass(frozen=True, slots=True)
class ParseError:
    """Why a text is not strict JSON: a message without argument text."""

    message: str


class _Refused(ValueError):
    """A text orjson accepted that the second pass refuses; the message is safe to show."""


class _DuplicateKey(_Refused):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey(f"duplicate object key in an object of {len(pairs)} members")
    return obj


def _int64(literal: str) -> int:
    value = int(literal)
    if not -(2**63) <= value < 2**64:
        raise _Refused(f"an integer of {len(literal)} characters is beyond 64 bits")
    return value


def _orjson_message(exc: orjson.JSONDecodeError) -> str:
    # orjson's message quotes no input text, only a description and a position.
    return f"{exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"


def parse(text: str) -> Any | ParseError:
    """Decode ``text`` strictly; return the value, or a :class:`ParseError`."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return ParseError(_orjson_message(exc))
    if value is None or isinstance(value, str | int):
        return value
    if nested_deeper(value):
        return ParseError(f"arrays and objects nested deeper than {MAX_DEPTH} levels")
    try:
        json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_int64)
    except _Refused as exc:
        return ParseError(str(exc))
    except (ValueError, RecursionError) as exc:  # orjson accepted it; stay safe anyway
        return ParseError(f"rejected by the duplicate-key pass ({type(exc).__name__})")
    return value
