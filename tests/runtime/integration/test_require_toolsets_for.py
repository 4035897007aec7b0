"""Who said what, on the real broker, with both engines (issue 32, item 11): with
``registry.require_toolsets_for: [acme]`` and ``approvals.destructive``, tenant acme's runs
get their tools, and so their MCP annotations, from the operator's registry only.

Authors: the operator registers toolset ``files`` (``rm`` annotated ``destructiveHint``) and
writes the worker's configuration; the gateway writes each ``run.start``, its ``tenant`` and
the tenant's inline ``tools``, where acme claims ``rm`` harmless. Acme's inline claim is
refused (``toolset_required``), acme's run naming the toolset is held for approval
(``destructive``), and tenant globex, not listed, still brings its own tools.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_harness import (
    ENGINES,
    PATH_SCHEMA,
    Reader,
    Stack,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    running_worker,
)

from worker.runtime.governance import registry_io
from worker.runtime.governance.registry import TOOLSET

#: The operator's registered ``rm``: destructive.
REGISTERED = [{"name": "rm", "inputSchema": PATH_SCHEMA,
               "annotations": {"destructiveHint": True}}]
#: The tenant's inline ``rm``: claimed read-only, no destructiveHint.
CLAIMED = [{"name": "rm", "inputSchema": PATH_SCHEMA, "annotations": {"readOnlyHint": True}}]


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, registry__wait_s="2",
                    registry__require_toolsets_for="acme",
                    approvals__destructive="true") as made:
        yield made


def _run(run_id: str, tenant: str, tools: Any) -> list[dict[str, Any]]:
    envelopes = provider_run("openai.chat", run_id, [(f"call_{run_id}", "rm",
                                                      '{"path": "/srv/a"}')])
    envelopes[0]["tenant"], envelopes[0]["tools"] = tenant, tools
    return envelopes


def test_a_listed_tenant_gets_tools_and_annotations_from_the_registry_only(
        stack: Stack, tmp_path: Path) -> None:
    """acme inline: ``toolset_required`` (error result, audited, run completed); acme by
    reference: held on the pending topic as ``destructive`` (the operator's annotation);
    globex inline: committed at once (its own claim, not listed)."""
    registry_io.put(stack.config(), TOOLSET, "files", 1, REGISTERED)
    reader = Reader(stack, roles=("committed", "errors", "final", "pending", "audit"))
    try:
        with running_worker(stack, tmp_path / "worker.log"):
            publish_envelopes(stack.bootstrap, stack.topic("events"), [
                *_run("inline", "acme", CLAIMED),
                *_run("byref", "acme", {"toolset": "files", "version": 1}),
                *_run("other", "globex", CLAIMED)])
            reader.collect(lambda records: finished(["inline", "other"])(records) and any(
                r.role == "pending" for r in records) and len(
                [r for r in records if r.role == "audit"]) >= 2, timeout=90)
    finally:
        reader.close()
    [error] = [r.value for r in reader.of("errors")]
    assert (error["run_id"], error["reason"]) == ("inline", "toolset_required")
    [pending] = [r.value for r in reader.of("pending")]
    assert (pending["run_id"], pending["approval"]["required_by"]) == ("byref", ["destructive"])
    assert [r.value["run_id"] for r in reader.of("committed")] == ["other"]
    audits = {r.value["run_id"]: r.value for r in reader.of("audit")}
    assert audits["inline"]["reason"] == "toolset_required"
    assert audits["other"]["outcome"] == "committed"
