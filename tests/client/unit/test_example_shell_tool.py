"""The pieces of ``examples/shell_tool.py`` together (issue 33, item 4): the example's policy
(``examples/shell.cedar``) holds a Responses ``shell_call``; an unsigned approve does not
count; the on-call approver's signed approve commits it; the example's runner runs the
committed call's allow-listed commands, and answers (not runs) the others."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from builders import (
    decision,
    dlq,
    feed,
    item_events,
    responses_head,
    responses_run,
    responses_tail,
    shell_call,
    values,
)

from worker.client.runner import Runner
from worker.core import Assembler, AssembleSettings, Topic
from worker.core.approvers import Approvers
from worker.runtime.config import Config
from worker.runtime.governance.approvers import DecisionSigner

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
KEY = ("oncall", b"k" * 32)


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("shell_tool", EXAMPLES / "shell_tool.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker() -> Assembler:
    """The pure core as the example's worker runs it: the policy enforced, oncall's key known."""
    pytest.importorskip("cedarpy")
    from worker.runtime.governance.policy import CedarPolicy

    a = Assembler(AssembleSettings())
    a.policy = CedarPolicy((EXAMPLES / "shell.cedar").read_text(encoding="utf-8"))
    a.approvals.approvers = Approvers({"oncall-1": KEY})
    return a


def test_a_shell_call_runs_only_after_a_signed_approve() -> None:
    """Held by the example's policy, not decided by an unsigned approve, committed by the
    on-call approver's signed one; the example's tool then runs the allow-listed command and
    answers the other without running it."""
    a = worker()
    item = shell_call("call_sh", ["echo hello from latch", "rm -rf /tmp/nothing"])
    emits = feed(a, responses_run("r1", [{"type": "shell"}], [
        *responses_head(), *item_events(0, item), responses_tail()], tenant="acme"))
    [pending] = values(emits, Topic.PENDING)
    assert (pending["name"], pending["kind"]) == ("shell", "shell_call")
    assert values(emits, Topic.COMMITTED) == []

    unsigned = feed(a, [decision("r1", "approve", "call_sh", by="oncall")])
    assert [r["reason"] for r in dlq(unsigned)] == ["approval_unsigned"]
    assert values(unsigned, Topic.COMMITTED) == []

    signed = DecisionSigner("oncall-1", *KEY).sign(
        decision("r1", "approve", "call_sh", by="oncall"), 1)
    [call] = values(feed(a, [signed]), Topic.COMMITTED)
    assert call["arguments"] == {"action": item["action"]}

    ran: list[Any] = []
    tools = {name: (lambda action, f=f: ran.append(action) or f(action))
             for name, f in example().TOOLS.items()}
    runner = Runner(Config(), tools, consumer=object(), producer=object())
    result = orjson.loads(runner.handle(orjson.dumps(call), None).value or b"")
    assert ran == [item["action"]]
    assert (result["tool_call_id"], result["is_error"]) == ("call_sh", False)
    echo, refused = orjson.loads(result["content"])
    assert (echo["stdout"], echo["outcome"]) == ("hello from latch\n",
                                                 {"type": "exit", "exit_code": 0})
    assert (refused["stderr"], refused["outcome"]["exit_code"]) == (
        "not allowed by this runner", 126)


def test_the_example_tool_bounds_what_it_runs() -> None:
    """No shell: a pipe or an expansion is an argument, not a second program; a bad action is
    an error (it raises); the output is cut to ``max_output_length``."""
    run_shell = example().run_shell
    [piped] = run_shell({"commands": ["echo $HOME | cat"], "max_output_length": 7})
    assert piped["stdout"] == "$HOME |"
    with pytest.raises(ValueError):
        run_shell({"command": "ls"})
