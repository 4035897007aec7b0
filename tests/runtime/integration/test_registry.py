"""The registry topic on the real broker, with both engines (issue 25 item 3): a run naming a
toolset by reference commits its call; a run naming a version that never comes fails
``unknown_toolset`` after ``registry.wait_s``; ``latch registry put`` refuses a version that
exists already; ``latch replay`` of the events topic decides as the live worker did, across a
policy set version registered mid-stream (its markers in the events log)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    finished,
    make_stack,
    provider_run,
    publish_envelopes,
    running_worker,
    tools,
)

from worker.runtime import registry_io
from worker.runtime.registry import POLICY, POLICY_MARKER, TOOLSET


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=request.param, registry__wait_s="2") as made:
        yield made


def _by_reference(run_id: str, version: int) -> list[dict[str, Any]]:
    envelopes = provider_run("openai.chat", run_id, [(f"call_{run_id}", "read_file",
                                                      '{"path": "/srv/a"}')])
    envelopes[0]["tools"] = {"toolset": "files", "version": version}
    return envelopes


def _latch(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker", *args], capture_output=True,
                          text=True, timeout=120, env=os.environ | stack.env())


def _outcomes(values: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    return sorted((v["run_id"], v.get("call_id") or v["tool_call_id"], v.get("reason"))
                  for v in values)


def test_toolsets_by_reference_decide_the_same_live_and_in_replay(
        stack: Stack, tmp_path: Path) -> None:
    """Version 1 of toolset ``files`` registered: a run naming it commits its call; a run
    naming version 7 (never registered) fails ``unknown_toolset`` once the wait is over; a
    second put of version 1 is refused (exit 2, "exists already"); a policy set registered
    mid-stream gets a marker into each owned events partition; ``latch replay`` of the whole
    events topic gives the same outcomes for every call."""
    config = stack.config()
    registry_io.put(config, TOOLSET, "files", 1, tools("openai.chat", ["read_file"]))
    spec = tmp_path / "files.json"
    spec.write_bytes(orjson.dumps(tools("openai.chat", ["read_file"])))
    refused = _latch(stack, "registry", "put", "toolset", "files", "--version", "1",
                     "--tools", str(spec))
    assert refused.returncode == 2 and "exists already" in refused.stderr, refused.stderr
    reader = Reader(stack)
    try:
        with running_worker(stack, tmp_path / "worker.log"):
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              _by_reference("known", 1) + _by_reference("never", 7))
            reader.collect(finished(["known", "never"]), timeout=90)
            policy = tmp_path / "p.cedar"
            policy.write_text("permit(principal, action, resource);\n")
            put = _latch(stack, "registry", "put", "policy", "--version", "1", "--file",
                         str(policy))
            if "cedarpy is not installed" not in put.stderr:
                assert put.returncode == 0, put.stderr
            else:  # pragma: no cover  (the policy step installs cedarpy)
                registry_io.put(config, POLICY, "", 1, policy.read_text())
            publish_envelopes(stack.bootstrap, stack.topic("events"),
                              _by_reference("after", 1))
            reader.collect(finished(["after"]), timeout=90)
        live = _outcomes([o.value for o in reader.of("committed") + reader.of("errors")])
    finally:
        reader.close()
    assert live == [("after", "call_after", None), ("known", "call_known", None),
                    ("never", "call_never", "unknown_toolset")]
    listed = _latch(stack, "registry", "list")
    assert "toolset files 1" in listed.stdout and "policy 1" in listed.stdout, listed.stderr
    out = tmp_path / "replay.jsonl"
    replay = _latch(stack, "replay", "--from-beginning", "--to-file", str(out),
                    "--no-progress")
    assert replay.returncode == 0, replay.stderr
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    replayed = [line["value"] for line in lines if line["topic"] in ("committed", "errors")]
    assert _outcomes(replayed) == live
    markers = _events_keys(stack).count(POLICY_MARKER)
    assert markers >= 1  # one per owned partition, perhaps again after a rebalance


def _events_keys(stack: Stack) -> list[bytes | None]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": "registry-it",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    keys: list[bytes | None] = []
    try:
        consumer.assign([TopicPartition(stack.topic("events"), p, 0)
                         for p in range(stack.partitions)])
        ends = 0
        while ends < stack.partitions:
            msg = consumer.poll(5)
            if msg is None:
                break
            if msg.error() is not None:
                ends += 1
                continue
            keys.append(msg.key())
    finally:
        consumer.close()
    return keys
