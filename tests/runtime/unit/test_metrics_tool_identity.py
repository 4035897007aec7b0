"""The ``tool`` metric label is the tool's one name (issue 32, item 1): a Responses custom
tool ``shell`` counts as ``shell``, as its committed record and the policy name it; a name two
of the run's tools share (``ambiguous_tool``) takes no label slot of its own.

Who sends what: the names come from the run's tools (the gateway) and the model's calls; only
a name the run's tool check let through may take a slot."""

from __future__ import annotations

from typing import Any

import orjson
from builders import responses_head, responses_run, responses_tail
from prometheus_client.parser import text_string_to_metric_families

from worker.core import Assembler
from worker.runtime.observability.metrics import OTHER, Metrics


def custom_call(index: int, call_id: str) -> list[dict[str, Any]]:
    item = {"type": "custom_tool_call", "id": f"ctc_{index}", "call_id": call_id,
            "name": "shell", "input": "ls"}
    return [{"type": "response.output_item.added", "output_index": index, "item": item},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def tool_labels(metrics: Metrics) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == "latch_call_outcomes_total":
                key = sample.labels["tool"]
                counts[key] = counts.get(key, 0) + sample.value
    return counts


def test_a_custom_tool_counts_under_its_name_and_an_ambiguous_one_under_other() -> None:
    """In a run that declares ``shell`` as a custom and as a function tool, the refused call
    counts under ``_other`` (it takes no slot); the committed custom call of a run that
    declares it once counts as ``shell``."""
    metrics = Metrics(labels=["tool"], label_cap=10)
    assembler = Assembler()
    for run_id, tools in (("r1", [{"type": "custom", "name": "shell"},
                                  {"type": "function", "name": "shell"}]),
                          ("r2", [{"type": "custom", "name": "shell"}])):
        for envelope in responses_run(run_id, tools, [*responses_head(), *custom_call(0, "c"),
                                                      responses_tail()]):
            metrics.record(assembler.feed_record(None, orjson.dumps(envelope)))
    assert tool_labels(metrics) == {"shell": 1, OTHER: 1}
    metrics.shutdown()
