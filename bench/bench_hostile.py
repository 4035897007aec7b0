"""How long the worst inputs known take the core (issue 9): every one must be bounded.

Each case is a whole run fed to a fresh ``Assembler`` (with a cache of its own, so the
schema is compiled inside the timed section, once, when the call is decided), through
``feed_record`` as the worker does. Printed: the case, its outcome, and the best and median
time over ``--runs`` passes. The cases:

* ``pattern``: ``"pattern": "^(a+)+$"`` against 29 ``a`` and a ``!`` (18 s on Python's ``re``);
* ``fan-out``: ``allOf`` of two ``$ref`` to the next level, 18 levels (7 s before);
* ``unique``: ``uniqueItems`` over 8,000 objects (54 s before, quadratic);
* ``780 KB run.start``: six tools of 130 KB schemas and one called tool of 128 KB with
  thousands of properties (2.3 s per schema compiled at ``run.start``, before);
* ``ref chain``: a ``$ref`` chain of 470 links;
* ``2,000-value schema``: the largest schema ``max_schema_nodes`` accepts, compiled (checked
  against its metaschema by jsonschema, the dearest part of a compile);
* ``steps``: the most keyword applications a value can cost: 25,000 properties each checked
  against an ``anyOf`` of eight subschemas, ended by ``max_schema_validation_steps``
  (20,000 by default): the bound on one call's validation time;
* ``deep value``: a value 62 levels deep under a recursive schema.

    python bench/bench_hostile.py            # 5 passes each
    python bench/bench_hostile.py --runs 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.core import Assembler, AssembleSettings, Topic
from worker.core.schemacheck import SchemaLimits
from worker.core.tools import ValidatorCache


def chat_run(tools: dict[str, Any], name: str, args: str) -> list[bytes]:
    """The records of a chat run that calls ``name`` with ``args`` once."""
    specs = [{"type": "function", "function": {"name": n, "parameters": s}}
             for n, s in tools.items()]
    envelopes: list[dict[str, Any]] = [
        {"v": 1, "run_id": "r", "seq": 0, "type": "run.start", "provider": "openai.chat",
         "tools": specs},
        {"v": 1, "run_id": "r", "seq": 1, "type": "provider.event", "event": {"choices": [
            {"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "c1", "type": "function",
                 "function": {"name": name, "arguments": args}}]}}]}},
        {"v": 1, "run_id": "r", "seq": 2, "type": "stream.end"}]
    return [orjson.dumps(e) for e in envelopes]


def fan_out(levels: int) -> dict[str, Any]:
    defs = {f"l{n}": {"allOf": [{"$ref": f"#/$defs/l{n + 1}"}, {"$ref": f"#/$defs/l{n + 1}"}]}
            for n in range(levels)}
    defs[f"l{levels}"] = {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


def ref_chain(links: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{n}": {"$ref": f"#/$defs/d{n + 1}"} for n in range(links)}
    defs[f"d{links}"] = {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def big_start() -> tuple[dict[str, Any], str]:
    """Six tools of 130 KB and one of about 128 KB with many properties (the one called)."""
    tools: dict[str, Any] = {f"big{n}": {"type": "object", "description": "x" * 130_000}
                             for n in range(6)}
    props = {f"p{n:05d}": {"type": "string"} for n in range(4000)}
    tools["called"] = {"type": "object", "properties": props}
    return tools, "{}"


def cases() -> list[tuple[str, list[bytes]]]:
    obj = {"type": "object"}
    recursive = {"$defs": {"n": {"type": "object", "additionalProperties": {"$ref": "#/$defs/n"}}},
                 "$ref": "#/$defs/n"}
    alternatives = [{"type": "integer", "minimum": n, "maximum": n + 1000} for n in range(8)]
    steps_schema = {"type": "object", "additionalProperties": {"anyOf": alternatives}}
    steps_args = orjson.dumps({f"k{n}": -1 for n in range(25_000)}).decode()
    tools, args = big_start()
    return [
        ("pattern ^(a+)+$", chat_run(
            {"f": {"type": "object", "properties": {"s": {"pattern": "^(a+)+$"}}}}, "f",
            orjson.dumps({"s": "a" * 29 + "!"}).decode())),
        ("fan-out 18 levels", chat_run({"f": fan_out(18)}, "f", "{}")),
        ("uniqueItems 8,000 objects", chat_run(
            {"f": {"type": "object", "properties": {"a": {"uniqueItems": True}}}}, "f",
            orjson.dumps({"a": [{"i": n, "s": "x" * 8} for n in range(8000)]}).decode())),
        ("780 KB run.start", chat_run({**tools, "g": obj}, "called", args)),
        ("ref chain 470 links", chat_run({"f": ref_chain(470)}, "f", "{}")),
        ("2,000-value schema compiled", chat_run(
            {"f": {"type": "object", "properties": {f"p{n}": {"type": "string"}
                                                     for n in range(998)}}}, "f", "{}")),
        ("steps budget", chat_run({"f": steps_schema}, "f", steps_args)),
        ("deep value 62 levels", chat_run({"f": recursive}, "f",
                                          '{"a": ' * 61 + "{}" + "}" * 61)),
    ]


def run_once(records: list[bytes]) -> tuple[float, str]:
    settings = AssembleSettings(max_tool_argument_bytes=1 << 20)
    limits = SchemaLimits(settings.max_schema_nodes, settings.max_schema_validation_steps)
    assembler = Assembler(settings, ValidatorCache(limits=limits))
    start = time.perf_counter()
    emits = [e for r in records for e in assembler.feed_record(b"r", r)]
    elapsed = time.perf_counter() - start
    out = [e.value for e in emits if e.topic in (Topic.COMMITTED, Topic.ERRORS)]
    verdict = "committed" if out and "call_id" in out[0] else (out[0]["content"] if out else "?")
    return elapsed, verdict


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    worst = 0.0
    for name, records in cases():
        size = sum(len(r) for r in records)
        times, verdict = [], ""
        for _ in range(args.runs):
            elapsed, verdict = run_once(records)
            times.append(elapsed)
        worst = max(worst, max(times))
        print(f"{name:28} {size / 1024:8.0f} KiB  best {min(times) * 1000:8.1f} ms  "
              f"median {statistics.median(times) * 1000:8.1f} ms  -> {verdict[:90]}")
    print(f"slowest pass of any case: {worst * 1000:.1f} ms")



if __name__ == "__main__":
    main()
