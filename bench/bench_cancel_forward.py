"""How long a cancel takes from the control topic's acknowledgement to its forwarded marker in
the events log, on each engine (issue 33, item 5; docs/benchmarks.md, "Cancel forward").

    python bench/bench_cancel_forward.py [--bootstrap 127.0.0.1:9092] [--engine both]
                                         [--cancels 200] [--backlog 0]

For each engine: a fresh stack and worker; as soon as its ``/readyz`` turns 200, cancels one
after another (each for its own run, keyed by run id as a gateway sends them): the first
``--ready`` of them are the "ready" phase, then the "steady" phase; then a second worker
joins (a rebalance) and the rest are the "rebalance" phase, until the second worker is
ready and on. ``--backlog N``: N cancels of other runs in the control log before the worker
starts (a group new to the topic), so the "ready" phase measures the first cancels behind
what is left of it when ``/readyz`` turns 200. Each cancel's latency is the forwarded
marker's record time (the worker's producer stamps it) less the wall time at which the
cancel's produce was acknowledged; the time at which a ``read_committed`` reader saw the
marker is given too. Prints p50, p99 and max per engine and phase, and the load average.
Both clocks are this machine's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import orjson  # noqa: E402

from tests.worker_harness import (  # noqa: E402
    Markers,
    Stack,
    WorkerProcess,
    http_get,
    make_stack,
    produce_acked,
    publish,
    readiness,
    start_worker,
)
from worker.tools import broker  # noqa: E402

PARTITIONS = 3


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cancel(stack: Stack, markers: Markers, run_id: str) -> tuple[float, float]:
    """One cancel: (ack to the marker's record time, ack to a reader seeing it), seconds."""
    value = orjson.dumps({"v": 1, "type": "cancel", "run_id": run_id, "reason": "bench"})
    acked = produce_acked(stack.bootstrap, stack.topic("control"), run_id.encode(), value)
    _, marker_ms, seen = markers.wait(run_id, timeout=120)
    return marker_ms / 1000 - acked, seen - acked


@contextlib.contextmanager
def killed(*procs: WorkerProcess) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            if proc.proc.poll() is None:
                proc.kill()


def measure(bootstrap: str, engine: str, count: int, ready_count: int,
            rebalance_count: int, logs: Path, backlog: int = 0
            ) -> dict[str, list[tuple[float, float]]]:
    phases: dict[str, list[tuple[float, float]]] = {"ready": [], "steady": [], "rebalance": []}
    with make_stack(bootstrap, f"bench-cancel-forward-{engine}", partitions=PARTITIONS,
                    worker__engine=engine, worker__tick_interval_s="5") as stack:
        old = [f"old-{n}".encode() for n in range(backlog)]
        publish(bootstrap, stack.topic("control"), [(key, orjson.dumps(
            {"v": 1, "type": "cancel", "run_id": key.decode(), "reason": "bench"}))
            for key in old])
        ports = broker.free_ports(2)
        first = start_worker(stack, logs / f"{engine}-a.log", ports)
        with killed(first):
            readiness(ports, first)
            markers = Markers(stack)
            try:
                steady = count - ready_count - rebalance_count
                for n in range(ready_count + steady):
                    phase = "ready" if n < ready_count else "steady"
                    phases[phase].append(cancel(stack, markers, f"{engine}-{n}"))
                second = start_worker(stack, logs / f"{engine}-b.log", ports + 1)
                with killed(second):
                    n = ready_count + steady
                    while n < count or not _ready(ports + 1):
                        phases["rebalance"].append(cancel(stack, markers, f"{engine}-{n}"))
                        n += 1
            finally:
                markers.close()
    return phases


def _ready(port: int) -> bool:
    answer = http_get(port, "/readyz")
    return answer is not None and answer[0] == 200


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("LATCH_TEST_BOOTSTRAP",
                                                              "127.0.0.1:9092"))
    parser.add_argument("--engine", choices=("faust", "kafka", "both"), default="both")
    parser.add_argument("--cancels", type=int, default=200)
    parser.add_argument("--ready", type=int, default=20,
                        help="cancels of the ready phase (right after /readyz turns 200)")
    parser.add_argument("--backlog", type=int, default=0,
                        help="cancels in the control log before the worker starts")
    parser.add_argument("--rebalance", type=int, default=30,
                        help="cancels at least, from a second worker's start on")
    args = parser.parse_args(argv)
    engines = ("faust", "kafka") if args.engine == "both" else (args.engine,)
    with tempfile.TemporaryDirectory(prefix="bench-cancel-") as tmp:
        for engine in engines:
            phases = measure(args.bootstrap, engine, args.cancels, args.ready,
                             args.rebalance, Path(tmp), args.backlog)
            every = [m for found in phases.values() for m in found]
            for phase, found in (*phases.items(), ("all", every)):
                if not found:
                    continue
                marker = [m for m, _ in found]
                seen = [s for _, s in found]
                print(f"{engine:6} {phase:9} n={len(found):4}  ack->marker time "
                      f"p50 {statistics.median(marker) * 1000:7.1f} ms  "
                      f"p99 {quantile(marker, 0.99) * 1000:7.1f} ms  "
                      f"max {max(marker) * 1000:7.1f} ms   ack->seen "
                      f"p50 {statistics.median(seen) * 1000:7.1f} ms  "
                      f"p99 {quantile(seen, 0.99) * 1000:7.1f} ms  "
                      f"max {max(seen) * 1000:7.1f} ms", flush=True)
    one, five, fifteen = os.getloadavg()
    print(f"load average (1, 5, 15 min): {one:.2f} {five:.2f} {fifteen:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
