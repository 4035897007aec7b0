"""How much the pure core costs per envelope, against the cost of merely parsing it.

Builds a realistic mix of stream envelopes, encoded to bytes once, and times in the same
process, over the same bytes:

* the **floor**: ``orjson.loads(value)`` for every record, nothing else;
* the **core**: ``Assembler.feed_record(key, value, now_ms)`` for every record, on a fresh
  assembler each pass (decoding, run lookup, adapter, buffers, the latch, outputs).

The two are timed in ``--runs`` pairs, a floor pass then a core pass, back to back; the
headline is the median of the pairs' ratios, which a machine that speeds up or slows down
between pairs moves little (the best pass of each is printed too). Issue 13's target is a
core at most 1.5x the floor (``ratio core/orjson.loads`` <= 1.5), compiled. Validators are
compiled once per process (``tools.SHARED_VALIDATORS``), before the timed passes. Whether the
core runs compiled (mypyc, ``setup.py``) or as pure Python is printed first.

The mix: runs of all three providers, interleaved eight at a time as a partition sees them,
made of real event shapes taken from the recorded streams in ``../shared/fixtures/providers``
(chat chunks with their ``id``/``model``/``system_fingerprint``, Anthropic ``text_delta``
events, Responses ``output_text.delta`` events with their ``item_id`` and ``obfuscation``):
mostly text deltas, two or three parallel tool calls per run in small argument fragments,
and in one run in twenty a 64 KiB argument in small fragments.

    python bench/bench_core.py               # 9 timed pairs
    python bench/bench_core.py --runs 9 --streams 400
    python bench/bench_core.py --profile     # and cProfile the core loop
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from worker.core import Assembler, AssembleSettings
from worker.tools.capture import provider_events

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "providers"
CHAT_FILE = "openai-python/.inline-snapshot/external/" \
    "f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin"
CHAT_TEXT_FILE = "openai-python/.inline-snapshot/external/" \
    "4cc50a6135d254573a502310e6af1246f55edb6ad95fa24059f160996b68866d.bin"
ANTHROPIC_FILE = "anthropic-sdk-python/tests/lib/streaming/fixtures/tool_use_response.txt"
RESPONSES_FILE = "vercel-ai/packages/openai/src/responses/__fixtures__/" \
    "openai-reasoning-encrypted-content.1.chunks.txt"

WORDS = ("The", " weather", " in", " Paris", " is", " mild", ",", " with", " light", " rain",
         " expected", " later", " today", ".", " I", "'ll", " check", " the", " forecast",
         " for", " you", " and", " summarise", " it", " below", ":", "\n\n", " température",
         " 12", "°C")

Record = tuple[bytes, bytes, int]


# -- event templates from the recorded streams ------------------------------------------------


def _events(fixtures: Path, name: str) -> list[dict[str, Any]]:
    path = fixtures / name
    return provider_events(path.read_text(encoding="utf-8"), path.name)[0]


def _first(events: list[dict[str, Any]], test: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    return copy.deepcopy(next(e for e in events if test(e)))


def _first_of(events: list[dict[str, Any]], kind: str, field: str,
              field_type: str) -> dict[str, Any]:
    """The first event of type ``kind`` whose ``field`` is of type ``field_type``."""
    return _first(events, lambda e: e["type"] == kind and e[field]["type"] == field_type)


def _chat_delta(event: dict[str, Any]) -> dict[str, Any]:
    choices = event.get("choices") or [{}]
    delta: dict[str, Any] = choices[0].get("delta") or {}
    return delta


class Templates:
    """One real event of each kind per provider, copied and filled in by the builders."""

    def __init__(self, fixtures: Path) -> None:
        chat = _events(fixtures, CHAT_FILE) + _events(fixtures, CHAT_TEXT_FILE)
        self.chat_text = _first(chat, lambda e: bool(_chat_delta(e).get("content")))
        self.chat_open = _first(chat, lambda e: "id" in (_chat_delta(e).get("tool_calls")
                                                         or [{}])[0])
        self.chat_args = _first(chat, lambda e: bool(_chat_delta(e).get("tool_calls"))
                                and "id" not in _chat_delta(e)["tool_calls"][0])
        self.chat_finish = _first(chat, lambda e: e["choices"][0].get("finish_reason") is not None)
        anthropic = _events(fixtures, ANTHROPIC_FILE)
        kind = self._by_type(anthropic)
        self.a_start, self.a_stop = kind["message_start"], kind["message_stop"]
        self.a_text_block = _first_of(anthropic, "content_block_start", "content_block", "text")
        self.a_tool_block = _first_of(anthropic, "content_block_start", "content_block",
                                      "tool_use")
        self.a_text = _first_of(anthropic, "content_block_delta", "delta", "text_delta")
        self.a_json = _first_of(anthropic, "content_block_delta", "delta", "input_json_delta")
        self.a_block_stop, self.a_delta = kind["content_block_stop"], kind["message_delta"]
        responses = _events(fixtures, RESPONSES_FILE)
        kind = self._by_type(responses)
        self.r_created, self.r_completed = kind["response.created"], kind["response.completed"]
        self.r_text = kind["response.output_text.delta"]
        self.r_args = kind["response.function_call_arguments.delta"]
        self.r_args_done = kind["response.function_call_arguments.done"]
        self.r_call = _first_of(responses, "response.output_item.added", "item", "function_call")
        self.r_message = _first_of(responses, "response.output_item.added", "item", "message")
        self.r_call_done = _first_of(responses, "response.output_item.done", "item",
                                     "function_call")
        self.tool = {"name": "write_file", "description": "Write a file.", "parameters": {
            "type": "object", "properties": {"path": {"type": "string"},
                                             "content": {"type": "string"}},
            "required": ["path", "content"], "additionalProperties": False}}

    @staticmethod
    def _by_type(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for event in events:
            found.setdefault(event["type"], copy.deepcopy(event))
        return found


# -- streams ---------------------------------------------------------------------------------


def _fragments(rng: random.Random, text: str) -> Iterator[str]:
    """Argument text in the pieces a provider streams: a token or a few (1 to 12 characters),
    a large argument in 16 to 64 (a token of a long string is often longer)."""
    low, high = (16, 64) if len(text) > 4096 else (1, 12)
    at = 0
    while at < len(text):
        step = rng.randint(low, high)
        yield text[at:at + step]
        at += step


def _arguments(rng: random.Random, n: int, large: bool) -> str:
    content = "".join(rng.choice(WORDS) for _ in range(20_000 if large else 12))
    if large:
        content = content[:64 * 1024]
    return orjson.dumps({"path": f"/tmp/out-{n}.md", "content": content}).decode()


def _with(template: dict[str, Any], **changes: Any) -> dict[str, Any]:
    event = copy.deepcopy(template)
    event.update(changes)
    return event


def chat_run(t: Templates, rng: random.Random, texts: int, calls: list[str]) -> list[Any]:
    def chunk(template: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
        event = copy.deepcopy(template)
        event["choices"][0]["delta"] = delta
        return event

    events = [chunk(t.chat_text, {"content": rng.choice(WORDS)}) for _ in range(texts)]
    for i, text in enumerate(calls):
        events.append(chunk(t.chat_open, {"tool_calls": [{
            "index": i, "id": f"call_{i}", "type": "function",
            "function": {"name": "write_file", "arguments": ""}}]}))
        events += [chunk(t.chat_args, {"tool_calls": [{"index": i, "function": {
            "arguments": f}}]}) for f in _fragments(rng, text)]
    return [*events, copy.deepcopy(t.chat_finish)]


def anthropic_run(t: Templates, rng: random.Random, texts: int, calls: list[str]) -> list[Any]:
    events = [copy.deepcopy(t.a_start), _with(t.a_text_block, index=0)]
    events += [_with(t.a_text, delta={"type": "text_delta", "text": rng.choice(WORDS)})
               for _ in range(texts)]
    events.append(_with(t.a_block_stop, index=0))
    for i, text in enumerate(calls, 1):
        block = {**t.a_tool_block["content_block"], "id": f"toolu_{i}", "name": "write_file"}
        events.append(_with(t.a_tool_block, index=i, content_block=block))
        events += [_with(t.a_json, index=i, delta={"type": "input_json_delta",
                                                   "partial_json": f})
                   for f in _fragments(rng, text)]
        events.append(_with(t.a_block_stop, index=i))
    return [*events, copy.deepcopy(t.a_delta), copy.deepcopy(t.a_stop)]


def responses_run(t: Templates, rng: random.Random, texts: int, calls: list[str]) -> list[Any]:
    events = [copy.deepcopy(t.r_created), _with(t.r_message, output_index=0)]
    events += [_with(t.r_text, output_index=0, sequence_number=n, delta=rng.choice(WORDS))
               for n in range(texts)]
    done = []
    for i, text in enumerate(calls, 1):
        item = {**t.r_call["item"], "id": f"fc_{i}", "call_id": f"call_{i}",
                "name": "write_file"}
        events.append(_with(t.r_call, output_index=i, item=item))
        events += [_with(t.r_args, output_index=i, item_id=f"fc_{i}", delta=f)
                   for f in _fragments(rng, text)]
        events.append(_with(t.r_args_done, output_index=i, item_id=f"fc_{i}", arguments=text))
        done.append({**item, "arguments": text, "status": "completed"})
        events.append(_with(t.r_call_done, output_index=i, item=done[-1]))
    # response.completed lists what was streamed (the recorded one lists the recording's own
    # call, which these runs never stream: a protocol_error for every call, and the run failed)
    completed = copy.deepcopy(t.r_completed)
    completed["response"]["output"] = [
        *(o for o in completed["response"]["output"] if o.get("type") != "function_call"),
        *done]
    return [*events, completed]


BUILDERS = {"openai.chat": chat_run, "anthropic.messages": anthropic_run,
            "openai.responses": responses_run}


def tools_for(provider: str, tool: dict[str, Any]) -> list[dict[str, Any]]:
    if provider == "openai.chat":
        return [{"type": "function", "function": tool}]
    if provider == "openai.responses":
        return [{"type": "function", **tool}]
    return [{"name": tool["name"], "description": tool["description"],
             "input_schema": tool["parameters"]}]


def run_envelopes(t: Templates, rng: random.Random, n: int) -> list[bytes]:
    """One run's envelopes, encoded: start, provider events, end."""
    provider = list(BUILDERS)[n % 3]
    run_id = f"run-{n:05d}"
    calls = [_arguments(rng, n * 10 + i, large=n % 20 == 7 and i == 0)
             for i in range(rng.choice([0, 1, 2, 2, 3]))]
    events = BUILDERS[provider](t, rng, rng.randint(80, 240), calls)
    docs: list[dict[str, Any]] = [{"type": "run.start", "provider": provider, "tenant": "t1",
                                   "tools": tools_for(provider, t.tool)}]
    docs += [{"type": "provider.event", "event": e} for e in events]
    docs.append({"type": "stream.end"})
    return [orjson.dumps({"v": 1, "run_id": run_id, "seq": seq, **doc})
            for seq, doc in enumerate(docs)]


def corpus(fixtures: Path, streams: int, seed: int = 7) -> list[Record]:
    """``streams`` runs, eight open at a time, their envelopes interleaved at random."""
    rng = random.Random(seed)
    t = Templates(fixtures)
    records: list[Record] = []
    now = 1_700_000_000_000
    for first in range(0, streams, 8):
        group = {f"run-{n:05d}".encode(): run_envelopes(t, rng, n)
                 for n in range(first, min(first + 8, streams))}
        order = [key for key, values in group.items() for _ in values]
        rng.shuffle(order)
        position = dict.fromkeys(group, 0)
        for key in order:
            records.append((key, group[key][position[key]], now))
            position[key] += 1
            now += 1
    return records


# -- timing ----------------------------------------------------------------------------------


#: CPU time of this process, not wall time: a shared machine's other load does not count.
clock = time.process_time


def floor_pass(records: list[Record]) -> float:
    loads = orjson.loads
    started = clock()
    for _key, value, _now in records:
        loads(value)
    return clock() - started


def core_pass(records: list[Record]) -> float:
    feed = Assembler(AssembleSettings()).feed_record
    started = clock()
    for key, value, now in records:
        feed(key, value, now)
    return clock() - started


def timed_pairs(records: list[Record], runs: int) -> list[tuple[float, float]]:
    """``runs`` pairs of one floor pass and one core pass, each pair timed back to back so
    that both of its passes see the same machine."""
    pairs = []
    for _ in range(runs):
        gc.collect()
        floor = floor_pass(records)
        gc.collect()
        pairs.append((floor, core_pass(records)))
    return pairs


def best_of(records: list[Record], runs: int) -> tuple[float, float]:
    """The best floor and the best core pass of ``runs`` pairs."""
    pairs = timed_pairs(records, runs)
    return min(f for f, _ in pairs), min(c for _, c in pairs)


def check(records: list[Record]) -> dict[str, int]:
    """What the corpus produces, so that the benchmark is seen to do the real work."""
    asm = Assembler(AssembleSettings())
    counts: dict[str, int] = {}
    for key, value, now in records:
        for emit in asm.feed_record(key, value, now):
            name = f"{emit.topic}:{emit.value.get('reason') or emit.value.get('status') or ''}"
            counts[name] = counts.get(name, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9,
                        help="pairs of timed passes (floor, then core)")
    parser.add_argument("--streams", type=int, default=240, help="LLM runs in the corpus")
    parser.add_argument("--fixtures", type=Path, default=FIXTURES,
                        help="the shared provider fixtures directory")
    parser.add_argument("--profile", action="store_true", help="cProfile one core pass")
    args = parser.parse_args(argv)

    import worker

    build = "compiled by mypyc" if worker.compiled_core() else "pure Python"
    print(f"core: {build} ({worker.__file__})")
    records = corpus(args.fixtures, args.streams)
    count, size = len(records), sum(len(v) for _, v, _ in records)
    outcomes = check(records)
    print(f"corpus: {count} envelopes, {size / 1e6:.1f} MB, {args.streams} runs; outputs: "
          + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    pairs = timed_pairs(records, args.runs)
    floor, core = min(f for f, _ in pairs), min(c for _, c in pairs)

    print(f"\n{'':24}{'best s':>9}{'envelopes/s':>14}{'MB/s':>9}{'x floor':>9}")
    for name, seconds in (("orjson.loads (floor)", floor), ("Assembler.feed_record", core)):
        print(f"{name:24}{seconds:9.3f}{count / seconds:14,.0f}{size / seconds / 1e6:9.1f}"
              f"{seconds / floor:9.2f}")
    # The headline is the median of the pairs' ratios: each pair's two passes ran back to
    # back, so a machine that slows down or speeds up between pairs moves both alike.
    ratios = sorted(c / f for f, c in pairs)
    print(f"\nratio of each pair: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"ratio core/orjson.loads: {statistics.median(ratios):.2f} (median of {len(ratios)} "
          f"pairs; best core / best floor {core / floor:.2f})")

    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(core_pass, records)
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
