"""Properties of ``bedrock.converse`` and ``google.gemini``, as ``test_core_properties.py``
states them for the other providers:

* any re-chunking of the same argument text (Bedrock ``toolUse.input`` fragments, Gemini whole
  calls against streamed ones) gives the same records;
* any re-chunking of the same ``partialArgs`` sequence (grouped into parts and chunks in any
  way, strings cut into any ``willContinue`` pieces) gives the same records;
* under arbitrary, mutated event sequences the core never raises, every record matches its
  schema's shape rules, and every call gets exactly one outcome, listed once in the final
  record.
"""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

import orjson
from builders import (
    BEDROCK,
    GEMINI,
    bedrock_tool_block,
    check_outputs,
    dlq,
    feed,
    finals,
    gemini_chunk,
    lines,
    outcomes,
    partial_args,
    run_envelopes,
    tools_for,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.core import Assembler, AssembleSettings, Topic

TOOLS = {"f": {"type": "object"}, "g": {"type": "object", "required": ["a"]}}
BOUNDED = settings(max_examples=60, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

keys = st.text(alphabet="ab_é'\"\\. [", min_size=1, max_size=4)
scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=12) | \
    st.floats(allow_nan=False, allow_infinity=False, width=32)
values = st.recursive(scalars, lambda inner: st.lists(inner, min_size=1, max_size=3)
                      | st.dictionaries(keys, inner, min_size=1, max_size=3), max_leaves=8)
objects = st.dictionaries(keys, values, max_size=4)


def cut(text: str, points: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(p % (len(text) + 1) for p in points)})
    return [text[a:b] for a, b in pairwise(bounds)] or [""]


def run(provider: str, events: list[dict[str, Any]], **limits: Any) -> list[bytes]:
    emits = feed(Assembler(AssembleSettings(**limits)),
                 run_envelopes("r1", provider, tools_for(provider, TOOLS), events))
    check_outputs(emits)
    return lines(emits)


# -- Bedrock: fragments ------------------------------------------------------------------------


@BOUNDED
@given(texts=st.lists(objects.map(lambda o: json.dumps(o)) | st.text(max_size=10), min_size=1,
                      max_size=3),
       data=st.data(), small=st.booleans())
def test_bedrock_any_fragmenting_gives_the_same_records(texts: list[str], data: st.DataObject,
                                                        small: bool) -> None:
    """The same argument texts cut at any points, with the blocks' deltas interleaved in any
    order, give byte-identical records (with and without a tight byte limit)."""
    limits = {"max_tool_argument_bytes": 40} if small else {}

    def events(pieces: list[list[str]], order: list[int]) -> list[dict[str, Any]]:
        starts = [bedrock_tool_block(i, f"c{i}", "f", "")[0] for i in range(len(texts))]
        deltas = [[{"contentBlockDelta": {"contentBlockIndex": i,
                                          "delta": {"toolUse": {"input": p}}}} for p in ps]
                  for i, ps in enumerate(pieces)]
        body = [deltas[i].pop(0) for i in order]
        stops = [{"contentBlockStop": {"contentBlockIndex": i}} for i in range(len(texts))]
        return [*starts, *body, *stops, {"messageStop": {"stopReason": "tool_use"}}]

    whole = [[t] for t in texts]
    pieces = [cut(t, data.draw(st.lists(st.integers(0, 40), max_size=6))) for t in texts]
    order = data.draw(st.permutations([i for i, ps in enumerate(pieces) for _ in ps]))
    assert run(BEDROCK, events(pieces, order), **limits) == run(
        BEDROCK, events(whole, list(range(len(texts)))), **limits)


# -- Gemini: partialArgs -----------------------------------------------------------------------


def gemini_stream(arguments: list[dict[str, Any]], data: st.DataObject | None) -> list[Any]:
    """Each object as a streamed call: its partialArgs (strings cut at drawn points, or whole
    when ``data`` is None) grouped into parts and chunks as drawn."""
    chunks: list[dict[str, Any]] = []
    for n, value in enumerate(arguments):
        partials = partial_args(value, pieces=1)
        if data is not None:
            partials = [p for q in partials for p in _recut(q, data)]
        chunks.append(gemini_chunk([{"functionCall": {"name": "f", "id": f"c{n}",
                                                      "willContinue": True}}]))
        sizes = data.draw(st.lists(st.integers(1, 3), min_size=len(partials),
                                   max_size=len(partials))) if data else [len(partials)]
        at = 0
        for size in sizes:
            group = partials[at:at + size]
            if not group:
                break
            at += size
            chunks.append(gemini_chunk([{"functionCall": {"partialArgs": group,
                                                          "willContinue": True}}]))
        chunks.append(gemini_chunk([{"functionCall": {}}]))
    return [*chunks, gemini_chunk([{"text": ""}], finish_reason="STOP")]


def _recut(partial: dict[str, Any], data: st.DataObject) -> list[dict[str, Any]]:
    if "stringValue" not in partial:
        return [partial]
    text = partial["stringValue"]
    pieces = cut(text, data.draw(st.lists(st.integers(0, 12), max_size=3)))
    return [{"jsonPath": partial["jsonPath"], "stringValue": p,
             **({"willContinue": True} if i < len(pieces) - 1 else {})}
            for i, p in enumerate(pieces)]


@BOUNDED
@given(arguments=st.lists(objects, min_size=1, max_size=3), data=st.data())
def test_gemini_any_partial_args_chunking_gives_the_same_records(
        arguments: list[dict[str, Any]], data: st.DataObject) -> None:
    """The same objects streamed as partialArgs, grouped into parts in any way and with their
    strings cut into any willContinue pieces, give the same outcomes and the same committed
    arguments as one another and as the same calls sent whole: the objects themselves."""
    whole = [gemini_chunk([{"functionCall": {"name": "f", "id": f"c{n}", "args": value}}])
             for n, value in enumerate(arguments)]
    whole.append(gemini_chunk([{"text": ""}], finish_reason="STOP"))
    reference = Assembler()
    expected = feed(reference, run_envelopes("r1", GEMINI, tools_for(GEMINI, TOOLS), whole))
    got = feed(Assembler(), run_envelopes("r1", GEMINI, tools_for(GEMINI, TOOLS),
                                          gemini_stream(arguments, data)))
    check_outputs(got)
    assert outcomes(got) == outcomes(expected)
    committed = [e.value["arguments"] for e in got if e.topic is Topic.COMMITTED]
    assert committed == [orjson.loads(orjson.dumps(a)) for a in arguments]


# -- mutation: one outcome per call ------------------------------------------------------------

idx = st.integers(0, 3)
junk = st.none() | st.integers(-1, 3) | st.text(max_size=3) | st.booleans()
bedrock_events = st.one_of(
    st.builds(lambda i, c, n, t: {"contentBlockStart": {"contentBlockIndex": i, "start": {
        "toolUse": {"toolUseId": c, "name": n, **({"type": t} if t else {})}}}},
        idx, st.sampled_from(["", "c1", "c2"]), st.sampled_from(["f", "g", "x"]),
        st.sampled_from([None, "server_tool_use"])),
    st.builds(lambda i, s: {"contentBlockDelta": {"contentBlockIndex": i,
                                                  "delta": {"toolUse": {"input": s}}}},
              idx, st.sampled_from(['{"a":', "1}", "{}", "", "x"])),
    st.builds(lambda i, s: {"contentBlockDelta": {"contentBlockIndex": i, "delta": {"text": s}}},
              idx, st.text(max_size=3)),
    st.builds(lambda i, s: {"contentBlockDelta": {"contentBlockIndex": i, "delta": {
        "reasoningContent": s}}}, idx, st.sampled_from([{"text": "t"}, {"signature": "s"},
                                                        {"redactedContent": "AAAA"}]) | junk),
    st.builds(lambda i: {"contentBlockStop": {"contentBlockIndex": i}}, idx | junk),
    st.builds(lambda r: {"messageStop": {"stopReason": r}},
              st.sampled_from(["tool_use", "max_tokens", "guardrail_intervened", "x"]) | junk),
    st.just({"messageStart": {"role": "assistant"}}),
    st.just({"metadata": {"usage": {}}}),
    st.just({"throttlingException": {"message": "m"}}),
    st.dictionaries(st.sampled_from(["contentBlockDelta", "contentBlockStart", "x"]), junk,
                    max_size=2),
)
function_calls = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["f", "g", "x", ""]), "id": st.sampled_from(["c1", "c2", ""]),
    "args": st.sampled_from([{}, {"a": 1}, [], "x"]), "willContinue": st.booleans() | junk,
    "partialArgs": st.lists(st.fixed_dictionaries({}, optional={
        "jsonPath": st.sampled_from(["$.a", "$.b[0]", "$['a']", "$[*]", "$"]) | junk,
        "stringValue": st.text(max_size=3) | junk, "numberValue": st.integers(0, 9) | junk,
        "willContinue": st.booleans()}), max_size=3) | junk})
parts = st.one_of(st.builds(lambda f: {"functionCall": f}, function_calls | junk),
                  st.builds(lambda t: {"text": t}, st.text(max_size=3)), junk)
gemini_events = st.one_of(
    st.builds(lambda c, ps, f: {"candidates": [{"index": c, "content": {"parts": ps},
                                                **({"finishReason": f} if f else {})}]},
              st.integers(0, 1) | junk, st.lists(parts, max_size=3) | junk,
              st.sampled_from([None, "STOP", "MAX_TOKENS", "SAFETY", "OTHER"])),
    st.just({"usageMetadata": {}}), st.just({"error": {"status": "INTERNAL"}}),
    st.just({"promptFeedback": {"blockReason": "SAFETY"}}),
    st.dictionaries(st.sampled_from(["candidates", "error"]), junk, max_size=1),
)


@BOUNDED
@given(provider=st.sampled_from([BEDROCK, GEMINI]), data=st.data(), end=st.booleans())
def test_mutated_streams_give_one_outcome_per_call(provider: str, data: st.DataObject,
                                                   end: bool) -> None:
    """Any sequence of plausible and broken events: no exception leaves the core, records
    keep their shape rules, the run ends with one final record (when the stream ends), and
    each call in it has exactly one outcome record."""
    events = data.draw(st.lists(bedrock_events if provider == BEDROCK else gemini_events,
                                max_size=14))
    emits = feed(Assembler(), run_envelopes("r1", provider, tools_for(provider, TOOLS), events,
                                            end=end))
    check_outputs(emits)
    assert all(d["reason"] in ("invalid_envelope", "run_finished") for d in dlq(emits))
    if end:
        [final] = finals(emits)
        ids = [(o["tool_call_id"], o.get("choice"), o["index"]) for o in final["outcomes"]]
        records = [(e.value.get("call_id") or e.value["tool_call_id"], e.value.get("choice"),
                    e.value["index"]) for e in emits if e.topic in (Topic.COMMITTED,
                                                                     Topic.ERRORS)]
        assert sorted(map(str, records)) == sorted(map(str, ids))


@BOUNDED
@given(provider=st.sampled_from([BEDROCK, GEMINI]), data=st.data())
def test_redelivery_and_replay_give_the_same_records(provider: str, data: st.DataObject) -> None:
    """As ``test_core_properties`` states for the other providers, over the same mutated
    streams: two fresh assemblers emit byte-identical records, and envelopes ``[:k]`` then
    ``[m:]`` with ``m <= k`` (a consumer that re-reads from an older offset) give the records
    of ``[:]``, the DLQ records of re-read garbage aside."""
    events = data.draw(st.lists(bedrock_events if provider == BEDROCK else gemini_events,
                                max_size=14))
    envelopes = run_envelopes("r1", provider, tools_for(provider, TOOLS), events)
    whole = lines(feed(Assembler(), envelopes))
    assert lines(feed(Assembler(), envelopes)) == whole
    k = data.draw(st.integers(0, len(envelopes)), label="k")
    m = data.draw(st.integers(0, k), label="m")
    again = lines(feed(Assembler(), envelopes[:k] + envelopes[m:]))

    def kept(records: list[bytes]) -> list[bytes]:
        return [r for r in records if not r.startswith(b'{"topic":"dlq"')]
    assert kept(again) == kept(whole)
