"""``bench/bench_worker.py --quick`` (the side-by-side worker benchmark, small) on the test
broker: it asserts what the benchmark did, never how fast."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_bench_worker_quick_reads_everything_and_counts_outputs(kafka_bootstrap: str,
                                                                tmp_path: Path) -> None:
    """Every contender that runs reads the whole backlog (its group commits the end of every
    events partition) and writes one final record per run; Latch's committed calls, error
    results and DLQ records are the offline core's, counted as a read_committed reader sees
    them; a contender that cannot run here is named on a printed line."""
    figures_path = tmp_path / "figures.json"
    dump = tmp_path / "latency.jsonl"
    out = subprocess.run([sys.executable, "bench/bench_worker.py", "--quick", "--bootstrap",
                          kafka_bootstrap, "--json", str(figures_path), "--latency",
                          "--latency-rate", "2000", "--latency-dump", str(dump),
                          "--topic-prefix", f"latch-test-bench-{uuid.uuid4().hex[:8]}"],
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
            for role in ("committed", "errors", "dlq"):
                assert outputs[role] == figures["expected"].get(role, 0), (name, role)
    assert "latch-faust/bare-faust" in figures["ratios"]
    # the latency mode (run first: the rate is fixed) timed each contender's 16 runs, after
    # a warm-up load whose runs are not among them
    latency = figures["latency"]
    assert latency.keys() == contenders.keys()
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    for name in contenders:
        assert latency[name]["runs"] == 16, name
        assert math.isfinite(latency[name]["visible_p99"]), name
        assert latency[name]["visible_p99"] >= latency[name]["visible_p50"], name
        runs = sorted(row["run"] for row in rows if row["contender"] == name)
        assert runs == [f"run-{n:05d}" for n in range(16)], name
    assert "visible_p99_over_bare_faust" in latency["latch-faust"]


def test_bench_worker_results_on_and_off(kafka_bootstrap: str, tmp_path: Path) -> None:
    """``--results answered,on,off``: the kafka engine read the whole backlog three times in
    the round, with the result latch on and every committed call answered by the benchmark,
    on, and off; each wrote the offline core's committed calls, one final per run and no DLQ
    record (the answered round's results, forwarded into its copy of the backlog, reach no
    other contender); with it on, a turn record for each run the offline core (latch on)
    gives one (the runs with committed calls wait: the backlog has no runners); answered,
    one for every run, after the last final; the on/off ratios are reported."""
    figures_path = tmp_path / "figures.json"
    out = subprocess.run([sys.executable, "bench/bench_worker.py", "--quick", "--bootstrap",
                          kafka_bootstrap, "--json", str(figures_path), "--contenders",
                          "latch-kafka", "--results", "answered,on,off",
                          "--topic-prefix", f"latch-test-bench-{uuid.uuid4().hex[:8]}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    figures = json.loads(figures_path.read_text())
    contenders = figures["contenders"]
    on, off = contenders["latch-kafka-results-on"], contenders["latch-kafka-results-off"]
    answered = contenders["latch-kafka-results-answered"]
    expected_on = figures["expected_results_on"]
    assert 0 < expected_on["turns"] < figures["runs"]
    for figures_of in (on, off, answered):
        assert figures_of["read_all"]
        assert figures_of["outputs"]["final"] == figures["runs"]
        assert figures_of["outputs"]["committed"] == figures["expected"]["committed"]
        assert figures_of["outputs"]["dlq"] == 0, figures_of["outputs"]
    assert on["outputs"]["turns"] == expected_on["turns"]
    assert "turns" not in off["outputs"]
    assert answered["outputs"]["turns"] == figures["runs"]
    assert answered["turns_after_s"] >= 0
    assert "latch-kafka-results-on/latch-kafka-results-off" in figures["ratios"]
    assert "latch-kafka-results-answered/latch-kafka-results-off" in figures["ratios"]
