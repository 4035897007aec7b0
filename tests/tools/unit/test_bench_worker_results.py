"""``bench/bench_worker.py --results on,off`` without a broker: which contenders it runs, the
settings each is started with (the result latch on or off, an earlier build's topics only),
what each counts, and the on/off ratios it reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fixtures_lib import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("bench_worker")


def test_each_engine_runs_once_per_mode_the_others_as_named(bench: ModuleType) -> None:
    """``--results on,off`` turns latch-faust and latch-kafka into one contender per mode, in
    the modes' order; a baseline and a bare contender stay as named; no modes: unchanged."""
    wanted = ["latch-faust", "latch-kafka-baseline", "latch-kafka", "bare-loop"]
    assert bench.with_results(wanted, ["on", "off"]) == [
        "latch-faust-results-on", "latch-faust-results-off", "latch-kafka-baseline",
        "latch-kafka-results-on", "latch-kafka-results-off", "bare-loop"]
    assert bench.with_results(wanted, ["off"])[0] == "latch-faust-results-off"
    assert bench.with_results(["latch-kafka"], ["off", "answered"]) == [
        "latch-kafka-results-off", "latch-kafka-results-answered"]
    assert bench.with_results(wanted, []) == wanted


def test_the_modes_start_the_engines_with_the_latch_on_and_off(
        bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each results contender is its engine with ``LATCH_RESULTS__ENABLED`` set; only the
    latch-on ones count turn records, only the answered ones have the benchmark answer their
    calls; the plain engine contenders set nothing (an earlier build refuses an unknown
    section)."""
    started: dict[str, dict[str, str]] = {}

    def spawn(command: list[str], env: dict[str, str], log: Path) -> Any:
        started[log.name] = env
        return None

    monkeypatch.setattr(bench, "spawn", spawn)
    every = bench.contenders(sys.executable)
    setup = bench.Setup("127.0.0.1:1", "g", "g.events", 2, tmp_path)
    for name in ("latch-faust-results-on", "latch-faust-results-off",
                 "latch-kafka-results-on", "latch-kafka-results-off", "latch-kafka",
                 "latch-kafka-results-answered"):
        every[name].start(setup, tmp_path / name)
    assert started["latch-faust-results-on"]["LATCH_RESULTS__ENABLED"] == "true"
    assert started["latch-kafka-results-on"]["LATCH_RESULTS__ENABLED"] == "true"
    assert started["latch-faust-results-off"]["LATCH_RESULTS__ENABLED"] == "false"
    assert started["latch-kafka-results-on"]["LATCH_RESULTS__DEADLINE_S"] == "86400"
    assert started["latch-kafka-results-off"]["LATCH_WORKER__ENGINE"] == "kafka"
    assert "LATCH_RESULTS__ENABLED" not in started["latch-kafka"]
    assert "turns" in every["latch-kafka-results-on"].outputs()
    assert "turns" not in every["latch-kafka-results-off"].outputs()
    assert started["latch-kafka-results-answered"]["LATCH_RESULTS__ENABLED"] == "true"
    assert "turns" in every["latch-kafka-results-answered"].outputs()
    assert [n for n, c in every.items() if c.answers] == [
        "latch-faust-results-answered", "latch-kafka-results-answered"]


def test_an_earlier_build_gets_only_the_topics_it_knows(bench: ModuleType,
                                                        tmp_path: Path) -> None:
    """``latch_env`` names the roles given (an earlier build's, from :func:`topic_roles`),
    never this checkout's ``turns`` when that build lacks it; this checkout's interpreter
    knows ``turns``; an interpreter without the worker gets this checkout's roles."""
    setup = bench.Setup("127.0.0.1:1", "g", "g.events", 2, tmp_path)
    env = bench.latch_env(setup, "kafka", ("events", "final", "results"))
    assert env["LATCH_TOPICS__FINAL"] == "g.final"
    assert "LATCH_TOPICS__TURNS" not in env and env["LATCH_TOPICS__EVENTS"] == "g.events"
    assert "turns" in bench.topic_roles(sys.executable)
    bare = subprocess.run(["/usr/bin/python3", "-c", "import worker"], check=False,
                          capture_output=True, cwd=bench.empty_dir())
    if bare.returncode != 0:
        assert bench.topic_roles("/usr/bin/python3") == bench.worker_harness.TOPIC_ROLES


def _result(bench: ModuleType, name: str, n: int, rate: float, cpu: float) -> Any:
    return bench.Result(name, n, 1000, 1000 / rate, cpu, cpu + 1, 5.0, True, {"final": 4},
                        load="1.00 1.00 1.00")


def test_on_over_off_is_reported_by_rate_and_by_cpu_per_round(bench: ModuleType) -> None:
    """The on/off ratio is the median of each round's on rate / off rate, and by CPU the
    median of off CPU / on CPU; off is also reported against the earlier build."""
    results = [_result(bench, "latch-kafka-results-on", 1, 90.0, 2.0),
               _result(bench, "latch-kafka-results-off", 1, 100.0, 1.8),
               _result(bench, "latch-kafka-results-on", 2, 50.0, 2.0),
               _result(bench, "latch-kafka-results-off", 2, 100.0, 2.0),
               _result(bench, "latch-kafka-results-on", 3, 95.0, 2.5),
               _result(bench, "latch-kafka-results-off", 3, 100.0, 2.0),
               _result(bench, "latch-kafka-baseline", 1, 80.0, 2.0)]
    summary = bench.report(results, ["latch-kafka-results-on", "latch-kafka-results-off",
                                     "latch-kafka-baseline"])
    ratios = summary["ratios"]
    assert ratios["latch-kafka-results-on/latch-kafka-results-off"] == pytest.approx(0.9)
    assert ratios["latch-kafka-results-on/latch-kafka-results-off by CPU"] == pytest.approx(0.9)
    assert ratios["latch-kafka-results-off/latch-kafka-baseline"] == pytest.approx(1.25)
    assert summary["contenders"]["latch-kafka-results-on"]["loads"] == ["1.00 1.00 1.00"] * 3


def test_an_unknown_mode_is_refused(bench: ModuleType, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    """``--results`` takes on and off only: anything else stops before any broker."""
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--results", "on,maybe", "--contenders", "latch-kafka"])
    assert stopped.value.code == 2
    assert "--results takes a comma list of on, off" in capsys.readouterr().err
