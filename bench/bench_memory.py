"""Memory per open run and per buffered argument byte, for 10,000 open runs.

    python bench/bench_memory.py                     # the core, in this process
    python bench/bench_memory.py --engines latch-faust --bootstrap 127.0.0.1:PORT
    python bench/bench_memory.py --runs 10000 --argument-bytes 2048 --top 15

**The core** (in this process, :class:`~worker.core.Assembler`): three phases over the same
``--runs`` runs of OpenAI chat (one registered tool with a JSON Schema): (1) each run's
``run.start``; (2) each run's first chunk, which opens a call (id and name, no argument
text); (3) ``--argument-bytes`` of argument text per run in 32-byte fragments. Each phase is
measured twice: with ``tracemalloc`` (Python heap bytes still allocated after the phase, and
the top allocation sites by line, which name the core's lines only when the core runs as
pure Python) and, in a fresh assembler without tracing, as the process's RSS delta.

**An engine** (``--engines``, a process of its own on ``--bootstrap``): the worker started on
fresh topics and warmed up (one run through it), then the same phases published to its events
topic, all at once (a backlog) or paced (``--rate``); after each phase, once the group has
committed the end of every partition and 2.5 s more (the worker, idle by then, has given the
heap's free memory back: runtime/memory.py), the worker's RSS (``/proc/PID/status``) is read.
Per run = phase (1)+(2) / runs; per argument byte = phase (3) / bytes. RSS includes the heads
table's entry per open run (faust's in-memory store), whatever faust and the clients keep, and
the memory the allocators keep around the runs' state after a burst's transient objects are
freed (docs/benchmarks.md, "Memory").

The target: at most 2 KiB per open run beyond its argument text.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# the checkout last: an installed build of worker (the compiled core) comes first
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests")]
sys.path.append(str(ROOT))

import bench_worker  # noqa: E402
import orjson  # noqa: E402
from builders import CHAT, chat_chunk, chat_tool, chat_tool_delta, run_start  # noqa: E402

from worker.core import Assembler, AssembleSettings  # noqa: E402

TARGET_PER_RUN = 2048
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"},
                                           "content": {"type": "string"}},
          "required": ["path", "content"], "additionalProperties": False}
FRAGMENT = 32

Record = tuple[bytes, bytes, int]


def phases(runs: int, argument_bytes: int, tag: str,
           fragment: int = FRAGMENT) -> list[tuple[str, list[Record]]]:
    """The three phases' records, encoded: starts, call openings, argument fragments."""
    ids = [f"mem-{tag}-{n:05d}" for n in range(runs)]
    tools = [chat_tool("write_file", SCHEMA)]
    starts = [(i.encode(), orjson.dumps(run_start(i, CHAT, tools)), 1) for i in ids]
    opening = chat_chunk([chat_tool_delta(0, "call_0", "write_file", "")])
    opens = [(i.encode(), orjson.dumps({"v": 1, "run_id": i, "seq": 1, "type": "provider.event",
                                        "event": opening}), 2) for i in ids]
    text = '{"path": "/tmp/a.md", "content": "' + "x" * argument_bytes
    pieces = [text[at:at + fragment] for at in range(0, argument_bytes, fragment)]
    args = []
    for seq, piece in enumerate(pieces, 2):
        chunk = orjson.dumps(chat_chunk([chat_tool_delta(0, arguments=piece)]))
        args += [(i.encode(), b'{"v":1,"run_id":"' + i.encode() + b'","seq":%d,' % seq
                  + b'"type":"provider.event","event":' + chunk + b"}", 3) for i in ids]
    return [("run.start", starts), ("call opened", opens), ("argument text", args)]


def rss_bytes(pid: str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def feed_all(assembler: Assembler, records: Sequence[Record]) -> None:
    feed = assembler.feed_record
    for key, value, now in records:
        feed(key, value, now)


def core(runs: int, argument_bytes: int, top: int) -> dict[str, Any]:
    import worker

    build = "compiled (mypyc)" if worker.compiled_core() else "pure Python"
    print(f"the core: {build}; {runs:,} runs, {argument_bytes:,} argument bytes each")
    steps = phases(runs, argument_bytes, "core")
    settings = AssembleSettings()
    measured: dict[str, Any] = {"build": build}

    def measure(label: str, probe: Callable[[], int]) -> list[int]:
        gc.collect()
        assembler, sizes = Assembler(settings), [probe()]
        for _, records in steps:
            feed_all(assembler, records)
            gc.collect()
            sizes.append(probe())
        if assembler.open_runs != runs:
            raise SystemExit(f"{assembler.open_runs} runs open, expected {runs}")
        measured[f"buffered_bytes_{label}"] = assembler.buffered_bytes
        return [b - a for a, b in itertools.pairwise(sizes)]

    rss = measure("rss", rss_bytes)
    tracemalloc.start(6)
    snapshots: list[tracemalloc.Snapshot] = []

    def traced() -> int:
        snapshots.append(tracemalloc.take_snapshot())
        return tracemalloc.get_traced_memory()[0]

    heap = measure("heap", traced)
    tracemalloc.stop()
    arg_total = runs * argument_bytes
    print(f"\n{'phase':16}{'heap B/run':>12}{'RSS B/run':>12}")
    for (name, _), h, r in zip(steps, heap, rss, strict=True):
        print(f"{name:16}{h / runs:12,.0f}{r / runs:12,.0f}")
    per_run_heap, per_run_rss = (heap[0] + heap[1]) / runs, (rss[0] + rss[1]) / runs
    per_byte_heap, per_byte_rss = heap[2] / arg_total, rss[2] / arg_total
    print(f"\nper open run (start + open call, no argument text): {per_run_heap:,.0f} B heap, "
          f"{per_run_rss:,.0f} B RSS (target <= {TARGET_PER_RUN:,})")
    print(f"per buffered argument byte: {per_byte_heap:.2f} B heap, {per_byte_rss:.2f} B RSS")
    measured |= {"per_run_heap": per_run_heap, "per_run_rss": per_run_rss,
                 "per_byte_heap": per_byte_heap, "per_byte_rss": per_byte_rss}
    for title, before, after in (("an open run (start + open call)", 0, 2),
                                 ("argument text", 2, 3)):
        print(f"\ntop allocation sites for {title}, bytes per run:")
        diff = snapshots[after].compare_to(snapshots[before], "traceback")
        for stat in diff[:top]:
            # the allocating line, then the lines of the core that led to it (innermost first)
            where = [f"{_short(f.filename)}:{f.lineno}" for f in reversed(stat.traceback)
                     if "/worker/" in f.filename or f is stat.traceback[-1]][:3]
            print(f"  {stat.size_diff / runs:9,.0f}  {stat.count_diff / runs:6.1f} blocks  "
                  + " <- ".join(where))
    return measured


def _short(filename: str) -> str:
    return filename.split("/worker/")[-1] if "/worker/" in filename else filename.split("/")[-1]


def engine(name: str, args: argparse.Namespace) -> dict[str, Any] | None:
    every = bench_worker.contenders(os.path.abspath(args.python))
    contender = every[name]
    reason = contender.unavailable()
    if reason:
        print(f"skipping {name}: {reason}")
        return None
    tag = uuid.uuid4().hex[:6]
    topics = bench_worker.Topics(args.bootstrap, args.topic_prefix)
    group = topics.fresh(f"mem-{name}", tag)
    work = Path(tempfile.mkdtemp(prefix="latch-bench-memory-"))
    setup = bench_worker.Setup(args.bootstrap, group, f"{group}.events", args.partitions, work)
    steps = phases(args.runs, args.argument_bytes, tag, args.fragment)
    try:
        topics.simple([setup.events], args.partitions)
        contender.prepare(topics, setup)
        proc = contender.start(setup, work / f"{name}.log")
        try:
            # a tiny run into every partition: the worker has taken each one over
            warm = bench_worker.warm_records(tag, args.partitions)
            bench_worker.publish_to_partitions(args.bootstrap, setup.events, warm)
            bench_worker.watch_finals(setup, proc, {key for _, (key, _, _) in warm}, 180,
                                      f"{name} warm-up")
            sizes = [settled_rss(setup, proc.pid)]
            print(f"  {name}: warmed up: RSS {sizes[0] / 1e6:,.1f} MB")
            for phase, records in steps:
                if args.rate > 0:
                    bench_worker.paced_publish(args.bootstrap, setup.events, records, args.rate)
                else:
                    bench_worker.publish(args.bootstrap, setup.events, records)
                sizes.append(settled_rss(setup, proc.pid))
                print(f"  {name}: after {phase}: RSS {sizes[-1] / 1e6:,.1f} MB")
        finally:
            bench_worker.stop(proc)
    finally:
        topics.delete_all()
    deltas = [b - a for a, b in itertools.pairwise(sizes)]
    per_run = (deltas[0] + deltas[1]) / args.runs
    per_byte = deltas[2] / (args.runs * args.argument_bytes)
    load = f"paced at {args.rate:,.0f} records/s" if args.rate > 0 else "a backlog"
    print(f"{name} ({load}): per open run {per_run:,.0f} B RSS (target <= "
          f"{TARGET_PER_RUN:,}); per buffered argument byte {per_byte:.2f} B RSS")
    return {"per_run_rss": per_run, "per_byte_rss": per_byte, "rss": sizes}


def settled_rss(setup: bench_worker.Setup, pid: int, timeout: float = 300) -> int:
    """The worker's RSS once its group has committed the end of every events partition."""
    ends = bench_worker.end_offsets_of(setup.bootstrap, setup.events, setup.partitions)
    deadline = time.monotonic() + timeout
    while True:
        done = bench_worker.committed(setup.bootstrap, setup.group, setup.events,
                                      setup.partitions)
        if all(d >= e for d, e in zip(done, ends, strict=True)):
            # The agent has acked: let the heads writes and sends settle, and the worker see
            # itself idle (it then gives the heap's free memory back: runtime/memory.py).
            time.sleep(2.5)
            return rss_bytes(str(pid))
        if time.monotonic() > deadline:
            raise SystemExit(f"not processed after {timeout:.0f} s: committed {done}, "
                             f"ends {ends}")
        time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--argument-bytes", type=int, default=2048,
                        help="argument text per run in phase 3 (all runs' text must stay "
                             "under max_buffered_bytes, 64 MiB by default)")
    parser.add_argument("--fragment", type=int, default=FRAGMENT,
                        help="an engine's argument fragments, in characters (the core's are "
                             f"always {FRAGMENT}): larger ones publish fewer records")
    parser.add_argument("--top", type=int, default=12, help="allocation sites to list")
    parser.add_argument("--engines", default="", help="comma list: latch-faust,latch-kafka")
    parser.add_argument("--bootstrap", help="the broker the engines use")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--no-core", action="store_true", help="only the engines")
    parser.add_argument("--topic-prefix", default="latch-bench",
                        help="every topic and consumer group an engine's run creates is "
                             "named <prefix>-..., with a random tag (default latch-bench)")
    parser.add_argument("--rate", type=float, default=0,
                        help="publish each phase at this many records/s (default 0: all at "
                             "once, a backlog the engine reads as fast as it can)")
    args = parser.parse_args(argv)
    if not args.no_core:
        core(args.runs, args.argument_bytes, args.top)
    for name in filter(None, (n.strip() for n in args.engines.split(","))):
        if not args.bootstrap:
            parser.error("--engines needs --bootstrap")
        engine(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
