"""Every input one meaning (issue 23, items 2, 4 and 6).

* Arguments that arrive already parsed (Anthropic ``tool_use.input``, a chat call whose
  ``function.arguments`` is an object, Gemini ``functionCall.args`` and ``partialArgs``, the
  fields of a Responses ``computer_call``) obey the rules of argument text: a repeated key,
  an integer beyond 64 bits or nesting deeper than 64 levels fails the call ``invalid_json``,
  as the same arguments sent as a string do, instead of committing orjson's last-wins,
  rounded reading of the record.
* An index is an integer >= 0 at every event of every adapter: ``true``, ``1.0``, ``"1"`` or
  ``-1`` is no index 1, and the event goes to the DLQ (``invalid_envelope``).
* Responses: an argument delta for an item of another type than the one added is a protocol
  break. Bedrock: an exception member beside a delta ends the stream as an error (an event
  stream ``exception`` message: tests/tools/unit/test_eventstream.py).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    GEMINI,
    PATH_SCHEMA,
    RESPONSES,
    anthropic_message_start,
    anthropic_tail,
    anthropic_tool_block,
    bedrock_tool_block,
    chat_chunk,
    chat_tool_delta,
    check_outputs,
    check_schemas,
    committed,
    dlq,
    errors,
    feed,
    finals,
    gemini_chunk,
    responses_call,
    responses_head,
    responses_item,
    responses_tail,
    run_envelopes,
    tools_for,
)

from worker.core import Assembler, Emit, strictjson
from worker.core import ops as op
from worker.core.providers.openai_responses import OpenAIResponses

#: A member name that each test's raw bytes rename, so that one object holds a key twice.
DUP = "DUPLICATE_KEY_MARKER"
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def records(provider: str, tools: list[Any], events: list[dict[str, Any]],
            rename: bytes | None = None) -> list[bytes]:
    """The run's envelopes as bytes; with ``rename``, :data:`DUP` becomes that key in them."""
    raw = [orjson.dumps(env) for env in run_envelopes("r1", provider, tools, events)]
    if rename is not None:
        raw = [r.replace(f'"{DUP}"'.encode(), b'"' + rename + b'"') for r in raw]
    return raw


def run(raw: list[bytes]) -> list[Emit]:
    emits = feed(Assembler(), raw)
    check_schemas(emits)
    check_outputs(emits)
    return emits


def outcome(emits: list[Emit]) -> tuple[str, Any]:
    """The one call's outcome: ``("committed", its arguments)`` or ``(reason, detail)``."""
    done = committed(emits)
    if done:
        return "committed", done[0]["arguments"]
    [error] = errors(emits)
    return error["reason"], error["content"]


# -- item 2: arguments that arrive parsed ------------------------------------------------------


def anthropic_input(args: Any) -> list[dict[str, Any]]:
    block = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": args}
    return [anthropic_message_start(),
            {"type": "content_block_start", "index": 0, "content_block": block},
            {"type": "content_block_stop", "index": 0}, *anthropic_tail()]


def chat_object(args: Any) -> list[dict[str, Any]]:
    entry = {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "f", "arguments": args}}
    return [chat_chunk([entry]), chat_chunk(finish_reason="tool_calls")]


def gemini_args(args: Any) -> list[dict[str, Any]]:
    return [gemini_chunk([{"functionCall": {"name": "f", "args": args, "id": "g1"}}],
                         finish_reason="STOP")]


def gemini_partial(args: dict[str, Any]) -> list[dict[str, Any]]:
    """``args`` streamed as one ``partialArgs`` element per member, whose value is a string
    (the :data:`DUP` member: a second ``stringValue`` of the element before it)."""
    partial: list[dict[str, Any]] = []
    for key, value in args.items():
        if key == DUP:
            partial[-1][DUP] = value
        else:
            partial.append({"jsonPath": f"$.{key}", "stringValue": value})
    return [gemini_chunk([{"functionCall": {"name": "f", "willContinue": True, "id": "g1"}}]),
            gemini_chunk([{"functionCall": {"partialArgs": partial}}]),
            gemini_chunk([], finish_reason="STOP")]


SHAPES = {ANTHROPIC: anthropic_input, CHAT: chat_object, f"{GEMINI}/args": gemini_args,
          f"{GEMINI}/partialArgs": gemini_partial}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_repeated_key_in_parsed_arguments_fails_invalid_json(shape: str) -> None:
    """``{"path": "/tmp/x", "path": "/etc/passwd"}`` as a parsed value fails the call
    ``invalid_json`` (on main it committed ``/etc/passwd``, orjson's last-wins reading, where a
    first-key-wins reader of the topic sees ``/tmp/x``); the same value without the repeat
    commits. (For ``partialArgs`` the repeat is a second ``stringValue``.)"""
    provider = shape.split("/")[0]
    tools = tools_for(provider, {"f": PATH_SCHEMA})
    events = SHAPES[shape]({"path": "/tmp/x", DUP: "/etc/passwd"})
    rename = b"stringValue" if shape.endswith("partialArgs") else b"path"
    reason, detail = outcome(run(records(provider, tools, events, rename)))
    assert reason == "invalid_json"
    assert "duplicate object key" in detail and "/etc/passwd" not in detail
    clean = SHAPES[shape]({"path": "/tmp/x"})
    assert outcome(run(records(provider, tools, clean))) == ("committed", {"path": "/tmp/x"})


def test_the_same_repeat_as_text_fails_the_same_way() -> None:
    """The rule the parsed shapes now follow: the repeat in argument text fails
    ``invalid_json`` with the same message (main already did this)."""
    tools = tools_for(CHAT, {"f": PATH_SCHEMA})
    text = '{"path":"/tmp/x","path":"/etc/passwd"}'
    reason, detail = outcome(run(records(CHAT, tools, chat_object(text))))
    assert reason == "invalid_json" and "duplicate object key" in detail


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_an_integer_beyond_64_bits_in_parsed_arguments_fails_invalid_json(shape: str) -> None:
    """orjson reads ``18446744073709551616`` as the float ``1.8446744073709552e+19``: parsed
    arguments holding it fail ``invalid_json`` (on main they committed the rounded float), as
    the text does."""
    provider = shape.split("/")[0]
    tools = tools_for(provider, {"f": ANY_OBJECT})
    if shape.endswith("partialArgs"):
        events = gemini_partial({"path": "/tmp/x"})
        events[1]["candidates"][0]["content"]["parts"][0]["functionCall"]["partialArgs"].append(
            {"jsonPath": "$.n", "numberValue": 123456789})
        raw = [r.replace(b"123456789", b"18446744073709551616")
               for r in records(provider, tools, events)]
    else:
        raw = [r.replace(b"123456789", b"18446744073709551616")
               for r in records(provider, tools, SHAPES[shape]({"n": 123456789}))]
    reason, detail = outcome(run(raw))
    assert reason == "invalid_json" and "beyond 64 bits" in detail


def test_parsed_arguments_nested_too_deep_fail_invalid_json_at_any_depth() -> None:
    """A chat object nested 70 levels fails ``invalid_json`` (as text does); one nested 300
    levels too (on main orjson could not write it back, and the event went to the DLQ while
    the same text fails ``invalid_json``)."""
    tools = tools_for(CHAT, {"f": ANY_OBJECT})
    for depth in (70, 300):
        nested = b'{"a":' * (depth - 1) + b"{}" + b"}" * (depth - 1)
        emits = run([r.replace(b'"NESTED"', nested)
                     for r in records(CHAT, tools, chat_object({"n": "NESTED"}))])
        assert dlq(emits) == []
        reason, detail = outcome(emits)
        assert (reason, detail) == ("invalid_json", "invalid_json: arrays and objects nested "
                                    "deeper than 64 levels")


def test_a_repeated_key_elsewhere_in_the_carrying_event_fails_the_call_too() -> None:
    """The record that carries parsed arguments is read with one meaning as a whole: a
    repeated key beside the arguments (here in the block) fails the call ``invalid_json``."""
    tools = tools_for(ANTHROPIC, {"f": PATH_SCHEMA})
    events = anthropic_input({"path": "/tmp/x"})
    events[1]["content_block"].update({"cache_hint": "a", DUP: "b"})
    reason, _ = outcome(run(records(ANTHROPIC, tools, events, rename=b"cache_hint")))
    assert reason == "invalid_json"


def test_streamed_deltas_replace_the_start_input_whatever_it_held() -> None:
    """An Anthropic block whose deltas stream takes its text from them: a repeat in the
    start's ``input`` (which is then not used) does not fail the call."""
    tools = tools_for(ANTHROPIC, {"f": PATH_SCHEMA})
    events = [anthropic_message_start(),
              *anthropic_tool_block(0, "toolu_1", "f", '{"path":"/tmp/y"}'), *anthropic_tail()]
    events[1]["content_block"]["input"] = {"path": "/tmp/x", DUP: "/etc/passwd"}
    assert outcome(run(records(ANTHROPIC, tools, events, rename=b"path"))) == (
        "committed", {"path": "/tmp/y"})


def test_responses_client_item_fields_are_as_strict() -> None:
    """A ``computer_call``'s own fields are its arguments: from a record with a repeated key
    they are refused (``RefuseArgs``), from a clean one set as text."""
    item = {"type": "computer_call", "id": "cu_1", "call_id": "call_c", "status": "completed",
            "action": {"type": "click", "x": 1, DUP: 2}}
    adapter = OpenAIResponses()
    adapter.feed({"type": "response.output_item.added", "output_index": 0,
                  "item": {**item, "status": "in_progress"}})
    event = {"type": "response.output_item.done", "output_index": 0, "item": item}
    adapter.record = orjson.dumps({"event": event}).replace(f'"{DUP}"'.encode(), b'"x"')
    ops = adapter.feed(orjson.loads(adapter.record)["event"])
    assert [type(o) for o in ops] == [op.OpenCall, op.RefuseArgs, op.CloseCall]
    clean = OpenAIResponses()
    del item["action"][DUP]
    clean.feed({"type": "response.output_item.added", "output_index": 0, "item": item})
    clean.record = orjson.dumps({"event": {**event, "item": item}})
    ops = clean.feed({**event, "item": item})
    assert [type(o) for o in ops] == [op.OpenCall, op.SetArgs, op.CloseCall]
    assert ops[1].text == '{"action":{"type":"click","x":1}}'  # type: ignore[union-attr]


def test_one_meaning_reads_a_record_as_parse_reads_text() -> None:
    """``strictjson.one_meaning``: None for a record every reader reads alike (floats,
    escapes, big but 64-bit integers included); why not for a repeated key, an integer beyond
    64 bits, or nesting deeper than ``RECORD_MAX_DEPTH``."""
    assert strictjson.one_meaning(b'{"a":"x\\"y","b":[1.5,18446744073709551615,-1]}') is None
    assert strictjson.one_meaning('{"a":{"b":1,"b":1}}') is not None
    assert strictjson.one_meaning(b'{"a":18446744073709551616}') is not None
    deep = b"[" * (strictjson.RECORD_MAX_DEPTH + 1) + b"]" * (strictjson.RECORD_MAX_DEPTH + 1)
    assert strictjson.one_meaning(deep) is not None
    ok = b"[" * strictjson.RECORD_MAX_DEPTH + b"]" * strictjson.RECORD_MAX_DEPTH
    assert strictjson.one_meaning(ok) is None


# -- item 4: one reading of an index -------------------------------------------------------------

ODD_INDEXES = [True, 1.0, -1, "1"]


@pytest.mark.parametrize("odd", ODD_INDEXES, ids=repr)
def test_anthropic_delta_with_an_odd_index_is_refused(odd: Any) -> None:
    """A ``content_block_delta`` whose index is ``true``, ``1.0``, ``-1`` or ``"1"`` goes to
    the DLQ and adds nothing to block 1 (on main ``true`` and ``1.0`` were block 1, so the
    fragment was committed with it)."""
    tools = tools_for(ANTHROPIC, {"f": PATH_SCHEMA})
    block = anthropic_tool_block(1, "toolu_1", "f", '{"path":"/tmp/x"}', pieces=2)
    bogus = {"type": "content_block_delta", "index": odd,
             "delta": {"type": "input_json_delta", "partial_json": '"/etc/passwd"}'}}
    events = [anthropic_message_start(), *block[:2], bogus, *block[2:], *anthropic_tail()]
    emits = run(records(ANTHROPIC, tools, events))
    assert [d["reason"] for d in dlq(emits)] == ["invalid_envelope"]
    assert outcome(emits) == ("committed", {"path": "/tmp/x"})


@pytest.mark.parametrize("odd", ODD_INDEXES, ids=repr)
def test_anthropic_stop_with_an_odd_index_is_refused(odd: Any) -> None:
    """A ``content_block_stop`` whose index is not an integer >= 0 goes to the DLQ and stops
    no block (on main ``true`` and ``1.0`` stopped block 1, and its own stop then broke the
    protocol)."""
    tools = tools_for(ANTHROPIC, {"f": PATH_SCHEMA})
    block = anthropic_tool_block(1, "toolu_1", "f", '{"path":"/tmp/x"}')
    events = [anthropic_message_start(), *block[:-1], {"type": "content_block_stop",
                                                       "index": odd},
              block[-1], *anthropic_tail()]
    emits = run(records(ANTHROPIC, tools, events))
    assert [d["reason"] for d in dlq(emits)] == ["invalid_envelope"]
    assert outcome(emits) == ("committed", {"path": "/tmp/x"})
    assert finals(emits)[0]["status"] == "completed"


@pytest.mark.parametrize("odd", ODD_INDEXES, ids=repr)
def test_chat_tool_index_of_another_type_is_refused(odd: Any) -> None:
    """A chat continuation whose tool index is not an integer >= 0 goes to the DLQ (on main
    ``true`` or ``1.0`` was read as no index, and opened an id-less call)."""
    tools = tools_for(CHAT, {"f": PATH_SCHEMA})
    bogus = chat_tool_delta(0, arguments="x")
    bogus["index"] = odd
    events = [chat_chunk([chat_tool_delta(0, "call_1", "f", '{"path":"/tmp/x"}')]),
              chat_chunk([bogus]), chat_chunk(finish_reason="tool_calls")]
    emits = run(records(CHAT, tools, events))
    assert [d["reason"] for d in dlq(emits)] == ["invalid_envelope"]
    assert outcome(emits) == ("committed", {"path": "/tmp/x"})


@pytest.mark.parametrize("odd", ODD_INDEXES, ids=repr)
@pytest.mark.parametrize("kind", ["response.function_call_arguments.delta",
                                  "response.output_text.delta"])
def test_responses_output_index_of_another_type_is_refused(odd: Any, kind: str) -> None:
    """A Responses delta whose ``output_index`` is present but not an integer >= 0 goes to
    the DLQ, even with an ``item_id`` (on main it was read as absent, and the item id
    decided)."""
    tools = tools_for(RESPONSES, {"f": PATH_SCHEMA})
    call = responses_call(0, "call_a", "f", '{"path":"/tmp/x"}')
    bogus = {"type": kind, "output_index": odd, "item_id": "fc_0", "delta": "x"}
    events = [*responses_head(), call[0], bogus, *call[1:],
              responses_tail(output=[responses_item(0, "call_a", "f", '{"path":"/tmp/x"}')])]
    emits = run(records(RESPONSES, tools, events))
    assert [d["reason"] for d in dlq(emits)] == ["invalid_envelope"]
    assert outcome(emits) == ("committed", {"path": "/tmp/x"})


# -- item 6: protocol checks the docstrings promise -------------------------------------------


@pytest.mark.parametrize("added,delta", [
    ("function_call", "response.custom_tool_call_input.delta"),
    ("custom_tool_call", "response.function_call_arguments.delta"),
    ("function_call", "response.custom_tool_call_input.done"),
    ("custom_tool_call", "response.function_call_arguments.done"),
])
def test_responses_argument_event_for_another_item_type_is_a_break(added: str,
                                                                   delta: str) -> None:
    """An argument (input) event for an item added as the other type is a protocol break: the
    call fails ``protocol_error`` and the run ``failed`` (on main the fragment was
    appended)."""
    tools = [*tools_for(RESPONSES, {"f": ANY_OBJECT}),
             {"type": "custom", "name": "f"}]
    item: dict[str, Any] = {"type": added, "id": "it_0", "call_id": "call_a", "name": "f",
                            "status": "in_progress"}
    field = "delta" if delta.endswith(".delta") else (
        "input" if "custom" in delta else "arguments")
    events = [*responses_head(),
              {"type": "response.output_item.added", "output_index": 0, "item": item},
              {"type": delta, "output_index": 0, "item_id": "it_0", field: "{}"},
              responses_tail()]
    emits = run(records(RESPONSES, tools, events))
    assert outcome(emits)[0] == "protocol_error"
    assert dlq(emits) == [] and finals(emits)[0]["status"] == "failed"


def test_bedrock_exception_beside_a_delta_ends_the_stream() -> None:
    """``{"contentBlockDelta": ..., "throttlingException": ...}`` is the exception: the open
    call fails ``upstream_error`` and the run ``failed`` (on main the delta was read and the
    exception ignored)."""
    tools = tools_for(BEDROCK, {"f": PATH_SCHEMA})
    block = bedrock_tool_block(0, "tu_1", "f", '{"path":"/tmp/x"}')
    mixed = {**block[1], "throttlingException": {"message": "slow down"}}
    events = [{"messageStart": {"role": "assistant"}}, block[0], mixed, *block[2:],
              {"messageStop": {"stopReason": "tool_use"}}]
    emits = run(records(BEDROCK, tools, events))
    assert outcome(emits)[0] == "upstream_error"
    assert finals(emits)[0]["status"] == "failed"

