"""What a runner's tool function receives for each kind of committed call
(``schemas/committed-call.schema.json``, decision 0004): a function call's decoded
``arguments``; a custom call's ``input`` text (it has no ``arguments``); a client item's
fields (``computer_call``, ``local_shell_call``, ``mcp_approval_request``) as an object; a
``shell_call``'s ``action`` and an ``apply_patch_call``'s ``operation``."""

from __future__ import annotations

from typing import Any

import orjson

from worker.client.runner import Runner
from worker.runtime.config import Config
from worker.runtime.schemas import validator


def call(name: str, kind: str | None = None, **fields: Any) -> bytes:
    record: dict[str, Any] = {
        "v": 1, "run_id": "r1", "tenant": None, "provider": "openai.responses",
        "call_id": f"call_{name}", "name": name, "index": 0,
        "idempotency_key": f"r1:call_{name}", **fields}
    if kind is not None:
        record["kind"] = kind
    assert validator("committed-call").is_valid(record), record
    return orjson.dumps(record)


def echo_runner() -> tuple[Runner, list[Any]]:
    received: list[Any] = []

    def echo(given: Any) -> Any:
        received.append(given)
        return given

    names = ("apply_patch", "computer", "local_shell", "delete_repo", "get_weather", "shell")
    return Runner(Config(), dict.fromkeys(names, echo), consumer=object(),
                  producer=object()), received


def test_a_custom_call_gets_its_input_text_and_a_result() -> None:
    """A committed custom call (kind custom) carries input, not arguments: its tool gets the
    input text exactly as the model wrote it (never parsed) and its return value is the
    result, not an error result ``KeyError: 'arguments'``."""
    runner, received = echo_runner()
    text = '*** Begin Patch\n{"not": json at all\n*** End Patch'
    outcome = runner.handle(call("apply_patch", "custom", input=text), None)
    result = orjson.loads(outcome.value or b"")
    assert received == [text]
    assert (result["is_error"], result["content"]) == (False, text)
    assert validator("tool-result").is_valid(result)


def test_client_items_and_function_calls_get_their_arguments_object() -> None:
    """A computer_call, a local_shell_call and an mcp_approval_request get their item's fields
    (the committed arguments object); a function call its decoded arguments; each is answered
    once with the tool's return value."""
    runner, received = echo_runner()
    computer = {"action": {"type": "click", "x": 1, "y": 2}, "pending_safety_checks": []}
    shell = {"action": {"type": "exec", "command": ["ls"], "env": {}}}
    approval = {"server_label": "gh", "name": "delete_repo", "arguments": "{\"repo\": \"x\"}"}
    weather = {"location": "Paris"}
    records = [call("computer", "computer_call", arguments=computer),
               call("local_shell", "local_shell_call", arguments=shell),
               call("delete_repo", "mcp_approval_request", arguments=approval),
               call("get_weather", arguments=weather)]
    results = [orjson.loads(runner.handle(r, None).value or b"") for r in records]
    assert received == [computer, shell, approval, weather]
    assert [r["is_error"] for r in results] == [False] * 4


def test_shell_and_apply_patch_calls_get_their_action_and_operation() -> None:
    """A shell_call's tool gets the item's ``action``, an apply_patch_call's its ``operation``
    (issue 33): the one field of their committed arguments, not the wrapping object."""
    runner, received = echo_runner()
    action = {"commands": ["ls -la"], "timeout_ms": 5000, "max_output_length": 4096}
    operation = {"type": "create_file", "path": "a.txt", "diff": "+hello\n"}
    records = [call("shell", "shell_call", arguments={"action": action}),
               call("apply_patch", "apply_patch_call", arguments={"operation": operation})]
    results = [orjson.loads(runner.handle(r, None).value or b"") for r in records]
    assert received == [action, operation]
    assert [(r["is_error"], orjson.loads(r["content"])) for r in results] == [
        (False, action), (False, operation)]
