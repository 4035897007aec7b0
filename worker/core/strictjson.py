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

:func:`parse` never raises on bad text; it returns a :class:`ParseError` that holds a
position and a message safe to show (no argument text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson


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
    try:
        json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_int64)
    except _Refused as exc:
        return ParseError(str(exc))
    except (ValueError, RecursionError) as exc:  # orjson accepted it; stay safe anyway
        return ParseError(f"rejected by the duplicate-key pass ({type(exc).__name__})")
    return value
