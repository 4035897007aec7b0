"""Properties of the pure core, checked with hypothesis (style habit 7: h11's ``test_io`` and
``fuzz/afl-server.py``, h2's ``test_state_machines``).

What the file proves, one property per test:

* **Chunking does not matter.** The same argument text, whole or split into fragments at any
  points, with the run's parallel calls interleaved, gives byte-identical committed calls,
  error results and final message, for each of the three providers (contract rule 1: text is
  opaque until the call is complete).
* **The core is total.** Any sequence of records (garbage bytes, non-object JSON, envelopes of
  random type with provider events built from each provider's real vocabulary but with
  missing, mistyped and out-of-range fields, repeated and missing ``seq``, cancels, ticks,
  stream ends and errors) never raises out of ``Assembler.feed_record`` (contract rule 9).
* **Exactly one outcome.** Once every run has ended, every call that was opened has exactly one
  committed call or error result, every run exactly one final message whose ``outcomes`` are
  those records (with early commit, plus a ``failed``/``duplicate_call_id`` entry without a
  record for a call that reused an id whose outcome was out), and per run, per
  ``tool_call_id``, the set of emitted outcome kinds has size 1.
* **Determinism.** The same records give byte-identical output on a fresh assembler, and a
  re-delivery of any prefix of the records changes no outcome.
* **Schemas.** Every emitted record, as a ``latch assemble`` line, is valid against
  ``schemas/output-line.schema.json`` (which references the per-topic schemas by ``$id``).
* **Decoding is total.** ``decode(key, value)`` returns an envelope or a ``Rejected`` for any
  bytes.

Every ``@settings`` is bounded (``max_examples``) so that the whole file stays well under a
minute on two cores.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from mutation_fuzz import SpyAssembler, check_final  # tests/ is on the path (pyproject)
from referencing import Registry, Resource

from worker.core import Assembler, AssembleSettings, Emit, decode
from worker.core.envelope import (
    TICK_KEY,
    Cancel,
    ProviderEvent,
    Rejected,
    RunStart,
    StreamEnd,
    StreamError,
    Tick,
)

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
PROVIDERS = ("openai.chat", "anthropic.messages", "openai.responses")
IDLE_MS = 60_000

#: Settings the properties run under: the defaults; tight per-call and per-run limits, so that
#: oversize, in-flight and budget failures happen; tight memory budgets, so that runs are
#: evicted; block-level early commit with progress records and partial text.
SETTINGS = {
    "default": AssembleSettings(),
    "limits": AssembleSettings(max_tool_argument_bytes=48, max_tool_calls_in_flight_assemble=2,
                               max_tool_calls_per_run=2),
    "memory": AssembleSettings(max_open_runs=2, max_buffered_bytes=96),
    "pipelined": AssembleSettings(execute_before_stream_end=True, allow_pipelined_execute=("f",),
                                  emit_progress=True, ui_forward_partial_args=True),
}
#: Which call crosses a byte budget that calls share depends, by design, on the order their
#: fragments arrive in, so the chunking property runs without the memory budgets.
CHUNKING_SETTINGS = ["default", "limits", "pipelined"]


def bounded(examples: int) -> settings:
    """Hypothesis settings with an example budget, no deadline (the first example compiles
    JSON Schemas), and no health check for large or slow draws (the streams are both)."""
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- output schemas --------------------------------------------------------------------------


def _output_line_validator() -> Draft202012Validator:
    """``output-line`` with every file of ``schemas/`` in the registry, found by its ``$id``."""
    resources: list[tuple[str, Resource[Any]]] = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        resources.append((schema["$id"], Resource.from_contents(schema)))
    registry: Registry[Any] = Registry().with_resources(resources)
    schema = json.loads((SCHEMAS / "output-line.schema.json").read_text(encoding="utf-8"))
    return Draft202012Validator(schema, registry=registry)


OUTPUT_LINE = _output_line_validator()


def lines(emits: Iterable[Emit]) -> list[bytes]:
    """The ``latch assemble`` lines of ``emits``, each checked against its schema."""
    out = []
    for emit in emits:
        line = emit.as_line()
        error = best_match(OUTPUT_LINE.iter_errors(line))
        assert error is None, f"{error.message} at {list(error.absolute_path)}: {line}"
        out.append(orjson.dumps(line))
    return out


# -- records ---------------------------------------------------------------------------------


def envelope(run_id: str, seq: int, kind: str, **fields: Any) -> bytes:
    return orjson.dumps({"v": 1, "run_id": run_id, "seq": seq, "type": kind, **fields})


def tools_for(provider: str, schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """``run.start`` tools in ``provider``'s own format."""
    if provider == "openai.chat":
        return [{"type": "function", "function": {"name": n, "parameters": s}}
                for n, s in schemas.items()]
    if provider == "openai.responses":
        return [{"type": "function", "name": n, "parameters": s} for n, s in schemas.items()]
    return [{"name": n, "input_schema": s} for n, s in schemas.items()]


Record = tuple[bytes | None, bytes, int | None]


def feed_all(asm: Assembler, records: Iterable[Record]) -> list[Emit]:
    emits: list[Emit] = []
    for key, value, now in records:
        emits += asm.feed_record(key, value, now)
    return emits


# -- chunking: one logical stream, rendered with any fragmentation ---------------------------


@dataclass(frozen=True)
class Call:
    call_id: str
    name: str
    text: str


def chat_events(calls: Sequence[Call], frags: list[list[str]], order: list[int],
                restate: bool) -> list[dict[str, Any]]:
    del restate  # chat never restates the arguments
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events = [chunk({"role": "assistant", "content": "Let me check."})]
    events += [chunk({"tool_calls": [{"index": i, "id": c.call_id, "type": "function",
                                      "function": {"name": c.name, "arguments": ""}}]})
               for i, c in enumerate(calls)]
    events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": frags[i].pop(0)}}]})
               for i in order]
    return [*events, chunk({}, "tool_calls")]


def anthropic_events(calls: Sequence[Call], frags: list[list[str]], order: list[int],
                     restate: bool) -> list[dict[str, Any]]:
    del restate
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "msg_1", "type": "message",
                                              "role": "assistant", "model": "claude",
                                              "content": [], "stop_reason": None}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "Let me check."}},
        {"type": "content_block_stop", "index": 0},
    ]
    events += [{"type": "content_block_start", "index": i + 1,
                "content_block": {"type": "tool_use", "id": c.call_id, "name": c.name,
                                  "input": {}}} for i, c in enumerate(calls)]
    events += [{"type": "content_block_delta", "index": i + 1,
                "delta": {"type": "input_json_delta", "partial_json": frags[i].pop(0)}}
               for i in order]
    events += [{"type": "content_block_stop", "index": i + 1} for i in range(len(calls))]
    return [*events, {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
            {"type": "message_stop"}]


def responses_events(calls: Sequence[Call], frags: list[list[str]], order: list[int],
                     restate: bool) -> list[dict[str, Any]]:
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]}

    def item(i: int, c: Call, arguments: str) -> dict[str, Any]:
        return {"type": "function_call", "id": f"fc_{i}", "call_id": c.call_id, "name": c.name,
                "arguments": arguments, "status": "completed"}

    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress",
                                                  "model": "gpt-5", "output": []}},
        {"type": "response.output_item.added", "output_index": 0,
         "item": {**message, "content": []}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
         "content_index": 0, "delta": "Let me check."},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
    ]
    events += [{"type": "response.output_item.added", "output_index": i + 1,
                "item": item(i, c, "")} for i, c in enumerate(calls)]
    events += [{"type": "response.function_call_arguments.delta", "item_id": f"fc_{i}",
                "output_index": i + 1, "delta": frags[i].pop(0)} for i in order]
    if restate:
        for i, c in enumerate(calls):
            events += [{"type": "response.function_call_arguments.done", "item_id": f"fc_{i}",
                        "output_index": i + 1, "arguments": c.text},
                       {"type": "response.output_item.done", "output_index": i + 1,
                        "item": item(i, c, c.text)}]
    output = [message, *(item(i, c, c.text) for i, c in enumerate(calls))]
    return [*events, {"type": "response.completed",
                      "response": {"id": "resp_1", "status": "completed", "model": "gpt-5",
                                   "output": output}}]


RENDER: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "openai.chat": chat_events,
    "anthropic.messages": anthropic_events,
    "openai.responses": responses_events,
}
TOOL_SCHEMAS = {
    "f": {"type": "object"},
    "g": {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]},
}


def stream(provider: str, calls: Sequence[Call], frags: list[list[str]], order: list[int],
           restate: bool = False) -> list[Record]:
    """The records of one run whose calls' texts arrive as ``frags``, in ``order``."""
    events = RENDER[provider](calls, [list(f) for f in frags], order, restate)
    values = [envelope("r1", 0, "run.start", provider=provider, tenant="t1",
                       tools=tools_for(provider, TOOL_SCHEMAS))]
    values += [envelope("r1", n, "provider.event", event=e) for n, e in enumerate(events, 1)]
    values.append(envelope("r1", len(events) + 1, "stream.end"))
    return [(b"r1", v, 1_000 + n) for n, v in enumerate(values)]


def outcomes_of(provider: str, calls: Sequence[Call], frags: list[list[str]], order: list[int],
                settings_name: str, restate: bool = False) -> list[bytes]:
    asm = Assembler(SETTINGS[settings_name])
    emits = feed_all(asm, stream(provider, calls, frags, order, restate))
    return [line for line in lines(emits) if not line.startswith(b'{"topic":"progress"')]


def whole(calls: Sequence[Call]) -> tuple[list[list[str]], list[int]]:
    return [[c.text] for c in calls], list(range(len(calls)))


def split(text: str, points: Iterable[int]) -> list[str]:
    cuts = [0, *sorted(points), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


json_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=5)


@st.composite
def argument_texts(draw: st.DrawFn) -> str:
    """A valid JSON object in some layout, or one of the invalid texts the latch must refuse."""
    obj = draw(json_objects)
    indent = draw(st.sampled_from([None, 0, 2]))
    valid = json.dumps(obj, indent=indent, ensure_ascii=draw(st.booleans()))
    return draw(rarely(2, st.sampled_from([valid, orjson.dumps(obj).decode()]), st.one_of(
        st.integers(0, len(valid)).map(lambda n: valid[:n]),  # truncated
        st.just(valid[:-1] + ",}" if obj else "{,}"),  # trailing comma
        st.just('{"k": 1, "k": 2}'),  # duplicate key
        json_values.map(lambda v: orjson.dumps(v).decode()),  # maybe not an object
        st.sampled_from(["", "  ", "NaN", "{'k': 1}", '{"k": 1} // c', '{"k": 01}']),
        st.text(max_size=24),
    )))


@st.composite
def logical_calls(draw: st.DrawFn) -> list[Call]:
    texts = draw(st.lists(argument_texts(), min_size=1, max_size=3))
    return [Call(f"call_{i}", draw(st.sampled_from(["f", "f", "g", "nope"])), text)
            for i, text in enumerate(texts)]


@pytest.mark.parametrize("provider", PROVIDERS)
@bounded(120)
@given(calls=logical_calls(), data=st.data(), settings_name=st.sampled_from(CHUNKING_SETTINGS),
       restate=st.booleans())
def test_chunking_and_interleaving_do_not_change_outcomes(
    provider: str, calls: list[Call], data: st.DataObject, settings_name: str, restate: bool
) -> None:
    """Argument texts split at random points, with the fragments of parallel calls
    interleaved at random, give byte-identical committed calls, error results and final message
    to the same texts sent whole, one call after the other."""
    frags = [split(c.text, data.draw(st.lists(st.integers(0, len(c.text)), max_size=8)))
             for c in calls]
    order = data.draw(st.permutations([i for i, f in enumerate(frags) for _ in f]))
    expected = outcomes_of(provider, calls, *whole(calls), settings_name, restate)
    assert outcomes_of(provider, calls, frags, order, settings_name, restate) == expected


EVERY_POINT_TEXTS = [
    '{"path": "/tmp/ä b", "n": [1, -2.5e3, true, null], "o": {"k": "\\u00e9\\n"}}',
    '{"path": "/tmp/a", "n": [1, 2,], "o": {}}',  # invalid: trailing comma
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("text", EVERY_POINT_TEXTS)
def test_split_at_every_point(provider: str, text: str) -> None:
    """Splitting one call's text into two at every position, while a parallel call's text
    arrives between the halves, never changes the outcomes (h11 ``test_io`` style)."""
    calls = [Call("call_a", "f", text), Call("call_b", "f", '{"x": "\u2603"}')]
    expected = outcomes_of(provider, calls, *whole(calls), "default")
    for cut in range(len(text) + 1):
        frags = [[text[:cut], text[cut:]], [calls[1].text]]
        assert outcomes_of(provider, calls, frags, [0, 1, 0], "default") == expected, cut


@pytest.mark.parametrize("provider", PROVIDERS)
def test_split_at_every_pair_of_points(provider: str) -> None:
    """Three fragments, cut at every pair of positions, give the outcome of the whole text."""
    text = '{"a": [1, "ü"], "b": {}}'
    calls = [Call("call_a", "f", text)]
    expected = outcomes_of(provider, calls, *whole(calls), "default")
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            frags = [[text[:i], text[i:j], text[j:]]]
            assert outcomes_of(provider, calls, frags, [0, 0, 0], "default") == expected, (i, j)


# -- arbitrary input -------------------------------------------------------------------------

junk = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**64 - 1) | st.floats(allow_nan=False,
                                                                   allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=3),
    max_leaves=4,
)


#: Ids and names include buffer keys ("0", "0.0", "1") and the empty string on purpose.
ids = st.sampled_from(["", "call_a", "call_b", "toolu_1", "0", "0.0", "1"])
names = st.sampled_from(["", "f", "g", "web_search", "nope"])
fragments = st.sampled_from(['{"k": 1}', "{", "}", '"k"', ":", "1", ",", "", "[", "x", "{}"])
texts = st.text(max_size=6)


@st.composite
def rarely(draw: st.DrawFn, odds: int, usual: st.SearchStrategy[Any],
           rare: st.SearchStrategy[Any]) -> Any:
    """``rare`` one time in ``odds``, else ``usual`` (``one_of`` would pick each half the time,
    however often a branch is repeated)."""
    return draw(rare if draw(st.integers(1, odds)) == 1 else usual)


@st.composite
def dropping(draw: st.DrawFn, mapping: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A dict from ``mapping`` with one key in twelve dropped."""
    value = draw(mapping)
    if value and draw(st.integers(1, 12)) == 1:
        del value[draw(st.sampled_from(sorted(value)))]
    return value


def field(proper: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the proper value, one time in four a value of any JSON type."""
    return rarely(4, proper, junk)


class Vocabulary:
    """Each provider's real streaming events as strategies.

    ``wild``: every field may be missing or of any JSON type, indexes may be negative.
    Otherwise events are plausible: every field is there with a value of the right type, but
    for one field in ten that is broken or dropped, so calls open, grow and end often enough
    for their outcomes to be worth checking.
    """

    def __init__(self, wild: bool) -> None:
        self.wild = wild
        index = st.integers(-1, 3) if wild else st.integers(0, 2)
        self.chat = self._chat(index)
        self.anthropic = self._anthropic(index)
        self.responses = self._responses(index)

    def field(self, proper: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return rarely(4 if self.wild else 12, proper, junk)

    def obj(self, kind: str | None, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        """An object of type ``kind`` with ``fields``, some of them broken or missing."""
        head = {} if kind is None else {"type": self.field(st.just(kind))}
        body = {k: self.field(v) for k, v in fields.items()}
        if self.wild:
            return st.fixed_dictionaries(head, optional=body)
        return dropping(st.fixed_dictionaries({**head, **body}))

    def _chat(self, index: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
        arguments = fragments | st.dictionaries(st.text(max_size=3), junk, max_size=3)
        entry = self.obj(None, index=index, id=ids, type=st.just("function"),
                         function=self.obj(None, name=names, arguments=arguments))
        delta = self.obj(None, role=st.just("assistant"), content=texts,
                         reasoning_content=texts, refusal=texts,
                         tool_calls=st.lists(entry, max_size=2))
        finish = st.sampled_from(["stop", "length", "tool_calls", None, None, None])
        choice = self.obj(None, index=index if self.wild else st.sampled_from([0, 0, 0, 1]),
                          delta=delta, finish_reason=finish)
        return self.obj(None, object=st.just("chat.completion.chunk"),
                        choices=st.lists(choice, min_size=1, max_size=2))

    def _anthropic(self, index: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
        obj = self.obj
        block = st.one_of(
            obj("tool_use", id=ids, name=names, input=st.just({}) | json_objects),
            obj("tool_use", id=ids, name=names, input=st.just({})),
            obj("server_tool_use", id=ids, name=names, input=json_objects),
            obj("text", text=texts), obj("thinking", thinking=texts, signature=texts),
            obj("web_search_tool_result", tool_use_id=ids, content=junk),
            obj("redacted_thinking", data=texts), junk,
        )
        delta = st.one_of(
            obj("input_json_delta", partial_json=fragments),
            obj("input_json_delta", partial_json=fragments), obj("text_delta", text=texts),
            obj("thinking_delta", thinking=texts), obj("signature_delta", signature=texts),
            obj("citations_delta", citation=junk), junk,
        )
        stop = st.sampled_from(["end_turn", "tool_use", "max_tokens", "refusal", "pause_turn"])
        return st.one_of(
            obj("message_start", message=obj("message", id=texts, model=texts,
                                              role=st.just("assistant"), content=st.just([]))),
            obj("content_block_start", index=index, content_block=block),
            obj("content_block_delta", index=index, delta=delta),
            obj("content_block_delta", index=index, delta=delta),
            obj("content_block_stop", index=index),
            obj("message_delta", delta=obj(None, stop_reason=stop)),
            obj("message_stop"), obj("ping"),
            obj("error", error=obj("overloaded_error", message=texts)), obj(None, type=texts),
        )

    def _responses(self, index: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
        obj = self.obj
        item_ids = st.sampled_from(["fc_1", "fc_2", "msg_1"])
        item = st.one_of(
            obj("function_call", id=item_ids, call_id=ids, name=names, arguments=fragments,
                status=st.just("completed")),
            obj("function_call", id=item_ids, call_id=ids, name=names, arguments=st.just("")),
            obj("message", id=st.just("msg_1"), role=st.just("assistant"), content=junk),
            obj("web_search_call", id=st.just("ws_1"), status=texts),
            obj("reasoning", id=texts), junk,
        )
        body = obj(None, id=texts, model=texts, status=texts, output=st.lists(item, max_size=3),
                   error=obj(None, code=texts))
        return st.one_of(
            *(obj(k, response=body) for k in (
                "response.created", "response.in_progress", "response.completed",
                "response.incomplete", "response.failed")),
            obj("response.output_item.added", output_index=index, item=item),
            obj("response.output_item.added", output_index=index, item=item),
            obj("response.output_item.done", output_index=index, item=item),
            obj("response.function_call_arguments.delta", output_index=index, item_id=item_ids,
                delta=fragments),
            obj("response.function_call_arguments.delta", output_index=index, item_id=item_ids,
                delta=fragments),
            obj("response.function_call_arguments.done", output_index=index, item_id=item_ids,
                arguments=fragments),
            obj("response.output_text.delta", output_index=index, item_id=item_ids, delta=texts),
            obj("error", code=texts), obj(None, type=texts),
        )

    def events(self, provider: str) -> st.SearchStrategy[Any]:
        """Mostly events of ``provider``; sometimes another provider's."""
        own = {"openai.chat": self.chat, "anthropic.messages": self.anthropic,
               "openai.responses": self.responses}
        others = [s for p, s in own.items() if p != provider]
        return rarely(6, own[provider], st.one_of(*others))


VOCABULARY = {wild: Vocabulary(wild) for wild in (True, False)}

tool_schemas = st.sampled_from([
    {}, {"type": "object"}, {"type": "object", "required": ["k"]}, True, False,
    {"type": "object", "properties": {"k": {"type": "integer"}}},
    {"$ref": "#/$defs/o", "$defs": {"o": {"type": "object"}}},
    {"$ref": "#"}, {"$ref": "https://example.com/no-such-schema"}, {"$ref": "#/$defs/missing"},
    {"type": 5}, {"$schema": [1]}, {"$schema": "https://example.com/unknown"},
    {"properties": {"k": {"pattern": "["}}}, {"anyOf": [{"$ref": "#"}]},
]) | junk


@st.composite
def start_fields(draw: st.DrawFn, provider: str, wild: bool) -> dict[str, Any]:
    """``run.start`` fields: tools with good and broken schemas; with ``wild``, broken fields."""
    def maybe(proper: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return rarely(8, proper, junk) if wild else proper

    schemas = {**draw(st.dictionaries(names, tool_schemas, max_size=2)), **TOOL_SCHEMAS}
    tools = draw(maybe(st.just(tools_for(provider, schemas))))
    fields: dict[str, Any] = {"provider": draw(maybe(st.just(provider))), "tools": tools}
    if draw(st.booleans()):
        fields["tenant"] = draw(maybe(st.just("t1")))
    if draw(st.booleans()):
        fields["limits"] = draw(maybe(st.fixed_dictionaries({}, optional={
            "max_tool_calls": maybe(st.integers(0, 3))})))
    return fields


#: What each provider sends when the output hit its token limit (contract rule 5).
TRUNCATION = {
    "openai.chat": {"object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
    "anthropic.messages": {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}},
    "openai.responses": {"type": "response.incomplete", "response": {
        "id": "resp_1", "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"}}},
}


#: Ids that calls of one run share often: repeated, missing, or equal to a buffer key.
shared_ids = st.sampled_from(["call_a", "", "0", "1", "0.0"])


@st.composite
def scripted_calls(draw: st.DrawFn) -> list[Call]:
    """A run's calls: ids that may repeat, be missing or equal a buffer key; registered,
    unknown or missing names; valid, invalid or empty argument texts."""
    return [Call(draw(rarely(2, st.just(f"call_{i}"), shared_ids)),
                 draw(st.sampled_from(["f", "f", "g", "nope", ""])),
                 draw(rarely(3, argument_texts(), fragments)))
            for i in range(draw(st.integers(0, 4)))]


#: Order keys a gateway should never send, and some it may (chat choice and tool index,
#: Anthropic block index, Responses output_index: outputs carry them, schemas bound them).
ORDER_KEYS = [-1, True, None, 1.5, "0", 7, 2**53, 2**64 - 1]


def reindex(rng: random.Random, event: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``event`` with one of its order keys replaced by one of :data:`ORDER_KEYS`."""
    event = orjson.loads(orjson.dumps(event))
    holders, choices = [event], event.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        holders.append(choices[0])
        delta = choices[0].get("delta")
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        if isinstance(calls, list) and calls and isinstance(calls[0], dict):
            holders.append(calls[0])
    keyed = [(h, k) for h in holders for k in ("index", "output_index") if k in h]
    if keyed:
        holder, name = rng.choice(keyed)
        holder[name] = rng.choice(ORDER_KEYS)
    return event


def provider_events(draw: st.DrawFn, rng: random.Random, provider: str,
                    wild: bool) -> list[dict[str, Any]]:
    """A real-shaped stream of a few parallel calls, then damaged a little: events inserted
    from the provider vocabulary, dropped, repeated, given a broken field or a bad order key,
    or a truncation."""
    calls = draw(scripted_calls())
    frags = [split(c.text, rng.choices(range(len(c.text) + 1), k=rng.randrange(5)))
             for c in calls]
    order = [i for i, f in enumerate(frags) for _ in f]
    rng.shuffle(order)
    events = RENDER[provider](calls, frags, order, rng.random() < 0.5)
    for _ in range(rng.randrange(7 if wild else 4)):
        at = rng.randrange(len(events) + 1)
        how = rng.choice(["insert", "insert", "drop", "repeat", "truncate", "break",
                          "reindex"])
        if how == "insert":
            events.insert(at, draw(VOCABULARY[wild].events(provider)))
        elif how == "truncate":
            events.insert(at, TRUNCATION[provider])
        elif at < len(events) and how == "drop":
            del events[at]
        elif at < len(events) and how == "repeat":
            events.insert(at, events[at])
        elif at < len(events) and how == "reindex":
            events[at] = reindex(rng, events[at])
        elif at < len(events):
            name = rng.choice(sorted(events[at]) or ["type"])
            events[at] = {**events[at], name: draw(junk)}
    return events


def run_values(draw: st.DrawFn, rng: random.Random, run_id: str, provider: str,
               wild: bool) -> list[bytes]:
    """One run's envelopes in gateway order: ``run.start``, its provider events, and usually
    ``stream.end``; sometimes a cancel or a stream error on the way. ``seq`` has gaps, and
    with ``wild`` steps back, and any field of any envelope may be broken."""
    docs: list[dict[str, Any]] = [{"type": "run.start", **draw(start_fields(provider, wild))}]
    docs += [{"type": "provider.event", "event": e}
             for e in provider_events(draw, rng, provider, wild)]
    if rng.random() < 0.8:
        docs.append({"type": "stream.end"})
    if rng.random() < 0.2:
        docs.insert(rng.randint(1, len(docs)), rng.choice([
            {"type": "cancel", "reason": "user_stop"}, {"type": "stream.error", "error": "x"}]))
    steps = [1, 1, 1, 2, 5] + ([0, -1] if wild else [])
    seq, values = 0, []
    for doc in docs:
        if doc["type"] != "cancel":
            doc["seq"] = seq
            seq += rng.choice(steps)
        doc = {"v": 1, "run_id": run_id, **doc}
        if wild and rng.random() < 0.1:
            doc[rng.choice(["v", "run_id", "seq", "type", "ts", "event"])] = draw(junk)
        if wild and rng.random() < 0.5:
            doc["ts"] = rng.randrange(10**7)
        values.append(orjson.dumps(doc))
    return values


garbage = st.one_of(
    st.binary(max_size=16), junk.map(orjson.dumps),
    st.just(b'{"v": 1, "run_id": "r1", "seq": 1, "type": "provider.event"'),
    st.just(b'{"v": 2, "run_id": "r1", "seq": 1, "type": "stream.end"}'),
    st.just(b'{"v": 1, "run_id": "r9", "seq": 3, "type": "stream.end"}'),  # never started
)


@st.composite
def record_lists(draw: st.DrawFn, wild: bool) -> list[Record]:
    """Records of one to three runs, each in gateway order, interleaved at random, with
    record times that only move forward, and between them garbage, ticks, and re-deliveries
    of records already sent. With ``wild``, keys are broken too; without it everything but
    the garbage is a well-formed envelope, as a well-behaved gateway publishes them.

    Hypothesis draws what the records say (calls, texts, events, broken values); the cheap
    decisions about where and when (split points, interleaving, seq steps, clock, keys) come
    from a ``random.Random`` seeded by a drawn integer, which keeps generation fast."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1), label="seed"))
    providers = draw(st.lists(st.sampled_from(PROVIDERS), min_size=1, max_size=3))
    runs = {f"r{n}": run_values(draw, rng, f"r{n}", p, wild)
            for n, p in enumerate(providers, 1)}
    order = [r for r, values in runs.items() for _ in values]
    rng.shuffle(order)
    clock, records = 0, []
    for run_id in order:
        clock += IDLE_MS if rng.random() < 0.025 else rng.choice([0, 1, 250, 5_000])
        key = run_id.encode()
        if wild and rng.random() < 0.125:
            key = rng.choice([None, b"", b"r1", b"\xff"])
        records.append((key, runs[run_id].pop(0), clock))
        extra = rng.choice([None] * 17 + ["garbage", "tick", "again"])
        if extra == "garbage":
            records.append((key, draw(garbage), clock))
        elif extra == "tick":
            records.append((TICK_KEY.encode(), orjson.dumps(
                {"v": 1, "type": "tick", "ts": clock}), clock))
        elif extra == "again":  # a re-delivery of a record sent before, with its record time
            records.append(rng.choice(records))
    return records


#: How ``end_all`` ends each run still open (at most three runs are open).
endings = st.lists(st.sampled_from(["stream.end", "cancel", "stream.error", "tick"]),
                   min_size=3, max_size=3)


def end_all(asm: Assembler, ends: list[str], clock: int) -> list[Emit]:
    """End every open run by a stream end or error, a cancel, or a tick past the idle timeout,
    then tick far past the timeout: afterwards no run is open."""
    emits: list[Emit] = []
    for run_id, how in zip(asm.open_run_ids(), ends, strict=False):
        if how == "tick":
            clock += IDLE_MS
            value = orjson.dumps({"v": 1, "type": "tick", "ts": clock})
        elif how == "cancel":
            value = orjson.dumps({"v": 1, "run_id": run_id, "type": "cancel"})
        else:
            value = envelope(run_id, 10**9, how)
        emits += asm.feed_record(run_id.encode(), value, clock)
    clock += 2 * IDLE_MS
    emits += asm.feed_record(None, orjson.dumps({"v": 1, "type": "tick", "ts": clock}), clock)
    assert asm.open_runs == 0
    return emits


@bounded(300)
@given(records=record_lists(wild=True), settings_name=st.sampled_from(list(SETTINGS)))
def test_feed_record_is_total(records: list[Record], settings_name: str) -> None:
    """No sequence of records makes ``feed_record`` raise; every record it returns is valid
    against its schema and serialisable, and a DLQ record keeps the original bytes (but the
    summary of a run's late events, which counts them: decision 0015)."""
    asm = Assembler(SETTINGS[settings_name])
    for key, value, now in records:
        emits = asm.feed_record(key, value, now)
        for emit in emits:
            if emit.topic == "dlq" and "late" not in emit.value:
                assert base64.b64decode(emit.value["original_b64"]) == value
        lines(emits)


def check_outcomes(asm: SpyAssembler, emits: list[Emit], pipelined: bool) -> None:
    """The exactly-one-outcome invariants over everything ``asm`` emitted (see the test)."""
    per_run: dict[str, list[Emit]] = defaultdict(list)
    audits: dict[str, list[str]] = defaultdict(list)  # one audit record per outcome record
    finals: dict[str, dict[str, Any]] = {}
    ended: set[str] = set()
    for emit in emits:
        if emit.topic == "dlq":
            continue
        run_id = emit.value["run_id"]
        assert run_id not in finals, f"a record after the final of {run_id}: {emit}"
        if emit.topic == "run_ended":  # at most one per run, before its final (decision 0015)
            assert run_id not in ended, f"a second run.ended of {run_id}: {emit}"
            ended.add(run_id)
        elif emit.topic == "final":
            finals[run_id] = emit.value
        elif emit.topic == "audit":
            audits[run_id].append(emit.value["idempotency_key"])
        elif emit.topic != "progress":
            per_run[run_id].append(emit)
    assert set(finals) == asm.started
    for run_id, final in finals.items():
        check_final(run_id, per_run[run_id], final, early=pipelined)
        assert audits[run_id] == [e.value["idempotency_key"] for e in per_run[run_id]]
        assert len(final["outcomes"]) == asm.opened[run_id]


@bounded(250)
@given(records=record_lists(wild=False) | record_lists(wild=True), ends=endings,
       settings_name=st.sampled_from(list(SETTINGS)))
def test_every_call_gets_exactly_one_outcome(
    records: list[Record], ends: list[str], settings_name: str
) -> None:
    """Once every run has ended (stream end, stream error, cancel or idle tick), every opened
    call is in its run's one final message, whose ``outcomes`` are the run's records (with
    early commit, plus an unrecorded ``duplicate_call_id`` entry for a call reusing an id
    whose outcome was out), nothing of a run follows its final, a run has at most one
    ``run.ended``, each ``tool_call_id`` has one kind of outcome, and no two records share an
    idempotency key."""
    asm = SpyAssembler(SETTINGS[settings_name])
    emits = feed_all(asm, records)
    clock = max((now or 0 for _, _, now in records), default=0)
    emits += end_all(asm, ends, clock)
    lines(emits)
    check_outcomes(asm, emits, pipelined=settings_name == "pipelined")
    for emit in emits:  # --hypothesis-show-statistics: what the examples reached
        event(f"{emit.topic}: {emit.value.get('reason') or emit.value.get('status') or ''}")


@bounded(150)
@given(records=record_lists(wild=True), settings_name=st.sampled_from(list(SETTINGS)),
       offline=st.booleans())
def test_same_input_gives_byte_identical_output(
    records: list[Record], settings_name: str, offline: bool
) -> None:
    """Two fresh assemblers fed the same records (with record times, or offline without them)
    emit byte-identical records: nothing in the core depends on a clock, a hash seed or a
    random number."""
    if offline:
        records = [(k, v, None) for k, v, _ in records]
    first = lines(feed_all(Assembler(SETTINGS[settings_name]), records))
    assert lines(feed_all(Assembler(SETTINGS[settings_name]), records)) == first


@bounded(150)
@given(records=record_lists(wild=False), ends=endings, data=st.data(),
       settings_name=st.sampled_from(list(SETTINGS)))
def test_redelivering_a_prefix_changes_no_outcome(
    records: list[Record], ends: list[str], data: st.DataObject, settings_name: str
) -> None:
    """Records ``[:k]`` then ``[m:]`` with ``m <= k`` (a consumer that crashed before committing
    its offsets and read again from ``m``), then the same ends of the runs still open, give
    the same committed calls, error results, final messages and progress as ``[:]`` does: a
    re-delivered envelope is recognised by its ``seq`` and ignored. Only the DLQ records of
    re-read garbage repeat."""
    k = data.draw(st.integers(0, len(records)), label="k")
    m = data.draw(st.integers(0, k), label="m")
    clock = max((now or 0 for _, _, now in records), default=0)

    def outcomes(sequence: list[Record]) -> list[bytes]:
        asm = Assembler(SETTINGS[settings_name])
        emits = feed_all(asm, sequence) + end_all(asm, ends, clock)
        return [line for line in lines(emits) if not line.startswith(b'{"topic":"dlq"')]

    assert outcomes(records[:k] + records[m:]) == outcomes(records)


# -- decoding --------------------------------------------------------------------------------

VALID_ENVELOPES = [
    {"v": 1, "run_id": "r1", "seq": 0, "type": "run.start", "provider": "openai.chat",
     "tenant": "t1", "tools": [], "limits": {"max_tool_calls": 2}, "ts": 5},
    {"v": 1, "run_id": "r1", "seq": 1, "type": "provider.event", "event": {"type": "ping"}},
    {"v": 1, "run_id": "r1", "seq": 2, "type": "stream.end"},
    {"v": 1, "run_id": "r1", "seq": 2, "type": "stream.error", "error": "reset"},
    {"v": 1, "run_id": "r1", "type": "cancel", "reason": "user_stop"},
    {"v": 1, "type": "tick", "ts": 60_000},
]
FIELDS = sorted({k for doc in VALID_ENVELOPES for k in doc})


@st.composite
def mutated_envelopes(draw: st.DrawFn) -> bytes:
    """A valid envelope of each type with a few fields removed or replaced by any JSON value."""
    doc = dict(draw(st.sampled_from(VALID_ENVELOPES)))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=2)):
        if draw(st.booleans()):
            doc.pop(name, None)
        else:
            doc[name] = draw(st.sampled_from([[], {}, None, True, -1, 1.5, "", "r1", "x"]) | junk)
    return orjson.dumps(doc)


ENVELOPES = (RunStart, ProviderEvent, StreamEnd, StreamError, Cancel, Tick, Rejected)


@bounded(1500)
@given(key=st.sampled_from([b"r1", b"r1", None, b"", b"\xff"]),
       value=st.one_of(mutated_envelopes(), mutated_envelopes(), st.binary(max_size=64),
                       junk.map(orjson.dumps), st.text(max_size=16)))
def test_decode_is_total(key: bytes | None, value: bytes | str) -> None:
    """``decode`` never raises: any key and value decode to an envelope or a ``Rejected``."""
    assert isinstance(decode(key, value), ENVELOPES)
