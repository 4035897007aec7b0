"""``core/ops.py``, the words an adapter speaks to its run: a run's stops (the first stop of a
choice stands, the whole message's decides every call, the run ends as its most severe stop),
and the small checks every adapter shares (an index, UTF-8 lengths, a kept value's depth).
The ops themselves are pinned through the adapters (test_openai_chat.py and the others) and the
run (test_run.py)."""

from __future__ import annotations

import pytest

from worker.core import ops as op
from worker.core.model import Reason, RunStatus
from worker.core.strictjson import MAX_DEPTH


def test_a_choice_keeps_its_first_stop() -> None:
    """``add_stop`` adds one stop a choice: a second stop of the same choice (or a second
    stop of the whole message) changes nothing, another choice's is added after it."""
    first = op.Truncated(0)
    stops = op.add_stop((), first)
    assert op.add_stop(stops, op.content_stop(0, "a filter")) == (first,)
    other = op.content_stop(1, "a filter")
    assert op.add_stop(stops, other) == (first, other)
    whole = op.Truncated()
    assert op.add_stop(op.add_stop((), whole), op.Truncated()) == (whole,)


def test_the_whole_messages_stop_decides_every_call() -> None:
    """``stop_of`` gives a call the stop of the whole message when there is one, else its own
    choice's, else None."""
    mine, whole = op.Truncated(2), op.content_stop(None, "a filter")
    assert op.stop_of((mine,), 2) is mine
    assert op.stop_of((mine,), 3) is None
    assert op.stop_of((mine, whole), 3) is whole
    assert op.stop_of((), None) is None


def test_a_run_ends_as_its_most_severe_stop() -> None:
    """``stopped_status``: ``failed`` over ``truncated`` over ``completed``, whatever the
    order of the stops; no stop is ``completed``."""
    truncated, filtered = op.Truncated(0), op.content_stop(1, "a filter")
    assert op.stopped_status(()) is RunStatus.COMPLETED
    assert op.stopped_status((truncated,)) is RunStatus.TRUNCATED
    assert op.stopped_status((truncated, filtered)) is RunStatus.FAILED
    assert op.stopped_status((filtered, truncated)) is RunStatus.FAILED
    assert filtered.reason is Reason.CONTENT_FILTERED and truncated.reason is Reason.TRUNCATED


@pytest.mark.parametrize(("value", "index"), [
    (0, True), (7, True), (-1, False), (True, False), (1.0, False), ("1", False), (None, False),
])
def test_an_index_is_an_int_at_least_zero(value: object, index: bool) -> None:
    """``is_index``: only an ``int`` >= 0 is a call's index (never a bool, a float or a
    string that looks like one)."""
    assert op.is_index(value) is index


def test_lengths_are_utf8_bytes_and_json_text() -> None:
    """``utf8_len`` counts UTF-8 bytes (a lone surrogate as its 3), ``json_len`` the bytes
    of a value written as JSON."""
    assert op.utf8_len("abc") == 3
    assert op.utf8_len("é€") == 5
    assert op.utf8_len("\ud800") == 3
    assert op.json_len({"a": [1, "é"]}) == len('{"a":[1,"é"]}'.encode())


def test_a_kept_value_nested_too_deep_is_refused() -> None:
    """``bounded`` returns a value an adapter keeps as it is, and refuses one nested deeper
    than ``strictjson.MAX_DEPTH`` levels (an ``EventRefused``: the event goes to the DLQ)."""
    fits: object = []
    for _ in range(MAX_DEPTH - 1):
        fits = [fits]
    assert op.bounded(fits) is fits
    with pytest.raises(op.EventRefused, match="nested deeper"):
        op.bounded([[fits]])


def test_unwrapped_calls_are_grouped_under_their_wrapper() -> None:
    """``unwrapped_calls`` lists the calls unwrapped from each parallel wrapper under the
    wrapper's key, in order; a call of no wrapper is in no list."""
    def view(key: str, parent: str | None) -> op.CallView:
        return op.CallView(key, key, "f", "{}", {}, True, parent)

    a, b, c = view("w#0", "w"), view("x", None), view("w#1", "w")
    assert op.unwrapped_calls([a, b, c]) == {"w": [a, c]}
