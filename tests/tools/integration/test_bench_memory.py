"""``bench/bench_memory.py`` (memory per open run and per argument byte), small, on the test
broker: it asserts that each mode ran its phases to the end and printed its figures, never
what the figures are (memory is measured by the benchmark, not by a test)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_memory_core_and_kafka_engine_small(kafka_bootstrap: str) -> None:
    """The core in-process and the kafka engine as its own process: each phase's records are
    processed (the engine's group commits every partition's end, else the benchmark exits
    non-zero) and both per-run and per-byte figures are printed. Each phase is published
    paced (``--rate``), the path a backlog does not take."""
    out = subprocess.run(
        [sys.executable, "bench/bench_memory.py", "--runs", "300", "--argument-bytes", "512",
         "--engines", "latch-kafka", "--bootstrap", kafka_bootstrap, "--python",
         sys.executable, "--rate", "3000",
         "--topic-prefix", f"latch-test-bench-{uuid.uuid4().hex[:8]}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    core = re.search(r"per open run \(start \+ open call, no argument text\): ([\d,]+) B heap",
                     out.stdout)
    assert core and int(core.group(1).replace(",", "")) > 0, out.stdout
    engine = re.search(r"latch-kafka \(paced at 3,000 records/s\): per open run (-?[\d,]+) B RSS "
                       r".*; per buffered argument "
                       r"byte (-?[\d.]+) B RSS", out.stdout)
    assert engine, out.stdout
    for phase in ("warmed up", "after run.start", "after call opened", "after argument text"):
        assert f"latch-kafka: {phase}: RSS" in out.stdout, phase
