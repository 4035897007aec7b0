"""``worker.core.strictjson``: RFC 8259 and nothing more, duplicate keys refused (rule 1).

``parse`` is the only judge of an argument text: what it accepts is what the validator and
the runner see, so it must accept every strict JSON text, refuse every lenient one, refuse
any object with two equal keys, never raise, and never quote the text in its messages.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core import strictjson
from worker.core.strictjson import ParseError, parse

SECRET = "hunter2-SECRET"


@pytest.mark.parametrize("text", [
    "{}", "[]", '{"a": 1}', '{"a": [1, 2.5, -3e2, true, false, null]}', '"s"', "0", "-0.0",
    "true", "null", '{"nested": {"deep": {"deeper": [{"x": {}}]}}}',
    '{"esc": "\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\ud83d\\ude00"}',
    '{"utf8": "\u00e9\u6f22\U0001f600"}', ' \n\t{"ws": 1}\r\n ',
    '{"a": {"k": 1}, "b": {"k": 2}, "k": [{"k": 3}, {"k": 4}]}',
    '{"a": 1, "A": 2, "a ": 3}',
])
def test_accepts_strict_json(text: str) -> None:
    """Every RFC 8259 text is accepted and decodes to what the standard library decodes
    (equal keys in *different* objects, and keys differing in case or spaces, are fine)."""
    value = parse(text)
    assert not isinstance(value, ParseError)
    assert value == json.loads(text)


LENIENT = {
    "trailing_comma_object": '{"a": 1,}',
    "trailing_comma_array": "[1, 2,]",
    "line_comment": '{"a": 1} // c',
    "block_comment": '{"a": /* c */ 1}',
    "hash_comment": '# c\n{"a": 1}',
    "nan": '{"a": NaN}',
    "infinity": '{"a": Infinity}',
    "minus_infinity": '{"a": -Infinity}',
    "single_quoted_string": "{\"a\": 'x'}",
    "single_quoted_key": "{'a': 1}",
    "unquoted_key": "{a: 1}",
    "truncated_object": '{"a": 1',
    "truncated_string": '{"a": "x',
    "truncated_literal": '{"a": tru',
    "truncated_number": '{"a": 1.',
    "leading_zero": '{"a": 01}',
    "plus_sign": '{"a": +1}',
    "hex_number": '{"a": 0x1F}',
    "leading_dot": '{"a": .5}',
    "python_literals": '{"a": True, "b": None}',
    "invalid_escape": '{"a": "\\x41"}',
    "raw_control_char": '{"a": "line\nbreak"}',
    "lone_surrogate": '{"a": "\\ud800"}',
    "two_values": '{"a": 1} {"b": 2}',
    "missing_colon": '{"a" 1}',
    "missing_comma": '{"a": 1 "b": 2}',
    "empty": "",
    "whitespace_only": "   ",
    "bom": '\ufeff{"a": 1}',
    "overflowing_number": '{"a": 1e400}',
}


@pytest.mark.parametrize("text", list(LENIENT.values()), ids=list(LENIENT))
def test_refuses_lenient_json(text: str) -> None:
    """Trailing commas, comments, NaN/Infinity, single quotes, unquoted keys, repaired
    truncation and every other non-RFC form return a ParseError, never a value."""
    assert isinstance(parse(text), ParseError)


DUPLICATES = {
    "top_level": '{"a": 1, "a": 2}',
    "same_value": '{"a": 1, "a": 1}',
    "nested_object": '{"x": {"a": 1, "a": 2}}',
    "inside_array": '[{"ok": 1}, {"a": 1, "b": 2, "a": 3}]',
    "deeply_nested": '{"l1": {"l2": [{"l3": {"k": 1, "k": 2}}]}}',
    "escaped_equal": '{"path": 1, "p\\u0061th": 2}',
    "escaped_both": '{"\\u0061": 1, "\\u0061": 2}',
    "empty_key": '{"": 1, "": 2}',
}


@pytest.mark.parametrize("text", list(DUPLICATES.values()), ids=list(DUPLICATES))
def test_refuses_duplicate_keys(text: str) -> None:
    """Two equal keys in one object, at any depth and however they are escaped, are refused:
    a runner that keeps the first value would run what the validator never saw."""
    result = parse(text)
    assert isinstance(result, ParseError)
    assert "duplicate" in result.message


@pytest.mark.parametrize("template", [
    '{"@": 1, "@": 2}', '{"a": "@",}', '{"a": "@"', '{"a": @}', "{'@': 1}", '{"a": ["@", NaN]}',
    '{"a": 1e9@}', '{"a": 1@}',
])
def test_messages_never_quote_the_text(template: str) -> None:
    """A ParseError's message holds positions and descriptions only, never argument text
    (which may be a secret)."""
    result = parse(template.replace("@", SECRET))
    assert isinstance(result, ParseError)
    assert SECRET not in result.message
    assert "hunter" not in result.message


def test_message_gives_a_position() -> None:
    """An invalid text's message says where the problem is."""
    result = parse('{"a": 1,}')
    assert isinstance(result, ParseError)
    assert "column 8 (char 7)" in result.message


@pytest.mark.parametrize("text", [
    "[" * 100_000, "{\"a\":" * 50_000, '{"a": "' + "x" * 1_000_000, "\x00", "\ud800",
    '{"a": 1}' + "\x00", "[" * 1000 + "]" * 1000,
])
def test_never_raises(text: str) -> None:
    """Pathological input (deep nesting, huge strings, NULs, lone surrogates) returns a
    value or a ParseError; it never raises."""
    result: Any = parse(text)
    assert result is not None or text == "null"


def test_deep_but_valid_nesting_is_consistent() -> None:
    """Nesting that orjson accepts is either the same value or a ParseError, never a value
    the duplicate-key pass did not see."""
    text = "[" * 500 + "{}" + "]" * 500
    result = parse(text)
    assert isinstance(result, ParseError) or result == json.loads(text)


def test_integers_beyond_64_bits_are_refused() -> None:
    """An integer beyond 64 bits must not silently become a rounded float: the committed
    value would differ from the number the model wrote (and from what a runner parsing the
    provider's text sees). It is refused (safer than rounding: an id of 30 digits rounded
    names another record). Integers at the 64-bit edges still decode exactly."""
    for text in ('{"n": 123456789012345678901234567890}', "[18446744073709551616]",
                 "123456789012345678901234567890", '{"n": -9223372036854775809}'):
        result = parse(text)
        assert isinstance(result, ParseError), text
        assert "64 bits" in result.message
    edges = '{"max": 18446744073709551615, "min": -9223372036854775808}'
    assert parse(edges) == {"max": 2**64 - 1, "min": -(2**63)}
    assert parse('{"f": 1.5e300, "g": 12345678901234567890.0}') == {
        "f": 1.5e300, "g": 12345678901234567890.0}


# -- the shortcut past the second pass ----------------------------------------------------------

#: JSON pieces chosen to trip a count of quotes: escaped quotes and backslashes in keys and
#: values, a key written with a \u escape that equals another key, floats and huge integers.
_KEYS = ['"a"', '"b"', '"a\\\\"', '"a\\""', '"\\""', '"\\u0061"', '"\\\\\\""']
_SCALARS = ['"a"', '"a\\\\"', '"a\\""', '"\\\\\\""', '"\\\\\\\\"', '"\\u0022"', '"\\n"', "1",
            "2.5", "18446744073709551616", "-9223372036854775809", "true", "null"]


def _texts() -> st.SearchStrategy[str]:
    scalars = st.sampled_from(_SCALARS)

    def nest(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        members = st.lists(st.tuples(st.sampled_from(_KEYS), children), max_size=4)
        return (members.map(lambda ms: "{" + ",".join(f"{k}:{v}" for k, v in ms) + "}")
                | st.lists(children, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"))
    return st.recursive(scalars, nest, max_leaves=12)


def _always_second_pass(text: str) -> Any:
    """What ``parse`` decided before the shortcut: orjson, then always the standard library
    pass with its duplicate-key and 64-bit hooks."""
    value = orjson.loads(text)
    try:
        strictjson._SECOND_PASS.decode(text)
    except ValueError:
        return "refused"
    return value


@settings(max_examples=2000, deadline=None)
@given(_texts())
def test_the_shortcut_decides_as_the_second_pass(text: str) -> None:
    """``parse`` skips the standard library's pass when a count of the text's quoted strings
    proves there is no repeated key and no float proves there is no integer beyond 64 bits.
    Over texts built to fool a count (escaped quotes and backslashes in keys, a ``\\u`` key
    equal to another, huge integers), it refuses and accepts exactly what the pass does."""
    got = parse(text)
    assert ("refused" if isinstance(got, ParseError) else got) == _always_second_pass(text)


def test_the_shortcut_is_taken_for_plain_arguments() -> None:
    """The common argument text (no float, no repeated key) is decided without the second
    pass, escapes included; a repeated key still reaches it."""
    calls: list[str] = []
    second = strictjson._SECOND_PASS

    class Spy(json.JSONDecoder):  # a decoder, as the (possibly compiled) module expects
        def decode(self, text: str) -> Any:  # type: ignore[override]
            calls.append(text)
            return second.decode(text)

    strictjson._SECOND_PASS = Spy()
    try:
        assert parse('{"path": "/tmp/a \\"b\\"", "content": "x\\\\y\\n"}') == {
            "path": '/tmp/a "b"', "content": "x\\y\n"}
        assert calls == []
        assert isinstance(parse('{"a": "x", "a": "y"}'), ParseError)
        assert len(calls) == 1
    finally:
        strictjson._SECOND_PASS = second
