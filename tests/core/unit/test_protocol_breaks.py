"""Streams that break their own protocol (issue 11, item 4; README, "Protocol breaks"), and
which of ``response.completed``'s ``output`` and the streamed items is the source of truth
(decision 0005).

A break fails every call not yet decided ``protocol_error``, each call the stream still
starts fails at its start, no text of two messages is ever joined, and the run ends
``failed``; every call id the stream carried before its end gets exactly one outcome.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    RESPONSES,
    anthropic_message_start,
    anthropic_tail,
    anthropic_text_block,
    anthropic_tool,
    anthropic_tool_block,
    check_outputs,
    check_schemas,
    committed,
    dlq,
    errors,
    feed,
    finals,
    outcome_ids,
    responses_call,
    responses_head,
    responses_item,
    responses_run,
    responses_tail,
    responses_tool,
    run_envelopes,
)
from fixtures_lib import VERCEL, fixture, load_events

from worker.core import Assembler, Emit

TOOLS_A = [anthropic_tool("f", {"type": "object"})]
TOOLS_R = [responses_tool("f", {"type": "object"})]
DUP_START = f"{VERCEL}/anthropic/src/__fixtures__/duplicate-message-start.chunks.txt"


def run(provider: str, tools: list[Any], events: list[dict[str, Any]],
        end: bool = True) -> list[Emit]:
    emits = feed(Assembler(), run_envelopes("r1", provider, tools, events, end=end))
    check_schemas(emits)
    check_outputs(emits)
    return emits


def results(emits: list[Emit]) -> list[tuple[str, str]]:
    return ([(c["call_id"], "committed") for c in committed(emits)]
            + [(e["tool_call_id"], e["reason"]) for e in errors(emits)])


# -- Anthropic: a spliced message ------------------------------------------------------------


def spliced(second_id: str) -> list[dict[str, Any]]:
    """Message 1 (text, call ``toolu_a`` complete), then a ``message_start`` of message 2
    (text, call ``toolu_b``, at the same block indexes), then message 2's end."""
    return [anthropic_message_start("msg_1"), *anthropic_text_block(0, "first "),
            *anthropic_tool_block(1, "toolu_a", "f", '{"a": 1}'),
            anthropic_message_start(second_id), *anthropic_text_block(0, "second"),
            *anthropic_tool_block(1, "toolu_b", "f", '{"b": 2}'), *anthropic_tail()]


def test_spliced_message_fails_both_messages_calls_once_each() -> None:
    """A second ``message_start`` with another id: ``toolu_a`` (complete, undecided) fails
    ``protocol_error`` at the break; ``toolu_b``, started by the second message, gets its own
    outcome, ``protocol_error``, at its start (before the fix it got none: it shared block
    index 1). The run ends ``failed``; the final message is the first message alone, never
    "first second"; both calls are in its outcomes."""
    emits = run(ANTHROPIC, TOOLS_A, spliced("msg_2"), end=False)
    assert results(emits) == [("toolu_a", "protocol_error"), ("toolu_b", "protocol_error")]
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert final["message"]["id"] == "msg_1"
    texts = [b["text"] for b in final["message"]["content"] if b["type"] == "text"]
    assert texts == ["first "]
    assert [o["tool_call_id"] for o in final["outcomes"]] == ["toolu_a", "toolu_b"]
    assert "second" not in orjson.dumps(final).decode()


def test_same_id_message_start_mid_stream_is_a_repeat() -> None:
    """A ``message_start`` repeated with the same id (a proxy's repeat), even after content:
    ignored; a spliced stream that replays the same message shows itself by its blocks
    (the next test)."""
    events = [anthropic_message_start("msg_1"), *anthropic_text_block(0, "hi"),
              anthropic_message_start("msg_1"),
              *anthropic_tool_block(1, "toolu_a", "f", "{}"), *anthropic_tail()]
    emits = run(ANTHROPIC, TOOLS_A, events)
    assert results(emits) == [("toolu_a", "committed")]
    assert finals(emits)[0]["status"] == "completed"


def test_same_id_replayed_blocks_are_a_break() -> None:
    """The same message replayed from its start (same id, then block 0 started again after
    it stopped): a break; ``toolu_a`` fails ``protocol_error`` once, and its replayed start,
    the same id again, opens no second call (the id has its one outcome); ``failed``."""
    first = [*anthropic_text_block(0, "hi"), *anthropic_tool_block(1, "toolu_a", "f", "{}")]
    events = [anthropic_message_start("msg_1"), *first, anthropic_message_start("msg_1"),
              *first, *anthropic_tail()]
    emits = run(ANTHROPIC, TOOLS_A, events)
    assert results(emits) == [("toolu_a", "protocol_error")]
    assert finals(emits)[0]["status"] == "failed"


def test_duplicate_message_start_fixture_is_a_repeat() -> None:
    """vercel-ai duplicate-message-start: ``msg_dup`` sent twice before any content, then
    "Hello, World!" and ``end_turn``. The same id twice is a repeat, not a splice: the run
    completes with that text once."""
    emits = run(ANTHROPIC, TOOLS_A, load_events(fixture(DUP_START)))
    [final] = finals(emits)
    assert final["status"] == "completed"
    assert final["message"]["content"] == [{"type": "text", "text": "Hello, World!"}]


def test_duplicate_message_start_fixture_with_another_id_is_a_splice() -> None:
    """The same file with the second ``message_start``'s id changed: a splice before any
    content. No call, but the run is not ``completed``: it ends ``failed``, and the text of
    the second message is not kept."""
    events = load_events(fixture(DUP_START))
    events[1] = {**events[1], "message": {**events[1]["message"], "id": "msg_other"}}
    emits = run(ANTHROPIC, TOOLS_A, events)
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert final["message"]["content"] == []


@pytest.mark.parametrize("event", [
    {"type": "content_block_delta", "index": 7,
     "delta": {"type": "input_json_delta", "partial_json": "{"}},
    {"type": "content_block_stop", "index": 7},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
], ids=["delta-unopened", "stop-unknown", "delta-stopped", "stop-twice", "restart-stopped"])
def test_misplaced_block_event_fails_the_run(event: dict[str, Any]) -> None:
    """Each misplaced block event, after a stopped text block 0 and while call ``toolu_a``
    at block 1 is open: the call fails ``protocol_error`` (its later deltas change nothing),
    the run ends ``failed``, and nothing goes to the DLQ (the event was readable)."""
    block = anthropic_tool_block(1, "toolu_a", "f", '{"a": 1}')
    events = [anthropic_message_start(), *anthropic_text_block(0, "hi"), block[0], event,
              *block[1:], *anthropic_tail()]
    emits = run(ANTHROPIC, TOOLS_A, events)
    assert results(emits) == [("toolu_a", "protocol_error")]
    assert dlq(emits) == []
    assert finals(emits)[0]["status"] == "failed"


def test_break_outcomes_come_at_the_run_end_in_provider_order() -> None:
    """The break decides the calls at once, but their error results go out with the run's
    end, in provider order (block index, then start order) like every run's outcomes: the
    event that broke the stream emits nothing."""
    envs = run_envelopes("r1", ANTHROPIC, TOOLS_A, spliced("msg_2"), end=False)
    cut = next(n for n, e in enumerate(envs)
               if e.get("event", {}).get("type") == "message_start" and n > 1)
    asm = Assembler()
    assert feed(asm, envs[:cut + 1]) == []
    assert outcome_ids(feed(asm, envs[cut + 1:])) == ["toolu_a", "toolu_b"]


def test_an_event_after_the_end_changes_nothing() -> None:
    """An event after ``message_stop`` goes to the DLQ (``run_finished``); the outcomes
    already out stay the only ones."""
    events = [anthropic_message_start(), *anthropic_tool_block(0, "toolu_a", "f", "{}"),
              *anthropic_tail(), *anthropic_tool_block(1, "toolu_late", "f", "{}")]
    emits = run(ANTHROPIC, TOOLS_A, events, end=False)
    assert results(emits) == [("toolu_a", "committed")]
    assert {d["reason"] for d in dlq(emits)} == {"run_finished"}


# -- Responses ----------------------------------------------------------------------------------


def test_responses_second_response_spliced_in() -> None:
    """A ``response.created`` after output items (another response spliced in): the open
    call ``call_a`` fails ``protocol_error``; the second response's call ``call_b``, at the
    same output_index, gets its own ``protocol_error``; the run ends ``failed``."""
    events = [*responses_head(), *responses_call(0, "call_a", "f", "{}", done=False),
              *responses_head("resp_2"), *responses_call(0, "call_b", "f", "{}"),
              responses_tail()]
    emits = run(RESPONSES, TOOLS_R, events)
    assert results(emits) == [("call_a", "protocol_error"), ("call_b", "protocol_error")]
    assert finals(emits)[0]["status"] == "failed"


def test_responses_id_rotation_is_no_break() -> None:
    """A gateway that gives ``response.in_progress`` another response id than
    ``response.created`` (seen from GitHub Copilot's) does not break anything."""
    head = responses_head()
    head[1] = {**head[1], "response": {**head[1]["response"], "id": "resp_rotated"}}
    events = [*head, *responses_call(0, "call_a", "f", "{}"), responses_tail()]
    emits = run(RESPONSES, TOOLS_R, events)
    assert results(emits) == [("call_a", "committed")]


@pytest.mark.parametrize("event", [
    {"type": "response.output_item.added", "output_index": 0,
     "item": responses_item(0, "call_x", "f", "")},
    {"type": "response.function_call_arguments.delta", "output_index": 5, "delta": "{"},
    {"type": "response.function_call_arguments.delta", "item_id": "fc_nope", "delta": "{"},
    {"type": "response.custom_tool_call_input.done", "output_index": 5, "input": "x"},
    {"type": "response.output_item.done", "output_index": 5,
     "item": responses_item(5, "call_y", "f", "{}")},
], ids=["added-twice", "delta-unopened", "delta-unknown-item", "done-unopened",
        "item-done-unknown"])
def test_responses_misplaced_event_fails_the_run(event: dict[str, Any]) -> None:
    """Each misplaced item event while ``call_a`` is open at output_index 0: ``call_a`` fails
    ``protocol_error``; a call id the event itself carries (``call_x``, ``call_y``) gets its
    own ``protocol_error``; the run ends ``failed``; no DLQ record."""
    call = responses_call(0, "call_a", "f", '{"a": 1}')
    events = [*responses_head(), call[0], event, *call[1:], responses_tail()]
    emits = run(RESPONSES, TOOLS_R, events)
    carried = event.get("item", {}).get("call_id")
    expected = [("call_a", "protocol_error")]
    if carried:
        expected.append((carried, "protocol_error"))
    assert sorted(results(emits)) == sorted(expected)
    assert dlq(emits) == [] and finals(emits)[0]["status"] == "failed"


# -- Responses: response.completed against the streamed items (decision 0005) ------------------


def completed_with(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [*responses_head(), *responses_call(0, "call_a", "f", '{"a": 1}'),
            responses_tail(output=output)]


def test_completed_output_missing_items_keeps_the_streamed_ones() -> None:
    """``response.completed`` with an empty ``output`` (as some gateways and the vercel-ai
    parallel fixture send): the streamed items are the final message, the call commits."""
    emits = run(RESPONSES, TOOLS_R, completed_with([]))
    assert results(emits) == [("call_a", "committed")]
    [final] = finals(emits)
    assert final["status"] == "completed"
    assert [i["call_id"] for i in final["message"]["output"]] == ["call_a"]


def test_completed_output_with_other_text_is_a_break() -> None:
    """``response.completed`` restating ``call_a`` with another argument text: the provider
    contradicts itself; ``call_a`` (undecided) fails ``protocol_error``; the final message
    keeps the streamed text, never the restated one."""
    emits = run(RESPONSES, TOOLS_R, completed_with([responses_item(0, "call_a", "f",
                                                                   '{"a": 2}')]))
    assert results(emits) == [("call_a", "protocol_error")]
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert final["message"]["output"][0]["arguments"] == '{"a": 1}'


def test_completed_output_with_another_name_is_a_break() -> None:
    """The same call restated under another name: ``protocol_error``."""
    emits = run(RESPONSES, [*TOOLS_R, responses_tool("g", {})],
                completed_with([responses_item(0, "call_a", "g", '{"a": 1}')]))
    assert results(emits) == [("call_a", "protocol_error")]


def test_completed_output_with_a_call_never_streamed() -> None:
    """``response.completed`` lists ``call_z``, never streamed: a break; ``call_a`` fails and
    ``call_z`` gets its own ``protocol_error`` (listed in the outcomes; not in the message,
    which holds what was streamed)."""
    emits = run(RESPONSES, TOOLS_R, completed_with([
        responses_item(0, "call_a", "f", '{"a": 1}'), responses_item(1, "call_z", "f", "{}")]))
    assert results(emits) == [("call_a", "protocol_error"), ("call_z", "protocol_error")]
    [final] = finals(emits)
    assert [o["tool_call_id"] for o in final["outcomes"]] == ["call_a", "call_z"]
    assert [i["call_id"] for i in final["message"]["output"]] == ["call_a"]


def test_completed_output_agreeing_changes_nothing() -> None:
    """The same call restated with the same name and text: committed, ``completed``."""
    emits = run(RESPONSES, TOOLS_R, completed_with([responses_item(0, "call_a", "f",
                                                                   '{"a": 1}')]))
    assert results(emits) == [("call_a", "committed")]
    assert finals(emits)[0]["status"] == "completed"


def test_pipelined_call_stays_committed_when_completed_disagrees() -> None:
    """A call committed early (``execute_before_stream_end``) is never taken back: when
    ``response.completed`` then restates it differently the run ends ``failed`` but the
    committed call is its one outcome."""
    from worker.core import AssembleSettings

    asm = Assembler(AssembleSettings(execute_before_stream_end=True,
                                     allow_pipelined_execute=("f",)))
    emits = feed(asm, responses_run("r1", TOOLS_R, completed_with(
        [responses_item(0, "call_a", "f", '{"a": 2}')])))
    check_outputs(emits)
    assert results(emits) == [("call_a", "committed")]
    assert finals(emits)[0]["status"] == "failed"
