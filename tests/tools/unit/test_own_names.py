"""The tests' and benchmarks' workers use names of their own on the broker: every topic the
configuration names (the runners' results topic too), the heads changelog and the app id
(consumer group) start with the stack's or the benchmark run's own prefix, never a default
name that ``latch demo`` or a worker may hold on the same broker with other settings."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from types import ModuleType

import pytest
import worker_harness
from fixtures_lib import load_bench

from worker.runtime import admin
from worker.runtime.config import Config, TopicNames, load_config

ROOT = Path(__file__).resolve().parents[3]


_load = load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load("bench_worker")


def _names(config: Config) -> list[str]:
    return [spec.name for spec in admin.specs(config)]


def test_a_benchmark_contender_names_every_topic_after_its_group(bench: ModuleType,
                                                                 tmp_path: Path) -> None:
    """A Latch contender's configuration (``latch_env``) puts every topic ``latch topics
    create`` would make under the contender's group: before, the results topic kept its
    default name, and a broker where ``latch demo`` had made ``tool.calls.results`` with 12
    partitions failed the benchmark's 6 (``TopicsError``)."""
    group = "latch-test-bench-abc123-latch-kafka-r1-def456"
    setup = bench.Setup("127.0.0.1:1", group, f"{group}.events", 6, tmp_path)
    defaults = set(_names(Config()))
    for engine in (None, "kafka"):
        config = load_config(None, env=bench.latch_env(setup, engine))
        assert config.worker.app_id == group
        for name in _names(config):
            assert name.startswith((f"{group}.", f"{group}-")), name
            assert name not in defaults, name


def test_a_benchmark_runs_under_its_topic_prefix(bench: ModuleType) -> None:
    """``--topic-prefix`` starts every group (and so every topic) a benchmark run makes;
    each name is fresh."""
    topics = bench.Topics("127.0.0.1:1", "latch-test-bench-abc123")
    group = topics.fresh("latch-kafka-r1")
    assert re.fullmatch(r"latch-test-bench-abc123-latch-kafka-r1-[0-9a-f]{6}", group)
    assert topics.fresh("latch-kafka-r1") != group
    assert topics.fresh("mem-latch-kafka", "tag") == "latch-test-bench-abc123-mem-latch-kafka-tag"
    assert bench.Topics("127.0.0.1:1").prefix == "latch-bench"


def test_a_test_stack_names_every_topic_after_its_app_id() -> None:
    """The integration tests' stack (``make_stack``) names every topic of the configuration
    and the heads changelog after its own app id."""
    stack = worker_harness.Stack("127.0.0.1:1", "latch-it-own-names-abc123", 3)
    config = stack.config()
    assert config.worker.app_id == stack.app_id
    defaults = set(_names(Config()))
    for name in _names(config):
        assert name.startswith((f"{stack.app_id}.", f"{stack.app_id}-")), name
        assert name not in defaults, name


def test_no_integration_test_or_benchmark_names_a_default_topic() -> None:
    """No integration test and no benchmark script spells a default topic name (or the
    default app id as a group): what they create or read is named per run."""
    defaults = [value for value in (getattr(TopicNames(), f.name) for f in fields(TopicNames))
                if isinstance(value, str)]
    files = [*ROOT.glob("tests/*/integration/*.py"), *ROOT.glob("bench/*.py"),
             ROOT / "tests" / "worker_harness.py"]
    assert len(files) > 20
    found = [f"{path.relative_to(ROOT)}: {name}" for path in files
             for name in defaults if f'"{name}"' in path.read_text()]
    found += [f"{path.relative_to(ROOT)}: group latch" for path in files
              if re.search(r'"group\.id": "latch"|group_id="latch"', path.read_text())]
    assert found == []
