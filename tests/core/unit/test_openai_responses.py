"""``worker.core.providers.openai_responses``: the OpenAI Responses adapter's items (issue 11,
item 3): the parallel wrapper with pipelined entries, the items a client answers or never
answers (decision 0004), custom tool calls. Its protocol breaks are
``test_openai_responses_breaks.py``.

Outcomes in the fixture tests are written from reading the files (``../shared/fixtures/
providers``, see its README); every other stream is built here as the providers document it.
Every emitted line is checked against ``schemas/output-line.schema.json``.
"""

from __future__ import annotations

from typing import Any

from builders import (
    RESPONSES,
    checked_run,
    committed,
    errors,
    feed,
    finals,
    item_events,
    outcome_ids,
    responses_call,
    responses_head,
    responses_item,
    responses_run,
    responses_tail,
    responses_tool,
    wrapper_text,
)
from fixtures_lib import VERCEL, check_run, fixture, only_final, run_capture, topic

from worker.core import Assembler, AssembleSettings

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}
RESPONSES_FIXTURES = f"{VERCEL}/openai/src/responses/__fixtures__"


run = checked_run


def test_responses_wrapper_pipelined_entries_commit_at_item_done() -> None:
    """Responses ``parallel`` with ``execute_before_stream_end`` and one entry's tool
    allowed: that call commits at ``output_item.done``, before ``response.completed``; the
    other waits for the end of the stream."""
    text = wrapper_text(("functions.fast", {}), ("functions.slow", {}))
    events = [*responses_head(), *responses_call(0, "call_p", "parallel", text)]
    tools = [responses_tool("fast", {}), responses_tool("slow", {})]
    asm = Assembler(AssembleSettings(execute_before_stream_end=True,
                                     allow_pipelined_execute=("fast",)))
    early = feed(asm, responses_run("r1", tools, events, end=False))
    assert outcome_ids(early) == ["call_p#0"]
    late = feed(asm, [{"v": 1, "run_id": "r1", "seq": len(events) + 1, "type": "provider.event",
                       "event": responses_tail(output=[responses_item(0, "call_p", "parallel",
                                                                      text)])}])
    assert outcome_ids(late) == ["call_p#1"]
    assert finals(late)[0]["status"] == "completed"


# -- Responses: built-in items, never calls -----------------------------------------------------


def test_web_search_fixture_has_no_client_call() -> None:
    """vercel-ai openai-web-search-tool.1: five reasoning items, four ``web_search_call``
    items and a message, run at OpenAI. No call, no outcome; the run completes and the final
    message keeps all ten items in output_index order."""
    lines = run_capture(RESPONSES, fixture(f"{RESPONSES_FIXTURES}/openai-web-search-tool.1"
                                           ".chunks.txt"), [responses_tool("weather", CITY)])
    check_run(RESPONSES, lines)
    assert topic(lines, "committed") == [] and topic(lines, "errors") == []
    final = only_final(lines)
    assert final["status"] == "completed" and final["outcomes"] == []
    assert [i["type"] for i in final["message"]["output"]] == [
        "reasoning", "web_search_call"] * 4 + ["reasoning", "message"]


def test_mcp_call_fixture_is_never_committed() -> None:
    """vercel-ai openai-mcp-tool-approval.4: ``mcp_list_tools``, an ``mcp_call``
    (``create_short_url``, with its own argument deltas) and a message. The MCP call runs at
    OpenAI: never committed, not even with an MCP tool of that server registered; kept in
    the final message; the repeated ``response.mcp_call.in_progress`` changes nothing."""
    tools = [{"type": "mcp", "server_label": "zip1", "server_url": "https://zip1.io/mcp"},
             responses_tool("create_short_url", {})]
    lines = run_capture(RESPONSES, fixture(f"{RESPONSES_FIXTURES}/openai-mcp-tool-approval.4"
                                           ".chunks.txt"), tools)
    check_run(RESPONSES, lines)
    assert topic(lines, "committed") == [] and topic(lines, "errors") == []
    final = only_final(lines)
    assert final["status"] == "completed"
    assert [i["type"] for i in final["message"]["output"]] == [
        "mcp_list_tools", "mcp_call", "message"]
    assert final["message"]["output"][1]["name"] == "create_short_url"


# -- Responses: items a client answers (decision 0004) -------------------------------------------




COMPUTER = {"type": "computer_call", "id": "cu_1", "call_id": "call_cu",
            "action": {"type": "click", "button": "left", "x": 10, "y": 20},
            "pending_safety_checks": [], "status": "completed"}
SHELL = {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_sh",
         "action": {"type": "exec", "command": ["ls", "-la"], "env": {}}, "status": "completed"}
APPROVAL = {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "zip1",
            "name": "create_short_url", "arguments": '{"url": "https://ai-sdk.dev"}'}
CLIENT_TOOLS = [{"type": "computer_use_preview", "display_width": 1024, "display_height": 768,
                 "environment": "browser"}, {"type": "local_shell"},
                {"type": "mcp", "server_label": "zip1", "require_approval": "always"}]


def test_client_answered_items_commit_with_their_kind() -> None:
    """``computer_call``, ``local_shell_call`` and ``mcp_approval_request``, each with its
    tool registered: committed with ``kind``, the id the answer pairs with (``call_id``; the
    approval request's item id) and, as arguments, the item's fields but type, id, call_id
    and status. The final message keeps the items as they came."""
    events = [*responses_head(), *item_events(0, COMPUTER), *item_events(1, SHELL),
              *item_events(2, APPROVAL), responses_tail()]
    emits = run(responses_run("r1", CLIENT_TOOLS, events))
    assert [(c["kind"], c["call_id"], c["name"], c["arguments"]) for c in committed(emits)] == [
        ("computer_call", "call_cu", "computer",
         {"action": COMPUTER["action"], "pending_safety_checks": []}),
        ("local_shell_call", "call_sh", "local_shell", {"action": SHELL["action"]}),
        ("mcp_approval_request", "mcpr_1", "create_short_url",
         {"server_label": "zip1", "name": "create_short_url",
          "arguments": APPROVAL["arguments"]})]
    [final] = finals(emits)
    assert final["message"]["output"] == [COMPUTER, SHELL, APPROVAL]
    assert [o["kind"] for o in final["outcomes"]] == [
        "computer_call", "local_shell_call", "mcp_approval_request"]


def test_client_answered_items_without_their_tool_fail_unknown_tool() -> None:
    """The same items in a run that registered only a function tool (or an MCP server of
    another label): each fails ``unknown_tool`` with its kind; nothing commits."""
    tools = [responses_tool("weather", CITY), {"type": "mcp", "server_label": "other"}]
    events = [*responses_head(), *item_events(0, COMPUTER), *item_events(1, SHELL),
              *item_events(2, APPROVAL), responses_tail()]
    emits = run(responses_run("r1", tools, events))
    assert committed(emits) == []
    assert [(e["kind"], e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("computer_call", "call_cu", "unknown_tool"), ("local_shell_call", "call_sh",
                                                       "unknown_tool"),
        ("mcp_approval_request", "mcpr_1", "unknown_tool")]


def test_a_function_tool_named_like_a_kind_registers_no_item() -> None:
    """A function tool named ``computer_call`` registers that function, not computer use."""
    events = [*responses_head(), *item_events(0, COMPUTER), responses_tail()]
    emits = run(responses_run("r1", [responses_tool("computer_call", {})], events))
    assert [e["reason"] for e in errors(emits)] == ["unknown_tool"]


# -- Responses: custom tool calls -------------------------------------------------------------


CUSTOM_TOOL = {"type": "custom", "name": "code_exec", "description": "runs code",
               "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}


def custom_events(index: int, call_id: str, name: str, text: str) -> list[dict[str, Any]]:
    """A ``custom_tool_call`` as the Responses API streams it (openai-python
    ``ResponseCustomToolCall``, ``ResponseCustomToolCallInputDeltaEvent`` / ``DoneEvent``)."""
    item = {"type": "custom_tool_call", "id": f"ctc_{index}", "call_id": call_id,
            "name": name, "input": ""}
    where = {"item_id": f"ctc_{index}", "output_index": index}
    return [{"type": "response.output_item.added", "output_index": index, "item": item},
            *({"type": "response.custom_tool_call_input.delta", **where, "delta": text[i:i + 5]}
              for i in range(0, len(text), 5)),
            {"type": "response.custom_tool_call_input.done", **where, "input": text},
            {"type": "response.output_item.done", "output_index": index,
             "item": {**item, "input": text, "status": "completed"}}]


def test_custom_call_commits_its_input_as_text() -> None:
    """A ``custom_tool_call`` to a registered custom tool commits with ``kind: custom`` and
    ``input``: the text exactly as streamed, never parsed (this one is not JSON), and no
    ``arguments``. The grammar format is not enforced. The final message's item carries the
    input."""
    code = 'print("hi")\nimport os; os.listdir(".")'
    events = [*responses_head(), *custom_events(0, "call_c", "code_exec", code),
              responses_tail()]
    emits = run(responses_run("r1", [CUSTOM_TOOL], events))
    [call] = committed(emits)
    assert (call["kind"], call["call_id"], call["name"], call["input"]) == (
        "custom", "call_c", "code_exec", code)
    assert "arguments" not in call
    [final] = finals(emits)
    assert final["message"]["output"][0]["input"] == code
    assert final["message"]["output"][0]["call_id"] == "call_c"


def test_custom_call_to_an_unregistered_custom_tool_fails() -> None:
    """A custom call whose name is registered only as a function tool fails ``unknown_tool``
    (a function registration does not allow free-form input), its error never quoting the
    input."""
    events = [*responses_head(), *custom_events(0, "call_c", "code_exec", "rm -rf /x"),
              responses_tail()]
    emits = run(responses_run("r1", [responses_tool("code_exec", {})], events))
    [error] = errors(emits)
    assert (error["kind"], error["reason"]) == ("custom", "unknown_tool")
    assert "rm -rf" not in error["content"]


def test_custom_call_input_over_the_byte_limit_fails() -> None:
    """The argument byte limit holds for free-form input too."""
    events = [*responses_head(), *custom_events(0, "call_c", "code_exec", "x" * 100),
              responses_tail()]
    emits = run(responses_run("r1", [CUSTOM_TOOL], events), max_tool_argument_bytes=64)
    assert [e["reason"] for e in errors(emits)] == ["arguments_exceed_max_bytes"]


def test_function_call_records_have_no_kind() -> None:
    """Function calls' records are as they were before kinds: no ``kind``, no ``input``."""
    events = [*responses_head(), *responses_call(0, "call_f", "weather", '{"city": "X"}'),
              responses_tail()]
    emits = run(responses_run("r1", [responses_tool("weather", CITY)], events))
    [call] = committed(emits)
    assert "kind" not in call and "input" not in call
    assert "kind" not in finals(emits)[0]["outcomes"][0]
