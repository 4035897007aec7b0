"""Stops that forbid running a call, and the field checks of issue 33, through the real broker
on both engines (docs/contract.md, "Stop and incomplete reasons").

One worker per engine reads one run per case, every provider's content stop among them (Chat
``content_filter``, per choice; Anthropic ``refusal``; Responses ``incomplete_details.reason:
content_filter``; Bedrock ``guardrail_intervened``; Gemini ``SAFETY``), Anthropic
``pause_turn`` with a dangling ``server_tool_use``, a Gemini call repeated by a later chunk,
Bedrock tool input after its block's stop, and a Chat call whose fragments re-send the whole
arguments. Each run's outcomes are the ones below, and the worker's committed calls, error
results and final messages are byte for byte the offline core's (``latch assemble``) for the
same history. Who sends what: the gateway, every record (the events topic).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    PATH_SCHEMA,
    RESPONSES,
    anthropic_calls,
    anthropic_message_start,
    anthropic_tail,
    anthropic_tool_block,
    bedrock_calls,
    bedrock_tool_block,
    chat_call_chunks,
    chat_calls,
    chat_chunk,
    chat_tool_delta,
    gemini_calls,
    gemini_chunk,
    responses_calls,
    run_envelopes,
    tools_for,
)
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    WorkerProcess,
    assert_same_outcomes,
    expected,
    finished,
    make_stack,
    publish_envelopes,
    running_worker,
)

ARGS = '{"path": "/srv/SECRET-a"}'
CALL = [("c1", "read_file", ARGS)]
WHOLE = {"functionCall": {"name": "read_file", "args": {"path": "/srv/SECRET-a"}}}


def _runs() -> dict[str, tuple[str, list[dict[str, Any]], list[tuple[str, str]], str]]:
    """run id -> (provider, events, (call id, outcome) in emission order, final status)."""
    incomplete = {"type": "response.incomplete", "response": {
        "id": "resp_1", "object": "response", "status": "incomplete", "output": [],
        "incomplete_details": {"reason": "content_filter"}}}
    return {
        "chat-filter": (CHAT, chat_calls(CALL, finish_reason="content_filter"),
                        [("c1", "content_filtered")], "failed"),
        "chat-choices": (CHAT, [*chat_call_chunks(0, "c0", "read_file", ARGS, choice=0),
                                *chat_call_chunks(0, "c1", "read_file", ARGS, choice=1),
                                chat_chunk(finish_reason="content_filter", choice=0),
                                chat_chunk(finish_reason="tool_calls", choice=1)],
                         [("c1", "committed"), ("c0", "content_filtered")], "failed"),
        "anthropic-refusal": (ANTHROPIC, anthropic_calls(CALL, stop_reason="refusal"),
                              [("c1", "content_filtered")], "failed"),
        "responses-filter": (RESPONSES, [*responses_calls(CALL, terminal=None), incomplete],
                             [("c1", "content_filtered")], "failed"),
        "bedrock-guardrail": (BEDROCK, bedrock_calls(CALL, stop_reason="guardrail_intervened"),
                              [("c1", "content_filtered")], "failed"),
        "gemini-safety": (GEMINI, gemini_calls(CALL, finish_reason="SAFETY"),
                          [("c1", "content_filtered")], "failed"),
        "anthropic-paused": (ANTHROPIC, [
            anthropic_message_start(),
            *anthropic_tool_block(0, "srvtoolu_1", "web_search", '{"query": "q"}',
                                  kind="server_tool_use"),
            *anthropic_tool_block(1, "c1", "read_file", ARGS), *anthropic_tail("pause_turn")],
            [("c1", "turn_paused")], "completed"),
        "gemini-repeat": (GEMINI, [gemini_chunk([WHOLE]), gemini_chunk([WHOLE]),
                                   gemini_chunk([{"text": ""}], finish_reason="STOP")],
                          [("latch-0-0-gemini-repeat", "committed")], "completed"),
        "bedrock-after-stop": (BEDROCK, [
            *bedrock_tool_block(0, "c1", "read_file", ARGS),
            {"contentBlockDelta": {"contentBlockIndex": 0,
                                   "delta": {"toolUse": {"input": "{}"}}}},
            {"messageStop": {"stopReason": "tool_use"}}],
            [("c1", "protocol_error")], "failed"),
        "chat-resent": (CHAT, [
            chat_chunk([chat_tool_delta(0, "c1", "read_file", "")]),
            *(chat_chunk([chat_tool_delta(0, arguments=ARGS[:n])]) for n in (9, 17, len(ARGS))),
            chat_chunk(finish_reason="tool_calls")], [("c1", "invalid_json")], "completed"),
    }


RUNS = _runs()


def _envelopes() -> list[dict[str, Any]]:
    return [env for run_id, (provider, events, _, _) in RUNS.items()
            for env in run_envelopes(run_id, provider,
                                     tools_for(provider, {"read_file": PATH_SCHEMA}), events)]


@pytest.fixture(scope="module", params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(kafka_bootstrap, f"stops-{request.param}", partitions=2,
                    worker__engine=str(request.param)) as made:
        yield made


@pytest.fixture(scope="module")
def worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with running_worker(stack, tmp_path_factory.mktemp(stack.engine) / "worker.log") as proc:
        yield proc


def test_stops_and_field_checks_on_the_broker(stack: Stack, worker: WorkerProcess,
                                              tmp_path: Path) -> None:
    """Every run's calls get the outcome the table says, once, and its final message the
    status; no call stopped for its content commits; the paused turn's final message keeps
    its ``server_tool_use`` and leaves the paused client call out; no argument text is in an
    error result; no DLQ record; the worker's outputs are the offline core's."""
    envelopes = _envelopes()
    publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
    reader = Reader(stack)
    try:
        reader.collect(finished(RUNS), timeout=90)
    finally:
        reader.close()
    assert_same_outcomes(reader, expected(envelopes, stack.config()))
    assert reader.of("dlq") == []
    finals = reader.finals()
    for run_id, (_, _, outcomes, status) in RUNS.items():
        got = [(r.value["call_id"], "committed") for r in reader.of("committed")
               if r.value["run_id"] == run_id]
        got += [(r.value["tool_call_id"], r.value["reason"]) for r in reader.of("errors")
                if r.value["run_id"] == run_id]
        assert sorted(set(got)) == sorted(outcomes), run_id
        assert finals[run_id]["status"] == status, run_id
    assert all("SECRET" not in r.value["content"] for r in reader.of("errors"))
    paused = finals["anthropic-paused"]["message"]
    assert [b["type"] for b in paused["content"]] == ["server_tool_use"]
    assert paused["stop_reason"] == "pause_turn"
