"""``bench/bench_worker.py``'s latency mode without a broker: the report with
``--latency-rounds`` (each contender's percentiles are of all its rounds' runs pooled, never
one round's), the warm-up load, and the per-run dump."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import orjson
import pytest
from fixtures_lib import load_bench

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("bench_worker")


def _round(bench: ModuleType, name: str, visible: list[float], rate: float) -> object:
    return bench.Latency(name, rate, rate, len(visible), [v - 1 for v in visible], visible)


def test_rounds_are_pooled_and_each_rounds_p99_is_kept(bench: ModuleType) -> None:
    """Two rounds of 100 runs: a calm one (p99 5 ms) and one with three slow runs (p99
    450 ms); pooled over 200 runs the p99 is the fourth-slowest outcome, 400 ms, neither
    round's own, and the gap to the bare agent is taken from the pooled p99s."""
    calm = [5.0] * 99 + [10.0]
    stormy = [5.0] * 97 + [400.0, 450.0, 500.0]
    bare = [3.0] * 100
    latencies = [_round(bench, "latch-kafka", calm, 1000.0),
                 _round(bench, "bare-faust", bare, 1000.0),
                 _round(bench, "latch-kafka", stormy, 1200.0),
                 _round(bench, "bare-faust", bare, 1000.0)]
    out = bench.report_latency(latencies)
    kafka = out["latch-kafka"]
    assert kafka["runs"] == 200 and kafka["rate"] == 1100.0
    assert kafka["rounds_visible_p99"] == [5.0, 450.0]
    assert kafka["visible_p99"] == 400.0 and kafka["visible_p50"] == 5.0
    assert kafka["appended_p99"] == 399.0
    assert out["bare-faust"]["runs"] == 200
    assert kafka["visible_p99_over_bare_faust"] == 397.0


def test_one_round_reports_as_before(bench: ModuleType) -> None:
    """With one latency round the report's p99 is that round's own percentile, and the per-round
    list holds that one figure."""
    runs = [float(v) for v in range(1, 101)]
    out = bench.report_latency([_round(bench, "latch-faust", runs, 500.0)])
    assert out["latch-faust"]["visible_p99"] == bench.percentile(runs, 0.99) == 99.0
    assert out["latch-faust"]["rounds_visible_p99"] == [99.0]


def test_warm_up_load_has_the_measured_loads_shape_and_none_of_its_runs(
        bench: ModuleType) -> None:
    """The warm-up load (``renamed``) is the same corpus under other run ids: every record
    keeps its place, its time and every member but ``run_id``, and no run id (key or
    envelope) is one of the measured load's."""
    corpus = bench.bench_core.corpus(bench.find_fixtures(), 16, seed=13)
    warm = bench.renamed(corpus, "wup")
    assert len(warm) == len(corpus)
    measured = {key for key, _, _ in corpus}
    for (key, value, now), (wkey, wvalue, wnow) in zip(corpus, warm, strict=True):
        doc, wdoc = orjson.loads(value), orjson.loads(wvalue)
        assert key == doc["run_id"].encode()
        assert wkey == wdoc["run_id"].encode() and wkey not in measured
        assert wdoc["run_id"] == "wup" + doc["run_id"].removeprefix("run")
        assert wnow == now and list(wdoc) == list(doc)
        assert {k: v for k, v in wdoc.items() if k != "run_id"} == \
            {k: v for k, v in doc.items() if k != "run_id"}
    assert len({key for key, _, _ in warm}) == len(measured)


def test_the_dump_has_one_line_per_run_with_its_round(bench: ModuleType,
                                                      tmp_path: Path) -> None:
    """Each run's figures under its own round (the round each latency run records, not its
    place in the list: a contender with no figures in a round leaves no gap to miscount)."""
    first = bench.Latency("latch-faust", 1000.0, 1000.0, 2, [1.0, 2.0], [3.0, 4.0],
                          [b"run-1", b"run-2"], [5_000, 5_500], round=1)
    second = bench.Latency("latch-faust", 1000.0, 1000.0, 1, [7.0], [8.0], [b"run-1"], [9_000],
                           round=3)
    path = tmp_path / "dump.jsonl"
    bench.dump_latencies(path, [first, second])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [
        {"contender": "latch-faust", "round": 1, "run": "run-1", "end_s": 0.0,
         "appended_ms": 1.0, "visible_ms": 3.0},
        {"contender": "latch-faust", "round": 1, "run": "run-2", "end_s": 0.5,
         "appended_ms": 2.0, "visible_ms": 4.0},
        {"contender": "latch-faust", "round": 3, "run": "run-1", "end_s": 0.0,
         "appended_ms": 7.0, "visible_ms": 8.0}]
