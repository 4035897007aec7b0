"""The text a run keeps for its final message counts in the partition's byte budget.

Assistant text, thinking, content blocks and output items are kept by each provider's adapter
until the run ends; the bytes it keeps (``Adapter.kept``: UTF-8 for text, JSON text for a kept
value) are counted in ``buffered_bytes`` beside argument and schema bytes, bounded by
``max_buffered_bytes`` with the same eviction as argument text, and released when the run
ends. ``max_run_text_bytes`` stays the per-run bound (counted in event bytes).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    RESPONSES,
    anthropic_message_start,
    anthropic_tail,
    chat_chunk,
    chat_tool_delta,
    committed,
    errors,
    feed,
    finals,
    gemini_chunk,
    provider_event,
    responses_head,
    responses_tail,
    run_envelopes,
    tools_for,
)
from test_assembler import checked, one_outcome_each

from worker.core import Assembler, AssembleSettings
from worker.core.ops import STATE_BYTES

#: 37 characters, 41 UTF-8 bytes (two "é", one "°": 2 bytes each; no JSON escapes).
PIECE = "Il fait 12°C à Paris, pluie légère. "
PIECE_BYTES = len(PIECE.encode())
PIECES = 50


def make(**settings: Any) -> Assembler:
    return Assembler(AssembleSettings(**settings))


def text_run(provider: str, pieces: int = PIECES, piece: str = PIECE
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """A run of ``provider`` without tools as three lists of provider events: the head (what
    opens the text), ``pieces`` text deltas of ``piece``, and the tail that ends the message."""
    if provider == CHAT:
        return ([], [chat_chunk(content=piece) for _ in range(pieces)],
                [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}])
    if provider == ANTHROPIC:
        head = [anthropic_message_start(), {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "text", "text": ""}}]
        delta = {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "text_delta", "text": piece}}
        return (head, [delta] * pieces,
                [{"type": "content_block_stop", "index": 0}, *anthropic_tail("end_turn")])
    if provider == RESPONSES:
        head = [*responses_head(), {"type": "response.output_item.added", "output_index": 0,
                                    "item": {"type": "message", "id": "msg_1",
                                             "role": "assistant", "content": []}}]
        delta = {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1",
                 "delta": piece}
        return head, [delta] * pieces, [responses_tail()]
    if provider == BEDROCK:
        delta = {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": piece}}}
        return ([{"messageStart": {"role": "assistant"}}], [delta] * pieces,
                [{"contentBlockStop": {"contentBlockIndex": 0}},
                 {"messageStop": {"stopReason": "end_turn"}}])
    assert provider == GEMINI
    return ([], [gemini_chunk([{"text": piece}]) for _ in range(pieces)],
            [gemini_chunk([{"text": ""}], finish_reason="STOP")])


@pytest.mark.parametrize("provider", [CHAT, ANTHROPIC, RESPONSES, BEDROCK, GEMINI])
def test_kept_text_counts_in_buffered_bytes_until_the_run_ends(provider: str) -> None:
    """Each text delta adds the UTF-8 bytes of its text to ``buffered_bytes`` (not its
    event's bytes, not its characters), and the run's end releases them all; the final
    message carries that text. (The first delta of a Bedrock block without a start, or of a
    Responses item, opens its state too: ``STATE_BYTES``.)"""
    head, deltas, tail = text_run(provider)
    envs = run_envelopes("r1", provider, [], [*head, *deltas, *tail])
    asm = make()
    feed(asm, envs[:1 + len(head)])
    before = asm.buffered_bytes
    feed(asm, envs[1 + len(head):1 + len(head) + len(deltas)])
    state = STATE_BYTES if provider in (BEDROCK, RESPONSES) else 0
    assert asm.buffered_bytes - before == PIECES * PIECE_BYTES + state
    emits = feed(asm, envs[1 + len(head) + len(deltas):])
    [final] = finals(checked(emits))
    assert final["status"] == "completed"
    assert PIECE * PIECES in orjson.dumps(final["message"]).decode()
    assert asm.buffered_bytes == 0 and asm.open_runs == 0


def test_many_runs_of_big_text_stay_within_the_partition_budget() -> None:
    """Hostile: 200 chat runs each streaming 40 KB of text (8 MB in all) into a partition
    whose ``max_buffered_bytes`` is 200 KB. ``buffered_bytes`` never exceeds the budget; the
    least recently active runs are ended to make room (status ``failed``, their open call
    ``budget_exceeded``, one outcome each), and every run gets its one final message."""
    budget = 200_000
    asm = make(max_buffered_bytes=budget)
    runs = [f"r{i}" for i in range(200)]
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    emits = []
    for run_id in runs:  # each run opens a call first, so that an eviction has one to fail
        emits += feed(asm, run_envelopes(run_id, CHAT, tools, [
            chat_chunk([chat_tool_delta(0, f"call_{run_id}", "f", "{")])], end=False))
    for seq in range(2, 42):  # interleaved, as a partition sees them
        for run_id in runs:
            emits += feed(asm, [provider_event(run_id, seq, chat_chunk(content="x" * 1000))])
            assert asm.buffered_bytes <= budget
    for run_id in runs:
        emits += feed(asm, [provider_event(run_id, 42, chat_chunk(
            [chat_tool_delta(0, arguments="}")])), {"v": 1, "type": "stream.end",
                                                    "run_id": run_id, "seq": 43}])
    emits = checked(emits)
    assert asm.buffered_bytes == 0
    assert asm.stats["evicted_buffered_bytes"] > 100
    by_run = {f["run_id"]: f for f in finals(emits)}
    assert sorted(by_run) == sorted(runs)
    failed = [r for r, f in by_run.items() if f["status"] == "failed"]
    assert len(failed) == asm.stats["evicted_buffered_bytes"]
    assert {e["reason"] for e in errors(emits)} == {"budget_exceeded"}
    assert len(errors(emits)) == len(failed)
    assert len(committed(emits)) == len(runs) - len(failed) > 0
    one_outcome_each(emits, [f"call_{r}" for r in runs])


def test_a_run_whose_text_alone_exceeds_the_budget_ends() -> None:
    """The receiving run alone over ``max_buffered_bytes`` (its text cannot be dropped from
    a final message in the making): that run ends ``failed``, its open call fails
    ``budget_exceeded``, nobody else is ended, and its bytes are released."""
    asm = make(max_buffered_bytes=10_000)
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    other = run_envelopes("other", CHAT, [], [chat_chunk(content="y" * 100)], end=False)
    emits = feed(asm, other)
    emits += feed(asm, run_envelopes("big", CHAT, tools, [
        chat_chunk([chat_tool_delta(0, "call_1", "f", "{")]),
        *[chat_chunk(content="x" * 1000) for _ in range(12)]], end=False))
    emits = checked(emits)
    [final] = finals(emits)
    assert final["run_id"] == "big" and final["status"] == "failed"
    [error] = errors(emits)
    assert error["tool_call_id"] == "call_1" and error["reason"] == "budget_exceeded"
    assert "cannot hold this run's text" in error["content"]
    assert asm.stats["runs_over_buffered_bytes_text"] == 1
    assert asm.open_run_ids() == ["other"] and asm.buffered_bytes == 100
