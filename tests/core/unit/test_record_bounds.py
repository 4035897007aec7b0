"""Every record the core emits fits the output topics' record size; every piece of per-run
state counts in the budget (issue 23, items 1 and 3).

The output topics take records of at most 64 MiB (``max.message.bytes``); the core keeps every
committed call, error result and final message at most ``settings.MAX_RECORD_BYTES`` (63 MiB,
the rest for key, headers and framing). A committed call that would be larger fails
``record_too_large``; a run whose final message would be larger ends ``failed`` (its undecided
calls ``record_too_large``) and its final message drops content and lists it in ``dropped``.
Choices and candidates are bounded per run (``max_choices_per_run``), and what an adapter keeps
per choice, candidate, block or item counts in ``max_buffered_bytes``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    RESPONSES,
    anthropic_calls,
    anthropic_message_start,
    chat_chunk,
    chat_tool_delta,
    committed,
    dlq,
    errors,
    feed,
    finals,
    gemini_chunk,
    provider_event,
    responses_head,
    run_envelopes,
    run_start,
    stream_end,
    tools_for,
)
from test_assembler import checked, one_outcome_each

from worker.core import Assembler, AssembleSettings, Topic
from worker.core.model import Emit
from worker.core.ops import STATE_BYTES
from worker.core.settings import MAX_RECORD_BYTES, largest_records

MiB = 1024 * 1024


def make(**settings: Any) -> Assembler:
    return Assembler(AssembleSettings(**settings))


def accepted(settings: AssembleSettings) -> bool:
    """Whether the configuration would accept these limits (``largest_records``)."""
    return all(size <= MAX_RECORD_BYTES for _, size, _ in largest_records(settings))


def sizes(emits: list[Emit]) -> list[int]:
    """The bytes of each record as the worker publishes it."""
    return [len(orjson.dumps(e.value)) for e in emits]


def empty_choices(first: int, count: int) -> dict[str, Any]:
    """One chat chunk of ``count`` empty choices ``{"index": n}`` from ``first`` on."""
    return {"choices": [{"index": n} for n in range(first, first + count)]}


def chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return chat_chunk([chat_tool_delta(0, call_id, name, arguments)])


# -- choices and candidates: bounded, and counted --------------------------------------------


def test_many_empty_chat_choices_end_the_run_within_the_bound() -> None:
    """The issue's chat run: chunks under 1 MiB of empty choices ``{"index": n}`` (18 bytes of
    input each, about 84 in the final's ``choices``). Today 15.5 MiB of them made a 73 MiB
    final; now the chunk that opens choice 129 (``max_choices_per_run``, 128) ends the run:
    status ``failed``, the call opened before fails ``budget_exceeded`` (one outcome), no later
    chunk opens anything, and the final lists 128 choices, far within the bound."""
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    chunks = [chat_call("call_1", "f", "{}")]
    chunks += [empty_choices(1 + 40_000 * n, 40_000) for n in range(3)]  # 3 x 0.7 MB
    asm = make()
    emits = checked(feed(asm, run_envelopes("r", CHAT, tools, chunks)))
    [final] = finals(emits)
    assert final["status"] == "failed" and len(final["choices"]) == 128
    [error] = errors(emits)
    assert error["reason"] == "budget_exceeded" and "more than 128 choices" in error["content"]
    one_outcome_each(emits, ["call_1"])
    assert len(orjson.dumps(final)) < 64 * 1024
    # The later chunks reach an ended run: counted and summed up in one ``run_finished``
    # record, and the gateway was told by ``run.ended`` (decision 0015).
    assert dlq(emits) == [] and asm.stats["late_events"] == 2
    [summary] = dlq(asm.summarise_late())
    assert summary["reason"] == "run_finished" and summary["late"]["count"] == 2
    assert [e.value["reason"] for e in emits if e.topic is Topic.RUN_ENDED] == [
        "budget_exceeded"]


def test_many_gemini_candidates_end_the_run() -> None:
    """Gemini's: empty candidates (``{}``, indexed by position, or ``{"index": n}``) beyond
    ``max_choices_per_run`` end the run ``failed``; the final lists only the candidates
    opened, each call gets one outcome."""
    tools = tools_for(GEMINI, {"f": {"type": "object"}})
    call = gemini_chunk([{"functionCall": {"name": "f", "args": {}}}])
    many: dict[str, Any] = {"candidates": [{} for _ in range(50_000)]}
    emits = checked(feed(make(max_choices_per_run=10),
                         run_envelopes("r", GEMINI, tools, [call, many])))
    [final] = finals(emits)
    assert final["status"] == "failed" and len(final["choices"]) == 10
    [error] = errors(emits)
    assert error["reason"] == "budget_exceeded" and "more than 10 choices" in error["content"]
    one_outcome_each(emits, ["latch-0-0-r"])


@pytest.mark.parametrize("provider", [CHAT, GEMINI])
def test_choices_up_to_the_limit_are_fine(provider: str) -> None:
    """Exactly ``max_choices_per_run`` choices (candidates) is allowed: the run completes."""
    event: dict[str, Any] = (empty_choices(0, 4) if provider == CHAT else
                             {"candidates": [{"index": n, "finishReason": "STOP"}
                                             for n in range(4)]})
    emits = checked(feed(make(max_choices_per_run=4), run_envelopes("r", provider, [], [event])))
    [final] = finals(emits)
    assert final["status"] == "completed" and len(final["choices"]) == 4


@pytest.mark.parametrize("provider", [CHAT, GEMINI])
def test_each_choice_counts_in_the_budget(provider: str) -> None:
    """The issue's 3.4 MiB of empty choices held 33.6 MiB while ``buffered_bytes`` read 0:
    each choice (candidate) but the first now counts ``STATE_BYTES`` while its run is open, and
    a run whose choices alone would cross ``max_buffered_bytes`` ends (``budget_exceeded``)."""
    event: dict[str, Any] = (empty_choices(0, 100) if provider == CHAT else
                             {"candidates": [{"index": n} for n in range(100)]})
    asm = make()
    feed(asm, run_envelopes("r", provider, [], [event], end=False))
    assert asm.buffered_bytes == 99 * STATE_BYTES
    feed(asm, [stream_end("r", 2)])
    assert asm.buffered_bytes == 0
    small = make(max_buffered_bytes=50 * STATE_BYTES)
    emits = checked(feed(small, run_envelopes("r", provider, [], [event])))
    assert [f["status"] for f in finals(emits)] == ["failed"]
    assert small.stats["runs_over_buffered_bytes_text"] == 1 and small.buffered_bytes == 0


def blocks(provider: str, count: int) -> list[dict[str, Any]]:
    """Events that open ``count`` empty blocks (items) of ``provider``."""
    if provider == ANTHROPIC:
        return [anthropic_message_start(), *({"type": "content_block_start", "index": n,
                                               "content_block": {"type": "text", "text": ""}}
                                              for n in range(count))]
    if provider == BEDROCK:
        return [{"contentBlockDelta": {"contentBlockIndex": n, "delta": {"text": ""}}}
                for n in range(count)]
    assert provider == RESPONSES
    return [*responses_head(), *({"type": "response.output_text.delta", "output_index": n,
                                  "delta": ""} for n in range(count))]


@pytest.mark.parametrize("provider", [ANTHROPIC, BEDROCK, RESPONSES])
def test_each_block_or_item_counts_in_the_budget(provider: str) -> None:
    """Empty content blocks (Anthropic, Bedrock) and empty item texts (Responses) keep no text,
    but each is state: it counts ``STATE_BYTES`` in ``buffered_bytes`` until its run ends."""
    asm = make()
    feed(asm, run_envelopes("r", provider, [], blocks(provider, 0), end=False))
    before = asm.buffered_bytes
    seq = len(blocks(provider, 0))
    events = blocks(provider, 200)[seq:]
    feed(asm, [provider_event("r", seq + 1 + n, e) for n, e in enumerate(events)])
    assert asm.buffered_bytes - before >= 200 * STATE_BYTES
    feed(asm, [stream_end("r", seq + 201)])
    assert asm.buffered_bytes == 0


# -- the final message: measured, bounded, marked ------------------------------------------


def test_a_final_message_over_the_bound_drops_its_content_and_says_so() -> None:
    """Limits the configuration accepts (40 MiB of arguments a run, 5 MiB a call) and an
    Anthropic run of 5 calls of 4.2 MB each, numbers written short (``1e15``): each committed
    call would fit (16 MB), but the final message writes each ``input`` back in full, 80 MB in
    all. The run ends ``failed`` instead of completing: each call fails ``record_too_large``
    (one outcome each, none committed), and the final message keeps its outcomes, drops its
    message's content (keeping its role, id, model and stop reason) and says so in
    ``dropped``."""
    settings = AssembleSettings(max_tool_argument_bytes=5 * MiB, max_buffered_bytes=40 * MiB,
                                max_run_text_bytes=1 * MiB)
    assert accepted(settings)
    asm = Assembler(settings)
    numbers = '{"a":[0' + ",1e15" * 838_860 + "]}"
    calls = [(f"toolu_{n}", "f", numbers) for n in range(5)]
    envs = run_envelopes("r", ANTHROPIC, tools_for(ANTHROPIC, {"f": {"type": "object"}}),
                         anthropic_calls(calls, pieces=5))
    emits = feed(asm, envs)
    assert max(sizes(emits)) <= MAX_RECORD_BYTES
    emits = checked(emits)
    [final] = finals(emits)
    assert final["status"] == "failed" and final["dropped"] == ["message"]
    assert final["message"] == {"role": "assistant", "id": "msg_1", "model": "claude-sonnet-4-5",
                                "stop_reason": "tool_use", "content": []}
    assert [o["reason"] for o in final["outcomes"]] == ["record_too_large"] * 5
    assert committed(emits) == [] and {e["reason"] for e in errors(emits)} == {
        "record_too_large"}
    one_outcome_each(emits, [f"toolu_{n}" for n in range(5)])
    assert asm.stats["runs_over_record_bytes"] == 1 and asm.buffered_bytes == 0


def test_a_huge_argument_under_permissive_limits_is_never_emitted() -> None:
    """The issue's second case: limits the schema accepts but the configuration now refuses
    (``max_tool_argument_bytes`` 100 MiB, ``max_buffered_bytes`` 256 MiB, ``max_run_text_bytes``
    100 MiB) given to the core directly, and one 64 MiB argument. Its committed call would be
    over the bound: the run's final message is measured first, the run ends ``failed``, the
    call fails ``record_too_large`` (its error result small), and the final message drops the
    argument, marked. No record is over the bound."""
    settings = AssembleSettings(max_tool_argument_bytes=100 * MiB,
                                max_buffered_bytes=256 * MiB, max_run_text_bytes=100 * MiB)
    assert not accepted(settings)
    asm = Assembler(settings)
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    piece = "x" * 1_000_000

    def chunks() -> Iterator[dict[str, Any]]:
        yield chat_chunk([chat_tool_delta(0, "call_1", "f", '{"a":"')])
        for _ in range(64 * MiB // len(piece) + 1):
            yield chat_chunk([chat_tool_delta(0, arguments=piece)])
        yield chat_chunk([chat_tool_delta(0, arguments='"}')])

    emits = feed(asm, run_envelopes("r", CHAT, tools, chunks()))
    assert max(sizes(emits)) <= MAX_RECORD_BYTES
    [error] = errors(emits)
    assert error["tool_call_id"] == "call_1" and error["reason"] == "record_too_large"
    [final] = finals(emits)
    assert final["status"] == "failed" and final["dropped"] == ["message"]
    one_outcome_each(emits, ["call_1"])


def test_a_committed_call_over_the_bound_fails_record_too_large() -> None:
    """Limits the configuration accepts (20 MiB of arguments a call) and a 17 MiB argument of
    numbers written short (``1e15``), which orjson writes back in full
    (``1000000000000000.0``, 4.5 times as long): the committed call would be 70 MiB. It fails
    ``record_too_large`` (measured, never emitted) and the run goes on: the next call commits.
    The final message shows the argument text as sent, within the bound."""
    settings = AssembleSettings(max_tool_argument_bytes=20 * MiB, max_buffered_bytes=40 * MiB,
                                max_run_text_bytes=1 * MiB)
    assert accepted(settings)
    asm = Assembler(settings)
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    numbers = ",1e15" * (17 * MiB // 5)

    def chunks() -> Iterator[dict[str, Any]]:
        yield chat_chunk([chat_tool_delta(0, "call_big", "f", '{"a":[0')])
        for at in range(0, len(numbers), 900_000):
            yield chat_chunk([chat_tool_delta(0, arguments=numbers[at:at + 900_000])])
        yield chat_chunk([chat_tool_delta(0, arguments="]}")])
        yield chat_chunk([chat_tool_delta(1, "call_small", "f", '{"a":[1e15]}')])

    emits = feed(asm, run_envelopes("r", CHAT, tools, chunks()))
    assert max(sizes(emits)) <= MAX_RECORD_BYTES
    emits = checked(emits)
    [error] = errors(emits)
    assert error["tool_call_id"] == "call_big" and error["reason"] == "record_too_large"
    assert "would take" in error["content"]
    assert [c["call_id"] for c in committed(emits)] == ["call_small"]
    [final] = finals(emits)
    assert final["status"] == "completed" and "dropped" not in final
    one_outcome_each(emits, ["call_big", "call_small"])


# -- what every record repeats: ids, names, tenant, details -------------------------------


def test_an_overlong_call_id_or_name_is_none() -> None:
    """A call id over 512 characters, or a tool name over 256, would be repeated in every
    record of the call: it counts as absent, the call fails ``missing_id_or_name`` (under its
    buffer key when its id is the one too long), and no record repeats the text. An id or name
    within the limits is kept."""
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    chunks = [chat_chunk([chat_tool_delta(0, "c" * 513, "f", "{}"),
                          chat_tool_delta(1, "call_2", "n" * 257, "{}"),
                          chat_tool_delta(2, "d" * 512, "f", "{}")])]
    emits = checked(feed(make(), run_envelopes("r", CHAT, tools, chunks)))
    assert sorted((e["tool_call_id"], e["reason"]) for e in errors(emits)) == [
        ("0.0", "missing_id_or_name"), ("call_2", "missing_id_or_name")]
    assert [c["call_id"] for c in committed(emits)] == ["d" * 512]
    assert max(sizes(emits)) < 8 * 1024


def test_an_overlong_tenant_goes_to_the_dlq() -> None:
    """Every output of a run repeats its tenant: a ``run.start`` whose tenant is longer than
    256 characters is ``invalid_envelope`` (the DLQ), like an overlong run id."""
    emits = feed(make(), [run_start("r", CHAT, [], tenant="t" * 257)])
    [record] = dlq(emits)
    assert record["reason"] == "invalid_envelope" and "tenant" in record["detail"]
    assert finals(feed(make(), run_envelopes("r", CHAT, [], [], tenant="t" * 256)))


def test_text_beside_argument_fragments_counts_in_the_run_text() -> None:
    """An event carrying one argument fragment within ``FRAGMENT_ENVELOPE`` bytes of its text
    counts nothing in ``max_run_text_bytes``, unless it keeps something: chunks that carry 200
    bytes of content beside a fragment used to keep their content uncounted, past any bound.
    Now the run ends ``failed`` when that text crosses ``max_run_text_bytes``."""
    tools = tools_for(CHAT, {"f": {"type": "object"}})
    chunks = [chat_call("call_1", "f", "{")]
    chunks += [chat_chunk([chat_tool_delta(0, arguments=" ")], content="x" * 200)
               for _ in range(100)]
    emits = checked(feed(make(max_run_text_bytes=20_000), run_envelopes("r", CHAT, tools,
                                                                         chunks)))
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert [e["reason"] for e in errors(emits)] == ["budget_exceeded"]


def test_text_kept_from_a_refused_event_counts_in_the_run_text() -> None:
    """A chat chunk whose content the adapter keeps before one of its tool calls is refused
    (an index beyond 2**53: the chunk goes to the DLQ) used to keep that content uncounted in
    ``max_run_text_bytes``, so a run could grow its final message past any bound. The refused
    event's bytes now count: the run ends ``failed`` once they cross the bound."""
    chunks = [chat_chunk([chat_tool_delta(2**60 + n, f"call_{n}", "f", "{}")],
                         content="x" * 300) for n in range(100)]
    emits = checked(feed(make(max_run_text_bytes=20_000),
                         run_envelopes("r", CHAT, [], [*chunks, chat_chunk(content="y")])))
    assert len(dlq(emits)) == 100
    [final] = finals(emits)
    assert final["status"] == "failed"
