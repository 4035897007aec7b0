"""``latch policy schema --toolset NAME@VERSION`` on the real broker (worker/tools/policy.py):
a toolset registered with ``latch registry put`` is read back from the registry topic (a
unique one, ``LATCH_TOPICS__REGISTRY``) and its generated schema printed, the same as from the
file; a version that was never registered is a one-line error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from worker_harness import Stack, make_stack

PATH = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS = [{"name": "delete_file", "inputSchema": PATH, "annotations": {"destructiveHint": True}}]


@pytest.fixture
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=1) as made:
        yield made


def _latch(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker", *args], capture_output=True,
                          text=True, timeout=120, env=os.environ | stack.env())


def test_schema_of_a_registered_toolset(stack: Stack, tmp_path: Path) -> None:
    """Put a toolset with ``latch registry put``, then ``latch policy schema --toolset``
    prints the schema generated from it (as ``--tools`` does from the file); an unknown
    version exits 2 naming the versions the registry holds."""
    assert stack.env()["LATCH_TOPICS__REGISTRY"].startswith(stack.app_id)
    tools = tmp_path / "tools.json"
    tools.write_bytes(orjson.dumps(TOOLS))
    put = _latch(stack, "registry", "put", "toolset", "files", "--version", "1",
                 "--tools", str(tools))
    assert put.returncode == 0, put.stderr
    by_reference = _latch(stack, "policy", "schema", "--toolset", "files@1")
    assert by_reference.returncode == 0, by_reference.stderr
    by_file = _latch(stack, "policy", "schema", "--tools", str(tools))
    assert by_reference.stdout == by_file.stdout
    schema = orjson.loads(by_reference.stdout)["Latch"]
    assert "path" in schema["actions"]["call"]["appliesTo"]["context"]["attributes"][
        "arguments"]["attributes"]
    missing = _latch(stack, "policy", "schema", "--toolset", "files@2")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr == (f"latch policy: the registry (topic {stack.topic('registry')}) "
                              "holds no toolset 'files' version 2 (its versions: 1)\n")
