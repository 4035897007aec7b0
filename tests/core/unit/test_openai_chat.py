"""``worker.core.providers.openai_chat``: the OpenAI Chat Completions adapter.

Calls that all share ``index: 0`` (issue 11, item 3; decision 0006); a run with n > 1 choices
writes choice 0's text once (issue 9). The parallel wrapper's tests are test_wrapper.py's.
Every emitted line is checked against ``schemas/output-line.schema.json``.
"""

from __future__ import annotations

from typing import Any

import orjson
from builders import (
    CHAT,
    chat_call_chunks,
    chat_chunk,
    chat_run,
    chat_tool,
    chat_tool_delta,
    checked_run,
    committed,
    feed,
    finals,
    run_envelopes,
)
from test_assembler import checked

from worker.core import Assembler, AssembleSettings

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}


run = checked_run


# -- calls that all share index 0 (Ollama) ----------------------------------------------------


def test_every_call_at_index_zero_with_its_own_id_is_its_own_call() -> None:
    """Ollama (and some OpenAI Chat streams) send each call whole at ``index: 0`` with a new
    id: three ids, three calls, three outcomes, none of their texts joined."""
    chunks = [chat_chunk([chat_tool_delta(0, f"call_{n}", "weather", f'{{"city": "c{n}"}}')])
              for n in range(3)]
    chunks.append(chat_chunk(finish_reason="tool_calls"))
    emits = run(chat_run("r1", [chat_tool("weather", CITY)], chunks))
    assert [(c["call_id"], c["index"], c["arguments"]) for c in committed(emits)] == [
        ("call_0", 0, {"city": "c0"}), ("call_1", 0, {"city": "c1"}),
        ("call_2", 0, {"city": "c2"})]
    assert len(finals(emits)[0]["message"]["tool_calls"]) == 3


def test_index_zero_reused_with_streamed_fragments() -> None:
    """The same at ``index: 0`` when each call's text is streamed in fragments after its
    first chunk: each fragment goes to the call whose id last opened the index."""
    chunks = [*chat_call_chunks(0, "call_a", "weather", '{"city": "A"}'),
              *chat_call_chunks(0, "call_b", "weather", '{"city": "B"}'),
              chat_chunk(finish_reason="tool_calls")]
    emits = run(chat_run("r1", [chat_tool("weather", CITY)], chunks))
    assert [(c["call_id"], c["arguments"]) for c in committed(emits)] == [
        ("call_a", {"city": "A"}), ("call_b", {"city": "B"})]


def make(**settings: Any) -> Assembler:
    return Assembler(AssembleSettings(**settings))


# -- the final message's size ----------------------------------------------------------------


def test_chat_final_with_two_choices_writes_choice_0_once() -> None:
    """A chat run with n = 2 writes choice 0's text once (in ``message``), not also in
    ``choices``: the final message is as big as the text the run holds, not twice that."""
    text0, text1 = "A" * 1000, "B" * 10
    chunks = [{"choices": [{"index": 0, "delta": {"content": text0}}]},
              {"choices": [{"index": 1, "delta": {"content": text1}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"},
                           {"index": 1, "delta": {}, "finish_reason": "stop"}]}]
    emits = checked(feed(make(), run_envelopes("r", CHAT, [], chunks)))
    final = finals(emits)[0]
    assert orjson.dumps(final).count(b"A" * 1000) == 1
    assert final["message"]["content"] == text0
    assert final["choices"] == [{"index": 0, "finish_reason": "stop"},
                                {"index": 1, "message": {"role": "assistant", "content": text1},
                                 "finish_reason": "stop"}]
