"""A mutation fuzzer for the pure core, shared by the bounded hypothesis test
(``tests/core/property/test_fuzz_bounded.py``) and the wall-clock runner (``bench/fuzz_core.py``).

It starts from *real* envelopes: the recorded provider streams of the shared fixtures
(``../shared/fixtures/providers``, read as ``latch assemble --from-sse`` reads them), wrapped as
a gateway wraps them (``worker.tools.capture.envelopes``). One :func:`records` sequence
interleaves a
few runs of those captures and, at a given rate, damages them the ways real input goes bad:

* **structure**: a field deleted anywhere in the envelope or its event, a value replaced by one
  of another type (null, boolean, negative, huge, float, empty or long string, array, object),
  the envelope or event ``type`` swapped for another one, ``seq`` moved back, forward or far,
  ``run_id`` changed to another run's, an unknown one or an oversize one;
* **bytes**: a bit flipped, the record truncated, junk bytes inserted, a slice repeated;
* **order**: a record delivered again, dropped, keyed wrongly; cancels, stream ends and errors,
  ticks with time jumps, and garbage records in between.

:class:`Checker` feeds every record to one :class:`SpyAssembler` and holds it to the promises:
``feed_record`` never raises; every output serializes with orjson (as the worker publishes it)
and validates against ``schemas/output-line.schema.json``; a DLQ record keeps the original
bytes (the summary of a finished run's late events keeps none: decision 0015); a run has at
most one ``run.ended``; nothing of a run follows its final message; and, once
:meth:`Checker.finish` has fed a tick far in the future, every run that started has ended and
every call it opened is in its final message, each ``tool_call_id`` with one kind of outcome
(:func:`check_final`).
Everything is driven by one ``random.Random``, so a seed reproduces a sequence exactly.
"""

from __future__ import annotations

import base64
import copy
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.envelope import TICK_KEY
from worker.core.run import Run
from worker.runtime.schemas import validator
from worker.tools import capture

FIXTURES = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures" / "providers"
_OPENAI = "openai-python/.inline-snapshot/external"
_VERCEL = "vercel-ai/packages"
_PYDANTIC = "pydantic-ai/tests/models/cassettes"

#: The captures whose events seed the fuzzer, by Latch provider.
CAPTURES: dict[str, list[str]] = {
    "openai.chat": [
        f"{_OPENAI}/f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin",
        f"{_OPENAI}/c6aa7e397b7123c3501f25df3a05d4daf7e8ad6d61ffa406ab5361fe36a8d5b1.bin",
        f"{_OPENAI}/a491adda08c3d4fde95f5b2ee3f60f7f745f1a56d82e62f58031cc2add502380.bin",
        f"{_OPENAI}/4cc50a6135d254573a502310e6af1246f55edb6ad95fa24059f160996b68866d.bin",
        f"{_VERCEL}/mistral/src/__fixtures__/mistral-incremental-tool-call.chunks.txt",
        f"{_VERCEL}/mistral/src/__fixtures__/mistral-tool-call.chunks.txt",
        f"{_VERCEL}/groq/src/__fixtures__/groq-tool-call.chunks.txt",
        f"{_VERCEL}/deepseek/src/chat/__fixtures__/deepseek-tool-call.chunks.txt",
    ],
    "anthropic.messages": [
        "anthropic-sdk-python/tests/lib/streaming/fixtures/tool_use_response.txt",
        "anthropic-sdk-python/tests/fixtures/fable-fallback/stream-a-toolrefusal.sse",
        f"{_VERCEL}/anthropic/src/__fixtures__/anthropic-tool-no-args.chunks.txt",
        f"{_VERCEL}/anthropic/src/__fixtures__/anthropic-web-fetch-tool-20260209.1.chunks.txt",
        f"{_VERCEL}/anthropic/src/__fixtures__/duplicate-message-start.chunks.txt",
    ],
    "openai.responses": [
        f"{_VERCEL}/openai/src/responses/__fixtures__/github-copilot-id-rotation.1.chunks.txt",
        f"{_VERCEL}/openai/src/responses/__fixtures__/"
        "openai-reasoning-encrypted-content.1.chunks.txt",
        f"{_VERCEL}/openai/src/responses/__fixtures__/parallel-tool-call-wrapper.1.chunks.txt",
        f"{_PYDANTIC}/test_openai_responses/test_openai_responses_stream.yaml",
    ],
    "bedrock.converse": [
        f"{_VERCEL}/amazon-bedrock/src/__fixtures__/amazon-bedrock-json-with-tools.1.chunks.txt",
        f"{_VERCEL}/amazon-bedrock/src/__fixtures__/"
        "issue-11409-kimi-k2-thinking-glob-search.chunks.txt",
    ],
    "google.gemini": [
        f"{_VERCEL}/google/src/__fixtures__/google-stream-no-args-tool-call.chunks.txt",
        f"{_VERCEL}/google/src/__fixtures__/"
        "google-stream-tool-call-array-arguments-missing-terminal-function-call.chunks.txt",
    ],
}

#: Assembler settings the sequences run under: the defaults; budgets so tight that runs are
#: ended for open runs, buffered bytes and call floods; early commit with progress records.
SETTINGS: dict[str, AssembleSettings] = {
    "default": AssembleSettings(),
    "tight": AssembleSettings(max_tool_argument_bytes=48, max_tool_calls_in_flight_assemble=2,
                              max_tool_calls_per_run=1, max_open_runs=3,
                              max_buffered_bytes=64),
    "pipelined": AssembleSettings(execute_before_stream_end=True,
                                  allow_pipelined_execute=("get_weather", "weather", "f"),
                                  emit_progress=True, ui_forward_partial_args=True),
}

IDLE_MS = 60_000
_TYPES = ["run.start", "provider.event", "stream.end", "stream.error", "cancel", "tick", "x"]
_EVENT_TYPES = [
    "message_start", "content_block_start", "content_block_delta", "content_block_stop",
    "message_delta", "message_stop", "error", "ping", "response.created",
    "response.output_item.added", "response.function_call_arguments.delta",
    "response.function_call_arguments.done", "response.output_item.done",
    "response.output_text.delta", "response.completed", "response.incomplete",
    "response.failed", "input_json_delta", "text_delta", "tool_use", "function_call",
]


def junk(rng: random.Random) -> Any:
    """A JSON value of any type, some of them hostile."""
    return rng.choice([
        None, True, False, 0, -1, 2**63 - 1, 2**64 - 1, 1.5, -0.0, "", "x", "\u0000",
        "\ud83d\ude00", "{", '{"k": 1}', "x" * rng.choice([64, 300, 5000]), [], [None], {},
        {"type": "tool_use"}, {"index": 0}, nest(rng.choice([8, 63, 70])),
    ])


def nest(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


# -- the corpus --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    """One recorded provider response: its events, and tools registering its call names."""

    provider: str
    name: str
    events: tuple[Any, ...]
    tools: tuple[Any, ...]


def _tool_names(provider: str, events: list[Any]) -> set[str]:
    names: set[str] = set()
    for event in events:
        if not isinstance(event, dict):
            continue
        if provider == "openai.chat":
            for choice in event.get("choices") or ():
                for entry in (choice.get("delta") or {}).get("tool_calls") or ():
                    name = (entry.get("function") or {}).get("name")
                    if isinstance(name, str) and name:
                        names.add(name)
        elif provider == "bedrock.converse":
            start = (event.get("contentBlockStart") or {}).get("start") or {}
            name = (start.get("toolUse") or {}).get("name")
            if isinstance(name, str) and name:
                names.add(name)
        elif provider == "google.gemini":
            for candidate in event.get("candidates") or ():
                for part in (candidate.get("content") or {}).get("parts") or ():
                    name = (part.get("functionCall") or {}).get("name")
                    if isinstance(name, str) and name:
                        names.add(name)
        else:
            body = event.get("content_block") or event.get("item") or {}
            if body.get("type") in ("tool_use", "function_call") and body.get("name"):
                names.add(body["name"])
    return names


def _tools(provider: str, names: set[str]) -> list[Any]:
    schema = {"type": "object"}
    if provider == "openai.chat":
        return [{"type": "function", "function": {"name": n, "parameters": schema}}
                for n in sorted(names)]
    if provider == "openai.responses":
        return [{"type": "function", "name": n, "parameters": schema} for n in sorted(names)]
    if provider == "bedrock.converse":
        return [{"toolSpec": {"name": n, "inputSchema": {"json": schema}}} for n in sorted(names)]
    if provider == "google.gemini":
        return [{"functionDeclarations": [{"name": n, "parametersJsonSchema": schema}
                                          for n in sorted(names)]}]
    return [{"name": n, "input_schema": schema} for n in sorted(names)]


@cache
def corpus() -> tuple[Capture, ...]:
    """Every capture of :data:`CAPTURES`, Responses captures cut into one run per response.
    Raises FileNotFoundError naming the fixture directory when it is missing."""
    if not FIXTURES.is_dir():
        raise FileNotFoundError(f"provider fixtures not found at {FIXTURES.resolve()}")
    found: list[Capture] = []
    for provider, paths in CAPTURES.items():
        for relative in paths:
            path = FIXTURES / relative
            events, _done = capture.provider_events(path.read_text(encoding="utf-8"), str(path))
            runs = [events]
            if provider == "openai.responses":
                runs = [[]]
                for event in events:
                    runs[-1].append(event)
                    if isinstance(event, dict) and event.get("type") in (
                            "response.completed", "response.incomplete", "response.failed"):
                        runs.append([])
                runs = [r for r in runs if r]
            for run in runs:
                tools = _tools(provider, _tool_names(provider, run))
                found.append(Capture(provider, path.name, tuple(run), tuple(tools)))
    return tuple(found)


# -- sequences ---------------------------------------------------------------------------------

#: One input record: key, value, record time in ms.
Record = tuple[bytes | None, bytes, int]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a member of ``node`` (dict keys and list positions)."""
    if isinstance(node, dict):
        items: Any = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return
    for k, v in items:
        yield (*prefix, k)
        yield from _paths(v, (*prefix, k))


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path[:-1]:
        doc = doc[k]
    return doc


def mutate_doc(rng: random.Random, doc: dict[str, Any], run_ids: list[str]) -> dict[str, Any]:
    """A damaged copy of envelope ``doc`` (one structural change)."""
    doc = copy.deepcopy(doc)
    kind = rng.randrange(7)
    paths = list(_paths(doc))
    if kind == 0 and paths:  # delete a field or an array element anywhere
        path = rng.choice(paths)
        parent = _parent(doc, path)
        del parent[path[-1]]
    elif kind == 1 and paths:  # a value of another type anywhere
        path = rng.choice(paths)
        _parent(doc, path)[path[-1]] = junk(rng)
    elif kind == 2:  # another envelope or event type
        event = doc.get("event")
        if isinstance(event, dict) and rng.random() < 0.7:
            event["type"] = rng.choice(_EVENT_TYPES)
        else:
            doc["type"] = rng.choice(_TYPES)
    elif kind == 3:  # seq back, forward, far, or mistyped
        seq = doc.get("seq", 0)
        seq = seq if isinstance(seq, int) else 0
        doc["seq"] = rng.choice([seq - 1, seq + 1, seq + 7, 0, 2**63, 2**64 - 1, -1, 1.0, None])
    elif kind == 4:  # another run, an unknown one, an oversize one
        doc["run_id"] = rng.choice([*run_ids[-8:], "nobody", "", "r" * 300])
    elif kind == 5:  # a field Latch does not know (forward compatibility) or a ts of any kind
        doc[rng.choice(["ts", "x-extra", "limits", "tenant", "tools"])] = junk(rng)
    else:  # a string (an argument fragment, most likely) many times longer
        strings = [p for p in paths if isinstance(_parent(doc, p)[p[-1]], str)]
        if strings:
            path = rng.choice(strings)
            _parent(doc, path)[path[-1]] *= rng.choice([2, 8, 64])
    return doc


def mutate_bytes(rng: random.Random, value: bytes) -> bytes:
    """A damaged copy of record bytes (one byte-level change)."""
    if not value:
        return bytes([rng.randrange(256)])
    pos = rng.randrange(len(value))
    kind = rng.randrange(4)
    if kind == 0:
        return value[:pos] + bytes([value[pos] ^ (1 << rng.randrange(8))]) + value[pos + 1:]
    if kind == 1:
        return value[:pos]
    if kind == 2:
        junk_bytes = rng.choice([b"\xff", b"\x00", b"\xc3", b'"', b"}", b",", b"\\u"])
        return value[:pos] + junk_bytes + value[pos:]
    end = min(len(value), pos + rng.randrange(1, 32))
    return value[:end] + value[pos:end] + value[end:]


def dumps(doc: Any) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:  # an integer beyond 64 bits: written by hand, as a gateway bug would
        return repr(doc).encode()


def records(rng: random.Random, length: int, runs: int, rate: float) -> list[Record]:
    """``length`` records of about ``runs`` interleaved captures at a time (a new run starts
    when one is used up), each record damaged with probability ``rate``, with re-deliveries,
    drops, control records, ticks and garbage in between."""
    captures = corpus()
    weights = [4 if cap.tools else 1 for cap in captures]  # calls are what the latch is for
    run_ids: list[str] = []
    queues: dict[str, list[Any]] = {}
    out: list[Record] = []
    clock = 1_000
    while len(out) < length:
        live = [r for r in run_ids if queues[r]]
        if len(live) < runs:
            run_id = f"run{len(run_ids)}"
            [cap] = rng.choices(captures, weights)
            queues[run_id] = capture.envelopes(cap.provider, list(cap.events), list(cap.tools),
                                               run_id=run_id, tenant="t1")
            run_ids.append(run_id)
            live.append(run_id)
        clock += IDLE_MS + 1 if rng.random() < 0.01 else rng.choice([0, 0, 1, 10, 250, 5_000])
        roll = rng.random()
        if roll < 0.04 and out:  # a re-delivery
            out.append(rng.choice(out))
            continue
        if roll < 0.07:  # a tick
            out.append((TICK_KEY.encode(), dumps({"v": 1, "type": "tick", "ts": clock}),
                        clock))
            continue
        if roll < 0.09:
            out.append((rng.choice(run_ids).encode(), rng.randbytes(rng.randrange(24)), clock))
            continue
        run_id = rng.choice(live)
        if roll < 0.095:  # a control record or an early end
            kind = rng.choice(["cancel", "stream.end", "stream.error"])
            doc: Any = {"v": 1, "run_id": run_id, "type": kind, "seq": 10**6 + len(out)}
            out.append((run_id.encode(), dumps(doc), clock))
            continue
        item = queues[run_id].pop(0)
        if roll < 0.105:  # dropped on the way
            continue
        # A damaged run.start loses the whole run to the DLQ: damage it less often.
        damage = rate / 4 if isinstance(item, dict) and item.get("type") == "run.start" else rate
        if isinstance(item, bytes):
            value = item
        elif rng.random() < damage:
            value = dumps(mutate_doc(rng, item, run_ids))
        else:
            value = dumps(item)
        if rng.random() < damage / 3:
            value = mutate_bytes(rng, value)
        key: bytes | None = run_id.encode()
        if rng.random() < rate / 10:
            key = rng.choice([None, b"", b"\xff", b"nobody", rng.choice(run_ids).encode()])
        out.append((key, value, clock))
    return out


# -- the checks --------------------------------------------------------------------------------


class SpyAssembler(Assembler):
    """An assembler that counts the calls its adapters opened, per run, and the runs that
    started."""

    def __init__(self, settings: AssembleSettings) -> None:
        super().__init__(settings)
        self.opened: Counter[str] = Counter()
        self.started: set[str] = set()

    def _new_run(self, *args: Any) -> Run:
        run = SpyRun(*args, self._ledger, self._rules)
        run.opened = self.opened
        return run

    def _start(self, start: Any, run: Any, now_ms: int, raw: Any) -> list[Emit]:
        emits = super()._start(start, run, now_ms, raw)
        if self.is_open(start.run_id):
            self.started.add(start.run_id)
        return emits


class SpyRun(Run):
    """A run that counts the calls its adapter opened in its assembler's ``opened``."""

    opened: Counter[str]

    def _open(self, item: Any) -> list[Emit]:
        # Counted by what the run holds after: a start the run reads as no new call (an id
        # it holds already, after a protocol break) opens none.
        before = len(self.calls)
        emits = super()._open(item)
        self.opened[self.run_id] += len(self.calls) - before
        return emits

    def _unwrap(self, call: Any) -> Any:
        # A parallel wrapper gets no outcome of its own; each of its entries gets one.
        children = super()._unwrap(call)
        if children:
            self.opened[self.run_id] += len(children) - 1
        return children


def _entry(emit: Emit) -> dict[str, Any]:
    """The entry a committed call or error result must have in its final's ``outcomes``."""
    v = emit.value
    committed = emit.topic is Topic.COMMITTED
    entry = {"tool_call_id": v["call_id" if committed else "tool_call_id"], "name": v["name"],
             "index": v["index"]}
    if "choice" in v:
        entry["choice"] = v["choice"]
    entry["state"] = "committed" if committed else v["state"]
    if not committed:
        entry["reason"] = v["reason"]
    return entry


#: The final's entry of a call that has no record: it reused an id whose outcome was out.
UNRECORDED = {"state": "failed", "reason": "duplicate_call_id"}


def check_final(run_id: str, records: list[Emit], final: dict[str, Any], early: bool) -> None:
    """A run's outcome records against its final message: every ``tool_call_id`` has one
    kind of outcome ("committed" or one reason), whatever the calls that share it; the final
    lists each record's outcome (in the same order, or, with early commit, which sends some
    first, as a multiset) and, only with early commit, a ``failed``/``duplicate_call_id``
    entry without a record for a call that reused an id whose outcome was out already; no two
    records share an idempotency key."""
    kinds: dict[str, set[str]] = defaultdict(set)
    for e in records:
        committed = e.topic is Topic.COMMITTED
        kinds[e.value["call_id" if committed else "tool_call_id"]].add(
            "committed" if committed else e.value["reason"])
    assert all(len(k) == 1 for k in kinds.values()), (run_id, dict(kinds))
    entries = [orjson.dumps(_entry(e), option=orjson.OPT_SORT_KEYS) for e in records]
    listed = [orjson.dumps(o, option=orjson.OPT_SORT_KEYS) for o in final["outcomes"]]
    if not early:
        assert entries == listed, (run_id, entries, listed)
    else:
        unrecorded = Counter(listed)
        unrecorded.subtract(entries)
        assert all(n >= 0 for n in unrecorded.values()), (run_id, entries, listed)
        for line, n in unrecorded.items():
            entry = orjson.loads(line)
            assert not n or (entry["tool_call_id"] in kinds
                             and {k: entry.get(k) for k in UNRECORDED} == UNRECORDED), entry
    keys = [e.value["idempotency_key"] for e in records]
    assert len(set(keys)) == len(keys), keys


@dataclass
class Checker:
    """Feeds records to one assembler and checks every promise (module docstring)."""

    settings: AssembleSettings
    validate: bool = True
    asm: SpyAssembler = field(init=False)
    records: int = 0
    emitted: int = 0
    outcomes_checked: int = 0
    stuck: int = 0
    clock: int = 0
    _pending: dict[str, list[Emit]] = field(default_factory=lambda: defaultdict(list))
    #: The idempotency keys of the audit records of each run not yet finished, in order.
    _audits: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    _finals: set[str] = field(default_factory=set)
    _ended: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.asm = SpyAssembler(self.settings)
        self._schema = validator("output-line")

    def feed(self, key: bytes | None, value: bytes, now_ms: int | None) -> list[Emit]:
        emits = self.asm.feed_record(key, value, now_ms)
        self.records += 1
        self.clock = max(self.clock, now_ms or 0)
        for emit in emits:
            self._check(emit, value)
        return emits

    def _check(self, emit: Emit, value: bytes) -> None:
        self.emitted += 1
        orjson.dumps(emit.value)  # what the worker publishes
        line = emit.as_line()
        orjson.dumps(line)  # what latch assemble prints
        if self.validate:
            error = next(iter(self._schema.iter_errors(line)), None)
            assert error is None, f"{error.message} at {list(error.absolute_path)}: {line}"
        if emit.topic is Topic.DLQ:
            if "late" in emit.value:  # the one summary of a run's late events (decision 0015)
                assert emit.value["original_b64"] == "" and emit.value["late"]["count"] >= 1
                assert emit.value["run_id"] in self._finals, f"late events of an open run: {line}"
            else:
                assert base64.b64decode(emit.value["original_b64"]) == value
            return
        run_id = emit.value["run_id"]
        assert run_id not in self._finals, f"a record after the final of {run_id}: {line}"
        if emit.topic is Topic.RUN_ENDED:  # at most one per run, before its final (0015)
            assert run_id not in self._ended, f"a second run.ended of {run_id}: {line}"
            self._ended.add(run_id)
            return
        if emit.topic is Topic.FINAL:
            self._final(run_id, emit.value)
        elif emit.topic is Topic.AUDIT:  # right after its outcome, with its key
            pending = self._pending[run_id]
            assert pending and pending[-1].value["idempotency_key"] == \
                emit.value["idempotency_key"], f"an audit record not after its outcome: {line}"
            self._audits[run_id].append(emit.value["idempotency_key"])
        elif emit.topic is not Topic.PROGRESS:
            self._pending[run_id].append(emit)

    def _final(self, run_id: str, final: dict[str, Any]) -> None:
        self._finals.add(run_id)
        records = self._pending.pop(run_id, [])
        assert self._audits.pop(run_id, []) == [r.value["idempotency_key"] for r in records], \
            f"not one audit record per outcome in {run_id}"
        check_final(run_id, records, final, self.settings.execute_before_stream_end)
        assert len(final["outcomes"]) == self.asm.opened[run_id], (run_id, len(records))
        self.outcomes_checked += len(final["outcomes"])

    def finish(self) -> None:
        """A tick far in the future ends every open run; then every run that started has its
        final message and every call it opened exactly one outcome.

        Idle expiry goes by record time, and a damaged ``ts`` (used when a record has no time
        of its own, as in ``latch assemble``) can put a run's last activity at the largest
        time there is. The tick therefore carries that time, 2**64 - 1, and a run active
        within the idle timeout of it, which no tick can expire, is ended by a cancel
        (counted in ``stuck``).
        """
        self.clock = 2**64 - 1
        self.feed(TICK_KEY.encode(), orjson.dumps({"v": 1, "type": "tick", "ts": self.clock}),
                  self.clock)
        for run_id in self.asm.open_run_ids():
            self.stuck += 1
            self.feed(run_id.encode(), orjson.dumps({"v": 1, "run_id": run_id,
                                                     "type": "cancel"}), self.clock)
        assert self.asm.open_runs == 0
        assert self.asm.buffered_bytes == 0
        assert not self._pending, f"outcomes without a final: {sorted(self._pending)}"
        assert self.asm.started <= self._finals, self.asm.started - self._finals
        assert sum(self.asm.opened.values()) == self.outcomes_checked


def run_sequence(seed: int, length: int, runs: int, rate: float, settings_name: str,
                 validate: bool = True) -> Checker:
    """Generate and check one sequence; raise AssertionError (or anything the core raised)."""
    rng = random.Random(seed)
    checker = Checker(SETTINGS[settings_name], validate)
    for key, value, now in records(rng, length, runs, rate):
        checker.feed(key, value, now if rng.random() < 0.9 else None)
    checker.finish()
    return checker
