"""``worker.core.providers.gemini_args``: the Gemini ``partialArgs`` builder and its JSONPath
reader (singular queries only, bounded in depth and length, never longer than the records).
"""

from __future__ import annotations

from typing import Any

import pytest

from worker.core.providers import gemini_args
from worker.core.strictjson import MAX_DEPTH, ParseError


def records(*partials: dict[str, Any]) -> str:
    return "".join(gemini_args.record(p) for p in partials)


# -- JSONPath --------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "segments"), [
    ("$.a", ["a"]),
    ("$.operations[0].action", ["operations", 0, "action"]),
    ("$['a b']['c\\'d'][12]", ["a b", "c'd", 12]),
    ('$["x\\u0041\\n"]', ["xA\n"]),
    ("$._x1.é", ["_x1", "é"]),
])
def test_parse_path_reads_singular_queries(path: str, segments: list[Any]) -> None:
    """Names (shorthand and quoted, with RFC 9535 escapes) and indexes are read as segments."""
    assert gemini_args.parse_path(path) == segments


@pytest.mark.parametrize("path", [
    "a", "$.", "$.1a", "$[*]", "$..a", "$[-1]", "$[01]", "$[0:2]", "$[?@.a]", "$['a'",
    "$.a b", "$['\\x']", "$['\\ud800']", "$[1234567890123456]", "$.a\ud800", "$.\udfff",
])
def test_parse_path_refuses_everything_else(path: str) -> None:
    """Wildcards, descendants, slices, filters, negative or padded indexes, bad escapes and
    unterminated names are refused with a message (a string), never an exception."""
    assert isinstance(gemini_args.parse_path(path), str)


def test_parse_path_is_bounded() -> None:
    """A path deeper than MAX_DEPTH - 1 segments, or longer than MAX_PATH_CHARACTERS, is
    refused before any container is made."""
    assert isinstance(gemini_args.parse_path("$" + ".a" * MAX_DEPTH), str)
    assert gemini_args.parse_path("$" + ".a" * (MAX_DEPTH - 1)) == ["a"] * (MAX_DEPTH - 1)
    long = "$." + "a" * gemini_args.MAX_PATH_CHARACTERS
    assert "longer" in str(gemini_args.parse_path(long))


# -- building the arguments --------------------------------------------------------------------


def test_build_joins_strings_and_nests() -> None:
    """Strings continued with willContinue are joined; objects and arrays are made as the
    paths need them; numbers, booleans and null keep their types."""
    text = records({"jsonPath": "$.a.b", "stringValue": "he", "willContinue": True},
                   {"jsonPath": "$.a.b", "stringValue": "llo"},
                   {"jsonPath": "$.list[0]", "numberValue": 1},
                   {"jsonPath": "$.list[1].ok", "boolValue": True},
                   {"jsonPath": "$.none", "nullValue": "NULL_VALUE"},
                   {"json_path": "$.snake", "string_value": "s"})
    assert gemini_args.build(text) == {"a": {"b": "hello"}, "list": [1, {"ok": True}],
                                       "none": None, "snake": "s"}


@pytest.mark.parametrize(("partials", "why"), [
    ([{"jsonPath": "$.a", "stringValue": "x"}, {"jsonPath": "$['a']", "stringValue": "y"}],
     "duplicate key"),
    ([{"jsonPath": "$.a[1]", "numberValue": 1}], "beyond the next element"),
    ([{"jsonPath": "$.a", "numberValue": 1}, {"jsonPath": "$.a.b", "numberValue": 1}],
     "not an object or array"),
    ([{"jsonPath": "$.a[0]", "numberValue": 1}, {"jsonPath": "$.a.b", "numberValue": 1}],
     "member name applied to an array"),
    ([{"jsonPath": "$.a", "stringValue": "x", "willContinue": True}], "never finished"),
    ([{"jsonPath": "$.a", "stringValue": "x", "willContinue": True},
      {"jsonPath": "$.b", "stringValue": "y"}], "does not continue"),
    ([{"jsonPath": "$.a", "numberValue": 1, "willContinue": True},
      {"jsonPath": "$.a", "numberValue": 2}], "not a string"),
    ([{"jsonPath": "$", "numberValue": 1}], "whole arguments object"),
    ([{"jsonPath": "$[*]", "numberValue": 1}], "a selector other than"),
    ([{"jsonPath": "$.a"}], "0 values"),
    ([{"jsonPath": "$.a", "stringValue": "x", "numberValue": 1}], "2 values"),
    ([{"jsonPath": "$.a", "numberValue": "1"}], "wrong type"),
    ([{"stringValue": "x"}], "jsonPath"),
    (["not an object"], "not an object"),
])
def test_build_refuses_with_a_reason(partials: list[Any], why: str) -> None:
    """Every way a sequence of partial arguments fails to describe one strict object gives a
    ParseError (the call fails invalid_json), whose message says why and quotes no value."""
    result = gemini_args.build("".join(gemini_args.record(p) for p in partials))
    assert isinstance(result, ParseError), result
    assert why in result.message
    assert "'x'" not in result.message and '"x"' not in result.message


def test_build_is_never_longer_than_the_records() -> None:
    """What a record adds to the built JSON is never longer than the record (the counted
    bytes bound the built arguments)."""
    import orjson
    partials = [{"jsonPath": f"$.k{n}[0]['q']", "stringValue": "v" * n} for n in range(30)]
    text = records(*partials)
    assert len(orjson.dumps(gemini_args.build(text))) <= len(text.encode())
