"""``worker.core.assembler``: bad input and abuse through ``Assembler.feed_record``; every kind
has a defined result, and this file proves each one (hostile records; hostile runs, issue 9).

One test per case; its docstring states the defined result. Three groups:

* **Memory budgets** (``worker.core.assembler``, "Memory budgets"): a flood of open runs
  (``max_open_runs``), argument text beyond the partition's byte budget
  (``max_buffered_bytes``), and a flood of tool-call starts in one run. Running out never
  refuses a record or drops a call: runs are ended, least recently active first, and every call
  still gets exactly one outcome.
* **Hostile records**: huge fragments, deep nesting, mismatched keys, unknown providers and
  runs, late events, invalid UTF-8, non-object records, wrong versions and seqs, oversize run
  ids, NUL characters and lone surrogates. Each goes to the DLQ with a named reason, or gets a
  named outcome, and nothing raises.
* **Hostile runs** (issue 9), what a run itself sends, each test one line of this list (the
  input, then its defined outcome):

  * With block-level early commit, a later block reusing an id whose outcome is out already
    (committed early, or failed early): that outcome stands and the later call gets no
    record at all (the final message lists it ``failed``, ``duplicate_call_id``); every call
    id gets one kind of outcome, so a runner pairing results by id gets one result per id.
    Without early commit, calls sharing an id all fail ``duplicate_call_id``, each under its
    own key, whatever else ended them (an oversize text, a cancel).
  * A cancel that reaches the log before its run's ``run.start``: remembered (bounded count,
    expiry in record time) and applied when the run starts: the run ends ``cancelled`` at
    once and nothing of it commits; a cancel older than the expiry, or forgotten beyond the
    count, changes nothing. (That it survives a worker killed before the ``run.start``: a run
    head at the cancel's offset, ``tests/runtime/unit/test_early_cancel_heads.py`` and
    ``tests/runtime/integration/test_early_cancel_takeover.py``.)
  * Assistant text or thinking beyond ``max_run_text_bytes``: the run ends ``failed``, its
    uncommitted calls fail ``budget_exceeded``; argument fragments are not counted as text.
  * Many runs of big assistant text: the text kept counts in ``max_buffered_bytes``; the
    least recently active runs end ``failed`` to make room, and a run whose text alone
    exceeds it ends (``test_text_budget.py``).
  * 2.9 MB of arguments in 1-byte-ish fragments with ``ui_forward_partial_args``: progress
    records carry each fragment and its offset, so their size is linear in the argument
    bytes.

Every test feeds records through ``Assembler.feed_record`` as the worker does, and every output
line is checked to serialize with orjson (what the worker publishes) and to validate against
``schemas/output-line.schema.json``.

Issue 9's other hostile-run cases are pinned by the modules they concern:
``tests/core/unit/test_outputs.py`` (idempotency keys of ids holding ``:``),
``tests/core/unit/test_openai_chat.py`` (n > 1 choices: choice 0 written once) and
``tests/core/unit/test_schemacheck.py`` (tool schemas: references, patterns, fan-out, steps,
``uniqueItems``, sizes, laziness, memory, stack depth).
"""

from __future__ import annotations

import base64
import gc
import tracemalloc
from collections import Counter
from collections.abc import Iterable
from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    CHAT,
    PROVIDERS,
    RESPONSES,
    anthropic_message_start,
    anthropic_tail,
    anthropic_text_block,
    anthropic_tool_block,
    cancel,
    chat_chunk,
    chat_tool,
    chat_tool_delta,
    committed,
    dlq,
    errors,
    feed,
    finals,
    outcome_ids,
    provider_event,
    provider_run,
    reasons,
    responses_call,
    responses_head,
    responses_item,
    responses_tail,
    run_envelopes,
    run_start,
    stream_end,
    stream_error,
    tools_for,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.envelope import MAX_RUN_ID_LENGTH
from worker.core.ops import STATE_BYTES
from worker.core.outputs import idempotency_key
from worker.core.strictjson import MAX_DEPTH
from worker.runtime.config import load_config
from worker.runtime.schemas import validator
from worker.tools.chaos.plan import CallSpec, Plan, PlanError, RunPlan, check_intent, expected_emits
from worker.tools.chaos.verify import OutRecord, verify

OBJECT = {"type": "object"}
TOOLS = {"f": OBJECT}
MiB = 1024 * 1024
#: Bytes of schema text a run registering ``TOOLS`` holds (counted in ``max_buffered_bytes``).
SCHEMA = len(orjson.dumps(OBJECT))

OPEN_RUN_CONTENT = ("budget_exceeded: the worker's open-run budget (10 runs) was exhausted; "
                    "the least recently active run was ended")


def make(**settings: Any) -> Assembler:
    return Assembler(AssembleSettings(**settings))


def start(run_id: str, provider: str = CHAT, **kw: Any) -> dict[str, Any]:
    return run_start(run_id, provider, tools_for(provider, TOOLS), **kw)


def call_start(run_id: str, seq: int, call_id: str, index: int = 0) -> dict[str, Any]:
    """A chat chunk that opens call ``call_id`` at tool ``index`` with empty arguments."""
    return provider_event(run_id, seq, chat_chunk([chat_tool_delta(index, call_id, "f", "")]))


def args(run_id: str, seq: int, text: str, index: int = 0) -> dict[str, Any]:
    """A chat chunk with one argument fragment for tool ``index``."""
    return provider_event(run_id, seq, chat_chunk([chat_tool_delta(index, arguments=text)]))


def checked(emits: Iterable[Emit]) -> list[Emit]:
    """``emits``, each asserted to serialize with orjson (as the worker publishes it) and to
    validate as a ``latch assemble`` line."""
    emits = list(emits)
    schema = validator("output-line")
    for emit in emits:
        orjson.dumps(emit.value)
        line = emit.as_line()
        orjson.dumps(line)
        assert schema.is_valid(line), line
    return emits


def one_outcome_each(emits: Iterable[Emit], call_ids: Iterable[str]) -> None:
    """Every id in ``call_ids`` has exactly one committed call or error result, and nothing
    else has one."""
    assert Counter(outcome_ids(emits)) == Counter({c: 1 for c in call_ids})


def the_dlq_record(emits: list[Emit]) -> dict[str, Any]:
    """The only record of ``emits``, which must be a DLQ record."""
    assert [e.topic for e in emits] == [Topic.DLQ], emits
    return emits[0].value


def nested(depth: int) -> str:
    """An object holding arrays, ``depth`` levels in all (the object is level 1)."""
    return '{"a":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


# -- memory budget: open runs ------------------------------------------------------------------


def test_open_run_flood_ends_the_least_recently_active_runs() -> None:
    """100 runs against ``max_open_runs: 10``: every ``run.start`` is accepted (no DLQ record),
    and each one beyond the tenth first ends the least recently active open run, whose call
    fails ``budget_exceeded`` and whose final status is ``failed``. Activity, not age, decides:
    r00 had an event after r01..r09 started, so r01..r09 end before it. The last ten runs stay
    open and commit; all 100 calls get exactly one outcome."""
    asm = make(max_open_runs=10)
    rid = [f"r{i:02d}" for i in range(100)]
    emits: list[Emit] = []
    for i in range(10):
        emits += feed(asm, [start(rid[i]), call_start(rid[i], 1, f"call_{i}")])
    emits += feed(asm, [args("r00", 2, '{"n": 0')])
    assert emits == []
    for i in range(10, 100):
        emits += feed(asm, [start(rid[i]), call_start(rid[i], 1, f"call_{i}")])
    assert dlq(emits) == []
    ended = [f["run_id"] for f in finals(emits)]
    assert ended == [*rid[1:10], "r00", *rid[10:90]]
    assert asm.open_run_ids() == rid[90:]
    assert {f["status"] for f in finals(emits)} == {"failed"}
    assert {e["content"] for e in errors(emits)} == {OPEN_RUN_CONTENT}
    assert set(reasons(emits)) == {"budget_exceeded"} and len(errors(emits)) == 90
    for i in range(90, 100):
        emits += feed(asm, [args(rid[i], 2, "{}"), stream_end(rid[i], 3)])
    assert [c["call_id"] for c in committed(emits)] == [f"call_{i}" for i in range(90, 100)]
    one_outcome_each(checked(emits), [f"call_{i}" for i in range(100)])
    assert asm.stats["evicted_open_runs"] == 90 and asm.open_runs == 0


def test_run_ended_by_the_open_run_budget_is_finished() -> None:
    """A run ended to make room is finished like any other: a later provider event of it is
    counted for its one DLQ ``run_finished`` summary (decision 0015), and a later
    ``stream.end`` or cancel is ignored and counted."""
    asm = make(max_open_runs=1)
    feed(asm, [start("a"), call_start("a", 1, "call_a"), start("b")])
    assert feed(asm, [args("a", 2, "{}")]) == []
    assert [e.value["late"]["count"] for e in asm.summarise_late()] == [1]
    before = asm.stats["ignored_after_end"]
    assert feed(asm, [stream_end("a", 3), cancel("a")]) == []
    assert asm.stats["ignored_after_end"] == before + 2


def test_redelivered_envelopes_do_not_make_a_run_recently_active() -> None:
    """Only applied envelopes count as activity: a re-delivered one (seq already applied) is
    ignored and leaves the run where it was in the eviction order."""
    asm = make(max_open_runs=2)
    feed(asm, [start("a"), call_start("a", 1, "call_a"), start("b"), call_start("b", 1, "call_b")])
    feed(asm, [call_start("a", 1, "call_a")])  # a duplicate of a's seq 1
    emits = feed(asm, [start("c")])
    assert [f["run_id"] for f in finals(emits)] == ["a"]


# -- memory budget: buffered argument bytes ----------------------------------------------------


def test_byte_budget_ends_least_recently_active_runs_holding_text() -> None:
    """``max_buffered_bytes: 1000`` (plus the schema text the runs hold) with runs buffering
    300 bytes each: a fragment that would cross the budget ends the least recently active run
    *holding bytes*, other than its own run, until it fits; that run's call fails
    ``budget_exceeded`` (status ``failed``). A run holding nothing (e: no tools, no text) is
    never ended for bytes, however idle. The total is kept exactly, and the surviving runs
    commit."""
    budget = 1000 + 3 * SCHEMA
    asm = make(max_buffered_bytes=budget)
    head = '{"p":"' + "x" * 294  # 300 bytes
    emits = feed(asm, [run_start("e", CHAT, [])])
    for run_id in ("a", "b", "c"):
        emits += feed(asm, [start(run_id), call_start(run_id, 1, f"call_{run_id}"),
                            args(run_id, 2, head)])
    assert asm.buffered_bytes == 900 + 3 * SCHEMA and emits == []
    emits += feed(asm, [start("d"), call_start("d", 1, "call_d"), args("d", 2, head)])
    assert [f["run_id"] for f in finals(emits)] == ["a"]
    assert asm.buffered_bytes == 900 + 3 * SCHEMA
    emits += feed(asm, [args("b", 3, "x" * 100)])  # exactly the budget: fits, b now recent
    assert asm.buffered_bytes == budget and len(finals(emits)) == 1
    emits += feed(asm, [args("c", 3, "x" * 100)])  # ends d (holding, least recent), not b or e
    assert [f["run_id"] for f in finals(emits)] == ["a", "d"]
    assert asm.buffered_bytes == 800 + 2 * SCHEMA
    assert sorted(asm.open_run_ids()) == ["b", "c", "e"]
    content = (f"budget_exceeded: the worker's argument byte budget ({budget} bytes) was "
               "exhausted; the least recently active run was ended")
    assert [(e["tool_call_id"], e["content"]) for e in errors(emits)] == [
        ("call_a", content), ("call_d", content)]
    for run_id in ("b", "c"):
        emits += feed(asm, [args(run_id, 4, '"}'), stream_end(run_id, 5)])
    emits += feed(asm, [stream_end("e", 1)])
    assert sorted(c["call_id"] for c in committed(emits)) == ["call_b", "call_c"]
    assert {f["run_id"]: f["status"] for f in finals(emits)} == {
        "a": "failed", "d": "failed", "b": "completed", "c": "completed", "e": "completed"}
    one_outcome_each(checked(emits), ["call_a", "call_b", "call_c", "call_d"])
    assert asm.buffered_bytes == 0 and asm.stats["evicted_buffered_bytes"] == 2


def test_run_alone_over_the_byte_budget_fails_only_the_receiving_call() -> None:
    """When the receiving run alone would cross ``max_buffered_bytes``, ending other runs
    cannot help and none is ended: the call that received the fragment fails
    ``budget_exceeded``, its buffer is dropped, its later fragments are ignored, and the run's
    other calls commit."""
    asm = make(max_buffered_bytes=1000)
    emits = feed(asm, [start("a"), call_start("a", 1, "call_a"), args("a", 2, "{" + " " * 299)])
    emits += feed(asm, [start("b"), call_start("b", 1, "call_b0", 0),
                        call_start("b", 2, "call_b1", 1),
                        args("b", 3, "{" + " " * 599, 0), args("b", 4, "{" + " " * 499, 1)])
    assert finals(emits) == [] and asm.buffered_bytes == 900 + 2 * SCHEMA
    assert asm.stats["calls_over_buffered_bytes"] == 1
    emits += feed(asm, [args("b", 5, "}", 1), args("b", 6, "}", 0), stream_end("b", 7),
                        args("a", 3, "}"), stream_end("a", 4)])
    [error] = errors(emits)
    assert error["tool_call_id"] == "call_b1" and error["content"] == (
        "budget_exceeded: the worker's argument byte budget (1000 bytes) cannot hold this run's "
        "calls; this call's text was dropped")
    assert sorted(c["call_id"] for c in committed(emits)) == ["call_a", "call_b0"]
    one_outcome_each(checked(emits), ["call_a", "call_b0", "call_b1"])
    assert asm.buffered_bytes == 0


def test_restated_arguments_replace_their_bytes() -> None:
    """The Responses API restates a call's whole text (``arguments.done``, ``output_item.done``):
    the restatement replaces the buffer, so the bytes are counted once, and they are released
    when the run ends. (The adapter's kept response fields and item, without its arguments,
    count as its text, and the item its state, ``STATE_BYTES``.)"""
    asm = make()
    text = '{"p": "' + "x" * 293 + '"}'  # 302 bytes
    events = [*responses_head(), *responses_call(0, "call_1", "f", text)]
    feed(asm, run_envelopes("r1", RESPONSES, tools_for(RESPONSES, TOOLS), events, end=False))
    kept = (len(orjson.dumps({"id": "resp_1", "model": "gpt-4.1", "status": "in_progress"}))
            + len(orjson.dumps(responses_item(0, "call_1", "f", ""))) + STATE_BYTES)
    assert asm.buffered_bytes == 302 + SCHEMA + kept
    emits = feed(asm, [provider_event("r1", 99, responses_tail())])
    assert [c["call_id"] for c in committed(emits)] == ["call_1"]
    assert asm.buffered_bytes == 0


# -- memory budget: calls per run --------------------------------------------------------------


def test_flood_of_tool_call_starts_in_one_chunk_ends_the_run() -> None:
    """One chat chunk that starts 10,000 calls: a run may hold ``4 *
    max_tool_calls_in_flight_assemble`` calls (placeholders included), so the 129th call start
    (defaults: 4 * 32 + 1) ends the whole run with status ``failed``. Exactly those 129 calls
    get an outcome, each ``too_many_tool_calls``; the rest of the chunk is not read."""
    asm = make()
    chunk = chat_chunk([chat_tool_delta(i, f"call_{i}", "f", "{}") for i in range(10_000)])
    emits = feed(asm, [start("r1"), provider_event("r1", 1, chunk)])
    [final] = finals(emits)
    assert final["status"] == "failed" and len(final["outcomes"]) == 129
    assert set(reasons(emits)) == {"too_many_tool_calls"}
    one_outcome_each(checked(emits), [f"call_{i}" for i in range(129)])
    assert asm.open_runs == 0 and asm.stats["runs_ended_too_many_calls"] == 1


def test_flood_of_tool_call_starts_across_events_ends_the_run() -> None:
    """Anthropic ``tool_use`` blocks started one event each, with
    ``max_tool_calls_in_flight_assemble: 2``: calls 0-1 are in flight, calls 2-7 get failed
    placeholders (``at most 2 calls may be assembled at once``), and the start of call 8 ends the
    run (status ``failed``): the in-flight calls and call 8 fail ``too_many_tool_calls`` naming
    the run-level cap. The blocks that follow go to the DLQ as ``run_finished``."""
    asm = make(max_tool_calls_in_flight_assemble=2)
    events = [anthropic_message_start()]
    for i in range(12):
        events += anthropic_tool_block(i, f"toolu_{i}", "f", "{}", pieces=1, stop=False)[:1]
    envs = run_envelopes("r1", ANTHROPIC, tools_for(ANTHROPIC, TOOLS), events)
    emits = feed(asm, envs)
    [final] = finals(emits)
    assert final["status"] == "failed"
    by_id = {e["tool_call_id"]: e["content"] for e in errors(emits)}
    cap = "too_many_tool_calls: the run started more than 8 calls; the whole run was ended"
    placeholder = "too_many_tool_calls: at most 2 calls may be assembled at once"
    assert by_id == {**{f"toolu_{i}": cap for i in (0, 1, 8)},
                     **{f"toolu_{i}": placeholder for i in range(2, 8)}}
    assert dlq(emits) == []  # blocks 9, 10, 11: counted for the one summary (decision 0015)
    assert [e.value["late"]["count"] for e in asm.summarise_late()] == [3]
    one_outcome_each(checked(emits), [f"toolu_{i}" for i in range(9)])


# -- huge and deep input -----------------------------------------------------------------------


def huge_fragment_run(provider: str, size: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The envelopes before a call's huge fragment, and the envelope carrying it."""
    text = '{"p": "' + "x" * size + '"}'
    if provider == CHAT:
        head = [chat_chunk([chat_tool_delta(0, "call_1", "f", "")])]
        huge = chat_chunk([chat_tool_delta(0, arguments=text)])
    elif provider == ANTHROPIC:
        head = [anthropic_message_start(), *anthropic_tool_block(0, "call_1", "f", "", stop=False)]
        huge = {"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": text}}
    else:
        head = [*responses_head(), *responses_call(0, "call_1", "f", "", done=False)]
        huge = {"type": "response.output_item.done", "output_index": 0, "item": {
            "type": "function_call", "id": "fc_0", "call_id": "call_1", "name": "f",
            "arguments": text, "status": "completed"}}
    envs = run_envelopes("r1", provider, tools_for(provider, TOOLS), head, end=False)
    return envs, provider_event("r1", len(envs), huge)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_huge_single_fragment_is_never_kept(provider: str) -> None:
    """A 10 MiB argument fragment in one delta (for Responses: a 10 MiB restated item) fails
    the call ``arguments_exceed_max_bytes`` at once, and nothing keeps the text: the buffered
    byte total stays the run's schema text, the memory still allocated after the record is far
    below its size (the adapter keeps no copy either), and the final message is small."""
    asm = make()
    envs, huge = huge_fragment_run(provider, 10 * MiB)
    feed(asm, envs)
    held = asm.buffered_bytes  # the schema text, and the adapter's few kept fields
    record = orjson.dumps(huge)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        emits = asm.feed_record(None, record)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < MiB, f"{kept} bytes still allocated after a {len(record)}-byte record"
    # Nothing of the fragment (Responses: the restated item, kept without its arguments,
    # replaces the added one, 2 bytes shorter: "completed" against "in_progress").
    assert SCHEMA <= asm.buffered_bytes <= held < SCHEMA + 1024
    end = (stream_end("r1", 999) if provider == CHAT
           else provider_event("r1", 999, anthropic_tail()[-1] if provider == ANTHROPIC
                               else responses_tail()))
    emits += feed(asm, [end])
    [error] = errors(checked(emits))
    assert error["reason"] == "arguments_exceed_max_bytes"
    assert error["content"] == "arguments_exceed_max_bytes: more than 262144 bytes of arguments"
    assert len(orjson.dumps(finals(emits)[0])) < 4096


@pytest.mark.parametrize("provider", PROVIDERS)
def test_arguments_nested_10000_levels_are_invalid_json(provider: str) -> None:
    """Arguments nesting 10,000 arrays fail ``invalid_json``; nothing recurses that deep, so
    no ``RecursionError``, and the content quotes no argument text."""
    emits = feed(make(), provider_run(provider, "r1", TOOLS, [("call_1", "f", nested(10_000))]))
    [error] = errors(checked(emits))
    assert error["reason"] == "invalid_json" and "[[" not in error["content"]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 255, 600, 1000])
def test_arguments_nested_deeper_than_the_limit_are_invalid_json(provider: str,
                                                                 depth: int) -> None:
    """Arguments nesting more than 64 levels fail ``invalid_json`` ("arrays and objects nested
    deeper than 64 levels"), whatever the caller's stack depth. Before this limit, orjson read
    such a text (it reads up to 1024 levels) but could not write the committed call back (it
    writes up to 254): the worker could not publish it, stopped, and met the same record again
    on restart."""
    emits = feed(make(), provider_run(provider, "r1", TOOLS, [("call_1", "f", nested(depth))]))
    [error] = errors(checked(emits))
    assert error["content"].startswith(
        f"invalid_json: arrays and objects nested deeper than {MAX_DEPTH} levels")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_arguments_nested_to_the_limit_commit(provider: str) -> None:
    """Arguments nesting exactly 64 levels are valid and commit, and every output record,
    final message included, serializes."""
    emits = feed(make(), provider_run(provider, "r1", TOOLS, [("call_1", "f", nested(MAX_DEPTH))]))
    assert [c["call_id"] for c in committed(checked(emits))] == ["call_1"]


def test_event_nested_10000_levels_is_undecodable() -> None:
    """An envelope whose event nests 10,000 levels is beyond what orjson reads: the DLQ gets
    it as ``undecodable`` with its bytes, and the run goes on."""
    asm = make()
    feed(asm, [start("r1")])
    value = b'{"v":1,"run_id":"r1","seq":1,"type":"provider.event","event":{"a":' + (
        b"[" * 10_000 + b"]" * 10_000 + b"}}")
    record = the_dlq_record(asm.feed_record(b"r1", value))
    assert record["reason"] == "undecodable"
    assert base64.b64decode(record["original_b64"]) == value
    assert asm.is_open("r1")


DEEP = orjson.loads(nested(MAX_DEPTH))  # 64 levels on its own, one more inside anything

#: Provider events that would make an adapter keep a value nesting 65 levels or more.
DEEP_KEPT_EVENTS = {
    "anthropic_content_block": (ANTHROPIC, {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "text", "text": "",
                                                              "x": DEEP}}),
    "anthropic_citation": (ANTHROPIC, {"type": "content_block_delta", "index": 0, "delta": {
        "type": "citations_delta", "citation": {"x": DEEP}}}),
    "responses_output_item": (RESPONSES, {"type": "response.output_item.added",
                                          "output_index": 0, "item": {"type": "message",
                                                                      "x": DEEP}}),
    # The terminal event's ``output`` is no longer kept (decision 0005: the streamed items
    # are the final message), so a deep item there is read and dropped like any unkept part.
}


@pytest.mark.parametrize("name", list(DEEP_KEPT_EVENTS))
def test_event_part_kept_deeper_than_the_limit_is_invalid_envelope(name: str) -> None:
    """A provider event whose part that the adapter keeps for the final message nests more
    than 64 levels, though orjson reads it, is ``invalid_envelope``: the kept copy and the
    final message that writes it back must behave the same at any stack depth. Nothing of
    it is kept: the run goes on and completes."""
    provider, event = DEEP_KEPT_EVENTS[name]
    asm = make()
    head = {ANTHROPIC: [anthropic_message_start(),
                        *anthropic_text_block(0, "hi")[:1]],
            RESPONSES: responses_head()}[provider]
    feed(asm, [start("r1", provider), *(provider_event("r1", n, e)
                                        for n, e in enumerate(head, 1))])
    bad = provider_event("r1", 10, event)
    record = the_dlq_record(asm.feed_record(b"r1", orjson.dumps(bad)))
    assert record["reason"] == "invalid_envelope"
    assert record["detail"] == f"arrays and objects nested deeper than {MAX_DEPTH} levels"
    assert asm.is_open("r1")
    rest = provider_run(provider, "r1", TOOLS, [("call_1", "f", "{}")])[1:]
    if provider == ANTHROPIC:  # block 0 is the head's text block: the call takes block 1
        rest = [{**e, "event": {**e["event"], "index": e["event"]["index"] + 1}}
                if "index" in e.get("event", {}) else e for e in rest]
    emits = feed(asm, [{**e, "seq": e["seq"] + 20} for e in rest])
    assert [c["call_id"] for c in committed(checked(emits))] == ["call_1"]
    assert b'"x"' not in orjson.dumps(finals(emits)[0])


def test_event_part_not_kept_may_nest_deeper() -> None:
    """A part of an event that no adapter keeps (a ping's fields, an unknown field of a
    chunk) is not bounded: it is read where it stands and dropped, and the run goes on."""
    asm = make()
    feed(asm, [start("r1")])
    ignored = provider_event("r1", 1, {**chat_chunk(content="hi"), "x": DEEP})
    assert asm.feed_record(b"r1", orjson.dumps(ignored)) == []
    ok = provider_event("r1", 2, chat_chunk([chat_tool_delta(0, "call_1", "f", "{}")]))
    emits = feed(asm, [ok, stream_end("r1", 3)])
    assert [c["call_id"] for c in committed(checked(emits))] == ["call_1"]
    assert finals(emits)[0]["message"]["content"] == "hi"


def test_run_start_nested_deeper_than_the_limit_is_invalid_envelope() -> None:
    """A ``run.start`` nesting more than 64 levels is ``invalid_envelope``: its tools are kept
    for the run and their schemas compiled, which must not depend on the caller's stack."""
    asm = make()
    bad = {**start("r1"), "tools": [chat_tool("f", {"type": "object", "x": DEEP})]}
    record = the_dlq_record(asm.feed_record(b"r1", orjson.dumps(bad)))
    assert record["reason"] == "invalid_envelope"
    assert record["detail"] == f"arrays and objects nested deeper than {MAX_DEPTH} levels"
    assert not asm.is_open("r1")


ORDER_KEY_EVENTS = {
    "chat_tool_index_2**64-1": (
        CHAT, chat_chunk([chat_tool_delta(2**64 - 1, "call_1", "f", "{}")])),
    "chat_choice_2**60": (CHAT, chat_chunk([chat_tool_delta(0, "call_1", "f", "{}")],
                                           choice=2**60)),
    "anthropic_block_-1": (ANTHROPIC, {"type": "content_block_start", "index": -1,
                                       "content_block": {"type": "tool_use", "id": "call_1",
                                                         "name": "f", "input": {}}}),
    "anthropic_block_true": (ANTHROPIC, {"type": "content_block_start", "index": True,
                                         "content_block": {"type": "tool_use", "id": "call_1",
                                                           "name": "f", "input": {}}}),
    "responses_output_index_2**63": (RESPONSES, {
        "type": "response.output_item.added", "output_index": 2**63,
        "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
                 "arguments": ""}}),
}


@pytest.mark.parametrize("name", ORDER_KEY_EVENTS)
def test_call_index_out_of_range(name: str) -> None:
    """A provider event that opens a call at an index that is not an integer (``true``), is
    negative, or is beyond 2**53 - 1 (tool, content block or output index, or chat choice),
    goes to the DLQ as ``invalid_envelope``:
    every outcome repeats the index, JSON readers lose precision beyond 2**53, and orjson
    cannot write an integer beyond 2**64 - 1 (which the next chat call without an index would
    have got). The run goes on."""
    provider, event = ORDER_KEY_EVENTS[name]
    asm = make()
    feed(asm, [start("r1", provider)])
    record = the_dlq_record(feed(asm, [provider_event("r1", 1, event)]))
    assert record["reason"] == "invalid_envelope" and asm.is_open("r1")
    emits = feed(asm, [stream_end("r1", 2)])
    assert errors(checked(emits)) == [] and committed(emits) == []


def test_deep_server_tool_input_is_not_written_back() -> None:
    """An Anthropic server tool block whose ``partial_json`` text nests 300 levels (one
    string in the envelope, so the envelope is shallow) is shown in the final message with
    ``input: {}``: the final message always serializes."""
    events = [anthropic_message_start(),
              *anthropic_tool_block(0, "srvtoolu_1", "web_search", nested(300),
                                    kind="server_tool_use"),
              *anthropic_tail("end_turn")]
    emits = feed(make(), run_envelopes("r1", ANTHROPIC, tools_for(ANTHROPIC, TOOLS), events))
    [final] = finals(checked(emits))
    assert final["message"]["content"][0]["input"] == {}


# -- contract breaks that go to the DLQ --------------------------------------------------------


def test_key_and_run_id_differ() -> None:
    """A record whose key is not its envelope's run_id goes to the DLQ as ``key_mismatch``
    (naming the envelope's run), and does not touch either run."""
    asm = make()
    feed(asm, [start("r1"), start("r2")])
    emits = asm.feed_record(b"r2", orjson.dumps(args("r1", 1, "{}")))
    record = the_dlq_record(emits)
    assert record["reason"] == "key_mismatch" and record["run_id"] == "r1"
    assert sorted(asm.open_run_ids()) == ["r1", "r2"]


def test_unknown_provider() -> None:
    """A ``run.start`` naming a provider Latch does not know goes to the DLQ as
    ``unknown_provider``, and no run is opened (its events are then ``unknown_run``)."""
    asm = make()
    record = the_dlq_record(feed(asm, [{**start("r1"), "provider": "cohere.chat"}]))
    assert record["reason"] == "unknown_provider"
    assert dlq(feed(asm, [args("r1", 1, "{}")]))[0]["reason"] == "unknown_run"


def test_cancel_for_an_unknown_run() -> None:
    """A cancel for a run that has not started is remembered for its ``run.start``, not sent
    to the DLQ (``test_cancel_before_run_start_cancels_the_run`` in test_remembered.py proves
    what it does then)."""
    asm = make()
    assert feed(asm, [cancel("nobody")]) == []
    assert asm.early_cancel_pending("nobody")


def test_events_after_the_run_ended() -> None:
    """After a run's end: a provider event or a ``stream.error`` with a new seq is counted for
    the run's one DLQ ``run_finished`` summary (decision 0015); a ``stream.end`` or a cancel
    is ignored and counted (``ignored_after_end``); a re-delivered envelope is ignored and
    counted (``duplicates``). No outcome changes."""
    asm = make()
    envs = provider_run(CHAT, "r1", TOOLS, [("call_1", "f", "{}")])
    first = feed(asm, envs)
    assert [c["call_id"] for c in committed(first)] == ["call_1"]
    late = feed(asm, [args("r1", 50, "{}"), stream_error("r1", 51)])
    assert dlq(late) == []
    before = Counter(asm.stats)
    assert feed(asm, [stream_end("r1", 52), cancel("r1"), envs[1]]) == []
    assert asm.stats - before == Counter({"ignored_after_end": 2, "duplicates": 1})
    assert [e.value["late"]["count"] for e in asm.summarise_late()] == [2]


@pytest.mark.parametrize("value", [
    b'{"v":1,"run_id":"r1","seq":0,"type":"run.start","provider":"openai.chat","tenant":"\xff"}',
    b'{"v":1,"run_id":"r1","seq":1,"type":"provider.event","event":{"x":"\xc3"}}',
    b'\xef\xbb\xbf{"v":1,"run_id":"r1","seq":1,"type":"stream.end"}',
], ids=["invalid_byte", "truncated_sequence", "byte_order_mark"])
def test_invalid_utf8(value: bytes) -> None:
    """A record that is not valid UTF-8 (an invalid byte, a truncated multi-byte sequence, a
    byte order mark) goes to the DLQ as ``undecodable``, its bytes preserved exactly."""
    record = the_dlq_record(make().feed_record(b"r1", value))
    assert record["reason"] == "undecodable"
    assert base64.b64decode(record["original_b64"]) == value


@pytest.mark.parametrize("value", [b"[]", b'[{"v":1}]', b"7", b"-1.5e3", b'"run.start"',
                                   b"null", b"true"])
def test_json_that_is_not_an_object(value: bytes) -> None:
    """A record that is JSON but not an object (array, number, string, null, boolean) goes to
    the DLQ as ``invalid_envelope`` and names no run."""
    record = the_dlq_record(make().feed_record(None, value))
    assert record["reason"] == "invalid_envelope" and record["run_id"] is None


@pytest.mark.parametrize("version", [2, 0, "1", 1.0, None])
def test_unsupported_version(version: Any) -> None:
    """``v`` other than the integer 1 (``2``, ``0``, ``"1"``, ``1.0``, ``null``) goes to the
    DLQ as ``unsupported_version``."""
    record = the_dlq_record(feed(make(), [{**start("r1"), "v": version}]))
    assert record["reason"] == "unsupported_version"


@pytest.mark.parametrize("seq", [b"-1", b"1.5", b"2.0", b"1e3", b"true", b"false", b'"3"',
                                 b"null", b"18446744073709551616"])
def test_bad_seq(seq: bytes) -> None:
    """A seq that is not a non-negative integer (negative, a float even when integral, a
    boolean, a string, null, or 2**64, which orjson reads as a float) goes to the DLQ as
    ``invalid_envelope``, and the open run is untouched."""
    asm = make()
    feed(asm, [start("r1")])
    value = b'{"v":1,"run_id":"r1","type":"stream.end","seq":' + seq + b"}"
    record = the_dlq_record(asm.feed_record(b"r1", value))
    assert record["reason"] == "invalid_envelope" and asm.is_open("r1")


def test_enormous_seq_is_accepted_and_later_envelopes_are_duplicates() -> None:
    """The largest seq orjson reads as an integer (2**64 - 1) is valid and applied; every later
    envelope of the run then has a seq already passed, so it is a re-delivery, ignored and
    counted. The run still ends, by a cancel (or the idle timeout), with one outcome per call."""
    asm = make()
    emits = feed(asm, [start("r1"), call_start("r1", 2**64 - 1, "call_1")])
    before = asm.stats["duplicates"]
    emits += feed(asm, [args("r1", 5, "{}"), stream_end("r1", 6)])
    assert asm.stats["duplicates"] == before + 2 and asm.is_open("r1")
    emits += feed(asm, [cancel("r1")])
    assert reasons(checked(emits)) == ["cancelled"]


def test_run_id_of_100_kb() -> None:
    """A run_id longer than 256 characters (here 100 KB) goes to the DLQ as
    ``invalid_envelope``; the DLQ record names no run (the id is in the original bytes), so no
    output repeats it."""
    run_id = "r" * 100_000
    record = the_dlq_record(feed(make(), [start(run_id)]))
    assert record["reason"] == "invalid_envelope" and record["run_id"] is None
    assert record["detail"] == f"run_id has 100000 characters, more than {MAX_RUN_ID_LENGTH}"


def test_run_id_at_the_limit() -> None:
    """A run_id of exactly 256 characters (multi-byte ones included) is accepted; 257 is
    ``invalid_envelope``, on cancels as on stream envelopes."""
    asm = make()
    longest = "é" * MAX_RUN_ID_LENGTH
    emits = [e for env in provider_run(CHAT, longest, TOOLS, [("call_1", "f", "{}")])
             for e in asm.feed_record(longest.encode(), orjson.dumps(env))]
    assert [c["run_id"] for c in committed(checked(emits))] == [longest]
    assert the_dlq_record(feed(asm, [cancel("x" * 257)]))["reason"] == "invalid_envelope"


def test_nul_characters_in_strings() -> None:
    """An escaped NUL (``\\u0000``) is an ordinary character: in a run_id (and its key) and in
    argument strings it is kept exactly and the call commits. An unescaped NUL byte inside a
    JSON string is not JSON: in argument text the call fails ``invalid_json``; in a record the
    DLQ gets it as ``undecodable``."""
    asm = make()
    run_id = "r\x001"
    envs = provider_run(CHAT, run_id, TOOLS, [("call_1", "f", '{"p": "a\\u0000b"}'),
                                              ("call_2", "f", '{"p": "a\x00b"}')])
    emits = [e for env in envs for e in asm.feed_record(run_id.encode(), orjson.dumps(env))]
    [ok] = committed(checked(emits))
    assert ok["arguments"] == {"p": "a\x00b"} and ok["run_id"] == run_id
    assert reasons(emits) == ["invalid_json"]
    raw = (b'{"v":1,"run_id":"r2","seq":0,"type":"run.start","provider":"openai.chat",'
           b'"tenant":"a\x00"}')
    assert the_dlq_record(asm.feed_record(b"r2", raw))["reason"] == "undecodable"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_lone_surrogate_escapes_in_arguments(provider: str) -> None:
    """A lone surrogate escape (``\\ud800`` without its pair, or a low one alone) in argument
    text is not strict JSON: the call fails ``invalid_json``. A valid pair split across two
    fragments is just text, reassembled, and commits."""
    calls = [("call_1", "f", '{"p": "\\ud800"}'), ("call_2", "f", '{"p": "\\udc00x"}'),
             ("call_3", "f", '{"p": "\\ud83d\\ude00"}')]
    emits = checked(feed(make(), provider_run(provider, "r1", TOOLS, calls, pieces=2)))
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("call_1", "invalid_json"), ("call_2", "invalid_json")]
    [ok] = committed(emits)
    assert ok["arguments"] == {"p": "\U0001f600"}


def test_lone_surrogate_escape_in_an_envelope() -> None:
    """A lone surrogate escape anywhere in a record's JSON (here assistant text) is not valid
    JSON text for orjson: the DLQ gets the record as ``undecodable``; the run goes on."""
    asm = make()
    feed(asm, [start("r1")])
    value = b'{"v":1,"run_id":"r1","seq":1,"type":"provider.event","event":{"choices":[' \
            b'{"index":0,"delta":{"content":"\\ud800"}}]}}'
    assert the_dlq_record(asm.feed_record(b"r1", value))["reason"] == "undecodable"
    assert asm.is_open("r1")


# -- progress ------------------------------------------------------------------------------


def test_partial_argument_progress_is_linear_in_the_argument_bytes() -> None:
    """With ``ui_forward_partial_args``, 4,000 fragments of 25 bytes give progress records
    holding each fragment once (about 100 KB of text in all, where re-sending the buffer gave
    200 MB); the fragments, applied at their offsets, rebuild the text."""
    fragments = ['{"s": "'] + ["x" * 25] * 4000 + ['"}']
    text = "".join(fragments)
    chunks = [chat_chunk([chat_tool_delta(0, "c1", "f", fragments[0])])]
    chunks += [chat_chunk([chat_tool_delta(0, arguments=f)]) for f in fragments[1:]]
    asm = make(emit_progress=True, ui_forward_partial_args=True, max_tool_argument_bytes=MiB)
    emits = feed(asm, run_envelopes("r", CHAT, tools_for(CHAT, {"f": OBJECT}), chunks))
    progress = [e.value for e in emits if e.topic is Topic.PROGRESS]
    assert len(progress) == len(fragments)
    assert sum(len(p["arguments_delta"]) for p in progress) == len(text)
    rebuilt = b""
    for p in progress:
        rebuilt = rebuilt[:p["arguments_offset"]] + p["arguments_delta"].encode()
    assert rebuilt.decode() == text
    checked(emits[-5:])


# -- one id, one outcome -----------------------------------------------------------------------


def early_commit_reuse_run(run_id: str = "r") -> list[dict[str, Any]]:
    """An Anthropic run whose block 0 (tool ``f``, early commit) and block 2 share id ``X``."""
    events = [anthropic_message_start(), *anthropic_tool_block(0, "X", "f", "{}"),
              *anthropic_tool_block(1, "Y", "f", "{}"), *anthropic_tool_block(2, "X", "f", "{}"),
              *anthropic_tail()]
    return run_envelopes(run_id, ANTHROPIC, tools_for(ANTHROPIC, {"f": OBJECT}), events)


EARLY = {"execute_before_stream_end": True, "allow_pipelined_execute": ("f",)}


def kinds_per_id(emits: list[Emit]) -> dict[str, set[str]]:
    """Per call id, the kinds of outcome its records carry ("committed" or the reason)."""
    kinds: dict[str, set[str]] = {}
    for e in emits:
        if e.topic is Topic.COMMITTED:
            kinds.setdefault(e.value["call_id"], set()).add("committed")
        elif e.topic is Topic.ERRORS:
            kinds.setdefault(e.value["tool_call_id"], set()).add(e.value["reason"])
    return kinds


def test_early_committed_id_reused_later_gets_no_second_outcome() -> None:
    """Block 0 commits ``X`` at its block end; block 2 reuses ``X``: it gets no record (the
    committed ``r:X`` stays the id's only outcome), the final lists it ``failed``,
    ``duplicate_call_id`` after the committed one, and the assembler counts it."""
    asm = make(**EARLY)
    emits = checked(feed(asm, early_commit_reuse_run()))
    done = committed(emits)
    assert [(c["call_id"], c["index"], c["idempotency_key"]) for c in done] == [
        ("X", 0, "r:X"), ("Y", 1, "r:Y")]
    assert errors(emits) == []
    assert kinds_per_id(emits) == {"X": {"committed"}, "Y": {"committed"}}
    assert [(o["tool_call_id"], o["index"], o["state"], o.get("reason"))
            for o in finals(emits)[0]["outcomes"]] == [
        ("X", 0, "committed", None), ("Y", 1, "committed", None),
        ("X", 2, "failed", "duplicate_call_id")]
    assert asm.stats["reused_ids_suppressed"] == 1


def test_early_error_then_a_reused_id_gets_no_second_outcome() -> None:
    """Block 0 (``X``, early commit allowed) fails ``invalid_json`` at its block end; block 1
    reuses ``X`` with valid arguments: no record for it either (not a commit, not a
    ``duplicate_call_id``): ``X`` has the one error result, the final lists both calls."""
    events = [anthropic_message_start(), *anthropic_tool_block(0, "X", "f", '{"a": '),
              *anthropic_tool_block(1, "X", "f", "{}"), *anthropic_tail()]
    asm = make(**EARLY)
    emits = checked(feed(asm, run_envelopes("r", ANTHROPIC, tools_for(ANTHROPIC, {"f": OBJECT}),
                                            events)))
    assert kinds_per_id(emits) == {"X": {"invalid_json"}}
    assert [e["idempotency_key"] for e in errors(emits)] == ["r:X"]
    assert [(o["state"], o.get("reason")) for o in finals(emits)[0]["outcomes"]] == [
        ("failed", "invalid_json"), ("failed", "duplicate_call_id")]
    assert asm.stats["reused_ids_suppressed"] == 1


def test_without_early_commit_calls_sharing_an_id_all_fail_duplicate_call_id() -> None:
    """Without early commit every call sharing an id fails ``duplicate_call_id`` under its
    own key, whatever else ended it: an oversize text or a cancel does not give the id a
    second kind of outcome."""
    run = early_commit_reuse_run()
    emits = checked(feed(make(), run))
    assert kinds_per_id(emits) == {"X": {"duplicate_call_id"}, "Y": {"committed"}}
    assert [e["idempotency_key"] for e in errors(emits)] == ["r:X:0", "r:X:2"]
    big = [anthropic_message_start(), *anthropic_tool_block(0, "X", "f", '{"a": "' + "x" * 99
                                                             + '"}'),
           *anthropic_tool_block(1, "X", "f", "{}"), *anthropic_tail()]
    emits = checked(feed(make(max_tool_argument_bytes=64),
                         run_envelopes("r", ANTHROPIC, tools_for(ANTHROPIC, {"f": OBJECT}), big)))
    assert kinds_per_id(emits) == {"X": {"duplicate_call_id"}}
    cut = run_envelopes("r", ANTHROPIC, tools_for(ANTHROPIC, {"f": OBJECT}), big[:-4], end=False)
    emits = checked(feed(make(max_tool_argument_bytes=64), [*cut, cancel("r")]))
    assert kinds_per_id(emits) == {"X": {"duplicate_call_id"}}
    assert len(errors(emits)) == 2


def _early_reuse_plan(run_id: str) -> tuple[RunPlan, Any]:
    config = load_config(None, env={
        "LATCH_AGENT_STREAM_ASSEMBLE__EXECUTE_BEFORE_STREAM_END": "true",
        "LATCH_AGENT_STREAM_ASSEMBLE__ALLOW_PIPELINED_EXECUTE": "[\"f\"]"})
    envelopes = [orjson.dumps(e) for e in early_commit_reuse_run(run_id)]
    opened = {cid: CallSpec(cid, "f", "{}", "commit", {}) for cid in ("X", "Y")}
    run = RunPlan(run_id, ANTHROPIC, "early", envelopes, None, opened)
    run.expected = expected_emits(run, config)
    return run, config


def _old_rule(emits: list[Emit], run_id: str) -> list[Emit]:
    """``emits`` as the core gave them before (issue 9 item 4): the later call reusing the
    committed id ``X`` also had an error result, ``duplicate_call_id`` under its own key."""
    final = next(e for e in emits if e.topic is Topic.FINAL)
    error = {"v": 1, "run_id": run_id, "tenant": "t1", "provider": ANTHROPIC,
             "tool_call_id": "X", "name": "f", "index": 2, "is_error": True, "state": "failed",
             "reason": "duplicate_call_id", "content": "duplicate_call_id: another call of "
             "this run has the same id", "idempotency_key": idempotency_key(run_id, "X", "2")}
    return [e for e in emits if e is not final] + [Emit(Topic.ERRORS, run_id, error), final]


def test_chaos_checks_demand_one_kind_of_outcome_per_id() -> None:
    """The chaos verifier and the plan's ``check_intent`` accept the run above (the final
    lists the unrecorded reuse), and both refuse the old rule's records (a committed ``X``
    and a ``duplicate_call_id`` result for ``X``), as well as a forged second outcome for
    the committed call."""
    run, _ = _early_reuse_plan("a:b")
    plan = Plan(1, [run], [])

    def records(emits: list[Emit]) -> list[OutRecord]:
        return [OutRecord(e.topic.value, 0, n, b"a:b", orjson.dumps(e.value))
                for n, e in enumerate(emits)]

    verdict = verify(plan, records(run.expected))
    assert verdict.ok, verdict.failures
    check_intent(run)

    old = _old_rule(run.expected, "a:b")
    assert verify(plan, records(old)).contradictions
    old_run = RunPlan("a:b", ANTHROPIC, "early", run.envelopes, None, run.opened, expected=old)
    with pytest.raises(PlanError, match="2 kinds of outcome"):
        check_intent(old_run)

    forged = {**orjson.loads(records(run.expected)[0].value), "is_error": True,
              "state": "failed", "reason": "schema_invalid", "idempotency_key": "other"}
    forged["tool_call_id"] = forged.pop("call_id")
    assert verify(plan, [*records(run.expected),
                         OutRecord("errors", 0, 99, b"a:b", orjson.dumps(forged))]
                  ).contradictions


# -- text a run may hold ---------------------------------------------------------------------


def test_run_text_is_bounded() -> None:
    """Assistant text beyond ``max_run_text_bytes`` ends the run: status ``failed``, the open
    call fails ``budget_exceeded``, later events go nowhere; the final message stays small."""
    asm = make(max_run_text_bytes=50_000)
    head = run_envelopes("r", CHAT, tools_for(CHAT, {"f": OBJECT}),
                         [chat_chunk([chat_tool_delta(0, "c1", "f", "{")])], end=False)
    emits = feed(asm, head)
    for seq in range(2, 40):
        emits += feed(asm, [provider_event("r", seq, chat_chunk(content="x" * 2000))])
    emits = checked(emits)
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert len(final["message"]["content"] or "") <= 50_000
    [error] = errors(emits)
    assert error["reason"] == "budget_exceeded" and "exceeded 50000 bytes" in error["content"]
    assert asm.stats["runs_over_text_bytes"] == 1


def test_argument_fragments_are_not_text() -> None:
    """A 200 KB argument in 20,000 small fragments does not count as the run's text: with a
    tight text bound the call commits."""
    frags = ['{"s": "'] + ["abcdefghij"] * 20_000 + ['"}']
    chunks = [chat_chunk([chat_tool_delta(0, "c1", "f", frags[0])])]
    chunks += [chat_chunk([chat_tool_delta(0, arguments=f)]) for f in frags[1:]]
    emits = feed(make(max_run_text_bytes=10_000),
                 run_envelopes("r", CHAT, tools_for(CHAT, {"f": OBJECT}), chunks))
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
