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

Arguments also arrive already parsed, as a JSON value inside a provider event (Anthropic's
``tool_use.input``, a chat call whose ``function.arguments`` is an object, Gemini's
``functionCall.args`` and ``partialArgs``, the fields of a Responses ``computer_call``). By
then orjson has read the whole record, and a repeated key or an integer beyond 64 bits inside
the value is already lost. The same rules apply to them (issue 23): :func:`one_meaning` reads
the raw record that carried such a value again, as :func:`parse` reads text, and says why it
has no one meaning; the adapter then fails the call ``invalid_json``
(``ops.Adapter.arguments_text``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

#: Deepest nesting of arrays and objects accepted in argument text (and, by
#: ``worker.core.envelope``, in an envelope); a value is one level, its members two.
MAX_DEPTH = 64
#: Deepest nesting accepted in a record that carries arguments as a parsed value
#: (:func:`one_meaning`): the arguments' own :data:`MAX_DEPTH`, and room for the envelope and
#: the provider event around them (chat's ``function.arguments`` is 9 levels down).
RECORD_MAX_DEPTH = 2 * MAX_DEPTH


def nested_deeper(value: Any) -> bool:
    """Whether ``value`` nests arrays and objects more than :data:`MAX_DEPTH` levels deep
    (iterative: no recursion, whatever the depth)."""
    return _Shape(value).too_deep


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


#: The standard library decoder of the second pass, built once (``json.loads`` with hooks
#: builds one per call).
_SECOND_PASS = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_int=_int64)


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
    shape = _Shape(value)
    if shape.too_deep:
        return ParseError(f"arrays and objects nested deeper than {MAX_DEPTH} levels")
    if not shape.floats and shape.strings == _quoted_strings(text):
        return value  # nothing orjson could have dropped or rounded: no second pass needed
    try:
        _SECOND_PASS.decode(text)
    except _Refused as exc:
        return ParseError(str(exc))
    except (ValueError, RecursionError) as exc:  # orjson accepted it; stay safe anyway
        return ParseError(f"rejected by the duplicate-key pass ({type(exc).__name__})")
    return value


def one_meaning(record: bytes | str) -> ParseError | None:
    """None when every reader of the JSON ``record`` reads the value orjson reads: no object
    repeats a key, no integer is beyond 64 bits, nothing nests deeper than
    :data:`RECORD_MAX_DEPTH` levels (so that the check itself does not depend on the caller's
    stack). Else why not, in a message without record text. For the rare record that carries
    arguments as a parsed value; the common one is never read twice."""
    try:
        text = record.decode("utf-8") if isinstance(record, bytes) else record
        value = orjson.loads(text)
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return ParseError("the event that carried the arguments is not JSON")
    shape = _Shape(value, RECORD_MAX_DEPTH)
    if shape.too_deep:
        return ParseError("the event that carried the arguments nests arrays and objects "
                          f"deeper than {RECORD_MAX_DEPTH} levels")
    if not shape.floats and shape.strings == _quoted_strings(text):
        return None  # nothing orjson could have dropped or rounded
    try:
        _SECOND_PASS.decode(text)
    except _Refused as exc:
        return ParseError(f"{exc} in the event that carried the arguments")
    except (ValueError, RecursionError) as exc:  # orjson accepted it; stay safe anyway
        return ParseError(f"rejected by the duplicate-key pass ({type(exc).__name__})")
    return None


class _Shape:
    """One walk over a decoded value (iterative, whatever the depth): whether it nests deeper
    than :data:`MAX_DEPTH`, how many strings it holds (object keys and string values), and
    whether it holds a float.

    Together with :func:`_quoted_strings` this proves, for most texts, what the second pass
    would find. A repeated key makes orjson drop a member, and with it at least its key: the
    value then holds fewer strings than the text quotes. An integer beyond 64 bits becomes a
    float. So a value without floats that holds as many strings as the text has neither, and
    only the other texts pay for the standard library's slower pass."""

    __slots__ = ("floats", "strings", "too_deep")

    def __init__(self, value: Any, limit: int = MAX_DEPTH) -> None:
        self.too_deep = False
        self.floats = isinstance(value, float)
        self.strings = 0
        stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
        while stack:
            node, depth = stack.pop()
            if depth > limit:
                self.too_deep = True
                return
            if isinstance(node, dict):
                self.strings += len(node)
                children: Any = node.values()
            else:
                children = node
            for child in children:
                if isinstance(child, str):
                    self.strings += 1
                elif isinstance(child, dict | list):
                    stack.append((child, depth + 1))
                elif isinstance(child, float):
                    self.floats = True


def _quoted_strings(text: str) -> int:
    """How many strings a strict JSON ``text`` holds: its unescaped quotes, halved. Once every
    escaped backslash (a pair) is taken out, a backslash left before a quote escapes it."""
    if "\\" not in text:  # one character: a memchr, not a substring search
        return text.count('"') // 2
    if "\\\\" in text:
        text = text.replace("\\\\", "")
    return (text.count('"') - text.count('\\"')) // 2
