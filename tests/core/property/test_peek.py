"""``worker.core._peek`` (worker/core/csrc/peek.c) against orjson's parse of the same bytes.

``peek`` reads the common provider event (a text delta, an argument fragment) without building
its objects; ``Assembler.feed_record`` then skips ``orjson.loads``. That is only right if

* **it never reads what orjson would refuse or read otherwise**: whatever the bytes, a tuple
  from ``peek`` comes with ``orjson.loads`` accepting the same bytes, and the tuple is
  :func:`reference` of orjson's value, a model in Python of what peek.c documents (hostile
  bytes: invalid UTF-8, surrogates, numbers beyond a double, duplicate members, depth, junk);
* **it reads what it documents**: for any document orjson writes (no duplicate members), near
  the six shapes or not, ``peek`` answers exactly :func:`reference`'s answer, so the fast path
  is neither dead nor wider than the model;
* **the outputs do not change**: damaged sequences of every provider, fed with and without
  ``peek``, give the same records and counters.

The extension is built with the compiled core only (setup.py); in a pure-Python install these
tests are skipped, and CI's compiled step (``LATCH_EXPECT_COMPILED=1``) runs them.
"""

from __future__ import annotations

import os
import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mutation_fuzz import SETTINGS, mutate_bytes, records

from worker.core import Assembler
from worker.core import ops as op
from worker.core.envelope import TICK_KEY

try:
    from worker.core import _peek
except ImportError:  # a pure-Python install
    _peek = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(
    _peek is None and os.environ.get("LATCH_EXPECT_COMPILED") != "1",
    reason="worker.core._peek is built with the compiled core only: CI's compiled step runs "
           "these tests")

Peeked = tuple[int, str, int, "int | None", int, str]
RESPONSES_ARGS_TYPES = ("response.function_call_arguments.delta",
                        "response.custom_tool_call_input.delta")


def _peek_fn() -> Any:
    assert _peek is not None, "LATCH_EXPECT_COMPILED=1 but worker.core._peek is not built"
    return _peek.peek


# -- the model --------------------------------------------------------------------------------


def _int(value: Any) -> bool:
    """An integer as JSON has it (orjson reads one beyond 64 bits as a float; a bool is no
    integer)."""
    return type(value) is int


def _index(value: Any) -> bool:
    """An index as every adapter reads it (issue 23): an integer >= 0, never a bool, a float
    (``1.0``) or a negative."""
    return _int(value) and value >= 0


def _shape(event: dict[str, Any]) -> tuple[int, int, str] | None:
    kind = event.get("type")
    if kind == "content_block_delta":
        index, delta = event.get("index"), event.get("delta")
        if not _index(index) or type(delta) is not dict:
            return None
        if delta.get("type") == "text_delta" and type(delta.get("text")) is str:
            return op.ANTHROPIC_TEXT, index, delta["text"]
        if delta.get("type") == "input_json_delta" and type(delta.get("partial_json")) is str:
            return op.ANTHROPIC_JSON, index, delta["partial_json"]
        return None
    if kind == "response.output_text.delta" or kind in RESPONSES_ARGS_TYPES:
        index, text = event.get("output_index"), event.get("delta")
        if not _index(index) or type(text) is not str:
            return None
        return (op.RESPONSES_TEXT if kind == "response.output_text.delta"
                else op.RESPONSES_ARGS if kind == RESPONSES_ARGS_TYPES[0]
                else op.RESPONSES_INPUT), index, text
    choices = event.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return None
    choice = choices[0]
    if "index" in choice and not (_int(choice["index"]) and choice["index"] == 0):
        return None
    delta = choice.get("delta")
    if choice.get("finish_reason") is not None or type(delta) is not dict or len(delta) != 1:
        return None
    if type(delta.get("content")) is str and delta["content"]:
        return op.CHAT_TEXT, 0, delta["content"]
    calls = delta.get("tool_calls")
    if type(calls) is not list or len(calls) != 1 or type(calls[0]) is not dict:
        return None
    entry = calls[0]
    function = entry.get("function")
    if not _index(entry.get("index")) or entry.get("id") is not None or type(function) is not dict:
        return None
    if type(function.get("arguments")) is not str or function.get("name") is not None:
        return None
    return op.CHAT_ARGS, entry["index"], function["arguments"]


def reference(doc: Any) -> Peeked | None:
    """What peek.c documents, read from orjson's value of the record."""
    if type(doc) is not dict or doc.get("type") != "provider.event":
        return None
    run_id, version, seq, ts, event = (doc.get(k) for k in ("run_id", "v", "seq", "ts",
                                                            "event"))
    if type(run_id) is not str or not _int(seq) or not (_int(version) and version == 1):
        return None
    if not (ts is None or (_int(ts) and ts >= 0)) or type(event) is not dict:
        return None
    shape = _shape(event)
    if shape is None:
        return None
    kind, index, text = shape
    return kind, run_id, seq, ts, index, text


# -- documents near the six shapes ------------------------------------------------------------

MISSING = object()
#: Values of a JSON type or range a member should not have.
ODD = st.sampled_from([None, True, False, 1.5, 0.0, -0.0, 1.0, "0", "", [], {}, [1],
                      {"a": 1}])
INT = st.sampled_from([0, 0, 1, 2, 3, -1, 2**63, 2**64 - 1, -2**63])
TEXT = st.one_of(st.text(max_size=6), st.sampled_from(
    ["", "é°C", "\x00", 'a"b\\', "\u2028", "😀", "\ud7ff", "\ue000", "x" * 300]))


def _obj(**members: Any) -> Any:
    """A dict strategy whose members may each be left out (``MISSING``)."""
    return st.fixed_dictionaries(members).map(
        lambda d: {k: v for k, v in d.items() if v is not MISSING})


def _maybe(strategy: Any, *others: Any) -> Any:
    return st.one_of(strategy, st.just(MISSING), ODD, *[st.just(o) for o in others])


ANTHROPIC = _obj(
    type=st.sampled_from(["content_block_delta", "content_block_delta", "content_block_stop",
                          "message_delta"]),
    index=_maybe(INT),
    delta=st.one_of(_obj(type=st.sampled_from(["text_delta", "input_json_delta",
                                               "thinking_delta", "text"]),
                         text=_maybe(TEXT), partial_json=_maybe(TEXT),
                         thinking=_maybe(TEXT)), ODD))
RESPONSES = _obj(
    type=st.sampled_from(["response.output_text.delta", *RESPONSES_ARGS_TYPES,
                          "response.output_text.done", "response.function_call_arguments.done"]),
    output_index=_maybe(INT), item_id=_maybe(st.just("fc_1")), delta=_maybe(TEXT),
    sequence_number=_maybe(INT), obfuscation=_maybe(st.just("k3ad")))
ENTRY = _obj(index=_maybe(INT), id=_maybe(st.just("call_1"), None, None, ""),
             type=_maybe(st.just("function")),
             function=st.one_of(_obj(arguments=_maybe(TEXT), name=_maybe(st.just("f"), None)),
                                ODD))
CHOICE = _obj(
    index=st.sampled_from([0, 0, MISSING, MISSING, 1, -1, True, None, 0.0, "0"]),
    finish_reason=st.sampled_from([MISSING, MISSING, None, None, "stop", "length", 0, {}]),
    logprobs=_maybe(st.none()),
    delta=st.one_of(
        _obj(content=_maybe(TEXT)),
        _obj(tool_calls=st.one_of(st.lists(ENTRY, min_size=1, max_size=2), ODD)),
        _obj(content=_maybe(TEXT), role=_maybe(st.just("assistant")),
             tool_calls=_maybe(st.lists(ENTRY, max_size=1))),
        ODD))
CHAT = _obj(
    id=_maybe(st.just("chatcmpl-1")), object=_maybe(st.just("chat.completion.chunk")),
    type=_maybe(st.sampled_from(["content_block_delta", "response.output_text.delta", "x"])),
    choices=st.one_of(st.lists(CHOICE, min_size=1, max_size=2), ODD))
ENVELOPE = _obj(
    type=st.sampled_from(["provider.event", "provider.event", "provider.event", "run.start",
                          "stream.end"]),
    run_id=_maybe(st.sampled_from(["r", "run-😀", "", "a" * 200])),
    v=st.sampled_from([1, 1, 1, MISSING, 2, 0, True, 1.0, "1"]),
    seq=_maybe(INT),
    ts=st.sampled_from([MISSING, MISSING, None, 0, 5, 2**64 - 1, -1, True, 1.5, "5"]),
    event=st.one_of(ANTHROPIC, RESPONSES, CHAT, ODD),
    extra=_maybe(st.just({"nested": [1, 2, {"x": None}]})))


@settings(max_examples=1500, deadline=None)
@given(doc=ENVELOPE)
def test_peek_answers_what_the_model_reads_from_orjsons_value(doc: dict[str, Any]) -> None:
    """A document as orjson writes it (no duplicate members): peek's answer is the model's,
    None or the same tuple."""
    value = orjson.dumps(doc)
    assert _peek_fn()(value) == reference(orjson.loads(value))


HOSTILE = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"\x00", b"\x1f", b"\x7f", b"\xff",
           b"\xc3", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xef\xbb\xbf", b"1e400",
           b"-1e400", b"-0", b"1.0", b"18446744073709551616", b"\\ud800", b"\\udc00",
           b"\\ud800\\udc00", b"\\u0000", b"\\x41", b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c",
           b"tru", b"null", b"NaN", b"Infinity", b"//", b"/*", b",}", b"\"\":0,",
           b'"type":"x",', b'"run_id":"q",', b'"seq":1,', b'"index":9,', b'"text":"t",',
           b'"delta":"d",', b'"content":"c",']


def _damaged(rng: random.Random, value: bytes) -> bytes:
    """``value`` with one to three changes: mutation_fuzz's byte damage, or a hostile piece
    inserted or written over the bytes at a random place."""
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.3:
            value = mutate_bytes(rng, value)
            continue
        piece = rng.choice(HOSTILE)
        at = rng.randrange(len(value) + 1)
        value = value[:at] + piece + value[at + (len(piece) if roll < 0.6 else 0):]
    return value


@settings(max_examples=3000, deadline=None)
@given(doc=ENVELOPE, seed=st.integers(0, 2**32 - 1))
def test_a_damaged_record_is_read_as_orjson_reads_it_or_left_to_it(
        doc: dict[str, Any], seed: int) -> None:
    """Whatever the bytes: when peek answers, orjson accepts the same bytes, and the answer
    is the model's reading of orjson's value (a member read twice, which orjson keeps the last
    of, is left to orjson)."""
    value = _damaged(random.Random(seed), orjson.dumps(doc))
    answer = _peek_fn()(value)
    if answer is not None:
        assert answer == reference(orjson.loads(value))


DELTA = b'{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"hi"}}'


def _envelope(event: bytes = DELTA, head: bytes = b"") -> bytes:
    return (b'{' + head + b'"type":"provider.event","run_id":"r","v":1,"seq":3,"event":'
            + event + b'}')


@pytest.mark.parametrize(("value", "orjson_reads_it"), [
    (_envelope(head=b'"x":1e400,'), False),  # a number beyond a double in an unread member
    (_envelope(head=b'"x":"\xff",'), False),  # invalid UTF-8 in an unread string
    (_envelope(head=b'"x":"\xed\xa0\x80",'), False),  # a UTF-8-encoded surrogate
    (_envelope(head=b'"\xc3\x28":0,'), False),  # invalid UTF-8 in an unread key
    (_envelope(head=b'"x":"\\ud800",'), False),  # a lone surrogate escape
    (_envelope() + b"x", False),  # trailing bytes
    (b"\xef\xbb\xbf" + _envelope(), False),  # a byte order mark
    (_envelope(head=b'"x":' + b"[" * 70 + b"]" * 70 + b","), True),  # deeper than peek reads
    (_envelope(head=b'"run_id":"other",'), True),  # a member read twice: orjson keeps the last
    (_envelope(event=DELTA[:-1] + b',"index":2}'), True),
    (_envelope(event=DELTA.replace(b'"text":"hi"', b'"text":"hi","text":"ho"')), True),
    (_envelope(event=DELTA.replace(b'"index":1', b'"index":1.0')), True),  # 1.0 finds block 1
    (_envelope(event=DELTA.replace(b'"index":1', b'"index":18446744073709551616')), True),
    (_envelope(event=DELTA.replace(b'"hi"', b'"' + b"x" * 20_000 + b'"')), True),  # too long
    (_envelope(head=b'"v":1,'), True),
])
def test_records_left_to_orjson(value: bytes, orjson_reads_it: bool) -> None:
    """Records peek must leave to orjson: what orjson refuses (each refusal of the contract's
    ``undecodable``), and what it reads in a way peek does not (the last of a duplicate
    member, a float index, a number beyond 64 bits, a record too deep or too long)."""
    assert _peek_fn()(value) is None
    if orjson_reads_it:
        orjson.loads(value)
    else:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(value)


def test_each_shape_is_read() -> None:
    """One record of each of the six shapes, as the providers send them, is answered."""
    peek = _peek_fn()
    chat = b'{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":%s,' \
           b'"logprobs":null,"finish_reason":null}]}'
    cases = [
        (DELTA, (op.ANTHROPIC_TEXT, 1, "hi")),
        (b'{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta",'
         b'"partial_json":"{\\"a\\""}}', (op.ANTHROPIC_JSON, 2, '{"a"')),
        (chat % b'{"content":"caf\\u00e9\\n"}', (op.CHAT_TEXT, 0, "café\n")),
        (chat % b'{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}',
         (op.CHAT_ARGS, 1, "{}")),
        (b'{"type":"response.output_text.delta","item_id":"m","output_index":0,'
         b'"content_index":0,"delta":"\xf0\x9f\x98\x80","sequence_number":7}',
         (op.RESPONSES_TEXT, 0, "😀")),
        (b'{"type":"response.custom_tool_call_input.delta","output_index":3,"delta":""}',
         (op.RESPONSES_INPUT, 3, "")),
        (b'{"type":"response.function_call_arguments.delta","output_index":3,"delta":"{"}',
         (op.RESPONSES_ARGS, 3, "{")),
    ]
    for event, (kind, index, text) in cases:
        assert peek(_envelope(event)) == (kind, "r", 3, None, index, text)
    assert peek(_envelope(head=b'"ts":17,')) == (op.ANTHROPIC_TEXT, "r", 3, 17, 1, "hi")
    assert peek(bytearray(_envelope())) is None  # bytes only: orjson reads the rest


def test_the_module_says_what_the_core_expects() -> None:
    """peek.c's own constants are the kinds ``ops`` names, and its limits are below orjson's
    (whose depth limit is 1,024): a record beyond them is orjson's."""
    assert _peek is not None
    assert [_peek.ANTHROPIC_TEXT, _peek.ANTHROPIC_JSON, _peek.CHAT_TEXT, _peek.CHAT_ARGS,
            _peek.RESPONSES_TEXT, _peek.RESPONSES_ARGS, _peek.RESPONSES_INPUT] == [
        op.ANTHROPIC_TEXT, op.ANTHROPIC_JSON, op.CHAT_TEXT, op.CHAT_ARGS, op.RESPONSES_TEXT,
        op.RESPONSES_ARGS, op.RESPONSES_INPUT]
    assert 0 < _peek.MAX_DEPTH <= 1024
    assert _peek.MAX_BYTES == 16384


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), settings_name=st.sampled_from(sorted(SETTINGS)))
def test_outputs_are_the_same_with_and_without_peek(seed: int, settings_name: str) -> None:
    """Damaged and undamaged sequences of every provider, fed record by record to an
    assembler that peeks and to one that parses every record with orjson: the same records
    out, the same counters."""
    _compare(seed, settings_name)


def _compare(seed: int, settings_name: str) -> tuple[int, int]:
    """Feed one sequence to both; the records fed, and those the peeking one parsed."""
    rng = random.Random(seed)
    with_peek, without = Assembler(SETTINGS[settings_name]), Assembler(SETTINGS[settings_name])
    without._peek = None
    parsed = []

    def loads(value: bytes) -> Any:
        parsed.append(value)
        return orjson.loads(value)

    with_peek._loads = loads
    sequence = records(rng, 300, 3, 0.2)
    for key, value, now in sequence:
        assert with_peek.feed_record(key, value, now) == without.feed_record(key, value, now)
        # Bedrock's and Gemini's runs are never peeked at: exactly their keys are kept aside.
        assert with_peek._unpeeked == {
            run.key for run in with_peek._runs.values() if not run.adapter.peeked}
    assert with_peek.stats == without.stats
    assert with_peek.buffered_bytes == without.buffered_bytes
    end = 2**64 - 1  # after every run's last activity, whatever the damaged ts said
    for run_id in [None, *with_peek.open_run_ids()]:
        key, value = (TICK_KEY.encode(), orjson.dumps({"v": 1, "type": "tick", "ts": end})) \
            if run_id is None else (run_id.encode(), orjson.dumps(
                {"v": 1, "run_id": run_id, "type": "cancel"}))
        assert with_peek.feed_record(key, value, end) == without.feed_record(key, value, end)
    assert not with_peek.open_run_ids() and not with_peek._unpeeked
    return len(sequence), len(parsed)


def test_the_comparison_compares_the_fast_path() -> None:
    """The property above compares something: over a few sequences (short real captures of
    every provider, damaged, with control records between them), a hundred and more records
    are applied without orjson."""
    fed = parsed = 0
    for seed in range(6):
        n, p = _compare(seed, sorted(SETTINGS)[0])
        fed, parsed = fed + n, parsed + p
    assert fed - parsed >= 100, (fed, parsed)


#: Index values every adapter reads one way (issue 23): only an integer >= 0 is an index.
INDEXES = st.sampled_from([0, 1, 2, True, False, 1.0, 0.0, -0.0, -1, "1", None, 2**64 - 1,
                           MISSING])


def _index_events(provider: str, index: Any) -> list[dict[str, Any]]:
    """A run's provider events with one delta (or stop) at ``index`` among proper ones."""
    def at(event: dict[str, Any], key: str = "index") -> dict[str, Any]:
        return {k: v for k, v in {**event, key: index}.items() if v is not MISSING}
    if provider == "anthropic.messages":
        start = {"type": "content_block_start", "index": 1,
                 "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}}
        delta = {"type": "content_block_delta", "index": 1,
                 "delta": {"type": "input_json_delta", "partial_json": "{}"}}
        text = {"type": "content_block_delta", "index": 1,
                "delta": {"type": "text_delta", "text": "x"}}
        return [start, at(delta), at(text), at({"type": "content_block_stop"}), delta,
                {"type": "content_block_stop", "index": 1}, {"type": "message_stop"}]
    if provider == "openai.chat":
        def chunk(entry: dict[str, Any]) -> dict[str, Any]:
            return {"choices": [{"index": 0, "delta": {"tool_calls": [entry]}}]}
        first = {"index": 1, "id": "c", "function": {"name": "f", "arguments": ""}}
        more = {"index": 1, "function": {"arguments": "{}"}}
        return [chunk(first), chunk(at(more)), chunk(more)]
    added = {"type": "response.output_item.added", "output_index": 1,
             "item": {"type": "function_call", "id": "fc", "call_id": "c", "name": "f"}}
    args = {"type": "response.function_call_arguments.delta", "output_index": 1,
            "item_id": "fc", "delta": "{}"}
    text = {"type": "response.output_text.delta", "output_index": 1, "item_id": "fc",
            "delta": "x"}
    return [added, at(args, "output_index"), at(text, "output_index"), args,
            {"type": "response.completed", "response": {"output": []}}]


@settings(max_examples=200, deadline=None)
@given(provider=st.sampled_from(["anthropic.messages", "openai.chat", "openai.responses"]),
       index=INDEXES)
def test_every_index_reads_the_same_with_and_without_peek(provider: str, index: Any) -> None:
    """An index of every JSON type (``true``, ``1.0``, ``-1``, ``"1"``, beyond 2**63...) at
    every event that carries one: the assembler that peeks and the one that parses every
    record give the same records; an index that is not an integer >= 0 is never read as one
    (the record goes to the DLQ, as at ``content_block_start``)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
             if provider != "anthropic.messages" else
             {"name": "f", "input_schema": {"type": "object"}}]
    envelopes = [{"v": 1, "type": "run.start", "run_id": "r", "seq": 0, "provider": provider,
                  "tools": tools}]
    for seq, event in enumerate(_index_events(provider, index), start=1):
        envelopes.append({"v": 1, "type": "provider.event", "run_id": "r", "seq": seq,
                          "event": event})
    envelopes.append({"v": 1, "type": "stream.end", "run_id": "r", "seq": len(envelopes)})
    with_peek, without = Assembler(), Assembler()
    without._peek = None
    out = []
    for envelope in envelopes:
        value = orjson.dumps(envelope)
        emits = with_peek.feed_record(b"r", value, 0)
        assert emits == without.feed_record(b"r", value, 0)
        out += emits
    assert with_peek.stats == without.stats
    if not (type(index) is int and index >= 0) and index is not MISSING and not (
            index is None and provider != "anthropic.messages"):
        assert with_peek.stats["dlq_invalid_envelope"] >= 1
