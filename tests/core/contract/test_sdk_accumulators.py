"""Differential check: Latch's core against the official SDKs' own stream accumulators.

Every recorded stream of the three providers whose SDK ships an accumulator
(``../shared/fixtures/providers/``, see its README and licences) is fed twice: to the SDK's
accumulator, and through Latch's core exactly as ``latch assemble --from-sse`` does
(``fixtures_lib.run_events``), with every tool the stream calls registered without a schema
(Latch runs once with no tools to learn the names its calls carry, then again with those
names registered permissively). Both results are reduced to the same flat view, ``{(subject,
field): value}``, and compared key by key:

* ``openai.chat``: ``openai.lib.streaming.chat.ChatCompletionStreamState`` (``handle_chunk``,
  ``current_completion_snapshot``, ``get_final_completion``): per choice the text, the
  ``reasoning_content``, the order of the call ids, each call's name and argument text, the
  parsed arguments against Latch's committed record, and the finish reason (against the
  ``choices`` entry when Latch writes one, n > 1) and the run's status it implies
  (docs/contract.md, "Stop and incomplete reasons"; the SDK's ``get_final_completion``
  refuses a ``length`` or ``content_filter`` choice, Latch fails its calls);
* ``anthropic.messages``: ``anthropic.lib.streaming._messages.accumulate_event`` (what
  ``MessageStream`` builds its snapshot with): per content block its type and text or
  thinking, each ``tool_use`` / ``server_tool_use`` block's id, name, position and parsed
  input (Latch's final message and committed record), and ``stop_reason``;
* ``openai.responses``: ``openai.lib.streaming.responses.ResponseStreamState``
  (``handle_event``): per output item its type, each function call's id, name and argument
  text, both as the SDK joined the argument deltas (the ``snapshot`` of its delta events) and
  as its final response holds them, other items' name and arguments, the message text, and the
  response status.

Then each stream again with its argument fragments re-cut at random points (a seeded random,
:data:`RECUTS` variants per stream; sometimes more fragments than recorded, sometimes fewer,
empty ones included): both sides must still join them the same way.

Where the two legitimately differ, :data:`ALLOWED` names each difference (fixture, run,
subject, field) with its reason; a difference not in it fails the test, and so does an entry
that no longer occurs. Streams the SDK's accumulator itself refuses are listed in
:data:`SDK_REJECTS` with the exception it raises (asserted), never skipped silently.

Bedrock ConverseStream and Gemini are out of scope: boto3 has no accumulator (it yields the
decoded events), and google-genai joins no call: its chat session's ``send_message_stream``
records each chunk's ``Content`` as it came (one history entry per chunk), with no joining of
``partialArgs`` or ``willContinue``. A reference reading of our own would only restate Latch's
own provider code, which ``test_fixtures_bedrock_gemini.py`` checks against hand-read outcomes.
"""

from __future__ import annotations

import copy
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for fixtures_lib

from anthropic.lib.streaming._messages import accumulate_event
from builders import tools_for
from fixtures_lib import (
    ANTHROPIC_PY,
    OPENAI_PY,
    PYDANTIC,
    VERCEL,
    fixture,
    load_events,
    only_final,
    run_events,
    split_responses,
    topic,
)
from openai import LengthFinishReasonError, omit
from openai._models import construct_type
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

CHAT, ANTHROPIC, RESPONSES = "openai.chat", "anthropic.messages", "openai.responses"

# -- the streams --------------------------------------------------------------------------

RESPONSES_FIXTURES = f"{VERCEL}/openai/src/responses/__fixtures__"
PARALLEL_WRAPPER = f"{RESPONSES_FIXTURES}/parallel-tool-call-wrapper.1.chunks.txt"

STREAMS: dict[str, list[str]] = {
    CHAT: [
        f"{OPENAI_PY}/f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin",
        f"{OPENAI_PY}/c6aa7e397b7123c3501f25df3a05d4daf7e8ad6d61ffa406ab5361fe36a8d5b1.bin",
        f"{OPENAI_PY}/2018feb66ae13fcf5333d61b95849decc68d3f63bd38172889367e1afb1e04f7.bin",
        f"{OPENAI_PY}/a491adda08c3d4fde95f5b2ee3f60f7f745f1a56d82e62f58031cc2add502380.bin",
        f"{OPENAI_PY}/4cc50a6135d254573a502310e6af1246f55edb6ad95fa24059f160996b68866d.bin",
        f"{VERCEL}/mistral/src/__fixtures__/mistral-incremental-tool-call.chunks.txt",
        f"{VERCEL}/mistral/src/__fixtures__/mistral-tool-call.chunks.txt",
        f"{VERCEL}/groq/src/__fixtures__/groq-tool-call.chunks.txt",
        f"{VERCEL}/xai/src/__fixtures__/xai-tool-call.chunks.txt",
        f"{VERCEL}/deepseek/src/chat/__fixtures__/deepseek-tool-call.chunks.txt",
    ],
    ANTHROPIC: [
        f"{ANTHROPIC_PY}/lib/streaming/fixtures/tool_use_response.txt",
        f"{ANTHROPIC_PY}/fixtures/fable-fallback/stream-a-toolrefusal.sse",
        f"{VERCEL}/anthropic/src/__fixtures__/anthropic-tool-no-args.chunks.txt",
        f"{VERCEL}/anthropic/src/__fixtures__/anthropic-web-fetch-tool-20260209.1.chunks.txt",
        f"{VERCEL}/anthropic/src/__fixtures__/duplicate-message-start.chunks.txt",
        f"{PYDANTIC}/test_anthropic/test_anthropic_model_thinking_part_redacted_stream.yaml",
    ],
    RESPONSES: [
        f"{RESPONSES_FIXTURES}/openai-reasoning-encrypted-content.1.chunks.txt",
        f"{RESPONSES_FIXTURES}/github-copilot-id-rotation.1.chunks.txt",
        PARALLEL_WRAPPER,
        f"{RESPONSES_FIXTURES}/issue-19067-parallel-tool-call-wrapper.chunks.txt",
        f"{RESPONSES_FIXTURES}/openai-web-search-tool.1.chunks.txt",
        f"{RESPONSES_FIXTURES}/openai-mcp-tool-approval.4.chunks.txt",
        f"{PYDANTIC}/test_openai_responses/test_openai_responses_stream.yaml",
    ],
}
ALL_STREAMS = [(provider, path) for provider, paths in STREAMS.items() for path in paths]

#: Streams the SDK's accumulator refuses, by file name: (run, the exception it raises, why).
#: Latch's own outcomes for them are pinned by test_fixtures.py; here the test asserts only
#: that the SDK still refuses them (so that an SDK that starts accepting one is noticed).
SDK_REJECTS: dict[str, tuple[int, type[BaseException], str]] = {
    "mistral-tool-call.chunks.txt": (
        0, TypeError, "Mistral sends the whole call in one chunk with no tool-call `index`; "
        "the SDK's accumulate_delta indexes its list by it (None) and fails. Latch places an "
        "index-less call itself (docs/providers.md)."),
    "github-copilot-id-rotation.1.chunks.txt": (
        0, RuntimeError, "the gateway rotates the response id between lifecycle events; the "
        "SDK raises 'Lifecycle response identity changed', Latch keeps the streamed items."),
}

ISSUE_19067 = "issue-19067-parallel-tool-call-wrapper.chunks.txt"
WRAPPER = "parallel-tool-call-wrapper.1.chunks.txt"
UNWRAPPED = "Latch unwraps the parallel wrapper into its calls (docs/providers.md)"
EMPTY_COMPLETED_OUTPUT = ("the completed event's output is [] upstream: the SDK keeps it, Latch "
                          "keeps the streamed items")

#: The differences that are meant: (file name, run, subject, field) -> why.
ALLOWED: dict[tuple[str, int, str, str], str] = {
    # Chat: a message whose only text deltas were "" -- the SDK joins them to "", Latch writes
    # `content: null` like a non-streaming chat completion with tool calls
    # (worker/core/providers/openai_chat.py: `"".join(...) or None`).
    ("mistral-incremental-tool-call.chunks.txt", 0, "choice 0", "content"):
        "Latch writes null for a choice whose text deltas were all empty",
    ("deepseek-tool-call.chunks.txt", 0, "choice 0", "content"):
        "Latch writes null for a choice whose text deltas were all empty",
    # The parallel wrapper: the SDK keeps OpenAI's one `multi_tool_use.parallel` /
    # `parallel` call; Latch unwraps it into one call per `tool_uses[]` entry, ids
    # `<call_id>#<n>` (docs/providers.md, "The parallel wrapper").
    **{(name, 0, subject, field): UNWRAPPED for name in (ISSUE_19067, WRAPPER)
       for subject, field in (
           ("call call_parallel", "streamed arguments"), ("call call_parallel#0", "present"),
           ("call call_parallel#1", "present"), ("run", "call order"))},
    # Both hand-written wrapper files' `response.completed` carry `"output": []`. The SDK's
    # final response takes the server's list as it is (it rebuilds it from the streamed items
    # only when `output` is missing); Latch's final message is built from the streamed items
    # (docs/providers.md, "Responses: the streamed items are the source of truth").
    **{(name, 0, f"item {n}", "type"): EMPTY_COMPLETED_OUTPUT
       for name in (ISSUE_19067, WRAPPER) for n in (0, 1)},
}

RECUTS = 12  # random re-cuts per stream
ABSENT = "<absent>"

# -- the SDK side -------------------------------------------------------------------------


def sdk_chat(events: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for event in events:
        state.handle_chunk(construct_type(type_=ChatCompletionChunk, value=event))
    snapshot = state.current_completion_snapshot
    try:
        state.get_final_completion()
        final = "accepted"
    except LengthFinishReasonError as exc:  # a subclass of OpenAIError, like the filter one
        final = f"refused: {type(exc).__name__}"
    except Exception as exc:  # ContentFilterFinishReasonError
        final = f"refused: {type(exc).__name__}"
    view: dict[tuple[str, str], Any] = {("run", "final"): final}
    order: list[str] = []
    for choice in sorted(snapshot.choices, key=lambda c: c.index):
        subject = f"choice {choice.index}"
        message = choice.message
        view[(subject, "content")] = message.content
        view[(subject, "reasoning_content")] = (message.model_extra or {}).get(
            "reasoning_content")
        view[(subject, "finish_reason")] = choice.finish_reason
        for position, call in enumerate(message.tool_calls or ()):
            order.append(call.id)
            add_call(view, call.id, call.function.name, position,
                     arguments=call.function.arguments, parsed=parsed(call.function.arguments))
    view[("run", "call order")] = order
    return view


def sdk_anthropic(events: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    snapshot: Any = None
    buffers: dict[int, bytes] = {}
    for event in events:
        snapshot = accumulate_event(event=event, current_snapshot=snapshot,  # type: ignore[arg-type]
                                    json_bufs=buffers)
    blocks = [block.to_dict() for block in snapshot.content]
    return anthropic_view(blocks, snapshot.stop_reason)


def sdk_responses(events: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    streamed: dict[str, str] = {}  # call id -> the argument text the SDK joined
    call_ids: dict[int, str] = {}  # output_index -> call id, from output_item.added
    final: Any = None
    for event in events:
        for out in state.handle_event(construct_type(type_=ResponseStreamEvent, value=event)):
            if out.type == "response.output_item.added" and out.item.type == "function_call":
                call_ids[out.output_index] = out.item.call_id
                streamed[out.item.call_id] = out.item.arguments
            elif out.type == "response.function_call_arguments.delta" and \
                    out.output_index in call_ids:
                streamed[call_ids[out.output_index]] = out.snapshot
            elif out.type in ("response.completed", "response.incomplete", "response.failed"):
                final = out.response
    assert final is not None, "no terminal event"
    items = [item.to_dict() for item in final.output]
    view = responses_view(items, final.status)
    for call_id, text in streamed.items():
        view[(f"call {call_id}", "streamed arguments")] = text
    return view


# -- the Latch side -----------------------------------------------------------------------


def latch_lines(provider: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run through the core, every tool its calls name registered with no schema."""
    first = run_events(provider, events, [])
    names = {o["name"] for o in only_final(first)["outcomes"] if o.get("name")}
    return run_events(provider, events, tools_for(provider, dict.fromkeys(names)))


def latch_view(provider: str, lines: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    final = only_final(lines)
    message = final["message"]
    if provider == CHAT:
        view = latch_chat(final)
    elif provider == ANTHROPIC:
        view = anthropic_view(message["content"], message.get("stop_reason"))
    else:
        view = responses_view(message["output"], message.get("status"))
        for item in message["output"]:
            if item.get("type") == "function_call":
                view[(f"call {item['call_id']}", "streamed arguments")] = item["arguments"]
    # What the core decided for each call: its committed arguments, or its error reason.
    decided = {c["call_id"]: c["arguments"] for c in topic(lines, "committed")}
    decided |= {e["tool_call_id"]: f"error: {e['reason']}" for e in topic(lines, "errors")}
    for (subject, field), _value in list(view.items()):
        if field == "name" and subject.startswith("call "):
            view[(subject, "decided")] = decided.get(subject[5:], ABSENT)
    return view


def latch_chat(final: dict[str, Any]) -> dict[tuple[str, str], Any]:
    status = final["status"]
    view: dict[tuple[str, str], Any] = {("run", "final"): {
        "completed": "accepted", "truncated": "refused: LengthFinishReasonError",
        "failed": "refused: ContentFilterFinishReasonError"}.get(status, status)}
    choices = final.get("choices") or [{"index": 0, "finish_reason": ABSENT}]
    messages = [final["message"]] + [c["message"] for c in choices[1:]]
    order: list[str] = []
    for choice, message in zip(choices, messages, strict=True):
        subject = f"choice {choice['index']}"
        view[(subject, "content")] = message.get("content")
        view[(subject, "reasoning_content")] = message.get("reasoning_content")
        view[(subject, "finish_reason")] = choice["finish_reason"]
        for position, call in enumerate(message.get("tool_calls") or ()):
            order.append(call["id"])
            text = call["function"]["arguments"]
            add_call(view, call["id"], call["function"]["name"], position, arguments=text,
                     parsed=parsed(text))
    view[("run", "call order")] = order
    return view


# -- the common view ----------------------------------------------------------------------


def parsed(text: str | None) -> Any:
    try:
        return json.loads(text or "")
    except ValueError:
        return "<unparsable>"


def add_call(view: dict[tuple[str, str], Any], call_id: Any, name: Any, position: int,
             **fields: Any) -> None:
    subject = f"call {call_id}"
    view[(subject, "name")] = name
    view[(subject, "position")] = position
    view[(subject, "present")] = True
    for field, value in fields.items():
        view[(subject, field)] = value
    if "parsed" in fields:  # what a committed record should carry
        view[(subject, "decided")] = fields["parsed"]


TOOL_BLOCKS = ("tool_use", "server_tool_use", "mcp_tool_use")


def anthropic_view(blocks: list[dict[str, Any]], stop_reason: Any
                   ) -> dict[tuple[str, str], Any]:
    view: dict[tuple[str, str], Any] = {("run", "stop_reason"): stop_reason}
    order = []
    for position, block in enumerate(blocks):
        kind = block.get("type")
        view[(f"block {position}", "type")] = kind
        for field in ("text", "thinking", "signature", "data"):
            if field in block:
                view[(f"block {position}", field)] = block[field]
        if kind in TOOL_BLOCKS:
            order.append(block["id"])
            add_call(view, block["id"], block["name"], position, input=block.get("input"))
            if kind == "tool_use":
                view[(f"call {block['id']}", "decided")] = block.get("input")
    view[("run", "call order")] = order
    return view


def responses_view(items: list[dict[str, Any]], status: Any) -> dict[tuple[str, str], Any]:
    view: dict[tuple[str, str], Any] = {("run", "status"): status}
    order = []
    for position, item in enumerate(items):
        kind = item.get("type")
        view[(f"item {position}", "type")] = kind
        if kind == "function_call":
            order.append(item["call_id"])
            add_call(view, item["call_id"], item["name"], position,
                     arguments=item["arguments"], parsed=parsed(item["arguments"]))
        elif "arguments" in item or "input" in item:  # mcp_call, custom_tool_call
            for field in ("name", "arguments", "input"):
                if field in item:
                    view[(f"item {position}", field)] = item[field]
        elif kind == "message":
            view[(f"item {position}", "text")] = "".join(
                part.get("text") or part.get("refusal") or "" for part in item["content"])
    view[("run", "call order")] = order
    return view


# -- comparing ----------------------------------------------------------------------------

Difference = tuple[str, int, str, str]


def differences(name: str, run: int, sdk: dict[tuple[str, str], Any],
                latch: dict[tuple[str, str], Any]) -> dict[Difference, tuple[Any, Any]]:
    """(file, run, subject, field) -> (SDK value, Latch value) for every field that differs.

    A call only one side has differs in ``present`` alone (its other fields are not
    compared); the call order compares the ids both sides have.
    """
    only = {s for (s, f) in sdk if f == "present"} ^ {s for (s, f) in latch if f == "present"}
    out: dict[Difference, tuple[Any, Any]] = {}
    for key in sorted(sdk.keys() | latch.keys()):
        subject, field = key
        if subject in only and field != "present":
            continue
        mine, theirs = sdk.get(key, ABSENT), latch.get(key, ABSENT)
        if mine != theirs:
            out[(name, run, subject, field)] = (mine, theirs)
    return out


def compare(provider: str, name: str, run: int, events: list[dict[str, Any]],
            latch_events: list[dict[str, Any]] | None = None,
            ) -> tuple[dict[Difference, tuple[Any, Any]], int]:
    """The differences for one run, and how many calls it compared (``latch_events``: what
    Latch is fed instead, for the check's own test)."""
    sdk = SDK[provider](events)
    latch = latch_view(provider, latch_lines(provider, events if latch_events is None
                                             else latch_events))
    if provider == CHAT and latch.get(("choice 0", "finish_reason")) == ABSENT:
        # n = 1: Latch's final record has no `choices`, so no finish_reason of its own; the
        # finish reason is compared through what it implies (the `final` field, the status).
        for view in (sdk, latch):
            for key in [k for k in view if k[1] == "finish_reason"]:
                del view[key]
    calls = len({s for (s, f) in sdk.keys() | latch.keys() if f == "present"})
    return differences(name, run, sdk, latch), calls


def report(found: dict[Difference, tuple[Any, Any]], allowed: dict[Difference, str]) -> str:
    lines = []
    for key, (mine, theirs) in sorted(found.items()):
        if key not in allowed:
            name, run, subject, field = key
            lines.append(f"{name} run {run}: {subject}, {field}: SDK {mine!r} != Latch "
                         f"{theirs!r}")
    for key in sorted(allowed.keys() - found.keys()):
        lines.append(f"allowed difference no longer seen: {key}")
    return "\n".join(lines)


SDK: dict[str, Callable[[list[dict[str, Any]]], dict[tuple[str, str], Any]]] = {
    CHAT: sdk_chat, ANTHROPIC: sdk_anthropic, RESPONSES: sdk_responses}


def stream_runs(provider: str, relative: str) -> list[list[dict[str, Any]]]:
    """The runs of one stream file (a Responses capture: one per terminal event)."""
    if relative == PARALLEL_WRAPPER:
        events = parallel_wrapper_repaired()
    else:
        events = load_events(fixture(relative))
    return split_responses(events) if provider == RESPONSES else [events]


def parallel_wrapper_repaired() -> list[dict[str, Any]]:
    """The hand-written parallel-tool-call-wrapper file: its first and last lines lack their
    closing brace upstream; the repair appends it (as test_fixtures.py does)."""
    events, repaired = [], []
    for n, line in enumerate(fixture(PARALLEL_WRAPPER).read_text().splitlines()):
        try:
            events.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            events.append(orjson.loads(line + "}"))
            repaired.append(n)
    assert repaired == [0, 5]
    return events


# -- re-cutting the argument fragments ----------------------------------------------------

#: Where each argument fragment sits: (event index, path to its string in the event).
Slot = tuple[int, tuple[Any, ...]]


def fragment_slots(provider: str, events: list[dict[str, Any]]) -> dict[Any, list[Slot]]:
    """The argument fragments of each call, in stream order, by call (for Responses, an
    ``mcp_call``'s argument deltas too: the SDK's final item is the server's, Latch joins)."""
    calls: dict[Any, list[Slot]] = {}
    for n, event in enumerate(events):
        if provider == CHAT:
            for c, choice in enumerate(event.get("choices") or ()):
                for t, call in enumerate(choice.get("delta", {}).get("tool_calls") or ()):
                    if isinstance((call.get("function") or {}).get("arguments"), str):
                        key = (choice.get("index"), call.get("index"))
                        path = ("choices", c, "delta", "tool_calls", t, "function",
                                "arguments")
                        calls.setdefault(key, []).append((n, path))
        elif provider == ANTHROPIC:
            delta = event.get("delta") or {}
            if event.get("type") == "content_block_delta" and \
                    delta.get("type") == "input_json_delta":
                calls.setdefault(event["index"], []).append((n, ("delta", "partial_json")))
        elif event.get("type") in ("response.function_call_arguments.delta",
                                   "response.mcp_call_arguments.delta"):
            calls.setdefault(event["output_index"], []).append((n, ("delta",)))
    return calls


def _get(event: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        event = event[step]
    return event


def _set(event: Any, path: tuple[Any, ...], value: Any) -> None:
    _get(event, path[:-1])[path[-1]] = value


def _extra_fragment(provider: str, event: dict[str, Any], path: tuple[Any, ...],
                    text: str) -> dict[str, Any]:
    """A further event carrying one more fragment of the call ``event``/``path`` belongs to."""
    if provider == CHAT:
        choice = event["choices"][path[1]]
        call = choice["delta"]["tool_calls"][path[4]]
        extra = {k: v for k, v in event.items() if k not in ("choices", "usage")}
        extra["choices"] = [{"index": choice.get("index", 0), "delta": {"tool_calls": [
            {"index": call.get("index"), "function": {"arguments": text}}]},
            "finish_reason": None}]
        return extra
    extra = copy.deepcopy(event)
    _set(extra, path, text)
    return extra


def recut(provider: str, events: list[dict[str, Any]], rng: random.Random
          ) -> list[dict[str, Any]]:
    """``events`` with each call's argument text cut again at random points: the same text,
    in between zero and twice as many (plus one) fragments as recorded, empty ones allowed.
    Fragments beyond the recorded count ride on extra events right after the call's first
    fragment (for Chat, a minimal chunk with only that call's ``index`` and ``arguments``);
    when there are fewer, the last recorded fragments carry ``""``."""
    events = copy.deepcopy(events)
    inserts: dict[int, list[dict[str, Any]]] = {}
    for slots in fragment_slots(provider, events).values():
        text = "".join(_get(events[n], path) for n, path in slots)
        count = rng.randint(1, 2 * len(slots) + 1)
        if provider == CHAT and events[slots[0][0]]["choices"][slots[0][1][1]].get(
                "finish_reason"):
            count = len(slots)  # the first fragment's chunk also ends the choice
        cuts = sorted(rng.randint(0, len(text)) for _ in range(count - 1))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        head, extra = pieces[:1], pieces[1:1 + max(0, count - len(slots))]
        tail = pieces[1 + len(extra):]
        tail += [""] * (len(slots) - 1 - len(tail))
        first_n, first_path = slots[0]
        _set(events[first_n], first_path, head[0])
        inserts[first_n] = [_extra_fragment(provider, events[first_n], first_path, p)
                            for p in extra]
        for (n, path), piece in zip(slots[1:], tail, strict=True):
            _set(events[n], path, piece)
    out: list[dict[str, Any]] = []
    for n, event in enumerate(events):
        out.append(event)
        out += inserts.get(n, [])
    return out


# -- the tests ----------------------------------------------------------------------------

COMPARED = [(p, f) for p, f in ALL_STREAMS if Path(f).name not in SDK_REJECTS]


def _name(relative: str) -> str:
    return Path(relative).name


@pytest.mark.parametrize(("provider", "relative"), COMPARED,
                         ids=[_name(f)[:40] for _, f in COMPARED])
def test_latch_agrees_with_the_sdk_accumulator(provider: str, relative: str) -> None:
    """Each recorded stream: what the SDK's accumulator and Latch's core say about each call,
    the message text and the stop agree, but for the differences :data:`ALLOWED` names."""
    name = _name(relative)
    found: dict[Difference, tuple[Any, Any]] = {}
    for run, events in enumerate(stream_runs(provider, relative)):
        found |= compare(provider, name, run, events)[0]
    allowed = {k: v for k, v in ALLOWED.items() if k[0] == name}
    problems = report(found, allowed)
    assert not problems, f"SDK accumulator vs Latch, {relative}:\n{problems}"


@pytest.mark.parametrize(("provider", "relative"), COMPARED,
                         ids=[_name(f)[:40] for _, f in COMPARED])
def test_recut_fragments_join_the_same_way(provider: str, relative: str) -> None:
    """Each recorded stream with its argument fragments re-cut at random points (seeded,
    :data:`RECUTS` variants): both sides still agree, with the same allowed differences."""
    name = _name(relative)
    allowed = {k: v for k, v in ALLOWED.items() if k[0] == name}
    rng = random.Random(f"sdkdiff:{name}")
    for variant in range(RECUTS):
        found: dict[Difference, tuple[Any, Any]] = {}
        for run, events in enumerate(stream_runs(provider, relative)):
            found |= compare(provider, name, run, recut(provider, events, rng))[0]
        problems = report(found, allowed)
        assert not problems, f"re-cut variant {variant} of {relative}:\n{problems}"


def test_recut_keeps_the_text_and_moves_the_cuts() -> None:
    """The re-cutting itself: same joined text per call, and the cuts do move."""
    events = stream_runs(CHAT, STREAMS[CHAT][0])[0]
    rng = random.Random(0)
    before = fragment_slots(CHAT, events)
    seen_other_cuts = False
    for _ in range(10):
        cut = recut(CHAT, events, rng)
        after = fragment_slots(CHAT, cut)
        assert before.keys() == after.keys()
        for key in before:
            old = [_get(events[n], p) for n, p in before[key]]
            new = [_get(cut[n], p) for n, p in after[key]]
            assert "".join(old) == "".join(new)
            seen_other_cuts |= old != new
    assert seen_other_cuts


@pytest.mark.parametrize("file_name", sorted(SDK_REJECTS))
def test_streams_the_sdk_refuses_are_still_refused(file_name: str) -> None:
    """The streams left out of the comparison: the SDK's accumulator raises on them, as
    :data:`SDK_REJECTS` says (if an SDK release accepts one, it joins the comparison)."""
    provider, relative = next((p, f) for p, f in ALL_STREAMS if _name(f) == file_name)
    run, error, _why = SDK_REJECTS[file_name]
    with pytest.raises(error):
        SDK[provider](stream_runs(provider, relative)[run])


def test_figures() -> None:
    """How much the comparison covers (printed with ``-s``); guards against a silent shrink."""
    streams = runs = calls = 0
    for provider, relative in COMPARED:
        streams += 1
        for run, events in enumerate(stream_runs(provider, relative)):
            runs += 1
            calls += compare(provider, _name(relative), run, events)[1]
    print(f"\nSDK differential check: {streams} streams, {runs} runs, {calls} calls compared; "
          f"{len(SDK_REJECTS)} streams refused by the SDK; {len(ALLOWED)} allowed differences")
    assert (streams, runs) == (21, 25)
    assert calls >= 20


def test_a_fragment_joined_differently_is_reported() -> None:
    """The check itself: when Latch sees one argument fragment changed (what a joining bug
    would look like), the report names the file, the call and the fields."""
    relative = STREAMS[CHAT][0]
    events = stream_runs(CHAT, relative)[0]
    changed = copy.deepcopy(events)
    n, path = next((n, p) for n, p in fragment_slots(CHAT, changed)[(0, 1)]
                   if "AAP" in _get(changed[n], p))
    _set(changed[n], path, _get(changed[n], path).replace("AAP", "MSF"))
    found, calls = compare(CHAT, "f82268f2.bin", 0, events, latch_events=changed)
    call = "call call_DNYTawLBoN8fj3KN6qU9N1Ou"
    assert calls == 2
    assert {(s, f) for _, _, s, f in found} == {
        (call, "arguments"), (call, "parsed"), (call, "decided")}
    assert f"f82268f2.bin run 0: {call}, arguments: SDK " in report(found, {})
