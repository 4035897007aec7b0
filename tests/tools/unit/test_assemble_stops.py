"""``latch assemble`` prints the outcomes of issue 33's stops as the worker emits them (README,
"Stop and incomplete reasons")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    CHAT,
    PATH_SCHEMA,
    anthropic_calls,
    chat_calls,
    run_envelopes,
    tools_for,
)

TOOLS = {"read_file": PATH_SCHEMA}
CALL = [("c1", "read_file", '{"path": "/a"}')]


def test_latch_assemble_prints_each_stop(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``latch assemble`` prints the new outcomes as the worker emits them: a Chat call
    stopped by ``content_filter`` (error ``content_filtered``, final ``failed``) and an
    Anthropic call of a paused turn (error ``turn_paused``, ``dropped``; final
    ``completed``), every line valid against ``schemas/output-line.schema.json``."""
    from worker import cli
    from worker.runtime.schemas import validator

    monkeypatch.chdir(tmp_path)  # (no latch.yaml here)
    envelopes = [*run_envelopes("chat", CHAT, tools_for(CHAT, TOOLS),
                                chat_calls(CALL, finish_reason="content_filter")),
                 *run_envelopes("paused", ANTHROPIC, tools_for(ANTHROPIC, TOOLS),
                                anthropic_calls(CALL, stop_reason="pause_turn"))]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in envelopes))
    assert cli.main(["assemble", str(path)]) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    output_line = validator("output-line")
    assert all(not list(output_line.iter_errors(line)) for line in lines)
    errors_out = {e["value"]["run_id"]: e["value"] for e in lines if e["topic"] == "errors"}
    assert errors_out["chat"]["reason"] == "content_filtered"
    assert (errors_out["paused"]["reason"], errors_out["paused"]["dropped"]) == (
        "turn_paused", True)
    finals_out = {e["value"]["run_id"]: e["value"]["status"] for e in lines
                  if e["topic"] == "final"}
    assert finals_out == {"chat": "failed", "paused": "completed"}
