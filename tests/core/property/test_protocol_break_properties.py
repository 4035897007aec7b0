"""Property: a stream that breaks its own protocol fails the run cleanly, and every call id it
carried before its end gets exactly one outcome (issue 11, item 4; docs/providers.md, "Protocol
breaks").

For each of the five providers a well-formed run of 1 to 3 calls, cut into any number of
fragments, gets one injected event of one of its kinds of break, at any place where it breaks
the protocol. Chat, Anthropic and Responses:

* ``repeat``: a second start (Anthropic ``message_start`` with another id, or a
  ``tool_use`` block start at an index in use; Responses ``output_item.added`` at an
  output_index in use; chat: a new id at a tool index in use, which chat's protocol allows);
* ``delta``: a delta for a block / item / tool index never opened;
* ``stop``: a stop for a block never started (Anthropic ``content_block_stop``, Responses
  ``output_item.done``; chat, which has none: a ``finish_reason`` for a choice never seen);
* ``after``: an event that opens a call after the run's end (every provider).

Bedrock (its run ends at ``stream.end``):

* ``repeat``: a ``toolUse`` block started at index 0 again (or before the stream's own block
  0, whose start is then the break);
* ``message``: a second ``messageStart``;
* ``delta``: a text delta at index 0, a ``toolUse`` block (open: a delta of another kind;
  stopped: content after its stop; not yet started: the block's start is then the break);
* ``late``: a ``toolUse`` block started after ``messageStop``.

Gemini (its run ends at ``stream.end``):

* ``finished``: a chunk whose ``functionCall`` comes after its candidate's ``finishReason``;
* ``nameless``: a ``functionCall`` with an id and ``partialArgs`` but no name, at a place
  where no call streams.

Checked for every example: every line fits ``schemas/output-line.schema.json``; exactly one
final record; each call id carried before the end has exactly one outcome (committed or error)
and the final record lists the same outcomes; nothing went to the DLQ but the one summary of
the event after the end (``run_finished``, counting it: decision 0015); and for every
provider but chat, whose protocol has no per-call start or stop, any break before the end
leaves the run ``failed`` with nothing committed after the break and the break's
``protocol_error`` among the outcomes.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import orjson
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    NEW_PROVIDERS,
    PROVIDERS,
    RESPONSES,
    chat_chunk,
    chat_tool_delta,
    check_schemas,
    feed,
    gemini_chunk,
    provider_calls,
    run_envelopes,
    tools_for,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.core import Assembler, Emit, Topic

OPENAI_KINDS = ("repeat", "delta", "stop", "after")
KINDS = {CHAT: OPENAI_KINDS, ANTHROPIC: OPENAI_KINDS, RESPONSES: OPENAI_KINDS,
         BEDROCK: ("repeat", "message", "delta", "late", "after"),
         GEMINI: ("finished", "nameless", "after")}
ARGS = st.sampled_from(['{"a": 1}', "{}", '{"path": "/x", "n": [1, 2]}', "{bad"])


def injected(provider: str, kind: str) -> dict[str, Any]:
    """The event of one kind of break for ``provider`` (its call ids start ``inj_``)."""
    if provider == ANTHROPIC:
        return {
            "repeat": {"type": "content_block_start", "index": 0, "content_block": {
                "type": "tool_use", "id": "inj_start", "name": "f", "input": {}}},
            "delta": {"type": "content_block_delta", "index": 99,
                      "delta": {"type": "input_json_delta", "partial_json": "{"}},
            "stop": {"type": "content_block_stop", "index": 99},
            "after": {"type": "content_block_start", "index": 50, "content_block": {
                "type": "tool_use", "id": "inj_after", "name": "f", "input": {}}},
        }[kind]
    if provider == BEDROCK:
        def start(index: int, call_id: str) -> dict[str, Any]:
            return {"contentBlockStart": {"contentBlockIndex": index, "start": {
                "toolUse": {"toolUseId": call_id, "name": "f"}}}}
        return {
            "repeat": start(0, "inj_start"),
            "message": {"messageStart": {"role": "assistant"}},
            "delta": {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "x"}}},
            "late": start(50, "inj_late"),
            "after": start(50, "inj_after"),
        }[kind]
    if provider == GEMINI:
        return {
            "finished": gemini_chunk([{"functionCall": {"name": "f", "id": "inj_finished",
                                                        "args": {}}}]),
            "nameless": gemini_chunk([{"functionCall": {"id": "inj_nameless", "partialArgs": [
                {"jsonPath": "$.a", "numberValue": 1}], "willContinue": True}}]),
            "after": gemini_chunk([{"functionCall": {"name": "f", "id": "inj_after"}}]),
        }[kind]
    if provider == RESPONSES:
        def item(call_id: str) -> dict[str, Any]:
            return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id,
                    "name": "f", "arguments": "{}"}
        return {
            "repeat": {"type": "response.output_item.added", "output_index": 0,
                       "item": item("inj_start")},
            "delta": {"type": "response.function_call_arguments.delta", "output_index": 99,
                      "delta": "{"},
            "stop": {"type": "response.output_item.done", "output_index": 99,
                     "item": item("inj_stop")},
            "after": {"type": "response.output_item.added", "output_index": 50,
                      "item": item("inj_after")},
        }[kind]
    return {
        "repeat": chat_chunk([chat_tool_delta(0, "inj_start", "f", "{}")]),
        "delta": chat_chunk([chat_tool_delta(99, arguments="{")]),
        "stop": chat_chunk(finish_reason="stop", choice=5),
        "after": chat_chunk([chat_tool_delta(50, "inj_after", "f", "{}")]),
    }[kind]


def opened_ids(provider: str, event: dict[str, Any]) -> list[str]:
    """The call ids an event names, as its provider's protocol carries them."""
    if provider == ANTHROPIC:
        block = event.get("content_block") or {}
        return [block["id"]] if event.get("type") == "content_block_start" and block.get(
            "type") == "tool_use" else []
    if provider == BEDROCK:
        tool = (event.get("contentBlockStart") or {}).get("start", {}).get("toolUse") or {}
        return [tool["toolUseId"]] if "toolUseId" in tool else []
    if provider == GEMINI:
        calls = [p["functionCall"] for c in event.get("candidates", ())
                 for p in c["content"]["parts"] if "functionCall" in p]
        return [c["id"] for c in calls if "id" in c]
    if provider == RESPONSES:
        item = event.get("item") or {}
        return [item["call_id"]] if item.get("type") == "function_call" else []
    return [tc["id"] for c in event.get("choices", ())
            for tc in c.get("delta", {}).get("tool_calls", ()) if tc.get("id")]


def is_end(provider: str, event: dict[str, Any]) -> bool:
    return event.get("type") in ("message_stop", "response.completed")


def places(provider: str, kind: str, events: list[dict[str, Any]]) -> list[int]:
    """Where the break of ``kind`` may go in ``events`` (a position before which it is
    inserted) so that it breaks the protocol: after the message's start and, for Anthropic
    and Responses, before the provider's own end; for the Bedrock ``late`` and Gemini
    ``finished`` kinds, after the message's end; for Gemini ``nameless``, where no call streams
    (the stream's start, or after a call's closing ``functionCall: {}``)."""
    if (provider, kind) in ((BEDROCK, "late"), (GEMINI, "finished")):
        end = next(n for n, e in enumerate(events) if "messageStop" in e or any(
            "finishReason" in c for c in e.get("candidates", ())))
        return list(range(end + 1, len(events) + 1))
    if provider == GEMINI:
        return [n for n in range(len(events)) if n == 0 or events[n - 1].get("candidates", [{}])[
            0].get("content", {}).get("parts") == [{"functionCall": {}}]]
    first = {CHAT: 0, ANTHROPIC: 1, RESPONSES: 2, BEDROCK: 1}[provider]  # after the start
    last = len(events) - (1 if provider in (ANTHROPIC, RESPONSES) else 0)
    return list(range(first, last + 1))


@st.composite
def broken_runs(draw: st.DrawFn) -> tuple[str, str, list[dict[str, Any]]]:
    provider = draw(st.sampled_from((*PROVIDERS, *NEW_PROVIDERS)))
    kind = draw(st.sampled_from(KINDS[provider]))
    texts = draw(st.lists(ARGS, min_size=1, max_size=3))
    if provider == GEMINI:  # Gemini sends parsed args (or partialArgs): never a bad text
        texts = [t if t != "{bad" else '{"s": "x"}' for t in texts]
    calls = [(f"call_{n}", "f", text) for n, text in enumerate(texts)]
    events = provider_calls(provider, calls, pieces=draw(st.integers(1, 4)))
    bad = injected(provider, kind)
    if kind == "after":
        envelopes = run_envelopes("r1", provider, tools_for(provider, {"f": {}}), events)
        envelopes.append({"v": 1, "run_id": "r1", "seq": len(envelopes),
                          "type": "provider.event", "event": bad})
        return provider, kind, envelopes
    at = draw(st.sampled_from(places(provider, kind, events)))
    events = [*events[:at], bad, *events[at:]]
    return provider, kind, run_envelopes("r1", provider, tools_for(provider, {"f": {}}), events)


def outcome_ids(emits: list[Emit]) -> list[str]:
    return [e.value.get("call_id") or e.value["tool_call_id"] for e in emits
            if e.topic in (Topic.COMMITTED, Topic.ERRORS)]


@settings(max_examples=300, deadline=None)
@given(broken_runs())
def test_a_broken_stream_gives_each_carried_id_one_outcome(
        case: tuple[str, str, list[dict[str, Any]]]) -> None:
    """See the module docstring: the properties every injected break keeps."""
    provider, kind, envelopes = case
    asm = Assembler()
    emits = feed(asm, envelopes)
    emits += asm.summarise_late()  # the one summary of the events after the end (0015)
    check_schemas(emits)
    finals = [e.value for e in emits if e.topic is Topic.FINAL]
    assert len(finals) == 1
    carried: list[str] = []
    ended = False
    for env in envelopes:
        event = env.get("event")
        if event is None or ended:
            ended = ended or env["type"] == "stream.end"
            continue
        carried += opened_ids(provider, event)
        ended = is_end(provider, event)
    got = Counter(outcome_ids(emits))
    assert set(got) >= set(carried), f"ids without an outcome: {set(carried) - set(got)}"
    assert all(got[i] == 1 for i in carried), got
    assert Counter(o["tool_call_id"] for o in finals[0]["outcomes"]) == got
    dead = [e.value for e in emits if e.topic is Topic.DLQ]
    assert [(d["reason"], d["late"]["count"]) for d in dead] == (
        [("run_finished", 1)] if kind == "after" else [])
    if provider != CHAT and kind != "after":
        assert finals[0]["status"] == "failed"
        final_at = next(n for n, e in enumerate(emits) if e.topic is Topic.FINAL)
        broke_at = next((n for n, e in enumerate(emits)
                         if e.value.get("reason") == "protocol_error"), final_at)
        assert all(e.topic is not Topic.COMMITTED for e in emits[broke_at:])
        assert broke_at < final_at or all(o["state"] == "committed"
                                          for o in finals[0]["outcomes"])


# -- re-chunking: the same text in any fragments gives the same records -----------------------


def cut(text: str, points: list[int]) -> list[str]:
    """``text`` cut at ``points`` (positions, any order, repeats allowed): no fragment lost."""
    bounds = sorted({0, len(text), *(p % (len(text) + 1) for p in points)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


CUSTOM = {"type": "custom", "name": "run_code"}


def custom_run(text: str, pieces: list[str]) -> list[dict[str, Any]]:
    item = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_c", "name": "run_code",
            "input": ""}
    where = {"item_id": "ctc_1", "output_index": 0}
    done = {**item, "input": text, "status": "completed"}
    events = [{"type": "response.output_item.added", "output_index": 0, "item": item},
              *({"type": "response.custom_tool_call_input.delta", **where, "delta": p}
                for p in pieces),
              {"type": "response.output_item.done", "output_index": 0, "item": done},
              {"type": "response.completed", "response": {"id": "resp_1", "output": [done]}}]
    return run_envelopes("r1", RESPONSES, [CUSTOM], events)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80), points=st.lists(st.integers(0, 100), max_size=6))
def test_custom_input_in_any_fragments_commits_the_same_text(text: str,
                                                             points: list[int]) -> None:
    """A custom tool call's input, streamed in any fragments and restated by the finished
    item and ``response.completed``: the same records as in one piece, its ``input`` the text
    exactly (never parsed, whatever it holds), run ``completed``."""
    whole = feed(Assembler(), custom_run(text, [text] if text else []))
    check_schemas(whole)
    [call] = [e.value for e in whole if e.topic is Topic.COMMITTED]
    assert call["input"] == text and call["kind"] == "custom"
    chunked = feed(Assembler(), custom_run(text, cut(text, points)))
    assert [e.as_line() for e in chunked] == [e.as_line() for e in whole]


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(st.tuples(st.sampled_from(["functions.f", "functions.g", "f", 7]),
                                  st.sampled_from([{}, {"k": 1}, {"k": "x"}, [1], None])),
                        min_size=1, max_size=4),
       points=st.lists(st.integers(0, 400), max_size=6))
def test_parallel_wrapper_in_any_fragments_gives_the_same_calls(
        entries: list[tuple[Any, Any]], points: list[int]) -> None:
    """A chat ``multi_tool_use.parallel`` wrapper whose text streams in any fragments: the
    same records as in one piece, one outcome per entry, ids ``call_w#<n>``."""
    text = orjson.dumps({"tool_uses": [{"recipient_name": r, "parameters": p}
                                       for r, p in entries]}).decode()
    tools = tools_for(CHAT, {"f": {"type": "object"},
                             "g": {"type": "object", "required": ["k"]}})

    def chunks(pieces: list[str]) -> list[dict[str, Any]]:
        first = chat_chunk([chat_tool_delta(0, "call_w", "multi_tool_use.parallel", "")])
        rest = [chat_chunk([chat_tool_delta(0, arguments=p)]) for p in pieces]
        return run_envelopes("r1", CHAT, tools,
                             [first, *rest, chat_chunk(finish_reason="tool_calls")])

    whole = feed(Assembler(), chunks([text]))
    check_schemas(whole)
    assert outcome_ids(whole) == [f"call_w#{n}" for n in range(len(entries))]
    chunked = feed(Assembler(), chunks(cut(text, points)))
    assert [e.as_line() for e in chunked] == [e.as_line() for e in whole]
