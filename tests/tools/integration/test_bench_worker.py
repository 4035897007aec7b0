"""``bench/bench_worker.py --quick`` (the side-by-side worker benchmark, small) on the test
broker: it asserts what the benchmark did, never how fast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_worker_quick_reads_everything_and_counts_outputs(kafka_bootstrap: str,
                                                                tmp_path: Path) -> None:
    """Every contender that runs reads the whole backlog (its group commits the end of every
    events partition) and writes one final record per run; Latch's committed calls are the
    offline core's; a contender that cannot run here is named on a printed line."""
    figures_path = tmp_path / "figures.json"
    out = subprocess.run([sys.executable, "bench/bench_worker.py", "--quick", "--bootstrap",
                          kafka_bootstrap, "--json", str(figures_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    figures = json.loads(figures_path.read_text())
    contenders = figures["contenders"]
    assert {"latch-faust", "bare-faust", "bare-loop"} <= contenders.keys()
    assert "latch-kafka" in contenders or "skipping latch-kafka:" in out.stdout
    assert figures["runs"] == 16 and figures["envelopes"] > 16 * 50
    for name, figures_of in contenders.items():
        assert figures_of["read_all"], name
        assert figures_of["outputs"]["final"] == figures["runs"], name
    for name in ("latch-faust", "latch-kafka"):
        if name in contenders:
            outputs = contenders[name]["outputs"]
            assert outputs["committed"] == figures["expected"]["committed"], name
            assert outputs["dlq"] == 0 and outputs["errors"] == 0, name
    assert "latch-faust/bare-faust" in figures["ratios"]
