"""``model.TRANSITIONS``, the state machine of one tool call (issue 24 item 3): a table of
(state, event) -> state, in the manner of h11's ``EVENT_TRIGGERED_TRANSITIONS`` and h2's
``_transitions``, that drives every move of a :class:`~worker.core.call.Call`.

* The table is total: every state has an entry for every event, and names only states.
* It says what the model's docstring says: terminal states absorb every event but
  ``duplicate_call_id``, which moves a failed or cancelled call to failed; a committed or
  unwrapped call never moves; ``OPEN`` reaches every state.
* Any sequence of events applied to a call, through ``step`` and the methods built on it,
  moves it exactly as the table says and never raises: a refused event is a defined outcome.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core.call import Call
from worker.core.model import TERMINAL, TRANSITIONS, CallEvent, CallState, Reason

STATES = list(CallState)
EVENTS = list(CallEvent)


def test_the_table_is_total() -> None:
    """Every (state, event) pair has an entry, no other key is there, and each entry is a
    state or None (the event changes nothing)."""
    assert set(TRANSITIONS) == {(s, e) for s in STATES for e in EVENTS}
    assert all(new is None or isinstance(new, CallState) for new in TRANSITIONS.values())


def test_terminal_states_absorb_all_but_duplicate() -> None:
    """No event moves a terminal call, but ``DUPLICATE`` moves a failed or cancelled one to
    failed; a committed or unwrapped call is never taken back; only ``DUPLICATE`` moves a
    terminal call, and only terminal calls."""
    for state in TERMINAL:
        for event in EVENTS:
            expected = (CallState.FAILED if event is CallEvent.DUPLICATE
                        and state in (CallState.FAILED, CallState.CANCELLED) else None)
            assert TRANSITIONS[(state, event)] is expected, (state, event)
    assert all(TRANSITIONS[(s, CallEvent.DUPLICATE)] is None for s in STATES if s not in TERMINAL)


def test_open_reaches_every_state() -> None:
    """From ``OPEN``, following the table, every state can be reached, and no move leads
    from a terminal state back to ``OPEN`` or ``ARGS_COMPLETE``."""
    reached, frontier = {CallState.OPEN}, [CallState.OPEN]
    while frontier:
        state = frontier.pop()
        for event in EVENTS:
            new = TRANSITIONS[(state, event)]
            if new is not None and new not in reached:
                reached.add(new)
                frontier.append(new)
    assert reached == set(STATES)
    assert all(new in TERMINAL for (state, _), new in TRANSITIONS.items()
               if state in TERMINAL and new is not None)


def _apply(call: Call, event: CallEvent) -> bool:
    """``event`` applied the way the core applies it (``fail`` for FAIL and CANCEL,
    ``duplicate`` for DUPLICATE, ``step`` for the others)."""
    if event is CallEvent.FAIL:
        return call.fail(Reason.STREAM_ERROR, "failed")
    if event is CallEvent.CANCEL:
        return call.fail(Reason.CANCELLED, "cancelled")
    if event is CallEvent.DUPLICATE:
        return call.duplicate("shared id")
    return call.step(event)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(EVENTS), max_size=12))
def test_any_sequence_of_events_follows_the_table(events: list[CallEvent]) -> None:
    """Whatever the events and their order, a call moves exactly as the table says, an event
    the table refuses leaves its state, reason and detail as they were (and says so), and
    nothing raises."""
    call = Call("0.0", 0, None, 0, "call_1", "f")
    for event in events:
        before = (call.state, call.reason, call.detail)
        expected = TRANSITIONS[(call.state, event)]
        moved = _apply(call, event)
        assert moved is (expected is not None)
        if expected is None:
            assert (call.state, call.reason, call.detail) == before
        else:
            assert call.state is expected
            if event is CallEvent.DUPLICATE:
                assert call.reason is Reason.DUPLICATE_CALL_ID
