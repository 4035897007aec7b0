"""``worker.core.providers.anthropic_messages``: Anthropic Messages streams that break their own
protocol (issue 11, item 4; docs/providers.md, "Protocol breaks"): a spliced or replayed message, a
repeated ``message_start``, misplaced block events.

A break fails every call not yet decided ``protocol_error``, each call the stream still
starts fails at its start, no text of two messages is ever joined, and the run ends
``failed``; every call id the stream carried before its end gets exactly one outcome. The
Responses breaks are ``test_openai_responses_breaks.py``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    anthropic_message_start,
    anthropic_tail,
    anthropic_text_block,
    anthropic_tool,
    anthropic_tool_block,
    call_results,
    check_schemas,
    checked_run,
    dlq,
    feed,
    finals,
    outcome_ids,
    run_envelopes,
)
from fixtures_lib import VERCEL, fixture, load_events

from worker.core import Assembler, Emit, Topic

TOOLS_A = [anthropic_tool("f", {"type": "object"})]
DUP_START = f"{VERCEL}/anthropic/src/__fixtures__/duplicate-message-start.chunks.txt"


def run(provider: str, tools: list[Any], events: list[dict[str, Any]],
        end: bool = True) -> list[Emit]:
    """Run ``events`` as run ``r1`` of ``provider`` through a checked fresh assembler."""
    return checked_run(run_envelopes("r1", provider, tools, events, end=end))


results = call_results


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
    event that broke the stream emits only the run's ``run.ended`` (the gateway may stop
    reading at once: decision 0015)."""
    envs = run_envelopes("r1", ANTHROPIC, TOOLS_A, spliced("msg_2"), end=False)
    cut = next(n for n, e in enumerate(envs)
               if e.get("event", {}).get("type") == "message_start" and n > 1)
    asm = Assembler()
    assert [(e.topic, e.value["reason"]) for e in feed(asm, envs[:cut + 1])] == [
        (Topic.RUN_ENDED, "protocol_error")]
    assert outcome_ids(feed(asm, envs[cut + 1:])) == ["toolu_a", "toolu_b"]


def test_an_event_after_the_end_changes_nothing() -> None:
    """The events after ``message_stop`` are counted and summed up in one DLQ record
    (``run_finished``, decision 0015); the outcomes already out stay the only ones."""
    late = anthropic_tool_block(1, "toolu_late", "f", "{}")
    events = [anthropic_message_start(), *anthropic_tool_block(0, "toolu_a", "f", "{}"),
              *anthropic_tail(), *late]
    asm = Assembler()
    emits = feed(asm, run_envelopes("r1", ANTHROPIC, TOOLS_A, events, end=False))
    emits += asm.summarise_late()
    check_schemas(emits)
    assert results(emits) == [("toolu_a", "committed")]
    assert [(d["reason"], d["late"]["count"]) for d in dlq(emits)] == [
        ("run_finished", len(late))]
