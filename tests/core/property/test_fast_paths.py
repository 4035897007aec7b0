"""The per-event fast paths of the core (issue 13 item 3) against the general paths they skip.

* ``OpenAIChat._text_delta``: a chunk with one choice that is a plain text delta is applied
  without ``_read_choices``'s loop. Over hostile choices (odd indexes, deltas of other
  shapes and types, empty or non-string content, finish reasons of any type, extra members),
  ``feed`` leaves the adapter as ``_read_choices`` does: same ops, same kept bytes, same final
  message, or the same refusal.
* ``Assembler.feed_record`` reads no ``ts`` from an envelope of exactly five members: with
  ``ts`` taking the place of another member, beside them, null, negative or of another type,
  its outputs are those of the general path.
* ``ops.NO_OPS``, the one list every text delta's ``feed`` returns, is never changed.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from mutation_fuzz import SETTINGS, records

from worker.core import Assembler, decode
from worker.core import ops as op
from worker.core.providers.openai_chat import OpenAIChat

TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["", "é°C", "\ud800", "a\\\"b"]))
#: Values of a JSON type or range that a member should not have (one branch of a strategy).
ODD = st.sampled_from([None, True, False, -1, 0, 1, 2, 1.5, "0", [], {}])
DELTA = st.one_of(
    st.fixed_dictionaries({"content": st.one_of(TEXT, ODD)}),
    st.fixed_dictionaries({"content": TEXT, "refusal": TEXT, "reasoning_content": TEXT}),
    st.fixed_dictionaries({"content": TEXT}, optional={
        "role": st.just("assistant"), "refusal": st.one_of(TEXT, st.none()),
        "reasoning_content": TEXT, "tool_calls": st.just(None)}),
    ODD)
MISSING = object()


def _choice(index: Any, delta: Any, finish: Any, extra: bool) -> dict[str, Any]:
    """A choice near the plain text delta: each member kept, left out or made odd."""
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    if extra:
        choice["logprobs"] = None
    return {k: v for k, v in choice.items() if v is not MISSING}


CHOICE = st.one_of(
    st.builds(_choice,
              index=st.sampled_from([0, 0, 0, MISSING, MISSING, 1, 2, -1, True, False, None, "0",
                                     0.0, []]),
              delta=st.one_of(st.fixed_dictionaries({"content": TEXT}), st.just(MISSING), DELTA),
              finish=st.sampled_from([MISSING, MISSING, MISSING, None, None, "stop", "length",
                                      "tool_calls", 0, True, {}]),
              extra=st.booleans()),
    ODD)


def _outcome(adapter: OpenAIChat, apply: Any) -> tuple[str, int, Any, list[int], Any]:
    """What applying a choice did: its ops (or the refusal), the bytes kept, choice 0's
    text and finish reason, the other choices made (the final message of one choice shows
    neither its finish reason nor its index), the final message."""
    try:
        result = repr(apply())
    except Exception as exc:  # the caller contains it: the same refusal is what counts
        result = f"raised {type(exc).__name__}"
    first = adapter._first
    state = None if first is None else (first.content, first.finish_reason)
    return result, adapter.kept, state, sorted(adapter._choices or {}), adapter.final([])


@settings(max_examples=400, deadline=None)
@given(before=st.lists(CHOICE, max_size=3), choice=CHOICE)
def test_a_chat_text_delta_is_read_as_the_loop_reads_it(before: list[Any], choice: Any) -> None:
    """After the same earlier chunks, a one-choice chunk fed through ``feed`` (fast path when
    it is a plain text delta) and through ``_read_choices`` (always the loop) gives the same
    ops or refusal, the same kept bytes and the same final message."""
    fast, general = OpenAIChat(), OpenAIChat()
    for earlier in before:  # the same history on both: both through the general loop
        assert _outcome(fast, lambda e=earlier: fast._read_choices([e])) == _outcome(
            general, lambda e=earlier: general._read_choices([e]))
    assert _outcome(fast, lambda: fast.feed({"choices": [choice]})) == _outcome(
        general, lambda: general._read_choices([choice]))


def test_the_chat_fast_path_takes_a_plain_text_delta() -> None:
    """The property above compares something: a plain text delta does take the fast path
    (``_text_delta`` applies it), and one with a finish reason does not."""
    adapter = OpenAIChat()
    assert adapter._text_delta({"index": 0, "delta": {"content": "Hi"}})
    assert adapter.final([])[0]["content"] == "Hi"
    assert not adapter._text_delta({"index": 0, "delta": {"content": "!"},
                                    "finish_reason": "stop"})
    assert adapter.final([])[0]["content"] == "Hi"


def _envelope(members: dict[str, Any]) -> bytes:
    return orjson.dumps(members)


START = {"v": 1, "run_id": "r", "seq": 0, "type": "run.start", "provider": "anthropic.messages",
         "tools": []}
EVENTS = [{"type": "message_start", "message": {"id": "m", "model": "x"}},
          {"type": "content_block_start", "index": 0, "content_block": {"type": "text",
                                                                        "text": ""}}]
DELTA_EVENT = {"type": "content_block_delta", "index": 0,
               "delta": {"type": "text_delta", "text": "hello"}}


@settings(max_examples=200, deadline=None)
@given(ts=st.one_of(st.none(), st.integers(-3, 2**64 - 1), st.just("5"), st.just(True),
                    st.just(1.5)),
       replaces=st.sampled_from([None, "v", "run_id", "seq", "type", "event"]),
       now=st.one_of(st.none(), st.integers(0, 10)))
def test_an_envelope_without_ts_is_read_as_the_general_path_reads_it(
        ts: Any, replaces: str | None, now: int | None) -> None:
    """A provider event whose ``ts`` is absent, null, valid or not, beside the other four
    members or in place of one of them: ``feed_record`` gives what the general path gives."""
    fast, general = Assembler(), Assembler()
    docs: list[dict[str, Any]] = [START] + [
        {"v": 1, "run_id": "r", "seq": n, "type": "provider.event", "event": e}
        for n, e in enumerate(EVENTS, 1)]
    doc = {"v": 1, "run_id": "r", "seq": 3, "type": "provider.event", "event": DELTA_EVENT}
    if replaces is not None:
        del doc[replaces]
    doc["ts"] = ts
    docs += [doc, {"v": 1, "run_id": "r", "seq": 4, "type": "provider.event",
                   "event": {"type": "message_stop"}}]
    for each in docs:
        value = _envelope(each)
        assert fast.feed_record(b"r", value, now) == general._feed_envelope(
            decode(b"r", value), b"r", value, now, None)
    assert fast.stats == general.stats


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), settings_name=st.sampled_from(sorted(SETTINGS)))
def test_no_ops_stays_empty(seed: int, settings_name: str) -> None:
    """Damaged and undamaged sequences of every provider leave the shared ``NO_OPS`` empty:
    no caller changes the list ``feed`` returned."""
    rng = random.Random(seed)
    assembler = Assembler(SETTINGS[settings_name])
    for key, value, now in records(rng, 300, 3, 0.2):
        assembler.feed_record(key, value, now)
    assert op.NO_OPS == []


#: ``delta.tool_calls[]`` entries at tool indexes 0 and 1: a function's or a custom call's
#: opening (with an id and a name) or a piece of its text (none), some with both members.
ENTRY = st.one_of(
    st.builds(lambda i, t: {"index": i, "function": {"arguments": t}}, st.sampled_from([0, 1]),
              TEXT),
    st.builds(lambda i, t: {"index": i, "custom": {"input": t}}, st.sampled_from([0, 1]), TEXT),
    st.builds(lambda i, n: {"index": i, "id": f"call_{n}", "type": "function",
                            "function": {"name": "f", "arguments": ""}},
              st.sampled_from([0, 1]), st.integers(0, 2)),
    st.builds(lambda i, n: {"index": i, "id": f"call_{n}", "type": "custom",
                            "custom": {"name": "c", "input": ""}},
              st.sampled_from([0, 1]), st.integers(0, 2)),
    st.builds(lambda i, t: {"index": i, "type": "custom", "function": {"arguments": t},
                            "custom": {"input": t}}, st.sampled_from([0, 1]), TEXT))


def _described(ops: list[op.Op]) -> list[tuple[Any, ...]]:
    return [(type(o).__name__, getattr(o, "key", None), getattr(o, "text", None),
             getattr(o, "kind", None), getattr(o, "tool", None)) for o in ops]


def _chat_args(entry: dict[str, Any]) -> tuple[int, str] | None:
    """What ``worker.core._peek`` reads as ``CHAT_ARGS`` of a one-entry chunk (peek.c)."""
    function = entry.get("function")
    if entry.get("id") is not None or type(function) is not dict:
        return None
    if type(function.get("arguments")) is not str or function.get("name") is not None:
        return None
    return entry["index"], function["arguments"]


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(ENTRY, max_size=8))
def test_chat_argument_pieces_are_read_as_the_loop_reads_them(entries: list[Any]) -> None:
    """Function and custom calls (issue 33) at the same indexes, in any order: a chunk that
    peek reads as ``CHAT_ARGS`` fed through ``fast`` (the loop when it says None) gives the
    ops ``_read_choices`` gives, and the same final message; so a custom call's index is never
    taken by the function fast path."""
    fast, general = OpenAIChat(), OpenAIChat()
    for entry in entries:
        chunk = {"index": 0, "delta": {"tool_calls": [entry]}}
        peeked = _chat_args(entry)
        taken = None if peeked is None else fast.fast(op.CHAT_ARGS, *peeked)
        if taken is None:
            taken = fast.feed({"choices": [chunk]})
        assert _described(taken) == _described(general._read_choices([chunk]))
    assert fast.final([]) == general.final([])
