"""``worker.core.providers.openai_responses``: Responses streams that break their own protocol
(issue 11, item 4; docs/providers.md, "Protocol breaks"), and which of ``response.completed``'s
``output`` and the streamed items is the source of truth (decision 0005).

A break fails every call not yet decided ``protocol_error``, each call the stream still
starts fails at its start, and the run ends ``failed``; every call id the stream carried
before its end gets exactly one outcome. The Anthropic breaks are
``test_anthropic_messages.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from builders import (
    RESPONSES,
    call_results,
    check_outputs,
    checked_run,
    dlq,
    feed,
    finals,
    responses_call,
    responses_head,
    responses_item,
    responses_run,
    responses_tail,
    responses_tool,
    run_envelopes,
)

from worker.core import Assembler, Emit

TOOLS_R = [responses_tool("f", {"type": "object"})]


def run(provider: str, tools: list[Any], events: list[dict[str, Any]],
        end: bool = True) -> list[Emit]:
    """Run ``events`` as run ``r1`` of ``provider`` through a checked fresh assembler."""
    return checked_run(run_envelopes("r1", provider, tools, events, end=end))


results = call_results


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
