"""A policy set version no worker can build, on the real broker, both engines (issue 32
item 4): ``latch registry put`` refuses it; written to the registry topic by something else
(anyone with write access to it: an older Latch, a hand-made record) it becomes the newest
version and its marker goes into every events partition, yet the worker keeps the version in
force (calls still commit), and says so: a log line, ``latch_policy_versions_refused_total``
and ``/readyz``'s ``policy.refused``, still ready. Before issue 32 every call of every tenant
was denied until someone registered a higher version."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_registry import _inline, _latch, _put_policy, _wait_for_marker
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    WorkerProcess,
    finished,
    make_stack,
    publish_envelopes,
)
from worker_harness import publish as publish_records

from worker.runtime.governance import registry
from worker.runtime.governance.registry import POLICY
from worker.tools import broker

pytestmark = pytest.mark.integration

PERMIT_ALL = '@id("all")\npermit(principal, action, resource);\n'
#: Two policies with one @id: Cedar parses it; no worker builds it.
TWO_IDS = PERMIT_ALL + '@id("all")\nforbid(principal, action, resource == Latch::Tool::"x");\n'


@pytest.fixture(params=ENGINES)
def enforcing(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    pytest.importorskip("cedarpy")
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=request.param, registry__wait_s="2",
                    policy__mode="enforce", worker__http_port=str(broker.free_ports())) as made:
        yield made


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_an_unbuildable_newest_version_keeps_the_version_in_force(
        enforcing: Stack, tmp_path: Path) -> None:
    """Version 1 (permit all) put and marked; version 2 (two policies ``all``) refused by
    ``put``, then written raw to the registry and marked in every events partition; runs
    after its marker still commit (version 1 decides), the worker logs why version 2 is not
    in force, counts it, lists it in ``/readyz`` (200) and stops cleanly."""
    stack = enforcing
    port = int(stack.settings["LATCH_WORKER__HTTP_PORT"])
    path = tmp_path / "two-ids.cedar"
    path.write_text(TWO_IDS, encoding="utf-8")
    refused = _latch(stack, "registry", "put", "policy", "--version", "2", "--file", str(path))
    assert refused.returncode == 2 and "a second policy with the id 'all'" in refused.stderr
    worker = WorkerProcess(stack, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        reader = Reader(stack)
        try:
            _put_policy(stack, tmp_path, 1, PERMIT_ALL)
            _wait_for_marker(stack, 1)
            publish_records(stack.bootstrap, stack.topic("registry"),
                            [registry.encode(POLICY, "", 2, TWO_IDS)])
            _wait_for_marker(stack, 2)
            worker.wait_for(r"policy set version 2 cannot be built")
            ids, envelopes = _inline("after-v2", stack.partitions)
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            reader.collect(finished(ids), timeout=90)
        finally:
            reader.close()
        committed = {o.value["call_id"] for o in reader.of("committed")}
        assert committed == {f"call_{r}" for r in ids}, [o.value for o in reader.of("errors")]
        status, body = _get(port, "/readyz")
        ready: dict[str, Any] = json.loads(body)
        assert status == 200, ready
        assert list(ready["policy"]["refused"]) == ["2"]
        assert "a second policy with the id 'all'" in ready["policy"]["refused"]["2"]
        assert ready["registry"] == {"following": True, "error": None}
        metrics = _get(port, "/metrics")[1].decode()
        assert "latch_policy_versions_refused_total 1.0" in metrics
        assert "latch_registry_following 1.0" in metrics
        assert worker.stop() == 0, worker.tail()
        lines = [line for line in worker.log().splitlines() if "cannot be built" in line]
        assert len(lines) == 1 and "version 1" in lines[0], lines
    finally:
        if worker.proc.poll() is None:
            worker.kill()
