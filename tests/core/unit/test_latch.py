"""``core/latch.py``, the completion latch: what it decides of each complete call, one class per
rule or reason it holds the core to. A call commits only when its text is strict JSON, an
object (``{}`` when empty), valid against its registered tool's schema, not stopped by the
provider (``truncated``, ``content_filtered``, ``turn_paused``, ``malformed_output``), named by
one registered tool of a known toolset, within the run's budget and an output record's size, and
allowed by the policy; every other call fails with its reason.

Moved out of test_rules.py (issue 35, item 5), whose helpers these share, and whose
``TestEveryReason`` still finds a class per reason here. Each test feeds hand-made envelope
sequences (``tests/builders.py``) through ``Assembler.feed_record`` exactly as the worker does.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import orjson
import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    EMPTY_SCHEMA,
    GEMINI,
    PATH_SCHEMA,
    RESPONSES,
    anthropic_calls,
    anthropic_message_start,
    anthropic_run,
    anthropic_tail,
    anthropic_text_block,
    anthropic_tool,
    anthropic_tool_block,
    bedrock_calls,
    chat_call_chunks,
    chat_calls,
    chat_chunk,
    chat_run,
    chat_tool,
    chat_tool_delta,
    check_outputs,
    committed,
    errors,
    feed,
    finals,
    gemini_calls,
    provider_run,
    reasons,
    responses_calls,
    run_envelopes,
    tools_for,
)
from test_rules import (
    SCENARIOS,
    SECRET,
    TOOLS,
    assembler,
    each_provider,
    fill,
    only_error,
    run_calls,
    truncated_run,
)

from worker.core import Reason
from worker.core.settings import MAX_RECORD_BYTES


class TestRule1OpaqueStrictArguments:
    """Rule 1: fragments are concatenated, never parsed; no leniency; duplicate keys fail."""

    @each_provider
    @pytest.mark.parametrize("pieces", [1, 2, 7, 1000])
    def test_fragments_are_concatenated_however_they_are_cut(self, provider: str,
                                                             pieces: int) -> None:
        """The committed value is the parse of the concatenated fragments, whatever the cut,
        including cuts inside strings, escapes and multibyte characters."""
        text = '{"path": "/tmp/\\"q\\" \\u00e9 \u00e9\u6f22 {[}]"}'
        emits = feed(assembler(), provider_run(provider, "r1", TOOLS,
                                               [("call_1", "read_file", text)], pieces=pieces))
        [call] = committed(emits)
        assert call["arguments"] == json.loads(text)

    @each_provider
    def test_text_is_parsed_once_and_only_at_completion(self, provider: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
        """No fragment is parsed while the call streams: the argument text is parsed once per
        call, whole, only when the completion event arrives. (The spy is orjson's ``loads``,
        which the strict parser looks up at each call, compiled or not; records reach it as
        bytes, argument text as a string.)"""
        seen: list[str] = []
        real = orjson.loads

        def spy(text: Any) -> Any:
            if isinstance(text, str):
                seen.append(text)
            return real(text)

        monkeypatch.setattr(orjson, "loads", spy)
        text = '{"path": "/tmp/a"}'
        envs = provider_run(provider, "r1", TOOLS, [("call_1", "read_file", text)], pieces=5)
        asm = assembler()
        end = {CHAT: len(envs) - 1, ANTHROPIC: len(envs) - 2, RESPONSES: len(envs) - 2}[provider]
        feed(asm, envs[:end])
        assert seen == []
        feed(asm, envs[end:])
        assert seen == [text]

    @each_provider
    def test_no_bracket_counting(self, provider: str) -> None:
        """A text whose brackets balance early but that goes on is one invalid text, not a
        complete object followed by noise, and brackets inside strings count for nothing."""
        emits = run_calls(provider, [("call_1", "read_file", '{"path": "a"} {"path": "b"}'),
                                     ("call_2", "read_file", '{"path": "}}]]{{"}')])
        assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
            ("call_1", "invalid_json")]
        assert [c["arguments"] for c in committed(emits)] == [{"path": "}}]]{{"}]

    @each_provider
    @pytest.mark.parametrize("text", [
        '{"path": "/tmp/a",}',
        '{"path": "/tmp/a"} // comment',
        '/* c */ {"path": "/tmp/a"}',
        '{"path": NaN}',
        '{"path": Infinity}',
        "{'path': '/tmp/a'}",
        '{path: "/tmp/a"}',
        '{"path": "/tmp/a"',
        '{"path": "/tm',
        '{"path": "/tmp/a"}}',
        '{"path": "\\x41"}',
        '{"path": 0x10}',
        '\ufeff{"path": "/tmp/a"}',
    ], ids=["trailing_comma", "line_comment", "block_comment", "nan", "infinity",
            "single_quotes", "unquoted_key", "missing_brace", "truncated_string",
            "extra_brace", "hex_escape", "hex_number", "bom"])
    def test_no_lenient_parse(self, provider: str, text: str) -> None:
        """Every lenient or repaired form fails ``invalid_json`` and is never committed."""
        error = only_error(run_calls(provider, [("call_1", "read_file", text)]))
        assert error["reason"] == "invalid_json"

    @each_provider
    @pytest.mark.parametrize("text", [
        '{"path": "/tmp/a", "path": "/etc/shadow"}',
        '{"path": "/tmp/a", "p\\u0061th": "/etc/shadow"}',
    ], ids=["plain", "escaped_equal"])
    def test_duplicate_keys_rejected(self, provider: str, text: str) -> None:
        """Two equal keys (also when spelled with an escape) fail ``invalid_json``: the
        validator and the runner could otherwise see different values."""
        error = only_error(run_calls(provider, [("call_1", "read_file", text)]))
        assert error["reason"] == "invalid_json"


class TestRule3EmptyArgumentsMeanEmptyObject:
    """Rule 3: missing or empty arguments are ``{}``, and then the schema decides."""

    @each_provider
    def test_empty_arguments_commit_as_empty_object(self, provider: str) -> None:
        """An empty argument text commits ``{}`` for a tool that takes no arguments."""
        [call] = committed(run_calls(provider, [("call_1", "noop", "")]))
        assert call["arguments"] == {}

    @each_provider
    def test_then_the_schema_decides(self, provider: str) -> None:
        """``{}`` is validated: a tool with a required property fails ``schema_invalid``."""
        error = only_error(run_calls(provider, [("call_1", "read_file", "")]))
        assert error["reason"] == "schema_invalid"
        assert "required" in error["content"]

    def test_chat_without_arguments_field(self) -> None:
        """A chat call whose chunks never carry ``function.arguments`` at all is ``{}``."""
        chunks = [chat_chunk([chat_tool_delta(0, "call_1", "noop", None)]),
                  chat_chunk(finish_reason="tool_calls")]
        emits = feed(assembler(), chat_run("r1", [chat_tool("noop", EMPTY_SCHEMA)], chunks))
        assert [c["arguments"] for c in committed(emits)] == [{}]

    def test_anthropic_complete_input_at_block_start(self) -> None:
        """An Anthropic block with its whole ``input`` at the start and no deltas uses it."""
        events = [anthropic_message_start(),
                  {"type": "content_block_start", "index": 0, "content_block": {
                      "type": "tool_use", "id": "toolu_1", "name": "read_file",
                      "input": {"path": "/a"}}},
                  {"type": "content_block_stop", "index": 0}, *anthropic_tail()]
        emits = feed(assembler(), anthropic_run("r1", [anthropic_tool("read_file", PATH_SCHEMA)],
                                                events))
        assert [c["arguments"] for c in committed(emits)] == [{"path": "/a"}]


class TestRule5Truncation:
    """Rule 5: truncation fails the message's calls with ``truncated``, even parseable ones."""

    @each_provider
    def test_truncation_fails_calls_whose_text_parses(self, provider: str) -> None:
        """Chat ``length``, Anthropic ``max_tokens``, Responses ``response.incomplete``:
        a valid, schema-conforming call still fails ``truncated``."""
        emits = feed(assembler(), truncated_run(provider))
        check_outputs(emits)
        error = only_error(emits)
        assert (error["tool_call_id"], error["reason"]) == ("call_1", "truncated")

    @each_provider
    def test_final_status_is_truncated(self, provider: str) -> None:
        """The run's final message says ``truncated`` (final-message schema: "the provider
        reported truncation"), for every provider."""
        [final] = finals(feed(assembler(), truncated_run(provider)))
        assert final["status"] == "truncated"

    def test_anthropic_context_window_exceeded_is_truncation(self) -> None:
        """Anthropic's ``model_context_window_exceeded`` stop reason also truncates."""
        events = anthropic_calls([("call_1", "read_file", '{"path": "/a"}')],
                                 stop_reason="model_context_window_exceeded")
        error = only_error(feed(assembler(), anthropic_run(
            "r1", tools_for(ANTHROPIC, TOOLS), events)))
        assert error["reason"] == "truncated"

    def test_chat_only_the_truncated_choice_fails(self) -> None:
        """With n=2, ``length`` on choice 1 fails choice 1's calls only."""
        chunks = (chat_call_chunks(0, "call_a", "read_file", '{"path": "/a"}', choice=0)
                  + chat_call_chunks(0, "call_b", "read_file", '{"path": "/b"}', choice=1)
                  + [chat_chunk(finish_reason="tool_calls", choice=0),
                     chat_chunk(finish_reason="length", choice=1)])
        emits = feed(assembler(), chat_run("r1", [chat_tool("read_file", PATH_SCHEMA)], chunks))
        assert [c["call_id"] for c in committed(emits)] == ["call_a"]
        assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
            ("call_b", "truncated")]

    def test_normal_stop_reasons_do_not_truncate(self) -> None:
        """``stop_reason: end_turn`` / ``tool_use`` and ``finish_reason: stop`` commit."""
        anth = anthropic_calls([("call_1", "read_file", '{"path": "/a"}')],
                               stop_reason="end_turn")
        chat = chat_calls([("call_1", "read_file", '{"path": "/a"}')], finish_reason="stop")
        for envs in (anthropic_run("r1", tools_for(ANTHROPIC, TOOLS), anth),
                     chat_run("r1", tools_for(CHAT, TOOLS), chat)):
            assert len(committed(feed(assembler(), envs))) == 1


class TestReasonInvalidJson:
    """``invalid_json``: the text is not strict JSON (see rule 1 for every lenient form)."""

    @each_provider
    @pytest.mark.parametrize("text", [
        '{"path": "/a",}', '{"path": "/a" /* c */}', '{"path": NaN}', "{'path': '/a'}",
        '{"path": "/a', '{"path": "/a", "path": "/b"}',
        '{"path": {"x": 1, "x": 2}}', '{"path": [{"k": 1, "k": 1}]}'],
        ids=["trailing_comma", "comment", "nan", "single_quotes", "truncated",
             "duplicate_key", "nested_duplicate_key", "duplicate_key_in_array"])
    def test_invalid_json(self, provider: str, text: str) -> None:
        """Each of these fails ``invalid_json`` with a content of positions and lengths."""
        error = only_error(run_calls(provider, [("call_1", "read_file", text)]))
        assert error["reason"] == "invalid_json"
        assert error["state"] == "failed"

    def test_content_gives_size_not_text(self) -> None:
        """The content reports the received byte count, never the text."""
        text = fill('{"path": "@",}')
        error = only_error(run_calls(CHAT, [("call_1", "read_file", text)]))
        assert f"{len(text)} bytes" in error["content"]
        assert SECRET not in error["content"]

    def test_same_key_in_sibling_objects_is_fine(self) -> None:
        """Equal keys in different objects are not duplicates."""
        schema = {"type": "object"}
        emits = run_calls(CHAT, [("c1", "any", '{"a": {"k": 1}, "b": {"k": 2}, "k": 3}')],
                          {"any": schema})
        assert [c["arguments"] for c in committed(emits)] == [
            {"a": {"k": 1}, "b": {"k": 2}, "k": 3}]


class TestReasonArgumentsNotObject:
    """``arguments_not_object``: the text is JSON but not an object."""

    @each_provider
    @pytest.mark.parametrize("text", ['["/a"]', '"/a"', "42", "true", "null"])
    def test_non_object_fails(self, provider: str, text: str) -> None:
        """A JSON array, string, number, boolean or null fails ``arguments_not_object``."""
        error = only_error(run_calls(provider, [("call_1", "any", text)], {"any": True}))
        assert error["reason"] == "arguments_not_object"

    def test_switch_off_lets_an_array_through(self) -> None:
        """With ``arguments_must_be_object: false`` an array that the schema accepts
        commits as an array."""
        emits = run_calls(CHAT, [("call_1", "any", '["/a", 1]')],
                          {"any": {"type": "array"}}, arguments_must_be_object=False)
        assert [c["arguments"] for c in committed(emits)] == [["/a", 1]]

    def test_switch_off_still_validates(self) -> None:
        """With the switch off the schema still decides: an array against an object schema
        fails ``schema_invalid``."""
        error = only_error(run_calls(CHAT, [("call_1", "read_file", '["/a"]')],
                                     arguments_must_be_object=False))
        assert error["reason"] == "schema_invalid"


class TestReasonMissingIdOrName:
    """``missing_id_or_name``: the provider never sent an id or a name."""

    BUFFER_KEY: ClassVar[dict[str, str]] = {CHAT: "0.0", ANTHROPIC: "0", RESPONSES: "0"}

    @each_provider
    def test_missing_id_falls_back_to_the_buffer_key(self, provider: str) -> None:
        """``tool_call_id`` is the buffer key when no id came; the name is kept."""
        error = only_error(run_calls(provider, [(None, "read_file", '{"path": "/a"}')]))
        assert error["reason"] == "missing_id_or_name"
        assert error["tool_call_id"] == self.BUFFER_KEY[provider]
        assert error["name"] == "read_file"
        assert error["idempotency_key"] == f"r1:{self.BUFFER_KEY[provider]}"

    @each_provider
    def test_missing_name_is_unknown(self, provider: str) -> None:
        """A call with an id but no name fails, named ``"unknown"``."""
        error = only_error(run_calls(provider, [("call_1", None, '{"path": "/a"}')]))
        assert (error["reason"], error["tool_call_id"], error["name"]) == (
            "missing_id_or_name", "call_1", "unknown")

    @each_provider
    def test_empty_strings_are_missing(self, provider: str) -> None:
        """``""`` for id and name is the same as no id and no name."""
        error = only_error(run_calls(provider, [("", "", '{"path": "/a"}')]))
        assert (error["reason"], error["name"]) == ("missing_id_or_name", "unknown")
        assert error["tool_call_id"] == self.BUFFER_KEY[provider]


class TestReasonUnknownToolset:
    """``unknown_toolset``: the run names a registry toolset version its lookup does not give
    (worker/runtime/governance/registry.py: not registered within ``registry.wait_s``)."""

    def test_every_call_fails_and_a_known_version_commits(self) -> None:
        """Without the version every call fails ``unknown_toolset`` (one error result per call
        id); the lookup is asked with the run.start's record time, and a version it gives
        supplies the run's tools."""
        asked: list[tuple[str, int, int]] = []
        tools = tools_for(CHAT, {"read_file": {"type": "object"}})
        latch = assembler()
        latch.toolsets = lambda n, v, at: asked.append((n, v, at)) or (tools if v == 1 else None)
        for version, reason in ((2, "unknown_toolset"), (1, None)):
            envs = chat_run(f"r{version}", {"toolset": "files", "version": version},  # type: ignore[arg-type]
                            chat_calls([("c1", "read_file", "{}"), ("c2", "read_file", "{}")]))
            emits = feed(latch, envs)
            assert reasons(emits) == ([reason, reason] if reason else [])
        assert [(n, v) for n, v, _ in asked] == [("files", 2), ("files", 1)]


class TestReasonUnknownTool:
    """``unknown_tool``: the name is not a client tool of the run."""

    @each_provider
    def test_unregistered_name_fails(self, provider: str) -> None:
        """A call to a tool that ``run.start`` did not list fails ``unknown_tool``."""
        error = only_error(run_calls(provider, [("call_1", "rm_rf", "{}")]))
        assert (error["reason"], error["name"]) == ("unknown_tool", "rm_rf")

    def test_run_without_tools(self) -> None:
        """A run whose ``run.start`` lists no tools commits nothing."""
        emits = feed(assembler(), chat_run("r1", [], chat_calls([("c1", "noop", "{}")])))
        assert reasons(emits) == ["unknown_tool"]

    def test_tools_are_per_run(self) -> None:
        """A tool registered by another run is not a tool of this run."""
        asm = assembler()
        feed(asm, provider_run(CHAT, "r1", {"noop": EMPTY_SCHEMA}, [("c1", "noop", "{}")]))
        emits = feed(asm, provider_run(CHAT, "r2", {"other": EMPTY_SCHEMA},
                                       [("c1", "noop", "{}")]))
        assert reasons(emits) == ["unknown_tool"]


class TestReasonSchemaInvalid:
    """``schema_invalid``: the value breaks the tool's JSON Schema."""

    SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object", "additionalProperties": False, "required": ["path"],
        "properties": {"path": {"type": "string", "pattern": "^/"},
                       "mode": {"enum": ["r", "w"]}}}

    @each_provider
    @pytest.mark.parametrize("value, keyword, path", [
        ({"path": SECRET}, "pattern", "/properties/path/pattern"),
        ({"path": 5, "note": SECRET}, None, None),
        ({"mode": SECRET}, None, None),
        ({"path": "/a", "mode": SECRET}, "enum", "/properties/mode/enum"),
        ({"path": "/a", SECRET: 1}, "additionalProperties", "/additionalProperties"),
    ], ids=["pattern", "type_and_extra", "required", "enum", "additional"])
    def test_content_has_path_and_keyword_never_the_value(self, provider: str, value: Any,
                                                          keyword: str | None,
                                                          path: str | None) -> None:
        """The content names the schema keyword and schema path of the violation, and never
        the value, which may be a secret."""
        emits = run_calls(provider, [("call_1", "read_file", orjson.dumps(value).decode())],
                          {"read_file": self.SCHEMA})
        error = only_error(emits)
        assert error["reason"] == "schema_invalid"
        assert "keyword '" in error["content"] and "schema path /" in error["content"]
        if keyword is not None:
            assert f"keyword '{keyword}'" in error["content"]
            assert f"schema path {path}" in error["content"]
        assert SECRET not in orjson.dumps(error).decode()

    def test_valid_value_commits(self) -> None:
        """The same schema lets a conforming value through."""
        emits = run_calls(CHAT, [("c1", "read_file", '{"path": "/a", "mode": "r"}')],
                          {"read_file": self.SCHEMA})
        assert len(committed(emits)) == 1


class TestReasonBudgetExceeded:
    """``budget_exceeded``: the run committed as many calls as it may."""

    @each_provider
    def test_calls_past_the_budget_fail(self, provider: str) -> None:
        """With ``max_tool_calls_per_run: 2`` the third valid call fails."""
        calls = [(f"call_{i}", "read_file", fill('{"path": "/@"}', i)) for i in range(3)]
        emits = run_calls(provider, calls, max_tool_calls_per_run=2)
        assert [c["call_id"] for c in committed(emits)] == ["call_0", "call_1"]
        assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
            ("call_2", "budget_exceeded")]

    def test_run_limit_lowers_the_budget(self) -> None:
        """A run's ``limits.max_tool_calls: 1`` lowers the configured budget of 16."""
        calls = [(f"call_{i}", "read_file", fill('{"path": "/@"}', i)) for i in range(3)]
        envs = provider_run(CHAT, "r1", TOOLS, calls, limits={"max_tool_calls": 1})
        emits = feed(assembler(), envs)
        assert len(committed(emits)) == 1
        assert reasons(emits) == ["budget_exceeded", "budget_exceeded"]

    def test_run_limit_never_raises_the_budget(self) -> None:
        """A run's ``limits.max_tool_calls: 10`` cannot raise a configured budget of 1."""
        calls = [(f"call_{i}", "read_file", fill('{"path": "/@"}', i)) for i in range(3)]
        envs = provider_run(CHAT, "r1", TOOLS, calls, limits={"max_tool_calls": 10})
        emits = feed(assembler(max_tool_calls_per_run=1), envs)
        assert len(committed(emits)) == 1

    def test_run_limit_zero(self) -> None:
        """``limits.max_tool_calls: 0`` commits nothing."""
        envs = provider_run(CHAT, "r1", TOOLS, [("c1", "noop", "{}")],
                            limits={"max_tool_calls": 0})
        assert reasons(feed(assembler(), envs)) == ["budget_exceeded"]

    def test_failed_calls_do_not_use_the_budget(self) -> None:
        """The budget counts calls at enqueue (committed), not failed ones."""
        calls = [("call_0", "read_file", "{bad"), ("call_1", "read_file", '{"path": "/1"}'),
                 ("call_2", "read_file", '{"path": "/2"}')]
        emits = run_calls(CHAT, calls, max_tool_calls_per_run=2)
        assert [c["call_id"] for c in committed(emits)] == ["call_1", "call_2"]

    def test_early_commits_use_the_budget(self) -> None:
        """Calls committed early at their block's end count against the budget."""
        calls = [(f"toolu_{i}", "read_file", fill('{"path": "/@"}', i)) for i in range(2)]
        emits = run_calls(ANTHROPIC, calls, max_tool_calls_per_run=1,
                          execute_before_stream_end=True, allow_pipelined_execute=("read_file",))
        assert [c["call_id"] for c in committed(emits)] == ["toolu_0"]
        assert reasons(emits) == ["budget_exceeded"]


class TestReasonTruncated:
    """``truncated``: each provider's truncation signal (rule 5 holds the details)."""

    @each_provider
    def test_each_provider_signal(self, provider: str) -> None:
        """Chat ``finish_reason: length``, Anthropic ``stop_reason: max_tokens`` and
        Responses ``response.incomplete`` each fail a parseable call ``truncated``."""
        assert reasons(feed(assembler(), truncated_run(provider))) == ["truncated"]

    @each_provider
    def test_truncated_wins_over_invalid_json(self, provider: str) -> None:
        """A truncated message's broken text reports the cause, ``truncated``."""
        emits = feed(assembler(), truncated_run(provider, '{"path": "/a'))
        assert reasons(emits) == ["truncated"]


class TestReasonContentFiltered:
    """``content_filtered``: the provider stopped the message for its content."""

    @pytest.mark.parametrize(("provider", "events"), [
        (BEDROCK, bedrock_calls([("c1", "read_file", '{"path": "/a"}')],
                                stop_reason="guardrail_intervened")),
        (GEMINI, gemini_calls([("c1", "read_file", '{"path": "/a"}')], finish_reason="SAFETY")),
    ], ids=[BEDROCK, GEMINI])
    def test_a_filtering_stop_fails_a_complete_call(self, provider: str,
                                                    events: list[dict[str, Any]]) -> None:
        """A call whose arguments are complete and valid still fails when the provider
        stopped the message for its content; the run fails."""
        emits = feed(assembler(), run_envelopes("r1", provider, tools_for(provider, TOOLS),
                                                events))
        assert reasons(emits) == ["content_filtered"]
        assert finals(emits)[0]["status"] == "failed"


    @pytest.mark.parametrize(("provider", "events"), [
        (CHAT, chat_calls([("c1", "read_file", '{"path": "/a"}')],
                          finish_reason="content_filter")),
        (ANTHROPIC, anthropic_calls([("c1", "read_file", '{"path": "/a"}')],
                                    stop_reason="refusal")),
        (RESPONSES, [*responses_calls([("c1", "read_file", '{"path": "/a"}')], terminal=None),
                     {"type": "response.incomplete", "response": {
                         "id": "resp_1", "status": "incomplete", "output": [],
                         "incomplete_details": {"reason": "content_filter"}}}]),
    ], ids=[CHAT, ANTHROPIC, RESPONSES])
    def test_a_content_stop_fails_a_complete_call(self, provider: str,
                                                  events: list[dict[str, Any]]) -> None:
        """Issue 33: Chat ``finish_reason: content_filter``, Anthropic ``stop_reason:
        refusal`` and Responses ``incomplete_details.reason: content_filter`` after a call
        whose arguments are complete and valid: it fails ``content_filtered`` (it committed
        before), and the run fails."""
        emits = feed(assembler(), run_envelopes("r1", provider, tools_for(provider, TOOLS),
                                                events))
        check_outputs(emits)
        assert reasons(emits) == ["content_filtered"] and not committed(emits)
        assert finals(emits)[0]["status"] == "failed"


class TestReasonTurnPaused:
    """``turn_paused``: the provider paused the turn (Anthropic ``pause_turn``)."""

    def test_a_paused_turn_fails_its_client_calls_and_leaves_them_out(self) -> None:
        """A complete, valid client call in a message that ends ``pause_turn`` is not run: it
        fails ``turn_paused`` with ``dropped: true``, and the final message (status
        ``completed``, stop_reason ``pause_turn``) leaves its block out, so that it can be sent
        back as it is for the turn to go on."""
        emits = feed(assembler(), anthropic_run("r1", tools_for(ANTHROPIC, TOOLS), [
            anthropic_message_start(), *anthropic_text_block(0, "looking"),
            *anthropic_tool_block(1, "c1", "read_file", '{"path": "/a"}'),
            *anthropic_tail("pause_turn")]))
        check_outputs(emits)
        [error] = errors(emits)
        assert (error["reason"], error.get("dropped")) == ("turn_paused", True)
        [final] = finals(emits)
        assert final["status"] == "completed"
        assert final["message"]["stop_reason"] == "pause_turn"
        assert [b["type"] for b in final["message"]["content"]] == ["text"]
        assert final["outcomes"][0]["dropped"] is True


class TestReasonMalformedOutput:
    """``malformed_output``: the provider found the model's output or call malformed."""

    @pytest.mark.parametrize(("provider", "events"), [
        (BEDROCK, bedrock_calls([("c1", "read_file", '{"path": "/a"}')],
                                stop_reason="malformed_tool_use")),
        (GEMINI, gemini_calls([("c1", "read_file", '{"path": "/a"}')],
                              finish_reason="MALFORMED_FUNCTION_CALL")),
    ], ids=[BEDROCK, GEMINI])
    def test_a_malformed_stop_fails_a_complete_call(self, provider: str,
                                                    events: list[dict[str, Any]]) -> None:
        """A provider's own verdict that the output was malformed fails the call, even when
        the text Latch holds parses and fits the schema."""
        emits = feed(assembler(), run_envelopes("r1", provider, tools_for(provider, TOOLS),
                                                events))
        assert reasons(emits) == ["malformed_output"]


class TestReasonRecordTooLarge:
    """``record_too_large``: a record Latch would emit for the call (or its run's final
    message) is larger than an output record may be (the full set: ``test_record_bounds.py``).
    """

    def test_a_committed_call_over_the_record_size_fails(self) -> None:
        """17.5 MB of argument text of numbers written short (``1e15``), which the committed
        call writes in full (``1000000000000000.0``): 66 MB, over the 63 MiB a record may take.
        The call fails ``record_too_large`` (its error result small); the run completes and its
        final message, which shows the text as sent, fits."""
        settings, envs = SCENARIOS[Reason.RECORD_TOO_LARGE]
        emits = feed(assembler(**settings), envs)
        assert committed(emits) == [] and reasons(emits) == ["record_too_large"]
        assert finals(emits)[0]["status"] == "completed"
        assert max(len(orjson.dumps(e.value)) for e in emits) <= MAX_RECORD_BYTES


class TestReasonPolicyDenied:
    """``policy_denied``: the run's policy, in ``enforce`` mode, does not allow the call
    (issue 25; the policy step itself: ``test_policy_step.py``)."""

    def test_a_forbidden_call_fails_naming_the_policy(self) -> None:
        """A schema-valid call that the policy forbids fails ``policy_denied``; its error names
        the determining policy and never the arguments; the run completes."""
        settings, envs = SCENARIOS[Reason.POLICY_DENIED]
        emits = feed(assembler(**settings), envs)
        check_outputs(emits)
        assert committed(emits) == [] and reasons(emits) == ["policy_denied"]
        (error,) = errors(emits)
        assert "no-reads" in error["content"] and SECRET not in error["content"]
        assert finals(emits)[0]["status"] == "completed"


class TestReasonToolsetRequired:
    """``toolset_required``: the run's tenant is in ``require_toolsets_for`` and its run.start
    carried inline tools (more in test_toolset_required.py)."""

    def test_every_call_of_a_listed_tenant_with_inline_tools_fails(self) -> None:
        """Every call fails ``toolset_required``; the same run of another tenant commits."""
        envs = chat_run("r1", tools_for(CHAT, TOOLS),
                        chat_calls([("c1", "read_file", '{"path": "/a"}'),
                                    ("c2", "read_file", '{"path": "/b"}')]))
        assert reasons(feed(assembler(require_toolsets_for=("t1",)), envs)) == [
            "toolset_required", "toolset_required"]
        assert reasons(feed(assembler(require_toolsets_for=("t2",)), envs)) == []


class TestReasonAmbiguousTool:
    """``ambiguous_tool``: two of the run's tools would share the call's name
    (tests/core/unit/test_identity.py has each way to get there)."""

    def test_a_name_declared_twice_is_refused_and_the_others_commit(self) -> None:
        """``read_file`` declared twice: its call fails, not checked against either schema;
        a call of the run's other tool commits."""
        settings, envs = SCENARIOS[Reason.AMBIGUOUS_TOOL]
        emits = feed(assembler(**settings), envs)
        check_outputs(emits)
        assert reasons(emits) == ["ambiguous_tool"]
        tools = tools_for(CHAT, {**TOOLS, "other": {}}) + tools_for(CHAT, {"read_file": {}})
        emits = feed(assembler(), chat_run("r1", tools, chat_calls(
            [("c1", "read_file", "{}"), ("c2", "other", "{}")])))
        assert reasons(emits) == ["ambiguous_tool"]
        assert [c["call_id"] for c in committed(emits)] == ["c2"]
