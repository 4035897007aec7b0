"""Recovery time (issue 4): how long a worker takes to take over partitions full of open runs.

    python bench/bench_recovery.py                      # 10,000 open runs, 6 partitions
    python bench/bench_recovery.py --runs 1000          # the smaller variant
    python bench/bench_recovery.py --bootstrap 127.0.0.1:PORT --profile rebuild.prof

What it does:

1. starts its own broker (``worker.tools.broker`` in a temp dir, on spare ports) unless
   ``--bootstrap`` is given, and creates a stack of uniquely named topics;
2. starts worker A and publishes ``--runs`` runs of the three providers, each ``run.start``
   and ``--events-per-run`` provider events: the openings (message/response start, the call's
   id and name) and the first pieces of the call's argument text, with no end: every run
   stays open;
3. waits until A has committed every events partition up to the end it had after publishing,
   then kills A with SIGKILL and waits until the group is empty (A's session expired);
4. starts worker B (with an instrumenting prelude: the worker's code is not changed) and times
   its start, the assignment, faust's table recovery and the rebuild of each partition
   (``_take_over``: the committed offset, the heads, the read of the events partition, the
   core's steps);
5. publishes each run's tail (the last piece of argument text, the provider's closing events,
   ``stream.end``), waits until every run has its final message, and times the finishing;
6. checks every output against the offline core (``worker.core.Assembler`` fed the same
   envelopes): each committed call carries exactly the argument text that was streamed, so
   the buffers B restored from the log are proven right;
7. stops B and the broker, deletes the topics, prints a table and a summary line.

``--backlog`` publishes the tails while no worker runs (before B starts), the failover of a
busy system: B's first records trigger the rebuilds and the finishing overlaps them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import string
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tests.worker_harness import (  # noqa: E402
    FAST_FAUST,
    PROVIDERS,
    Reader,
    Stack,
    WorkerProcess,
    by_run,
    make_stack,
    publish,
)
from worker.core import Assembler, Topic  # noqa: E402
from worker.runtime import admin  # noqa: E402
from worker.tools.chaos import run as chaos  # noqa: E402  (Broker.own: a broker in a temp dir on spare ports)

# --------------------------------------------------------------------------- the prelude

#: Run first in worker B (``WorkerProcess(prelude=...)``): wraps, without changing them,
#: ``FaustEngine._take_over`` / ``_load_heads`` / ``_on_assigned``, ``kafka_io.read_range`` /
#: ``resume_offset`` and ``step.step``, and writes one JSON line per event to
#: ``$LATCH_BENCH_STATS``. With ``$LATCH_BENCH_PROFILE`` set, cProfile runs while a take-over
#: does (every task on the loop during that time) and its stats are dumped there.
PRELUDE = r'''
import json as _json, os as _os, time as _time
_T0 = _time.time()
import worker.runtime.faust_engine.engine as _app, worker.runtime.step as _step
import worker.runtime.faust_engine.kafka_io as _kio
_OUT = open(_os.environ["LATCH_BENCH_STATS"], "a", buffering=1)
def _emit(**kw):
    _OUT.write(_json.dumps(kw) + "\n")
_emit(event="imported", t_prelude=_T0, t=_time.time())
_PROFILE_PATH = _os.environ.get("LATCH_BENCH_PROFILE")
_PROF = None
if _PROFILE_PATH:
    import cProfile as _cProfile
    _PROF = _cProfile.Profile()
_cur = None

_orig_take = _app.FaustEngine._take_over
async def _take_over(self, topic, partition):
    global _cur
    t0, p0, c0 = _time.time(), _time.perf_counter(), _time.process_time()
    _cur = {"read_s": 0.0, "first_record_s": None, "step_s": 0.0, "steps": 0, "read": 0,
            "heads_s": 0.0, "heads": 0, "resume_s": 0.0, "range": None}
    if _PROF is not None:
        _PROF.enable()
    try:
        state = await _orig_take(self, topic, partition)
    finally:
        if _PROF is not None:
            _PROF.disable()
            _PROF.dump_stats(_PROFILE_PATH)
        cur, _cur = _cur, None
    _emit(event="take_over", partition=partition, t_start=t0, t_end=_time.time(),
          wall_s=_time.perf_counter() - p0, cpu_s=_time.process_time() - c0,
          open_runs=state.assembler.open_runs, next_offset=state.next_offset,
          buffered_bytes=state.assembler.buffered_bytes, **cur)
    return state
_app.FaustEngine._take_over = _take_over

_orig_heads = _app.FaustEngine._load_heads
def _load_heads(self, state, partition):
    p0 = _time.perf_counter()
    found = _orig_heads(self, state, partition)
    if _cur is not None:
        _cur["heads_s"] += _time.perf_counter() - p0
        _cur["heads"] = len(self.heads)
    return found
_app.FaustEngine._load_heads = _load_heads

_orig_resume = _kio.resume_offset
async def _resume_offset(*args, **kwargs):
    p0 = _time.perf_counter()
    try:
        return await _orig_resume(*args, **kwargs)
    finally:
        if _cur is not None:
            _cur["resume_s"] += _time.perf_counter() - p0
_kio.resume_offset = _resume_offset

_orig_read = _kio.read_range
async def _read_range(options, topic, partition, start, stop):
    cur = _cur
    if cur is None:
        async for rec in _orig_read(options, topic, partition, start, stop):
            yield rec
        return
    cur["range"] = [start, stop]
    p0 = t = _time.perf_counter()
    async for rec in _orig_read(options, topic, partition, start, stop):
        now = _time.perf_counter()
        cur["read_s"] += now - t
        if cur["first_record_s"] is None:
            cur["first_record_s"] = now - p0
        cur["read"] += 1
        yield rec
        t = _time.perf_counter()
    cur["read_s"] += _time.perf_counter() - t
_kio.read_range = _read_range

_orig_step = _step.step
def _timed_step(assembler, record):
    if _cur is None:
        return _orig_step(assembler, record)
    p0 = _time.perf_counter()
    try:
        return _orig_step(assembler, record)
    finally:
        _cur["step_s"] += _time.perf_counter() - p0
        _cur["steps"] += 1
_step.step = _timed_step

_orig_assigned = _app.FaustEngine._on_assigned
async def _on_assigned(self, sender, *args, **kwargs):
    events = self.events.get_topic_name()
    _emit(event="assigned", t=_time.time(),
          partitions=sorted(tp.partition for tp in args[0] if tp.topic == events))
    return await _orig_assigned(self, sender, *args, **kwargs)
_app.FaustEngine._on_assigned = _on_assigned

# The live path, outside take-overs: time in _process, in _publish (handing the sends to the
# producer) and in PartitionState.confirm (waiting until they are delivered, once per
# finished run). SIGRTMIN+1 resets the counters (and starts cProfile when
# $LATCH_BENCH_PROFILE_FINISH is set); SIGRTMIN+2 writes them (and dumps the profile).
import signal as _signal
_LIVE = {}
def _reset():
    _LIVE.clear()
    _LIVE.update(t_reset=_time.time(), records=0, process_s=0.0, publish_s=0.0,
                 confirm_s=0.0, confirms=0, cpu0=_time.process_time())
_reset()
def _live_timer(name, count=None):
    def wrap(orig):
        async def timed(*args, **kwargs):
            if _cur is not None:
                return await orig(*args, **kwargs)
            p0 = _time.perf_counter()
            try:
                return await orig(*args, **kwargs)
            finally:
                _LIVE[name] += _time.perf_counter() - p0
                if count:
                    _LIVE[count] += 1
        return timed
    return wrap
_app.FaustEngine._process = _live_timer("process_s", "records")(_app.FaustEngine._process)
_app.FaustEngine._publish = _live_timer("publish_s")(_app.FaustEngine._publish)
_app.PartitionState.confirm = _live_timer("confirm_s", "confirms")(_app.PartitionState.confirm)
_FPROF = None
def _on_live_start(signum, frame):
    global _FPROF
    _reset()
    path = _os.environ.get("LATCH_BENCH_PROFILE_FINISH")
    if path:
        import cProfile as _cProfile
        _FPROF = _cProfile.Profile()
        _FPROF.enable()
def _on_live_stop(signum, frame):
    global _FPROF
    if _FPROF is not None:
        _FPROF.disable()
        _FPROF.dump_stats(_os.environ["LATCH_BENCH_PROFILE_FINISH"])
        _FPROF = None
    live = dict(_LIVE)
    live["cpu_s"] = _time.process_time() - live.pop("cpu0")
    _emit(event="live", t=_time.time(), **live)
_signal.signal(_signal.SIGRTMIN + 1, _on_live_start)
_signal.signal(_signal.SIGRTMIN + 2, _on_live_stop)
'''

# --------------------------------------------------------------------------- the runs

TOOL_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                   "mode": {"enum": ["overwrite", "append"]}},
    "required": ["path", "content"],
    "additionalProperties": False,
}
READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}},
               "required": ["path"], "additionalProperties": False}
TEXT = string.ascii_letters + string.digits + "      ,.;:-_/'\"\\\n\t{}[]éü€✓"


def provider_tools(provider: str) -> list[dict[str, Any]]:
    schemas = {"write_file": TOOL_SCHEMA, "read_file": READ_SCHEMA}
    if provider == "openai.chat":
        return [{"type": "function", "function": {"name": n, "description": f"{n} tool",
                                                  "parameters": s}} for n, s in schemas.items()]
    if provider == "anthropic.messages":
        return [{"name": n, "description": f"{n} tool", "input_schema": s}
                for n, s in schemas.items()]
    return [{"type": "function", "name": n, "description": f"{n} tool", "parameters": s}
            for n, s in schemas.items()]


def _pieces(text: str, count: int) -> list[str]:
    """``text`` cut in ``count`` nearly equal pieces (characters, so never mid-code-point)."""
    size, extra = divmod(len(text), count)
    out, at = [], 0
    for i in range(count):
        n = size + (1 if i < extra else 0)
        out.append(text[at:at + n])
        at += n
    return out


@dataclass
class BenchRun:
    run_id: str
    provider: str
    call_id: str
    arguments: str
    head: list[dict[str, Any]]  # published before the kill: the run stays open
    tail: list[dict[str, Any]]  # published after: the last piece, the closing events, the end


def make_run(rng: random.Random, n: int, tag: str, events_per_run: int) -> BenchRun:
    """One run: ``run.start`` + ``events_per_run`` provider events in the head (two openings
    and ``events_per_run - 2`` argument pieces), the last piece and the ends in the tail."""
    provider = PROVIDERS[n % 3]
    run_id = f"rec-{tag}-{n:06d}"
    suffix = "".join(rng.choices(string.ascii_letters + string.digits, k=24))
    call_id = ("toolu_" if provider == "anthropic.messages" else "call_") + suffix
    content = "".join(rng.choices(TEXT, k=rng.randint(150, 900)))
    args = orjson.dumps({"path": f"/srv/workspace/{run_id}/notes-{n % 97}.md",
                         "content": content, "mode": rng.choice(["overwrite", "append"])}
                        ).decode()
    pieces = _pieces(args, events_per_run - 1)  # events_per_run - 2 in the head, 1 in the tail
    name = "write_file"
    if provider == "openai.chat":
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": f"chatcmpl-{suffix}", "object": "chat.completion.chunk",
                    "created": 1700000000, "model": "gpt-4o-2024-08-06",
                    "system_fingerprint": "fp_0123456789",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}]}
        opening = [chunk({"role": "assistant", "content": None, "refusal": None}),
                   chunk({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                          "function": {"name": name, "arguments": ""}}]})]
        frags = [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
                 for p in pieces]
        closing = [chunk({}, "tool_calls")]
    elif provider == "anthropic.messages":
        opening = [{"type": "message_start", "message": {
            "id": f"msg_{suffix}", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 812, "output_tokens": 1}}},
            {"type": "content_block_start", "index": 0, "content_block": {
                "type": "tool_use", "id": call_id, "name": name, "input": {}}}]
        frags = [{"type": "content_block_delta", "index": 0,
                  "delta": {"type": "input_json_delta", "partial_json": p}} for p in pieces]
        closing = [{"type": "content_block_stop", "index": 0},
                   {"type": "message_delta", "delta": {"stop_reason": "tool_use",
                                                       "stop_sequence": None},
                    "usage": {"output_tokens": 240}},
                   {"type": "message_stop"}]
    else:
        response = {"id": f"resp_{suffix}", "object": "response", "status": "in_progress",
                    "model": "gpt-4.1", "output": []}
        item = {"type": "function_call", "id": f"fc_{suffix}", "call_id": call_id,
                "name": name, "arguments": "", "status": "in_progress"}
        opening = [{"type": "response.created", "sequence_number": 0, "response": response},
                   {"type": "response.output_item.added", "sequence_number": 1,
                    "output_index": 0, "item": item}]
        frags = [{"type": "response.function_call_arguments.delta", "sequence_number": 2 + i,
                  "output_index": 0, "item_id": f"fc_{suffix}", "delta": p}
                 for i, p in enumerate(pieces)]
        done = {**item, "arguments": args, "status": "completed"}
        closing = [{"type": "response.output_item.done", "output_index": 0, "item": done},
                   {"type": "response.completed",
                    "response": {**response, "status": "completed", "output": [done]}}]
    events = [*opening, *frags, *closing]
    envelopes = [{"v": 1, "run_id": run_id, "seq": 0, "type": "run.start", "provider": provider,
                  "tenant": f"tenant-{n % 7}", "tools": provider_tools(provider)}]
    envelopes += [{"v": 1, "run_id": run_id, "seq": s, "type": "provider.event", "event": e}
                  for s, e in enumerate(events, start=1)]
    envelopes.append({"v": 1, "run_id": run_id, "seq": len(envelopes), "type": "stream.end"})
    cut = 1 + events_per_run
    return BenchRun(run_id, provider, call_id, args, envelopes[:cut], envelopes[cut:])


def encode(envelopes: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    return [(e["run_id"].encode(), orjson.dumps(e)) for e in envelopes]


# --------------------------------------------------------------------------- Kafka helpers


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ends"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)]
    finally:
        consumer.close()


def wait_committed(stack: Stack, ends: list[int], timeout: float) -> list[int]:
    """Wait until the worker group has committed each events partition up to ``ends``."""
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": stack.app_id,
                         "enable.auto.commit": False})
    tps = [TopicPartition(stack.topic("events"), p) for p in range(stack.partitions)]
    deadline = time.monotonic() + timeout
    try:
        while True:
            committed = [tp.offset for tp in consumer.committed(tps, timeout=10)]
            if all(c >= e for c, e in zip(committed, ends, strict=True)):
                return committed
            if time.monotonic() > deadline:
                raise SystemExit(f"A did not commit in {timeout:.0f}s: {committed} < {ends}")
            time.sleep(0.25)
    finally:
        consumer.close()


def count_records(bootstrap: str, topic: str, partitions: int) -> tuple[int, int]:
    """The records a reader of ``topic`` from the beginning gets now (after compaction),
    and the sum of its end offsets."""
    ends = end_offsets(bootstrap, topic, partitions)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-count",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    positions = dict.fromkeys(range(partitions), 0)
    count = 0
    deadline = time.monotonic() + 120
    try:
        while any(positions[p] < ends[p] for p in range(partitions)):
            if time.monotonic() > deadline:
                raise SystemExit(f"could not read {topic} to its end")
            for msg in consumer.consume(5000, timeout=0.5):
                if msg.error() is None:
                    count += 1
                    positions[msg.partition()] = msg.offset() + 1
    finally:
        consumer.close()
    return count, sum(ends)


def set_topic_config(bootstrap: str, topic: str, settings: dict[str, str]) -> None:
    """Set topic configs (``incremental_alter_configs``), e.g. the changelog's ``segment.ms``."""
    client = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
               for k, v in settings.items()]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def wait_group_empty(stack: Stack, timeout: float = 120.0) -> None:
    """Wait until the group has no member (the killed worker's session expired)."""
    client = AdminClient({"bootstrap.servers": stack.bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        desc = client.describe_consumer_groups([stack.app_id])[stack.app_id].result(timeout=10)
        if not desc.members:
            return
        time.sleep(0.1)
    raise SystemExit(f"the group still has members after {timeout:.0f}s")


class TimedReader(Reader):
    """The harness reader, also keeping the record time (ms) of each role's first and last
    record: the time the worker produced them (the producer's create time)."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        self.first_ms: dict[str, int] = {}
        self.last_ms: dict[str, int] = {}

    def _poll(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            summary = {r: len(self.of(r)) for r in self.roles.values()}
            raise AssertionError(f"outputs incomplete: {summary}")
        for msg in self.consumer.consume(2000, timeout=0.2):
            if msg.error() is not None:
                continue
            role = self.roles[msg.topic()]
            self.positions[(msg.topic(), msg.partition())] = msg.offset() + 1
            _, ts = msg.timestamp()
            self.first_ms[role] = min(self.first_ms.get(role, ts), ts)
            self.last_ms[role] = max(self.last_ms.get(role, ts), ts)
            self.records.append(_out(role, msg))


def _out(role: str, msg: Any) -> Any:
    from tests.worker_harness import Out
    return Out(role, msg.partition(), msg.key(), orjson.loads(msg.value()))


def wait_finals(reader: TimedReader, run_ids: set[str], timeout: float) -> None:
    """Read until every run has its final message, then on to the ends of the outputs."""
    seen: set[str] = set()
    done_at = [0]

    def until(records: list[Any]) -> bool:
        for record in records[done_at[0]:]:
            if record.role == "final":
                seen.add(record.value["run_id"])
        done_at[0] = len(records)
        return run_ids <= seen

    reader.collect(until, timeout=timeout)


# --------------------------------------------------------------------------- B's log


LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")
REBUILT = re.compile(r"partition (\d+): rebuilt before offset (\d+) from (\d+) records; "
                     r"(\d+) runs open")


def log_events(text: str) -> list[tuple[float, str]]:
    """(wall time, line) of each timestamped line of a worker log (faust logs local time)."""
    out = []
    for line in text.splitlines():
        match = LOG_TIME.match(line)
        if match:
            when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((when, line))
    return out


def first_line(events: list[tuple[float, str]], pattern: str) -> float | None:
    for when, line in events:
        if re.search(pattern, line):
            return when
    return None


def read_stats(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- the benchmark


@dataclass
class Figures:
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, what: str, seconds: float | None, detail: str = "") -> None:
        self.rows.append((what, "" if seconds is None else f"{seconds:8.2f}", detail))

    def print(self) -> None:
        width = max(len(r[0]) for r in self.rows)
        print(f"\n{'phase'.ljust(width)}  {'seconds':>8}  detail")
        print(f"{'-' * width}  {'-' * 8}  {'-' * 40}")
        for what, secs, detail in self.rows:
            print(f"{what.ljust(width)}  {secs:>8}  {detail}")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@contextlib.contextmanager
def own_broker(work: Path, bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    broker = chaos.Broker.own(work)
    print(f"starting a broker in {broker.data_dir} on {broker.bootstrap}", flush=True)
    try:
        broker.start()
        yield broker.bootstrap
    finally:
        broker.stop()
        shutil.rmtree(broker.data_dir / "kraft-logs", ignore_errors=True)  # logs stay
        print("broker stopped", flush=True)


def bench(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    tag = f"{rng.getrandbits(24):06x}"
    runs = [make_run(rng, n, tag, args.events_per_run) for n in range(args.runs)]
    closed = [make_run(rng, n, tag, args.events_per_run)
              for n in range(args.runs, args.runs + args.closed_runs)]
    head = [e for r in runs for e in r.head] + [e for r in closed for e in r.head + r.tail]
    tail = [e for r in runs for e in r.tail]
    head_records, tail_records = encode(head), encode(tail)
    head_bytes = sum(len(k) + len(v) for k, v in head_records)
    print(f"{args.runs:,} runs: {len(head_records):,} head records ({head_bytes / 1e6:.1f} MB), "
          f"{len(tail_records):,} tail records; load average {load_average()}", flush=True)
    figures = Figures()
    faust = {"broker_commit_interval": args.commit_interval,
             "broker_session_timeout": args.session_timeout}
    work = Path(tempfile.mkdtemp(prefix="latch-bench-recovery-"))
    procs: list[WorkerProcess] = []
    try:
        with own_broker(work, args.bootstrap) as bootstrap, make_stack(
                bootstrap, "bench-recovery", partitions=args.partitions,
                agent_stream_assemble__assemble_idle_timeout_s=str(args.idle_timeout),
                worker__tick_interval_s=str(args.tick_interval)) as stack:
            return _bench(args, stack, runs, closed, head_records, tail_records, figures,
                          faust, work, procs)
    finally:
        for proc in procs:
            if proc.proc.poll() is None:
                proc.kill()
        print(f"logs and stats in {work}")


def _bench(args: argparse.Namespace, stack: Stack, runs: list[BenchRun], closed: list[BenchRun],
           head_records: list[tuple[bytes, bytes]], tail_records: list[tuple[bytes, bytes]],
           figures: Figures, faust: dict[str, Any], work: Path,
           procs: list[WorkerProcess]) -> int:
    events_topic = stack.topic("events")
    if args.changelog_config:
        set_topic_config(stack.bootstrap, admin.heads_changelog(stack.config()),
                         dict(pair.split("=", 1) for pair in args.changelog_config))
    # -- A: every run open ------------------------------------------------------------
    worker_a = WorkerProcess(stack, work / "a.log", **faust)
    procs.append(worker_a)
    worker_a.wait_ready()
    worker_a.wait_for(r"events partitions assigned: \[\d", timeout=60)
    t0 = time.monotonic()
    publish(stack.bootstrap, events_topic, head_records)
    published = time.monotonic() - t0
    ends = end_offsets(stack.bootstrap, events_topic, stack.partitions)
    what = f" + {len(closed):,} closed runs" if closed else ""
    figures.add(f"publish the heads{what} (no worker waits)", published,
                f"{len(head_records):,} records, {len(head_records) / published:,.0f}/s")
    committed = wait_committed(stack, ends, timeout=120 + len(head_records) / 100)
    processed = time.monotonic() - t0
    figures.add("A: publish -> all committed", processed,
                f"{sum(ends):,} records, {sum(ends) / processed:,.0f}/s (live path)")
    if args.wait_before_kill:
        time.sleep(args.wait_before_kill)  # e.g. to let the broker compact the changelog
    worker_a.kill()
    killed = time.monotonic()
    if problems := worker_a.problems():
        print("worker A logged problems:\n" + "\n".join(problems[:20]))
    wait_group_empty(stack)
    figures.add("kill -9 A -> group empty (session expiry)", time.monotonic() - killed,
                f"broker_session_timeout {args.session_timeout:g} s")
    committed = wait_committed(stack, [0] * stack.partitions, timeout=10)
    print(f"A committed {committed} (sum {sum(committed):,}); killed", flush=True)
    changelog, changelog_end = count_records(
        stack.bootstrap, admin.heads_changelog(stack.config()), stack.partitions)
    print(f"heads changelog: {changelog:,} records present (end offsets sum "
          f"{changelog_end:,})", flush=True)

    if args.backlog:
        t_tail = time.monotonic()
        publish(stack.bootstrap, events_topic, tail_records)
        figures.add("publish the tails (backlog, no worker)", time.monotonic() - t_tail,
                    f"{len(tail_records):,} records")

    # -- B: the take-over ---------------------------------------------------------------
    stats_path = work / "b.stats.jsonl"
    os.environ["LATCH_BENCH_STATS"] = str(stats_path)
    if args.profile:
        os.environ["LATCH_BENCH_PROFILE"] = str(Path(args.profile).resolve())
    if args.profile_finish:
        os.environ["LATCH_BENCH_PROFILE_FINISH"] = str(Path(args.profile_finish).resolve())
    reader = TimedReader(stack)
    b_start = time.time()
    b_mono = time.monotonic()
    prelude = PRELUDE + (Path(args.prelude).read_text() if args.prelude else "")
    worker_b = WorkerProcess(stack, work / "b.log", prelude=prelude, **faust)
    procs.append(worker_b)
    deadline = time.monotonic() + args.timeout
    takeovers: dict[int, dict[str, Any]] = {}
    if not args.backlog:
        while len(takeovers) < stack.partitions:
            if time.monotonic() > deadline:
                raise SystemExit(f"B rebuilt only {sorted(takeovers)}:\n{worker_b.tail()}")
            if worker_b.proc.poll() is not None:
                raise SystemExit(f"B exited {worker_b.proc.returncode}:\n{worker_b.tail()}")
            takeovers = {s["partition"]: s for s in read_stats(stats_path)
                         if s["event"] == "take_over"}
            time.sleep(0.1)
        worker_b.proc.send_signal(signal.SIGRTMIN + 1)  # reset the live counters
        t_tail = time.monotonic()
        tail_start = time.time()
        publish(stack.bootstrap, events_topic, tail_records)
        figures_tail_publish = time.monotonic() - t_tail
    wait_finals(reader, {r.run_id for r in runs + closed},
                timeout=max(1.0, deadline - time.monotonic()))
    all_done = reader.last_ms["final"] / 1000
    collected = time.monotonic() - b_mono
    worker_b.proc.send_signal(signal.SIGRTMIN + 2)  # write the live counters
    for _ in range(100):
        time.sleep(0.1)
        stats = read_stats(stats_path)
        if any(s["event"] == "live" for s in stats):
            break
    takeovers = {s["partition"]: s for s in stats if s["event"] == "take_over"}
    code = worker_b.stop()
    problems = worker_b.problems()

    # -- figures ---------------------------------------------------------------------------
    events = log_events(worker_b.log())
    imported = next(s for s in stats if s["event"] == "imported")
    assigned = [s for s in stats if s["event"] == "assigned" and s["partitions"]]
    t_assigned = assigned[0]["t"] if assigned else None
    t_ready = first_line(events, r"\[\^Worker\]: Ready")
    t_recovered = first_line(events, r"\[\^-*Recovery\]: Restore complete")
    figures.add("B: process start -> imports done", imported["t"] - b_start,
                "python, faust, worker")
    if t_assigned is not None:
        figures.add("B: process start -> partitions assigned", t_assigned - b_start,
                    f"events partitions {assigned[0]['partitions']}")
    if t_recovered is not None and t_assigned is not None:
        took = t_recovered - t_assigned
        figures.add("B: assigned -> heads table recovered", took,
                    f"faust recovery of the heads changelog: {changelog:,} records, "
                    f"{changelog / took if took > 0 else 0:,.0f}/s")
    if t_ready is not None:
        figures.add("B: process start -> faust Ready", t_ready - b_start, "")
    logged = {int(m.group(1)): (when, m) for when, line in events
              if (m := REBUILT.search(line))}
    total_read = total_runs = 0
    rebuild_wall = 0.0
    first_start = min((s["t_start"] for s in takeovers.values()), default=None)
    if first_start is not None and t_assigned is not None:
        figures.add("B: assigned -> first take-over starts", first_start - t_assigned,
                    "waits for the partition's first record (a tick)" if not args.backlog
                    else "")
    for p in sorted(takeovers):
        s = takeovers[p]
        total_read += s["read"]
        total_runs += s["open_runs"]
        rebuild_wall += s["wall_s"]
        rate = s["read"] / s["wall_s"] if s["wall_s"] else 0.0
        lg = logged.get(p)
        check = "" if lg is None or (int(lg[1].group(3)), int(lg[1].group(4))) == (
            s["read"], s["open_runs"]) else " (log differs!)"
        figures.add(
            f"  rebuild partition {p}", s["wall_s"],
            f"{s['read']:,} records -> {s['open_runs']:,} runs, {rate:,.0f} rec/s; "
            f"offset {s['resume_s']:.2f} heads {s['heads_s']:.2f} read {s['read_s']:.2f} "
            f"(first {s['first_record_s'] or 0:.2f}) core {s['step_s']:.2f} "
            f"cpu {s['cpu_s']:.2f}{check}")
    last_end = max((s["t_end"] for s in takeovers.values()), default=None)
    figures.add("rebuild, all partitions (sum of take-overs)", rebuild_wall,
                f"{total_read:,} records re-read, {total_runs:,} runs restored, "
                f"{total_read / rebuild_wall if rebuild_wall else 0:,.0f} rec/s")
    if first_start is not None and last_end is not None:
        figures.add("  first take-over start -> last end", last_end - first_start,
                    "take-overs run one after another (one agent)")
        figures.add("B: process start -> all partitions rebuilt", last_end - b_start, "")
    finishing = 0.0
    if not args.backlog:
        figures.add("publish the tails", figures_tail_publish, f"{len(tail_records):,} records")
        finishing = all_done - tail_start
        figures.add("tails publish start -> all runs finished", finishing,
                    f"{len(tail_records):,} records, {len(tail_records) / finishing:,.0f} "
                    f"rec/s, {len(runs) / finishing:,.0f} runs/s")
        live = next((s for s in stats if s["event"] == "live"), None)
        if live is not None:
            per = 1000 * live["confirm_s"] / live["confirms"] if live["confirms"] else 0.0
            figures.add("  B: time in _process (live records)", live["process_s"],
                        f"{live['records']:,} records, "
                        f"{1000 * live['process_s'] / max(1, live['records']):.2f} ms each; "
                        f"cpu {live['cpu_s']:.2f} s")
            figures.add("  B: of which waiting in confirm()", live["confirm_s"],
                        f"{live['confirms']:,} confirms (waits for delivery), "
                        f"{per:.1f} ms each; sends {live['publish_s']:.2f} s")
    end_to_end = all_done - b_start
    figures.add("B: process start -> all runs finished", end_to_end,
                f"last final message at +{end_to_end:.2f} s (read at +{collected:.2f} s)")

    # -- correctness ---------------------------------------------------------------------
    verdict = verify(reader, runs + closed, stack)
    reader.close()
    figures.add("correctness", None, verdict["summary"])
    figures.print()
    if problems:
        print("\nworker B logged problems:\n" + "\n".join(problems[:20]))
    print(f"\nB exited {code}; load average now {load_average()}")
    rate = total_read / rebuild_wall if rebuild_wall else 0.0
    summary = (f"recovery: {len(runs):,} open runs, {stack.partitions} partitions, "
               f"{total_read:,} records re-read in {rebuild_wall:.2f} s ({rate:,.0f} records/s); "
               f"assignment {t_assigned - b_start if t_assigned else float('nan'):.2f} s; "
               f"all runs finished {end_to_end:.2f} s after start")
    if not args.backlog:
        summary += f" (finishing {len(tail_records) / finishing:,.0f} records/s)"
    summary += f"; {verdict['short']}"
    print(summary)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "rows": figures.rows, "summary": summary, "verdict": verdict,
            "takeovers": takeovers, "b_start": b_start, "all_done": all_done,
            "load": load_average()}, indent=1))
    return 0 if verdict["ok"] and code == 0 and not problems else 1


def verify(reader: TimedReader, runs: list[BenchRun], stack: Stack) -> dict[str, Any]:
    """The worker's committed calls, error results and finals equal the offline core's, run by
    run; each committed call carries exactly the streamed argument text."""
    config = stack.config()
    assembler = Assembler(config.assemble)
    wanted = [e for r in runs for env in r.head + r.tail
              for e in assembler.feed_record(None, orjson.dumps(env))]
    differ: dict[str, int] = {}
    for topic in (Topic.COMMITTED, Topic.ERRORS, Topic.FINAL):
        got = by_run(r.value for r in reader.of(topic.value))
        want = by_run(e.value for e in wanted if e.topic is topic)
        differ[topic.value] = sum(1 for run in set(got) | set(want)
                                  if got.get(run) != want.get(run))
    committed = defaultdict(list)
    for record in reader.of("committed"):
        committed[record.value["run_id"]].append(record.value)
    def unique(values: list[dict[str, Any]]) -> set[bytes]:
        return {orjson.dumps([c["call_id"], c["name"], c["arguments"]],
                             option=orjson.OPT_SORT_KEYS) for c in values}
    exact = sum(1 for r in runs if unique(committed[r.run_id]) == unique(
        [{"call_id": r.call_id, "name": "write_file", "arguments": orjson.loads(r.arguments)}]))
    dupes = sum(max(0, len(v) - 1) for v in committed.values())
    errors, dlq = len(reader.of("errors")), len(reader.of("dlq"))
    ok = exact == len(runs) and not any(differ.values()) and errors == 0 and dlq == 0
    summary = (f"{exact:,}/{len(runs):,} runs committed exactly the streamed arguments; runs "
               f"differing from the offline core: {differ}; error results {errors}, DLQ {dlq}, "
               f"repeated committed records {dupes} -> {'PASS' if ok else 'FAIL'}")
    return {"ok": ok, "exact": exact, "differ": differ, "errors": errors, "dlq": dlq,
            "repeats": dupes, "summary": summary,
            "short": f"outputs {'equal' if ok else 'DIFFER from'} the offline core"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="open runs (default 10,000)")
    parser.add_argument("--partitions", type=int, default=6, help="events partitions")
    parser.add_argument("--events-per-run", type=int, default=4,
                        help="provider events of each run before the kill: 2 openings and "
                             "N-2 argument pieces (N >= 3; default 4)")
    parser.add_argument("--closed-runs", type=int, default=0,
                        help="complete runs published after the open runs' heads: records "
                             "the rebuild reads but does not feed (default 0)")
    parser.add_argument("--changelog-config", action="append", default=[],
                        metavar="KEY=VALUE", help="a topic config of the heads changelog "
                        "(repeatable), e.g. segment.ms=10000")
    parser.add_argument("--wait-before-kill", type=float, default=0.0,
                        help="seconds between A's last commit and its kill (default 0)")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--commit-interval", type=float,
                        default=FAST_FAUST["broker_commit_interval"],
                        help="faust broker_commit_interval, s (default %(default)s)")
    parser.add_argument("--session-timeout", type=float,
                        default=FAST_FAUST["broker_session_timeout"],
                        help="faust broker_session_timeout, s (default %(default)s)")
    parser.add_argument("--tick-interval", type=float, default=1.0,
                        help="worker.tick_interval_s (default %(default)s)")
    parser.add_argument("--idle-timeout", type=float, default=3600.0,
                        help="assemble_idle_timeout_s: long, so that no run expires while "
                             "the benchmark runs (default %(default)s)")
    parser.add_argument("--backlog", action="store_true",
                        help="publish the tails before B starts (a failover under load)")
    parser.add_argument("--profile", help="write cProfile stats of B's take-overs here")
    parser.add_argument("--profile-finish",
                        help="write cProfile stats of B while it finishes the runs here")
    parser.add_argument("--prelude", help="a Python file run in worker B after the "
                        "instrumentation, before the worker starts (to try a patch)")
    parser.add_argument("--json", help="write the figures as JSON here")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds B may take to finish every run")
    args = parser.parse_args(argv)
    if args.events_per_run < 3:
        parser.error("--events-per-run must be at least 3")
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
