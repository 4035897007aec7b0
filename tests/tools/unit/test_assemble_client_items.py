"""``latch assemble`` runs the core, so it handles issue 33's calls as the worker does: a chat
custom call commits its input, a Responses ``shell_call`` and ``apply_patch_call`` commit with
their kinds, a hosted shell's items have no outcome."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from builders import (
    apply_patch_call,
    chat_chunk,
    chat_custom_chunks,
    chat_custom_tool,
    chat_run,
    item_events,
    responses_head,
    responses_run,
    responses_tail,
    shell_call,
)

from worker import cli


def test_latch_assemble_commits_custom_shell_and_patch_calls(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three calls commit with their kinds; the hosted shell's item has no outcome."""
    monkeypatch.chdir(tmp_path)  # (no latch.yaml here)
    hosted = shell_call("call_h", ["ls"], item_id="sh_h",
                        environment={"type": "container_reference", "container_id": "c"})
    envelopes = [
        *chat_run("chat", [chat_custom_tool("code_exec")],
                  [*chat_custom_chunks(0, "call_c", "code_exec", "x = 1\nprint(x)"),
                   chat_chunk(finish_reason="tool_calls")]),
        *responses_run("resp", [{"type": "shell"}, {"type": "apply_patch"}], [
            *responses_head(), *item_events(0, shell_call("call_sh", ["pwd"])),
            *item_events(1, apply_patch_call("call_ap", {"type": "delete_file", "path": "x"})),
            *item_events(2, hosted), responses_tail()])]
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in envelopes) + b"\n")
    assert cli.main(["assemble", str(path)]) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    committed = [(line["value"]["call_id"], line["value"]["kind"]) for line in lines
                 if line["topic"] == "committed"]
    assert committed == [("call_c", "custom"), ("call_sh", "shell_call"),
                         ("call_ap", "apply_patch_call")]
    assert not [line for line in lines if line["topic"] in ("errors", "dlq")]
