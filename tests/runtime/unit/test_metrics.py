"""The worker's metrics: the names the design asks for, the values a run implies, closed
labels, capped optional labels, and a Prometheus exposition that parses."""

from __future__ import annotations

from pathlib import Path

import builders
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.core import Assembler, Topic
from worker.runtime.config import load_config
from worker.runtime.hooks import EngineHooks
from worker.runtime.observability.metrics import (
    LABEL_MAX_CHARS,
    METRIC_NAMES,
    OTHER,
    GovernanceView,
    Metrics,
    MetricsError,
    PartitionView,
)

DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.jsonl"


def samples(metrics: Metrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Prometheus samples by name, then by sorted labels."""
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[labels] = sample.value
    return found


def feed_demo(metrics: Metrics) -> Assembler:
    assembler = Assembler()
    assembler.sizes = []
    for line in DEMO.read_bytes().splitlines():
        if line.strip():
            metrics.record(assembler.feed_record(None, line), assembler.sizes)
    return assembler


def test_the_demo_runs_give_the_values_they_imply() -> None:
    """examples/demo.jsonl: six committed calls (one of them Bedrock's, one Gemini's), one
    invalid_json, one stream_error, one cancelled; eight runs; 140 records; seven calls checked
    by the latch (Bedrock's 26 bytes of input deltas; Gemini's 590 bytes of partialArgs
    records, the buffer the latch builds its object from)."""
    metrics = Metrics()
    assembler = feed_demo(metrics)
    assert assembler.sizes == []  # drained
    found = samples(metrics)
    assert sum(found["tool_assemble_invalid_json_total"].values()) == 1
    assert set(found["tool_assemble_overflow_total"].values()) == {0}
    outcomes = found["latch_call_outcomes_total"]
    by_state: dict[str, float] = {}
    for labels, value in outcomes.items():
        state = dict(labels)["state"]
        by_state[state] = by_state.get(state, 0) + value
    assert by_state == {"committed": 6, "failed": 2, "cancelled": 1}
    assert sum(found["latch_runs_finished_total"].values()) == 8
    assert found["latch_records_processed_total"] == {(): 140}
    assert found["tool_assemble_args_bytes_count"] == {(): 7}
    assert found["tool_assemble_args_bytes_sum"] == {(): 20 + 21 + 48 + 52 + 40 + 26 + 590}
    metrics.shutdown()


def test_every_declared_name_is_exported_once_each_instrument_has_data() -> None:
    """METRIC_NAMES is exactly what the exposition holds once every instrument has a point
    (dashboards and alerts are checked against METRIC_NAMES)."""
    metrics = Metrics()
    feed_demo(metrics)
    metrics.commit_delivered(1_000, 1.5)
    metrics.send_failed(Topic.COMMITTED)
    metrics.rebuilt(0.25, 40)
    metrics.rejected_not_committed("not_a_committed_call")
    metrics.watch(lambda: [PartitionView(0, 2, 100, 1000, 3, 1.5)])
    metrics.watch_governance(lambda: GovernanceView(1, False))
    metrics.redactions["aws_key"] += 2  # (a rule's rewrites, counted by the result latch)
    found = samples(metrics)
    missing = {name for name in METRIC_NAMES if name not in found and f"{name}_count" not in found}
    assert not missing
    assert found["tool_assemble_to_commit_seconds_sum"] == {(): 0.5}
    assert found["latch_runs_open"] == {(("partition", "0"),): 2}
    assert found["latch_consumer_lag_records"] == {(("partition", "0"),): 3}
    assert found["latch_rebuild_records_total"] == {(): 40}
    assert found["latch_send_failures_total"][(("topic", "committed"),)] == 1
    assert found["latch_send_failures_total"][(("topic", "final"),)] == 0
    metrics.shutdown()


def test_optional_labels_are_off_by_default_and_capped_when_on() -> None:
    """Without metrics_labels no tenant or tool label exists; with them, at most the cap of
    distinct values each, the rest under _other."""
    plain = Metrics(prometheus=False)
    feed_demo(plain)
    assert all(len(key) == 5 and key[3:] == ("", "") for key in plain.outcomes)
    capped = Metrics(prometheus=False, labels=["tool"], label_cap=1)
    feed_demo(capped)
    tools = {key[4] for key in capped.outcomes}
    assert len(tools - {OTHER}) == 1 and OTHER in tools
    with pytest.raises(MetricsError):
        Metrics(prometheus=False, labels=["run_id"])


def test_two_instances_keep_separate_registries() -> None:
    """Each Metrics has its own Prometheus registry (no duplicate families in one process)."""
    first, second = Metrics(), Metrics()
    first.rejected_not_committed("undecodable")
    line = b'tool_execute_rejected_not_committed_total{reason="undecodable"}'
    assert line + b" 1.0" in first.exposition()
    assert line + b" 0.0" in second.exposition()
    first.shutdown()
    second.shutdown()


# -- the optional labels: registered names only, bounded in length (issue 23 item 7) -----


def _labelled(metrics: Metrics, label: str) -> dict[str, float]:
    """The outcome counts by the value of one optional label."""
    counts: dict[str, float] = {}
    for labels, value in samples(metrics)["latch_call_outcomes_total"].items():
        key = dict(labels)[label]
        counts[key] = counts.get(key, 0) + value
    return counts


def _run(metrics: Metrics, run_id: str, calls: list[tuple[str, str, str]], *,
         tools: tuple[str, ...] = ("read_file",), tenant: str | None = "t1") -> None:
    """One chat run registering ``tools`` that makes ``calls``, fed to ``metrics``."""
    envelopes = builders.run_envelopes(
        run_id, builders.CHAT, builders.tools_for(builders.CHAT,
                                                  dict.fromkeys(tools, builders.PATH_SCHEMA)),
        builders.provider_calls(builders.CHAT, calls), tenant=tenant)
    assembler = Assembler()
    for envelope in envelopes:
        metrics.record(assembler.feed_record(None, orjson.dumps(envelope)))


def test_names_the_model_invents_never_become_tool_labels() -> None:
    """A model that calls 150 invented, long tool names (``unknown_tool``) takes no slot of
    the cap: they all count under ``_other``, and a registered tool that commits afterwards
    still gets its own value. Before, the invented names filled the cap for the process's
    life, first come first served."""
    metrics = Metrics(labels=["tool"], label_cap=100)
    for n in range(150):
        _run(metrics, f"r{n}", [(f"call_{n}", f"invented_{n}_" + "x" * 200, '{"path": "/a"}')])
    _run(metrics, "good", [("call_ok", "read_file", '{"path": "/a"}')])
    assert _labelled(metrics, "tool") == {OTHER: 150, "read_file": 1}
    metrics.shutdown()


def test_a_registered_name_takes_a_slot_only_within_the_length_bound() -> None:
    """A name the run registered gets its own value also when its call fails after the name
    was checked (``invalid_json``, ``schema_invalid``); one longer than
    ``LABEL_MAX_CHARS`` counts under ``_other`` and takes no slot."""
    long_name = "t" * (LABEL_MAX_CHARS + 1)
    metrics = Metrics(labels=["tool"], label_cap=2)
    _run(metrics, "r1", [("c1", long_name, '{"path": "/a"}')], tools=(long_name,))
    _run(metrics, "r2", [("c2", "read_file", '{"path": '), ("c3", "search", '{"nope": 1}')],
         tools=("read_file", "search"))
    assert _labelled(metrics, "tool") == {OTHER: 1, "read_file": 1, "search": 1}
    assert metrics.label_values("tool") == {"read_file", "search"}
    metrics.shutdown()


def test_the_operators_list_is_the_only_source_of_values_when_given() -> None:
    """With ``label_values`` (``worker.metrics_label_tools``, ``..._tenants``), a value gets
    its own label only when listed, registered or not; tenants likewise; a run without a
    tenant keeps the empty value."""
    metrics = Metrics(labels=["tool", "tenant"],
                      label_values={"tool": ["search"], "tenant": ["acme"]})
    _run(metrics, "r1", [("c1", "read_file", '{"path": "/a"}')], tenant="acme")
    _run(metrics, "r2", [("c2", "search", '{"path": "/a"}')], tools=("search",),
         tenant="other")
    _run(metrics, "r3", [("c3", "search", '{"path": "/a"}')], tools=("search",), tenant=None)
    assert _labelled(metrics, "tool") == {OTHER: 1, "search": 2}
    assert _labelled(metrics, "tenant") == {"acme": 1, OTHER: 1, "": 1}
    metrics.shutdown()
    with pytest.raises(MetricsError):
        Metrics(labels=["tool"], label_values={"run_id": ["x"]})


def test_tenant_labels_are_bounded_in_length_and_count() -> None:
    """Tenants come from ``run.start`` (never from the model): the first ``label_cap`` within
    ``LABEL_MAX_CHARS`` get their own value, a longer one and the later ones ``_other``."""
    metrics = Metrics(labels=["tenant"], label_cap=1)
    _run(metrics, "r1", [("c1", "read_file", '{"path": "/a"}')], tenant="t" * 65)
    _run(metrics, "r2", [("c2", "read_file", '{"path": "/a"}')], tenant="acme")
    _run(metrics, "r3", [("c3", "read_file", '{"path": "/a"}')], tenant="beta")
    assert _labelled(metrics, "tenant") == {OTHER: 2, "acme": 1}
    metrics.shutdown()


def test_the_worker_passes_the_operators_lists_to_its_metrics() -> None:
    """``worker.metrics_label_tools`` / ``metrics_label_tenants`` reach the worker's metrics
    (``EngineHooks``)."""
    config = load_config(None, env={"LATCH_WORKER__METRICS_LABELS": "tool,tenant",
                                    "LATCH_WORKER__METRICS_LABEL_TOOLS": "search,read_file",
                                    "LATCH_WORKER__METRICS_LABEL_TENANTS": "acme",
                                    "LATCH_WORKER__HTTP_PORT": "0"})
    assert config.worker.metrics_label_tools == ("search", "read_file")
    hooks = EngineHooks(config)
    try:
        assert hooks.metrics.allowed("tool") == {"search", "read_file"}
        assert hooks.metrics.allowed("tenant") == {"acme"}
    finally:
        hooks.stop(None)
