"""An example runner with one client-run shell tool, held for approval (issue 33).

A Responses run that declares OpenAI's shell tool for the client to run (``{"type": "shell"}``,
no container ``environment``) gets ``shell_call`` items. The worker commits such a call only
when the policy in force lets it: ``examples/shell.cedar`` holds every ``shell`` call for a
person (``@approval("required")``), and only a *signed* approve by the approver it names
commits it. This runner then executes what arrives on the committed topic, and nothing else:

    LATCH_POLICY__MODE=enforce LATCH_POLICY__FILE=examples/shell.cedar \
    LATCH_APPROVERS__KEYS='{oncall-1: "file:/etc/latch/oncall.key"}' \
    LATCH_APPROVERS__OWNERS='{oncall-1: oncall}' latch worker      # the worker
    python examples/shell_tool.py                                    # this runner
    LATCH_APPROVERS__KEY_ID=oncall-1 latch approve RUN CALL --by oncall   # a person

Its tool gets the call's ``action`` (``worker.client.execution.tool_input``: ``{"commands",
"timeout_ms"?, "max_output_length"?}``) and answers with what OpenAI's
``shell_call_output`` carries, one entry per command. The commands are the model's text, even
once approved: they run without a shell (``shlex.split``, no pipes, no expansion), only when
their program is in :data:`ALLOWED`, in :data:`WORKDIR`, within the call's ``timeout_ms`` (at
most :data:`MAX_TIMEOUT_MS`), their output cut to ``max_output_length`` characters.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import tempfile
from typing import Any

from worker.client.runner import Runner
from worker.runtime.config import load_config

#: The programs a command may run (its first word); anything else is answered, not run.
ALLOWED = frozenset({"echo", "ls", "pwd", "cat", "wc", "head"})
#: Where the commands run.
WORKDIR = tempfile.gettempdir()
MAX_TIMEOUT_MS = 10_000
MAX_OUTPUT = 4096


def run_shell(action: Any) -> list[dict[str, Any]]:
    """Run a ``shell_call``'s ``action``: one ``{"stdout", "stderr", "outcome"}`` per command,
    as ``shell_call_output`` wants them back. A bad action raises (an error result)."""
    if not isinstance(action, dict) or not isinstance(action.get("commands"), list):
        raise ValueError("a shell_call action has a list of commands")
    timeout_ms = _bounded(action.get("timeout_ms"), MAX_TIMEOUT_MS)
    limit = _bounded(action.get("max_output_length"), MAX_OUTPUT)
    return [_one(command, timeout_ms / 1000, limit) for command in action["commands"]]


def _bounded(value: Any, most: int) -> int:
    """The model's limit when it is a positive integer under ``most``, else ``most``."""
    return min(value, most) if type(value) is int and value > 0 else most


def _one(command: Any, timeout_s: float, limit: int) -> dict[str, Any]:
    try:
        argv = shlex.split(command) if isinstance(command, str) else []
    except ValueError:
        argv = []
    if not argv or argv[0] not in ALLOWED:
        return {"stdout": "", "stderr": "not allowed by this runner",
                "outcome": {"type": "exit", "exit_code": 126}}
    try:
        done = subprocess.run(argv, cwd=WORKDIR, capture_output=True, text=True,
                              timeout=timeout_s, check=False, errors="replace")
    except subprocess.TimeoutExpired:
        return {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}}
    return {"stdout": done.stdout[:limit], "stderr": done.stderr[:limit],
            "outcome": {"type": "exit", "exit_code": done.returncode}}


#: The runner's one tool: the client-run shell, by the name its committed calls carry.
TOOLS = {"shell": run_shell}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    runner = Runner(load_config(), TOOLS, group_id="latch-example-shell-runner")
    handled = runner.serve()  # until SIGTERM (or Ctrl-C), then closed
    print(f"{handled} records handled, {runner.executed} shell calls run")


if __name__ == "__main__":
    main()
