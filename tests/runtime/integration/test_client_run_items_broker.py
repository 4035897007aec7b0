"""Chat custom calls and Responses client-run items on the real broker, both engines, with a
runner (issue 33): the core decides, so faust and the kafka engine commit and hold alike.

* ``chat-custom`` (tenant dev): a Chat Completions custom tool call, its input in pieces:
  committed (``kind: custom``, the whole input text);
* ``items`` (tenant dev): a Responses ``shell_call`` and an ``apply_patch_call``: committed with
  their ``action`` / ``operation`` as arguments;
* ``held`` (tenant prod): a ``shell_call`` the policy holds (``@approval("required")`` for
  prod's shell): pending, then committed after a signed approve.

Then a runner executes each committed call once: the custom tool gets the input text, the
shell tool the action (``examples/shell_tool.py``'s tool, allow-listed commands only), the
patch tool the operation; one result per call lands on the results topic.
"""

from __future__ import annotations

import importlib.util
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import (
    APPROVER,
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
from worker_harness import (
    ENGINES,
    OUTPUTS,
    Reader,
    Stack,
    approver,
    approver_settings,
    finished,
    make_stack,
    publish_envelopes,
    running_worker,
)

from worker.client.runner import Runner

POLICIES = f"""\
@id("calls") permit(principal is Latch::Tenant, action == Latch::Action::"call", resource);
@id("prod-shell-needs-a-person") @approval("required")
permit(principal == Latch::Tenant::"prod", action == Latch::Action::"call", resource)
when {{ resource.kind == "shell" }};
@id("approver-decides")
permit(principal == Latch::Approver::"{APPROVER}", action == Latch::Action::"approve",
       resource);
"""
CODE = 'print("hi")\nfor i in range(3): print(i)'
PATCH = {"type": "create_file", "path": "notes/a.txt", "diff": "+hello\n+world\n"}
RUNS = ("chat-custom", "items", "held")
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "shell_tool.py"


def _envelopes() -> list[dict[str, Any]]:
    client = [{"type": "shell"}, {"type": "apply_patch"}]
    return [
        *chat_run("chat-custom", [chat_custom_tool("code_exec")],
                  [*chat_custom_chunks(0, "call_c", "code_exec", CODE, pieces=4),
                   chat_chunk(finish_reason="tool_calls")], tenant="dev"),
        *responses_run("items", client, [
            *responses_head(), *item_events(0, shell_call("call_sh1", ["echo one"])),
            *item_events(1, apply_patch_call("call_ap", PATCH)), responses_tail()],
            tenant="dev"),
        *responses_run("held", client, [
            *responses_head(), *item_events(0, shell_call("call_sh2", ["echo two"],
                                                          item_id="sh_2")),
            responses_tail()], tenant="prod")]


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest, tmp_path: Path
          ) -> Iterator[Stack]:
    pytest.importorskip("cedarpy")
    path = tmp_path / "policies.cedar"
    path.write_text(POLICIES, encoding="utf-8")
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, policy__mode="enforce",
                    policy__file=str(path), **approver_settings()) as made:
        yield made


def _held(records: list[Any]) -> bool:
    return (finished(["chat-custom", "items"])(records)
            and any(r.role == "pending" for r in records))


def _shell_tool() -> Any:
    spec = importlib.util.spec_from_file_location("shell_tool", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_shell


def test_custom_shell_and_patch_calls_commit_and_run_once(stack: Stack, tmp_path: Path
                                                           ) -> None:
    """See the module docstring: four calls commit (one after a signed approve), none fails,
    and the runner runs each once with what its kind hands a tool."""
    with running_worker(stack, tmp_path / "w.log"):
        publish_envelopes(stack.bootstrap, stack.topic("events"), _envelopes())
        reader = Reader(stack, (*OUTPUTS, "pending"))
        try:
            reader.collect(_held, timeout=90)
            [pending] = [r.value for r in reader.of("pending")]
            assert (pending["run_id"], pending["call_id"], pending["name"]) == (
                "held", "call_sh2", "shell")
            assert "call_sh2" not in [r.value["call_id"] for r in reader.of("committed")]
            with approver(stack, APPROVER) as publisher:
                publisher.approve("held", "call_sh2", by=APPROVER, reason="echo is fine")
                publisher.flush()
            reader.collect(finished(RUNS), timeout=90)
            committed = {r.value["call_id"]: r.value for r in reader.of("committed")}
            assert reader.of("errors") == [] and reader.of("dlq") == []
        finally:
            reader.close()
    assert {k: (c["name"], c.get("kind")) for k, c in committed.items()} == {
        "call_c": ("code_exec", "custom"), "call_sh1": ("shell", "shell_call"),
        "call_ap": ("apply_patch", "apply_patch_call"), "call_sh2": ("shell", "shell_call")}
    assert committed["call_c"]["input"] == CODE
    assert committed["call_ap"]["arguments"] == {"operation": PATCH}

    got: dict[str, list[Any]] = {"code_exec": [], "shell": [], "apply_patch": []}
    run_shell = _shell_tool()
    tools = {"code_exec": lambda text: got["code_exec"].append(text) or len(text),
             "shell": lambda action: got["shell"].append(action) or run_shell(action),
             "apply_patch": lambda op: got["apply_patch"].append(op) or {"path": op["path"]}}
    stop = threading.Event()
    timer = threading.Timer(90, stop.set)
    timer.start()
    runner = Runner(stack.config(), tools, group_id=f"latch-it-runner-{uuid.uuid4().hex[:8]}")
    try:
        assert runner.run(stop, max_records=4) == 4
    finally:
        timer.cancel()
        runner.close()
    assert got == {"code_exec": [CODE], "apply_patch": [PATCH],
                   "shell": [{"commands": ["echo one"], "timeout_ms": 5000,
                              "max_output_length": 4096},
                             {"commands": ["echo two"], "timeout_ms": 5000,
                              "max_output_length": 4096}]}
    results = Reader(stack, ("results",))
    try:
        results.collect(lambda records: len(records) >= 4, timeout=60)
        by_id = {r.value["tool_call_id"]: r.value for r in results.of("results")}
    finally:
        results.close()
    assert sorted(by_id) == ["call_ap", "call_c", "call_sh1", "call_sh2"]
    assert not any(r["is_error"] for r in by_id.values())
    assert orjson.loads(by_id["call_sh2"]["content"])[0]["stdout"] == "two\n"
    assert by_id["call_c"]["content"] == str(len(CODE))
