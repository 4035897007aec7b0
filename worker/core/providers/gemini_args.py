"""Gemini's streamed function call arguments (``partialArgs``), held opaque and built at the end.

With ``streamFunctionCallArguments`` a Gemini ``functionCall`` part carries no ``args`` object
but ``partialArgs[]``, each a ``PartialArg`` (google-genai ``types.PartialArg``)::

    {"jsonPath": "$.operations[0].action", "stringValue": "add", "willContinue": true}

``jsonPath`` is an RFC 9535 JSONPath that names one location in the arguments object; the
value is exactly one of ``stringValue``, ``numberValue``, ``boolValue`` or ``nullValue``; and
``willContinue: true`` says that the next ``PartialArg`` continues the same path (a long string
arrives in pieces, the pieces concatenated).

Contract rule 1 holds here as for JSON text: while the call streams, nothing is parsed or
built. Each ``PartialArg`` becomes one *record* appended to the call's buffer, as opaque text,
counted against ``max_tool_argument_bytes`` and the partition's byte budget like any fragment:
an RFC 7464 JSON text sequence record, ``RS [path, value, continues] LF`` (``RS`` is U+001E,
which no JSON text starts with, so a buffer of records is never mistaken for a whole call's
JSON ``args``). A ``PartialArg`` that is not well formed becomes a record that :func:`build`
refuses, so the call fails ``invalid_json`` at its end instead of committing without it.

:func:`build` runs once, when the call is complete, and is as strict as ``strictjson``:

* each path is a *singular* JSONPath: ``$`` then ``.name`` (RFC 9535 member-name-shorthand),
  ``['name']`` / ``["name"]`` (with the RFC's escapes) or ``[n]`` (a non-negative index without
  leading zeros); wildcards, slices, filters, negative indexes and descendants are refused;
* a path is at most :data:`MAX_PATH_CHARACTERS` long and names a location at most
  ``strictjson.MAX_DEPTH - 1`` levels below the arguments object (which is one level);
* containers are made as the paths need them; an array index must be an existing element or
  the next one (never a gap: no record can make a large array out of nothing);
* a location gets one value: a second value for it (``$.a`` twice, or ``$.a`` and
  ``$['a']``) is a duplicate key; a path through a value that is not a container, or through
  a container of the other kind, conflicts;
* ``willContinue`` is only for strings, and the next record must continue the same path with a
  string; a string still open at the end was never finished.

Each record is at least as long as what it adds to the built object's JSON (its path holds
every key it opens, quoted at least as long), so the built arguments are never longer than the
counted text.
"""

from __future__ import annotations

from typing import Any

import orjson

from worker.core.strictjson import MAX_DEPTH, ParseError

#: The record separator that starts each record (RFC 7464).
RS = "\x1e"
#: The longest ``jsonPath`` accepted, in characters.
MAX_PATH_CHARACTERS = 4096
_VALUE_FIELDS = ("stringValue", "numberValue", "boolValue", "nullValue")
#: The fields of a ``PartialArg`` in camelCase and in the proto JSON mapping's snake_case.
_SPELLINGS = (("jsonPath", "json_path"), ("willContinue", "will_continue"),
              *((f, f[:-5] + "_value") for f in _VALUE_FIELDS))
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "/": "/", "\\": "\\",
            "'": "'", '"': '"'}


def record(partial: Any) -> str:
    """The buffer record of one ``PartialArg`` (never raises; a malformed one gives a record
    that :func:`build` refuses)."""
    if not isinstance(partial, dict):
        return _poison("a partial argument that is not an object")
    if any(camel in partial and snake in partial for camel, snake in _SPELLINGS):
        return _poison("a partial argument with a field in both spellings")
    path = partial.get("jsonPath", partial.get("json_path"))
    if not isinstance(path, str):
        return _poison("a partial argument without a jsonPath string")
    present = [f for f in _VALUE_FIELDS if f in partial or _snake(f) in partial]
    if len(present) != 1:
        return _poison(f"a partial argument with {len(present)} values, not one")
    field = present[0]
    value = partial.get(field, partial.get(_snake(field)))
    if field == "nullValue":
        value = None
    elif not _has_type(field, value):
        return _poison(f"a partial argument whose {field} has the wrong type")
    more = partial.get("willContinue", partial.get("will_continue"))
    try:
        text = orjson.dumps([path, value, more is True]).decode()
    except orjson.JSONEncodeError:  # a float that JSON cannot hold (never from JSON input)
        return _poison("a partial argument whose value is not JSON")
    return f"{RS}{text}\n"


def _snake(field: str) -> str:
    return field[:-5] + "_value"


def _has_type(field: str, value: Any) -> bool:
    if field == "stringValue":
        return isinstance(value, str)
    if field == "boolValue":
        return isinstance(value, bool)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _poison(why: str) -> str:
    return f"{RS}{orjson.dumps({'refused': why}).decode()}\n"


def refused(why: str) -> str:
    """A record that :func:`build` refuses with ``why`` (a message without argument text):
    for ``partialArgs`` whose event has no one meaning (``strictjson.one_meaning``)."""
    return _poison(why)


def is_records(text: str) -> bool:
    """Whether a buffer holds ``partialArgs`` records rather than a whole call's JSON."""
    return text.startswith(RS)


def build(text: str) -> dict[str, Any] | ParseError:
    """The arguments object that a complete buffer of records describes, or why there is none
    (a message that quotes no argument text)."""
    root: dict[str, Any] = {}
    open_string: tuple[Any, Any, str] | None = None  # (container, key, path) of a string
    for number, raw in enumerate(text.split(RS)[1:], start=1):
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return ParseError(f"partial argument {number} is not a record")
        if isinstance(item, dict):
            return ParseError(f"partial argument {number}: {item.get('refused')}")
        if not isinstance(item, list) or len(item) != 3:
            return ParseError(f"partial argument {number} is not a record")
        path, value, more = item
        if open_string is not None:
            container, key, open_path = open_string
            if path != open_path or not isinstance(value, str):
                return ParseError(f"partial argument {number} does not continue the string "
                                  "before it")
            container[key] += value
        else:
            placed = _place(root, path, value)
            if isinstance(placed, str):
                return ParseError(f"partial argument {number}: {placed}")
            container, key = placed
        if more and not isinstance(value, str):
            return ParseError(f"partial argument {number} continues a value that is not a "
                              "string")
        open_string = (container, key, path) if more else None
    if open_string is not None:
        return ParseError("a streamed string value was never finished")
    return root


def _place(root: dict[str, Any], path: str, value: Any) -> tuple[Any, Any] | str:
    """Put ``value`` at ``path`` under ``root``; return where it went, or what is wrong."""
    segments = parse_path(path)
    if isinstance(segments, str):
        return segments
    if not segments:
        return "a value for the whole arguments object"
    node: Any = root
    for position, segment in enumerate(segments):
        last = position == len(segments) - 1
        if isinstance(segment, str):
            if not isinstance(node, dict):
                return "a member name applied to an array"
            if last:
                if segment in node:
                    return "a second value for the same location (a duplicate key)"
                node[segment] = value
                return node, segment
            child = node.get(segment)
            if child is None and segment not in node:
                child = node[segment] = [] if isinstance(segments[position + 1], int) else {}
        else:
            if not isinstance(node, list):
                return "an array index applied to an object"
            if segment > len(node):
                return "an array index beyond the next element"
            if last:
                if segment < len(node):
                    return "a second value for the same location (a duplicate element)"
                node.append(value)
                return node, segment
            if segment == len(node):
                node.append([] if isinstance(segments[position + 1], int) else {})
            child = node[segment]
        if not isinstance(child, dict | list):
            return "a path through a value that is not an object or array"
        node = child
    raise AssertionError("unreachable")  # pragma: no cover


def parse_path(path: str) -> list[str | int] | str:
    """The segments of a singular RFC 9535 JSONPath (``$.a['b'][0]``), or what is wrong with
    it. Bounded: at most :data:`MAX_PATH_CHARACTERS` characters and ``MAX_DEPTH - 1``
    segments, one pass."""
    if len(path) > MAX_PATH_CHARACTERS:
        return f"a jsonPath longer than {MAX_PATH_CHARACTERS} characters"
    if not path.startswith("$"):
        return "a jsonPath that does not start with $"
    segments: list[str | int] = []
    at, end = 1, len(path)
    while at < end:
        if len(segments) >= MAX_DEPTH - 1:
            return f"a jsonPath deeper than {MAX_DEPTH - 1} levels"
        char = path[at]
        if char == ".":
            start = at = at + 1
            while at < end and _name_char(path[at], at == start):
                at += 1
            if at == start:
                return "a jsonPath with an empty or invalid member name"
            segments.append(path[start:at])
        elif char == "[":
            parsed = _bracket(path, at + 1)
            if isinstance(parsed, str):
                return parsed
            segment, at = parsed
            segments.append(segment)
        else:
            return "a jsonPath that is not a singular query"
    return segments


def _name_char(char: str, first: bool) -> bool:
    """RFC 9535 member-name-shorthand: ALPHA / "_" / non-ASCII, then DIGIT too."""
    if char.isascii():
        return char.isalpha() or char == "_" or (not first and char.isdigit())
    return not 0xD800 <= ord(char) <= 0xDFFF  # (mypyc takes no surrogate in a literal)


def _bracket(path: str, at: int) -> tuple[str | int, int] | str:
    """The segment inside ``[...]`` starting at ``at``, and the position after ``]``."""
    end = len(path)
    if at < end and path[at] in "'\"":
        quote, chars = path[at], []
        at += 1
        while at < end and path[at] != quote:
            char = path[at]
            if char == "\\":
                escaped = _escape(path, at + 1)
                if escaped is None:
                    return "a jsonPath with an invalid escape"
                char, at = escaped
            else:
                if char < " ":
                    return "a jsonPath with a control character in a name"
                at += 1
            chars.append(char)
        if at + 1 >= end or path[at + 1] != "]":
            return "a jsonPath with an unterminated name"
        return "".join(chars), at + 2
    start = at
    while at < end and path[at].isascii() and path[at].isdigit():
        at += 1
    digits = path[start:at]
    if not digits or at >= end or path[at] != "]":
        return "a jsonPath with a selector other than a name or an index"
    if (len(digits) > 1 and digits[0] == "0") or len(digits) > 15:
        return "a jsonPath with an invalid index"
    return int(digits), at + 1


def _escape(path: str, at: int) -> tuple[str, int] | None:
    if at >= len(path):
        return None
    char = path[at]
    if char in _ESCAPES:
        return _ESCAPES[char], at + 1
    if char == "u":
        digits = path[at + 1:at + 5]
        if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
            code = int(digits, 16)
            if not 0xD800 <= code <= 0xDFFF:  # a lone surrogate: never a name JSON can carry
                return chr(code), at + 5
    return None
