"""The result latch's checks through Kafka, on both engines (issue 36, item 4): a result over
``results.max_bytes`` is answered ``result_too_large`` (its size, never its text), a structured
result failing its MCP tool's ``outputSchema`` ``result_schema_invalid``, and the operator's
redaction rules rewrite a result's text before it reaches the turn record.

Who writes what here: the runner (this test) writes results; the operator's configuration
(the environment) sets the limit and the rules; the run's tools (run.start) carry the output
schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from worker_harness import (
    ENGINES,
    PATH_SCHEMA,
    Reader,
    Stack,
    make_stack,
    provider_run,
    publish,
    publish_envelopes,
    running_worker,
)

from worker.client.results import answer, result_record

OUTPUT_SCHEMA = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
RULES = '{"*": [{"name": "token", "pattern": "s3cr3t-[0-9]+"}]}'


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, request.node.name, partitions=2,
                    worker__engine=str(request.param), results__max_bytes="64",
                    results__redact=RULES,
                    agent_stream_assemble__assemble_idle_timeout_s="300") as made:
        yield made


def test_too_large_schema_invalid_and_redacted_results(stack: Stack, tmp_path: Path) -> None:
    """Three calls of an MCP tool with an outputSchema: a 100-byte result (limit 64) is
    result_too_large, a structured result without its required member result_schema_invalid,
    a text with a token redacted; the turn and the audit never hold the large or the secret
    text."""
    envelopes = provider_run("openai.chat", "r-checks", [
        ("c1", "read_file", '{"path": "/a"}'), ("c2", "read_file", '{"path": "/b"}'),
        ("c3", "read_file", '{"path": "/c"}')])
    envelopes[0]["tools"] = [{"name": "read_file", "inputSchema": PATH_SCHEMA,
                              "outputSchema": OUTPUT_SCHEMA}]
    large, secret = "L" * 100, "the key is s3cr3t-42, keep it"
    with running_worker(stack, tmp_path / "worker.log"):
        reader = Reader(stack, ("committed", "turns", "audit"))
        try:
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            records = reader.collect(lambda rs: len([r for r in rs
                                                     if r.role == "committed"]) == 3, 60)
            calls = {r.value["call_id"]: r.value for r in records if r.role == "committed"}
            values = [answer(calls["c1"], False, large, 1000),
                      orjson.dumps(result_record(calls["c2"], False, '{"m": 1}',
                                                 structured={"m": 1})),
                      answer(calls["c3"], False, secret, 1000)]
            publish(stack.bootstrap, stack.topic("results"),
                    [(b"r-checks", value) for value in values])
            records = reader.collect(lambda rs: any(r.role == "turns" for r in rs), 60)
            [turn] = [r.value for r in records if r.role == "turns"]
            assert [o["outcome"] for o in turn["outcomes"]] == [
                "result_too_large", "result_schema_invalid", "answered"]
            assert turn["outcomes"][0]["size"] == 100
            contents = [m["content"] for m in turn["messages"]]
            assert contents[0].startswith("result_too_large: ")
            assert contents[1].startswith("result_schema_invalid: ")
            assert contents[2] == "the key is [redacted], keep it"
            shown = orjson.dumps([r.value for r in records]).decode()
            assert large not in shown and "s3cr3t-42" not in shown
        finally:
            reader.close()
