"""One tool identity on the real broker, with both engines (issue 32, items 1 and 12): the
core decides, so faust and the kafka engine refuse and deny the same way.

A Responses run calls its custom tool ``shell``, which a ``forbid`` on
``Latch::Tool::"shell"`` denies, naming the forbid and, beside it, a policy that could not be
evaluated; the error and audit records name the tool ``shell``. A second run declares
``shell`` twice (custom and function): its call fails ``ambiguous_tool``; its function call
``read_file`` commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builders import PATH_SCHEMA, responses_head, responses_run, responses_tail
from worker_harness import (
    ENGINES,
    Reader,
    Stack,
    finished,
    make_stack,
    publish_envelopes,
    running_worker,
)

POLICIES = """\
@id("all") permit(principal, action, resource);
@id("needs-size") forbid(principal, action, resource)
when { resource.kind == "custom" && context.arguments.size > 1 };
@id("no-shell") forbid(principal, action, resource == Latch::Tool::"shell");
"""
READ_FILE = {"type": "function", "name": "read_file", "parameters": PATH_SCHEMA}
SHELL = {"type": "custom", "name": "shell"}


def _custom(index: int, call_id: str) -> list[dict[str, Any]]:
    item = {"type": "custom_tool_call", "id": f"ctc_{index}", "call_id": call_id,
            "name": "shell", "input": "rm -rf /"}
    return [{"type": "response.output_item.added", "output_index": index, "item": item},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def _function(index: int, call_id: str) -> list[dict[str, Any]]:
    item = {"type": "function_call", "id": f"fc_{index}", "call_id": call_id,
            "name": "read_file", "arguments": '{"path": "/srv/a"}'}
    return [{"type": "response.output_item.added", "output_index": index, "item": item},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def _envelopes() -> list[dict[str, Any]]:
    return [*responses_run("denied", [SHELL, READ_FILE],
                           [*responses_head(), *_custom(0, "call_d"), responses_tail()]),
            *responses_run("ambiguous", [SHELL, {**READ_FILE, "name": "shell"}, READ_FILE],
                           [*responses_head(), *_custom(0, "call_a"), *_function(1, "call_r"),
                            responses_tail()])]


@pytest.fixture(params=ENGINES)
def stack(kafka_bootstrap: str, request: pytest.FixtureRequest, tmp_path: Path
          ) -> Iterator[Stack]:
    path = tmp_path / "policies.cedar"
    path.write_text(POLICIES, encoding="utf-8")
    with make_stack(kafka_bootstrap, request.node.name, partitions=1,
                    worker__engine=request.param, policy__mode="enforce",
                    policy__file=str(path)) as made:
        yield made


def test_one_name_decides_and_an_ambiguous_name_is_refused(stack: Stack, tmp_path: Path
                                                           ) -> None:
    """The custom call ``shell`` is denied by the forbid on its name, its content naming that
    forbid and the erroring policy; the ambiguous call fails ``ambiguous_tool``; only the
    function call commits; the audit records carry the name ``shell``."""
    with running_worker(stack, tmp_path / "w.log"):
        publish_envelopes(stack.bootstrap, stack.topic("events"), _envelopes())
        reader = Reader(stack)
        try:
            reader.collect(finished(["denied", "ambiguous"]), timeout=90)
            committed = [r.value["call_id"] for r in reader.of("committed")]
            errors = {r.value["tool_call_id"]: r.value for r in reader.of("errors")}
            audits = {r.value["tool_call_id"]: r.value for r in reader.of("audit")}
            assert reader.of("dlq") == []
        finally:
            reader.close()
    assert committed == ["call_r"]
    assert {k: (e["name"], e["reason"]) for k, e in errors.items()} == {
        "call_d": ("shell", "policy_denied"), "call_a": ("shell", "ambiguous_tool")}
    assert errors["call_d"]["content"] == (
        "policy_denied: forbidden by policy no-shell; a policy could not be evaluated, which "
        "denies the call: needs-size: type_error")
    assert "rm -rf" not in errors["call_d"]["content"]
    assert (audits["call_d"]["name"], audits["call_d"]["policy"]["policies"]) == (
        "shell", ["no-shell"])
