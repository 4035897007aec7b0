"""Cedar policies at the latch on the real broker, with both engines (issue 25): the worker
loads ``policy.file`` and every call is decided in the core, so faust and the kafka engine
decide the same way from one place.

One policy set: tenant ``t1`` may read files under ``/srv/`` and may call ``delete_file``, but
a ``forbid`` on tools annotated ``destructiveHint`` (MCP annotations) beats that permit; no
other tenant is permitted anything. In ``enforce`` an allowed call is committed and each other
one gets ``policy_denied`` naming the determining policy and nothing on the committed topic;
in ``log_only`` every call commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import PATH_SCHEMA
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    running_worker,
)

POLICIES = """\
@id("srv-reads")
permit(principal == Latch::Tenant::"t1", action == Latch::Action::"call",
       resource == Latch::Tool::"read_file")
when { context.arguments has path && context.arguments.path like "/srv/*" };

@id("t1-deletes")
permit(principal == Latch::Tenant::"t1", action, resource == Latch::Tool::"delete_file");

@id("no-destructive")
forbid(principal, action, resource)
when { resource.annotations has destructiveHint && resource.annotations.destructiveHint };
"""

#: MCP tools/list entries (any provider): delete_file is annotated destructive.
MCP_TOOLS = [
    {"name": "read_file", "inputSchema": PATH_SCHEMA, "annotations": {"readOnlyHint": True}},
    {"name": "delete_file", "inputSchema": PATH_SCHEMA,
     "annotations": {"destructiveHint": True}},
]
SECRET = "/etc/SECRET-hunter2"

#: run id -> (tenant, tool, path)
RUNS = {
    "allowed": ("t1", "read_file", "/srv/a"),
    "outside": ("t1", "read_file", SECRET),
    "forbidden": ("t1", "delete_file", "/srv/a"),
    "stranger": ("t2", "read_file", "/srv/a"),
}


def _envelopes() -> list[dict[str, Any]]:
    envelopes = []
    for run_id, (tenant, tool, path) in RUNS.items():
        run = provider_run("openai.chat", run_id, [(f"call_{run_id}", tool,
                                                    orjson.dumps({"path": path}).decode())])
        run[0] |= {"tenant": tenant, "tools": MCP_TOOLS}
        envelopes += run
    return envelopes


@pytest.fixture(params=[(e, m) for e in ENGINES for m in ("enforce", "log_only")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest, tmp_path: Path
          ) -> Iterator[Stack]:
    engine, mode = request.param
    path = tmp_path / "policies.cedar"
    path.write_text(POLICIES, encoding="utf-8")
    with make_stack(kafka_bootstrap, request.node.name, partitions=1, worker__engine=engine,
                    policy__mode=mode, policy__file=str(path)) as made:
        yield made


def test_calls_are_decided_by_the_policies(stack: Stack, tmp_path: Path) -> None:
    """enforce: the call the policies permit is committed; a path outside /srv/ (no permit),
    a destructive tool (a forbid beats a permit) and a tenant no policy names (deny by
    default) each get one ``policy_denied`` error naming the determining policy, never the
    arguments, and nothing on the committed topic. log_only: the same calls all commit."""
    enforce = stack.settings["LATCH_POLICY__MODE"] == "enforce"
    with running_worker(stack, tmp_path / "w.log"):
        publish_envelopes(stack.bootstrap, stack.topic("events"), _envelopes())
        reader = Reader(stack)
        try:
            reader.collect(finished(RUNS), timeout=90)
            committed = sorted(r.value["call_id"] for r in reader.of("committed"))
            errors = {r.value["tool_call_id"]: r.value for r in reader.of("errors")}
            assert reader.of("dlq") == []
        finally:
            reader.close()
    if not enforce:
        assert committed == sorted(f"call_{run}" for run in RUNS)
        assert errors == {}
        return
    assert committed == ["call_allowed"]
    assert sorted(errors) == ["call_forbidden", "call_outside", "call_stranger"]
    assert {e["reason"] for e in errors.values()} == {"policy_denied"}
    assert "no-destructive" in errors["call_forbidden"]["content"]
    assert "no policy permits" in errors["call_outside"]["content"]
    assert "no policy permits" in errors["call_stranger"]["content"]
    assert all(SECRET not in orjson.dumps(e).decode() for e in errors.values())
