"""The contract's "Rules the latch enforces" (1-9) and every reason code, one class each; the
rules and reasons the latch itself decides (``core/latch.py``) are test_latch.py's.

Each test feeds hand-made envelope sequences (``tests/builders.py``) through
``Assembler.feed_record`` exactly as the worker does and asserts on the emitted records. A
test names the rule or reason it holds the core to; every assertion can fail.
"""

from __future__ import annotations

import base64
from collections import Counter
from typing import Any, ClassVar

import orjson
import pytest
from builders import (
    ANTHROPIC,
    BEDROCK,
    CHAT,
    EMPTY_SCHEMA,
    PATH_SCHEMA,
    PROVIDERS,
    RESPONSES,
    anthropic_calls,
    anthropic_message_start,
    anthropic_run,
    anthropic_tail,
    anthropic_text_block,
    anthropic_tool,
    anthropic_tool_block,
    bedrock_calls,
    cancel,
    chat_call_chunks,
    chat_calls,
    chat_chunk,
    chat_run,
    chat_tool,
    chat_tool_delta,
    check_outputs,
    committed,
    decision,
    dlq,
    errors,
    feed,
    finals,
    lines,
    outcome_ids,
    provider_calls,
    provider_run,
    reasons,
    responses_call,
    responses_calls,
    responses_head,
    responses_item,
    responses_run,
    responses_tail,
    responses_tool,
    run_envelopes,
    split,
    stream_end,
    stream_error,
    tick,
    tools_for,
)

from worker.core import Assembler, AssembleSettings, Emit, Reason, Topic
from worker.core.envelope import DECISIONS
from worker.core.policy import ENFORCE, PolicyDecision, PolicyRequest
from worker.core.settings import ApprovalSettings

SECRET = "hunter2-SECRET"


def fill(template: str, value: object = SECRET) -> str:
    """``template`` with every ``@`` replaced by ``value`` (the secret by default)."""
    return template.replace("@", str(value))

TOOLS = {"read_file": PATH_SCHEMA, "noop": EMPTY_SCHEMA}
each_provider = pytest.mark.parametrize("provider", PROVIDERS)


class Forbidding:
    """A policy in ``enforce`` mode that forbids every call (policy id ``no-reads``)."""

    mode = ENFORCE
    version = None

    def decide(self, request: PolicyRequest) -> PolicyDecision:
        return PolicyDecision(ENFORCE, False, ("no-reads",))


def assembler(**overrides: Any) -> Assembler:
    """An assembler with these settings; ``policy=`` sets its policy (``Assembler.policy``)."""
    policy = overrides.pop("policy", None)
    asm = Assembler(AssembleSettings(**overrides))
    asm.policy = policy
    return asm


def run_calls(provider: str, calls: list[tuple[str | None, str | None, str]],
              schemas: dict[str, Any] | None = None, **settings: Any) -> list[Emit]:
    """Feed one complete run of ``provider`` making ``calls``; check the output invariants."""
    emits = feed(assembler(**settings), provider_run(provider, "r1", schemas or TOOLS, calls))
    check_outputs(emits)
    return emits


def only_error(emits: list[Emit]) -> dict[str, Any]:
    """The one error result of a run that committed nothing."""
    assert committed(emits) == []
    [error] = errors(emits)
    return error


def feed_each(asm: Assembler, envelopes: list[dict[str, Any]]) -> list[list[Emit]]:
    """Feed envelopes one at a time; what each one emitted."""
    return [asm.feed_record(None, orjson.dumps(env)) for env in envelopes]


def first_position(per_envelope: list[list[Emit]], topic: Topic) -> int | None:
    """The position of the first envelope that emitted a record on ``topic``."""
    for position, emits in enumerate(per_envelope):
        if any(e.topic is topic for e in emits):
            return position
    return None


def position_of(envelopes: list[dict[str, Any]], predicate: Any) -> int:
    """The position of the first envelope whose provider event satisfies ``predicate``."""
    for position, env in enumerate(envelopes):
        if env.get("type") == "provider.event" and predicate(env["event"]):
            return position
    raise AssertionError("no such envelope")


def no_secret(emits: list[Emit]) -> None:
    """No error content, DLQ detail or progress record quotes the secret argument text."""
    for e in emits:
        if e.topic is Topic.ERRORS:
            assert SECRET not in e.value["content"]
            assert SECRET not in orjson.dumps(e.value).decode()
        if e.topic is Topic.DLQ:
            assert SECRET not in e.value["detail"]


# ===========================================================================================
# Rule 1: arguments are opaque text until the call is complete; strict JSON only.
# ===========================================================================================


# ===========================================================================================
# Rule 2: keys.
# ===========================================================================================


class TestRule2ChatKeys:
    """Rule 2 for chat: keyed by (choice index, tool index), ids and names never concatenated."""

    TOOLS: ClassVar[list[Any]] = [chat_tool("read_file", PATH_SCHEMA)]

    def test_keyed_by_choice_then_tool_index(self) -> None:
        """Two choices (n=2) that both use tool index 0 give two calls, each with its own
        choice's fragments, however the chunks interleave."""
        a = chat_call_chunks(0, "call_a", "read_file", '{"path": "/a"}', choice=0)
        b = chat_call_chunks(0, "call_b", "read_file", '{"path": "/b"}', choice=1)
        chunks = [x for pair in zip(a, b, strict=True) for x in pair]
        emits = feed(assembler(), chat_run("r1", self.TOOLS, chunks))
        got = {(c["call_id"], c["choice"], c["index"]): c["arguments"] for c in committed(emits)}
        assert got == {("call_a", 0, 0): {"path": "/a"}, ("call_b", 1, 0): {"path": "/b"}}

    def test_keyed_by_tool_index_not_array_position(self) -> None:
        """Entries are routed by their ``index`` field, not by their place in the array."""
        chunks = [
            chat_chunk([chat_tool_delta(1, "call_b", "read_file", ""),
                        chat_tool_delta(0, "call_a", "read_file", "")]),
            chat_chunk([chat_tool_delta(1, arguments='{"path": "/b"}'),
                        chat_tool_delta(0, arguments='{"path": "/a"}')]),
        ]
        emits = feed(assembler(), chat_run("r1", self.TOOLS, chunks))
        got = {c["call_id"]: (c["index"], c["arguments"]) for c in committed(emits)}
        assert got == {"call_a": (0, {"path": "/a"}), "call_b": (1, {"path": "/b"})}

    def test_not_keyed_by_last_id_seen(self) -> None:
        """A fragment for index 0 that arrives after index 1 was opened goes to index 0."""
        chunks = [
            chat_chunk([chat_tool_delta(0, "call_a", "read_file", '{"path": ')]),
            chat_chunk([chat_tool_delta(1, "call_b", "read_file", '{"path": "/b"}')]),
            chat_chunk([chat_tool_delta(0, arguments='"/a"}')]),
        ]
        emits = feed(assembler(), chat_run("r1", self.TOOLS, chunks))
        got = {c["call_id"]: c["arguments"] for c in committed(emits)}
        assert got == {"call_a": {"path": "/a"}, "call_b": {"path": "/b"}}

    def test_repeated_id_and_name_are_not_concatenated(self) -> None:
        """A gateway that repeats id and name on every chunk still yields id ``call_a`` and
        name ``read_file``, not ``call_acall_a`` / ``read_fileread_file``."""
        chunks = [chat_chunk([chat_tool_delta(0, "call_a", "read_file", part)])
                  for part in split('{"path": "/a"}', 4)]
        emits = feed(assembler(), chat_run("r1", self.TOOLS, chunks))
        [call] = committed(emits)
        assert (call["call_id"], call["name"]) == ("call_a", "read_file")
        assert call["arguments"] == {"path": "/a"}

    def test_empty_id_and_name_are_no_id(self) -> None:
        """``"id": ""`` and ``"name": ""`` on continuation chunks are absent, not a new call
        and not a rename."""
        chunks = [chat_chunk([chat_tool_delta(0, "call_a", "read_file", "")])]
        chunks += [chat_chunk([chat_tool_delta(0, "", "", part)])
                   for part in split('{"path": "/a"}', 3)]
        emits = feed(assembler(), chat_run("r1", self.TOOLS, chunks))
        [call] = committed(emits)
        assert (call["call_id"], call["name"], call["arguments"]) == (
            "call_a", "read_file", {"path": "/a"})
        assert errors(emits) == []

    def test_empty_id_alone_is_missing(self) -> None:
        """A call whose only id is ``""`` has no id: it fails ``missing_id_or_name``."""
        chunks = chat_call_chunks(0, "", "read_file", '{"path": "/a"}')
        error = only_error(feed(assembler(), chat_run("r1", self.TOOLS, chunks)))
        assert error["reason"] == "missing_id_or_name"
        assert error["tool_call_id"] != ""

    def test_new_id_at_used_index_opens_a_new_call(self) -> None:
        """A different non-empty id at an index already in use is a second call with its own
        text (a known gateway bug), not a rename of the first."""
        chunks = (chat_call_chunks(0, "call_a", "read_file", '{"path": "/a"}')
                  + chat_call_chunks(0, "call_b", "read_file", '{"path": "/b"}'))
        emits = feed(assembler(), chat_run("r1", self.TOOLS, chunks))
        check_outputs(emits)
        got = [(c["call_id"], c["arguments"]) for c in committed(emits)]
        assert got == [("call_a", {"path": "/a"}), ("call_b", {"path": "/b"})]

    def test_name_after_the_arguments_still_names_the_call(self) -> None:
        """A name that arrives after the first argument fragments names the call."""
        chunks = [
            chat_chunk([chat_tool_delta(0, "call_a", None, '{"path"')]),
            chat_chunk([chat_tool_delta(0, None, None, ': "/a"}')]),
            chat_chunk([chat_tool_delta(0, None, "read_file", None)]),
        ]
        emits = feed(assembler(), chat_run("r1", self.TOOLS, chunks))
        [call] = committed(emits)
        assert (call["name"], call["arguments"]) == ("read_file", {"path": "/a"})

    def test_id_after_the_arguments_still_identifies_the_call(self) -> None:
        """An id that arrives after the first fragments identifies the same call."""
        chunks = [
            chat_chunk([chat_tool_delta(0, None, "read_file", '{"path"')]),
            chat_chunk([chat_tool_delta(0, "call_a", None, ': "/a"}')]),
        ]
        emits = feed(assembler(), chat_run("r1", self.TOOLS, chunks))
        [call] = committed(emits)
        assert (call["call_id"], call["arguments"]) == ("call_a", {"path": "/a"})


class TestRule2AnthropicKeys:
    """Rule 2 for Anthropic: keyed by content block index."""

    TOOLS: ClassVar[list[Any]] = [anthropic_tool("read_file", PATH_SCHEMA)]

    def test_keyed_by_content_block_index(self) -> None:
        """Deltas of two open ``tool_use`` blocks that interleave go to their own block, and
        ``index`` is the content block index (a text block holds index 0)."""
        one = anthropic_tool_block(1, "toolu_1", "read_file", '{"path": "/one"}', pieces=4)
        two = anthropic_tool_block(2, "toolu_2", "read_file", '{"path": "/two"}', pieces=4)
        body = [one[0], two[0]]
        body += [x for pair in zip(one[1:-1], two[1:-1], strict=True) for x in pair]
        body += [two[-1], one[-1]]
        events = [anthropic_message_start(), *anthropic_text_block(0, "hi"), *body,
                  *anthropic_tail()]
        emits = feed(assembler(), anthropic_run("r1", self.TOOLS, events))
        got = [(c["call_id"], c["index"], c["arguments"]) for c in committed(emits)]
        assert got == [("toolu_1", 1, {"path": "/one"}), ("toolu_2", 2, {"path": "/two"})]

    def test_repeated_block_start_is_not_concatenated(self) -> None:
        """A ``content_block_start`` repeated for the same index (a proxy quirk) neither
        opens a second call nor concatenates the id or name."""
        block = anthropic_tool_block(0, "toolu_1", "read_file", '{"path": "/a"}')
        events = [anthropic_message_start(), block[0], block[1], block[0], *block[2:],
                  *anthropic_tail()]
        emits = feed(assembler(), anthropic_run("r1", self.TOOLS, events))
        assert [(c["call_id"], c["name"], c["arguments"]) for c in committed(emits)] == [
            ("toolu_1", "read_file", {"path": "/a"})]
        assert errors(emits) == []


class TestRule2ResponsesKeys:
    """Rule 2 for Responses: keyed by output_index / item id; committed with ``call_id``."""

    TOOLS: ClassVar[list[Any]] = [responses_tool("read_file", PATH_SCHEMA)]

    def test_committed_with_call_id_not_item_id(self) -> None:
        """The committed call carries ``call_id``, never the item id ``fc_...``; so does the
        final message's item."""
        events = responses_calls([("call_1", "read_file", '{"path": "/a"}')])
        emits = feed(assembler(), responses_run("r1", self.TOOLS, events))
        [call] = committed(emits)
        assert call["call_id"] == "call_1"
        assert call["idempotency_key"] == "r1:call_1"
        [final] = finals(emits)
        [item] = final["message"]["output"]
        assert (item["id"], item["call_id"]) == ("fc_0", "call_1")

    def test_deltas_keyed_by_output_index(self) -> None:
        """Argument deltas of two items that interleave go to their own ``output_index``."""
        a = responses_call(0, "call_a", "read_file", '{"path": "/a"}', pieces=4, done=False)
        b = responses_call(1, "call_b", "read_file", '{"path": "/b"}', pieces=4, done=False)
        body = [a[0], b[0], *(x for pair in zip(a[1:], b[1:], strict=True) for x in pair)]
        events = [*responses_head(), *body, responses_tail()]
        emits = feed(assembler(), responses_run("r1", self.TOOLS, events))
        got = [(c["call_id"], c["index"], c["arguments"]) for c in committed(emits)]
        assert got == [("call_a", 0, {"path": "/a"}), ("call_b", 1, {"path": "/b"})]

    def test_deltas_keyed_by_item_id_when_no_output_index(self) -> None:
        """A delta that carries only ``item_id`` goes to the item added with that id."""
        a = responses_call(0, "call_a", "read_file", '{"path": "/a"}', done=False,
                           by_item_id=True)
        b = responses_call(1, "call_b", "read_file", '{"path": "/b"}', done=False,
                           by_item_id=True)
        body = [a[0], b[0], *(x for pair in zip(a[1:], b[1:], strict=True) for x in pair)]
        emits = feed(assembler(), responses_run("r1", self.TOOLS,
                                                [*responses_head(), *body, responses_tail()]))
        got = {c["call_id"]: c["arguments"] for c in committed(emits)}
        assert got == {"call_a": {"path": "/a"}, "call_b": {"path": "/b"}}

    def test_rotating_item_ids_stay_on_their_output_index(self) -> None:
        """A gateway that rotates item ids between events of one item (seen in recorded
        streams) does not split or re-route the call: output_index wins."""
        events = [*responses_head(),
                  *responses_call(0, "call_a", "read_file", '{"path": "/a"}', item_id="fc_x")]
        for event in events:
            if event["type"].startswith("response.function_call_arguments"):
                event["item_id"] = "fc_rotated"
        emits = feed(assembler(), responses_run("r1", self.TOOLS, [*events, responses_tail()]))
        assert [(c["call_id"], c["arguments"]) for c in committed(emits)] == [
            ("call_a", {"path": "/a"})]

    def test_item_id_is_no_call_id(self) -> None:
        """An item with an ``fc_`` id but no ``call_id`` has no call id: it fails
        ``missing_id_or_name`` rather than commit under the item id."""
        events = responses_calls([(None, "read_file", '{"path": "/a"}')])
        error = only_error(feed(assembler(), responses_run("r1", self.TOOLS, events)))
        assert error["reason"] == "missing_id_or_name"
        assert not error["tool_call_id"].startswith("fc_")


# ===========================================================================================
# Rule 3: missing or empty arguments mean {}.
# ===========================================================================================


# ===========================================================================================
# Rule 4: complete at stream end; block-level early commit only when allowed.
# ===========================================================================================


class TestRule4Completion:
    """Rule 4: calls complete at the stream's end; early commit needs both switches."""

    @each_provider
    def test_no_outcome_before_the_end(self, provider: str) -> None:
        """By default no committed call appears before the completing event (chat
        ``stream.end``, Anthropic ``message_stop``, Responses ``response.completed``)."""
        envs = provider_run(provider, "r1", TOOLS, [("call_1", "read_file", '{"path": "/a"}')])
        per = feed_each(assembler(), envs)
        ends = {ANTHROPIC: "message_stop", RESPONSES: "response.completed"}
        end = (len(envs) - 1 if provider == CHAT
               else position_of(envs, lambda e: e.get("type") == ends[provider]))
        assert first_position(per, Topic.COMMITTED) == end

    def test_chat_finish_reason_does_not_complete(self) -> None:
        """A chat ``finish_reason`` is not the end: without ``stream.end`` nothing commits."""
        envs = chat_run("r1", [chat_tool("read_file", PATH_SCHEMA)],
                        chat_calls([("call_1", "read_file", '{"path": "/a"}')]), end=False)
        assert feed(assembler(), envs) == []

    @pytest.mark.parametrize("provider, block_end", [
        (ANTHROPIC, lambda e: e["type"] == "content_block_stop"),
        (RESPONSES, lambda e: e["type"] == "response.output_item.done"),
    ], ids=["anthropic", "responses"])
    def test_early_commit_with_both_switches(self, provider: str, block_end: Any) -> None:
        """With ``execute_before_stream_end`` and the tool in ``allow_pipelined_execute``
        the call commits at its block's end; a tool not in the list still waits."""
        envs = provider_run(provider, "r1", TOOLS, [("call_1", "read_file", '{"path": "/a"}'),
                                                    ("call_2", "noop", "{}")])
        per = feed_each(assembler(execute_before_stream_end=True,
                                  allow_pipelined_execute=("read_file",)), envs)
        at = [p for p, emits in enumerate(per) for e in emits if e.topic is Topic.COMMITTED]
        first_block_end = position_of(envs, block_end)
        final_at = first_position(per, Topic.FINAL)
        assert at == [first_block_end, final_at]
        assert outcome_ids([e for emits in per for e in emits]) == ["call_1", "call_2"]

    @pytest.mark.parametrize("provider", [ANTHROPIC, RESPONSES])
    @pytest.mark.parametrize("switch, allow", [(True, ()), (False, ("read_file",)),
                                               (True, ("noop",))],
                             ids=["allow_list_empty", "switch_off", "other_tool_allowed"])
    def test_no_early_commit_without_both_switches(self, provider: str, switch: bool,
                                                   allow: tuple[str, ...]) -> None:
        """Either switch alone (or another tool in the list) keeps the commit at the end."""
        envs = provider_run(provider, "r1", TOOLS, [("call_1", "read_file", '{"path": "/a"}')])
        per = feed_each(assembler(execute_before_stream_end=switch,
                                  allow_pipelined_execute=allow), envs)
        assert first_position(per, Topic.COMMITTED) == first_position(per, Topic.FINAL)

    def test_chat_never_commits_early(self) -> None:
        """Chat has no block-level end: even with both switches a call waits for
        ``stream.end``."""
        envs = chat_run("r1", [chat_tool("read_file", PATH_SCHEMA)],
                        chat_calls([("call_1", "read_file", '{"path": "/a"}')]))
        per = feed_each(assembler(execute_before_stream_end=True,
                                  allow_pipelined_execute=("read_file",)), envs)
        assert first_position(per, Topic.COMMITTED) == len(envs) - 1

    def test_early_outcomes_of_a_shared_id_are_one_kind(self) -> None:
        """Two blocks that claim the same id, each ended early after the provider reported
        truncation: the first fails ``duplicate_call_id`` (it is emitted knowing the run's
        other calls, not only itself: its key names its buffer), and the second, whose id has
        its outcome out already, gets no record; the final lists both."""
        events = [anthropic_message_start(),
                  *anthropic_tool_block(0, "dup", "read_file", '{"path": "/a"}', stop=False),
                  *anthropic_tool_block(1, "dup", "read_file", '{"path": "/b"}', stop=False),
                  *anthropic_tail("max_tokens", message_stop=False),
                  {"type": "content_block_stop", "index": 0},
                  {"type": "content_block_stop", "index": 1}, {"type": "message_stop"}]
        emits = feed(assembler(execute_before_stream_end=True,
                               allow_pipelined_execute=("read_file",)),
                     anthropic_run("r1", tools_for(ANTHROPIC, TOOLS), events))
        check_outputs(emits)
        assert [(e["reason"], e["idempotency_key"]) for e in errors(emits)] == [
            ("duplicate_call_id", "r1:dup:0")]
        assert [(o["index"], o["reason"]) for o in finals(emits)[0]["outcomes"]] == [
            (0, "duplicate_call_id"), (1, "duplicate_call_id")]

    def test_early_committed_call_is_not_emitted_again(self) -> None:
        """A call committed at its block's end gets no second outcome at the message end."""
        envs = provider_run(ANTHROPIC, "r1", TOOLS, [("call_1", "read_file", '{"path": "/a"}')])
        emits = feed(assembler(execute_before_stream_end=True,
                               allow_pipelined_execute=("read_file",)), envs)
        check_outputs(emits)
        assert outcome_ids(emits) == ["call_1"]


# ===========================================================================================
# Rule 5: provider-reported truncation fails the calls of that message.
# ===========================================================================================


def truncated_run(provider: str, text: str = '{"path": "/a"}') -> list[dict[str, Any]]:
    """A run whose provider reports truncation after a call whose text parses."""
    calls = [("call_1", "read_file", text)]
    if provider == CHAT:
        events = chat_calls(calls, finish_reason="length")
    elif provider == ANTHROPIC:
        events = anthropic_calls(calls, stop_reason="max_tokens")
    else:
        events = responses_calls(calls, terminal="response.incomplete")
    return run_envelopes("r1", provider, tools_for(provider, TOOLS), events)


# ===========================================================================================
# Rule 6: server-side tool blocks are never committed.
# ===========================================================================================


class TestRule6ServerTools:
    """Rule 6: server-side tool blocks appear in the final message only."""

    @pytest.mark.parametrize("kind", ["server_tool_use", "mcp_tool_use"])
    def test_anthropic_server_blocks_are_not_calls(self, kind: str) -> None:
        """A ``server_tool_use`` / ``mcp_tool_use`` block is neither committed nor failed,
        even when a client tool of the same name is registered; it is in the final message."""
        events = [anthropic_message_start(),
                  *anthropic_tool_block(0, "srvtoolu_1", "web_search", '{"query": "x"}',
                                        kind=kind),
                  {"type": "content_block_start", "index": 1, "content_block": {
                      "type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
                      "content": []}},
                  {"type": "content_block_stop", "index": 1},
                  *anthropic_tool_block(2, "toolu_1", "read_file", '{"path": "/a"}'),
                  *anthropic_tail()]
        tools = [anthropic_tool("web_search", {"type": "object"}),
                 anthropic_tool("read_file", PATH_SCHEMA)]
        emits = feed(assembler(), anthropic_run("r1", tools, events))
        assert [c["call_id"] for c in committed(emits)] == ["toolu_1"]
        assert errors(emits) == []
        [final] = finals(emits)
        content = final["message"]["content"]
        assert [b["type"] for b in content] == [kind, "web_search_tool_result", "tool_use"]
        assert content[0]["input"] == {"query": "x"}
        assert [o["tool_call_id"] for o in final["outcomes"]] == ["toolu_1"]

    def test_responses_builtin_items_are_not_calls(self) -> None:
        """A Responses ``web_search_call`` item is not a call; it is in the final output."""
        search = {"type": "web_search_call", "id": "ws_1", "status": "completed",
                  "action": {"type": "search", "query": "x"}}
        events = [*responses_head(),
                  {"type": "response.output_item.added", "output_index": 0,
                   "item": {**search, "status": "in_progress"}},
                  {"type": "response.output_item.done", "output_index": 0, "item": search},
                  *responses_call(1, "call_1", "read_file", '{"path": "/a"}'),
                  responses_tail()]
        tools = [{"type": "web_search"}, responses_tool("read_file", PATH_SCHEMA)]
        emits = feed(assembler(), responses_run("r1", tools, events))
        assert [(c["call_id"], c["index"]) for c in committed(emits)] == [("call_1", 1)]
        assert errors(emits) == []
        [final] = finals(emits)
        assert [i["type"] for i in final["message"]["output"]] == [
            "web_search_call", "function_call"]


# ===========================================================================================
# Rule 7: limits (each limit has its reason class below; this checks they never drop).
# ===========================================================================================


class TestRule7Limits:
    """Rule 7: every limit ends in an outcome for every call, never a silent drop."""

    @each_provider
    def test_every_started_call_gets_exactly_one_outcome_under_limits(self,
                                                                      provider: str) -> None:
        """Five calls against small byte, in-flight and budget limits: five outcomes, one
        per call id, in index order."""
        calls = [(f"call_{i}", "read_file", fill('{"path": "/@"}', "x" * i * 8))
                 for i in range(5)]
        emits = feed(assembler(max_tool_argument_bytes=40, max_tool_calls_in_flight_assemble=4,
                               max_tool_calls_per_run=2),
                     provider_run(provider, "r1", TOOLS, calls))
        check_outputs(emits)
        assert outcome_ids(emits) == [c[0] for c in calls]

    @each_provider
    def test_byte_limit_is_inclusive(self, provider: str) -> None:
        """A text of exactly ``max_tool_argument_bytes`` bytes commits; one more byte fails."""
        text = '{"path": "/abc"}'
        ok = run_calls(provider, [("call_1", "read_file", text)],
                       max_tool_argument_bytes=len(text))
        assert len(committed(ok)) == 1
        bad = run_calls(provider, [("call_1", "read_file", text + " ")],
                        max_tool_argument_bytes=len(text))
        assert only_error(bad)["reason"] == "arguments_exceed_max_bytes"


# ===========================================================================================
# Rule 8: security decisions use committed arguments only; partial text stays private.
# ===========================================================================================


class TestRule8CommittedArgumentsOnly:
    """Rule 8: the validator sees what is committed; partial text never leaks by default."""

    @each_provider
    def test_validator_sees_exactly_the_committed_value(self, provider: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
        """The value the schema check decided on is the value the runner receives."""
        from worker.core.tools import SchemaCheck

        checked: list[Any] = []
        real = SchemaCheck.errors

        def spy(self: SchemaCheck, value: Any) -> str | None:
            checked.append(orjson.dumps(value))
            return real(self, value)

        monkeypatch.setattr(SchemaCheck, "errors", spy)
        emits = run_calls(provider, [("call_1", "read_file", '{"path": "/tmp/\\u00e9"}')])
        [call] = committed(emits)
        assert checked == [orjson.dumps(call["arguments"])]

    def test_responses_final_text_is_what_is_validated_and_committed(self) -> None:
        """When ``arguments.done`` restates the text differently from the deltas, the
        committed call holds the restated (provider's own) text, not a mix."""
        events = responses_call(0, "call_1", "read_file", '{"path": "/b"}')
        for event in events:
            if event["type"] == "response.function_call_arguments.delta":
                event["delta"] = '{"path": "/a"}' if event is events[1] else ""
        emits = feed(assembler(), responses_run(
            "r1", tools_for(RESPONSES, TOOLS), [*responses_head(), *events, responses_tail()]))
        assert [c["arguments"] for c in committed(emits)] == [{"path": "/b"}]

    @each_provider
    def test_no_progress_by_default(self, provider: str) -> None:
        """With default settings no progress record is emitted at all."""
        emits = run_calls(provider, [("call_1", "read_file", fill('{"path": "@"}'))])
        assert [e for e in emits if e.topic is Topic.PROGRESS] == []

    @each_provider
    def test_progress_carries_byte_counts_not_text(self, provider: str) -> None:
        """With progress on and ``ui_forward_partial_args`` off, progress records hold byte
        counts and never any argument text."""
        text = fill('{"path": "@"}')
        emits = run_calls(provider, [("call_1", "read_file", text)], emit_progress=True)
        progress = [e.value for e in emits if e.topic is Topic.PROGRESS]
        assert progress, "progress was switched on"
        assert all(SECRET not in orjson.dumps(p).decode() for p in progress)
        assert "arguments_delta" not in progress[0]
        assert max(p["bytes"] for p in progress) == len(text)

    def test_partial_text_only_when_configured(self) -> None:
        """``ui_forward_partial_args: true`` is the only way partial text reaches progress."""
        text = fill('{"path": "@"}')
        emits = run_calls(CHAT, [("call_1", "read_file", text)], emit_progress=True,
                          ui_forward_partial_args=True)
        text_bytes = b""
        for p in (e.value for e in emits if e.topic is Topic.PROGRESS):
            text_bytes = text_bytes[:p["arguments_offset"]] + p["arguments_delta"].encode()
        assert text_bytes.decode() == text

    def test_stats_never_hold_argument_text(self) -> None:
        """Counters (the source of metrics) never carry argument text in their names."""
        asm = assembler()
        feed(asm, provider_run(CHAT, "r1", TOOLS, [
            ("call_1", "read_file", fill('{"path": "@",}')),
            ("call_2", SECRET, fill('{"path": "@"}'))]))
        assert asm.stats
        assert all(SECRET not in key for key in asm.stats)

    @pytest.mark.parametrize("text", [
        fill('{"path": "@",}'), fill('{"path": "@"'), fill('["@"]'),
        fill('{"path": 1, "@": 2}'), fill('{"path": "/a", "path": "@"}'),
        fill('{"@": 1, "@": 2}')])
    def test_error_content_never_quotes_arguments(self, text: str) -> None:
        """Whatever makes a call fail, the error content holds no argument text."""
        emits = run_calls(CHAT, [("call_1", "read_file", text)])
        assert len(errors(emits)) == 1
        no_secret(emits)


# ===========================================================================================
# Rule 9: bad input never stops the worker.
# ===========================================================================================


MALFORMED_EVENTS: dict[str, list[dict[str, Any]]] = {
    CHAT: [{"choices": 5}, {"choices": ["x"]}, {"choices": [{"delta": {"tool_calls": [7]}}]},
           {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "x"}]}}]}],
    # A well-formed event in the wrong place (a delta for a block never started, for an item
    # never added) is no malformed event but a protocol break, which fails the run:
    # tests/core/unit/test_anthropic_messages.py, test_openai_responses_breaks.py.
    ANTHROPIC: [{"type": "content_block_start", "index": "0", "content_block": {}},
                {"type": "content_block_start"},
                {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "input_json_delta", "partial_json": 5}},
                {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "text_delta", "text": 5}},
                {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "thinking_delta", "thinking": ["x"]}}],
    RESPONSES: [{"type": "response.output_item.added", "output_index": "0", "item": {}},
                {"type": "response.function_call_arguments.delta", "output_index": 0,
                 "delta": 5},
                {"type": "response.output_text.delta", "output_index": 0, "delta": None}],
}


class TestRule9BadInputNeverStops:
    """Rule 9: bad input goes to the DLQ with its bytes; the run and partition go on."""

    @each_provider
    def test_malformed_provider_events_go_to_dlq_and_the_run_goes_on(self,
                                                                     provider: str) -> None:
        """Each malformed provider event becomes one DLQ record holding its original bytes;
        nothing raises, and the run still completes with its good call."""
        good = provider_calls(provider, [("call_1", "read_file", '{"path": "/a"}')])
        head = {CHAT: 0, ANTHROPIC: 2, RESPONSES: 2}[provider]
        if provider == ANTHROPIC:
            good = [anthropic_message_start(), *anthropic_text_block(0, "hi"),
                    *anthropic_tool_block(1, "call_1", "read_file", '{"path": "/a"}'),
                    *anthropic_tail()]
            head = 3
        bad = MALFORMED_EVENTS[provider]
        envs = run_envelopes("r1", provider, tools_for(provider, TOOLS),
                             [*good[:head], *bad, *good[head:]])
        asm = assembler()
        outs = [asm.feed_record(None, orjson.dumps(env)) for env in envs]
        records = [e for out in outs for e in out]
        dead = dlq(records)
        assert len(dead) == len(bad)
        bad_bytes = [orjson.dumps(env) for env in envs if env.get("event") in bad]
        assert [base64.b64decode(d["original_b64"]) for d in dead] == bad_bytes
        assert [c["call_id"] for c in committed(records)] == ["call_1"]
        assert len(finals(records)) == 1

    def test_anthropic_non_string_text_never_crashes_finalization(self) -> None:
        """A text delta whose ``text`` is not a string must not make the run's end raise
        (the final message joins the text): it goes to the DLQ and the call still commits."""
        text = anthropic_text_block(0, "hi")  # the bad delta while block 0 is still open
        events = [anthropic_message_start(), *text[:-1],
                  {"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": {"a": 1}}}, text[-1],
                  *anthropic_tool_block(1, "toolu_1", "read_file", '{"path": "/a"}'),
                  *anthropic_tail()]
        emits = feed(assembler(), anthropic_run("r1", tools_for(ANTHROPIC, TOOLS), events))
        assert len(dlq(emits)) == 1
        assert [c["call_id"] for c in committed(emits)] == ["toolu_1"]
        [final] = finals(emits)
        assert final["message"]["content"][0]["text"] == "hi"

    def test_anthropic_non_string_block_start_text_never_crashes(self) -> None:
        """A text block that starts with a non-string ``text`` goes to the DLQ instead of
        crashing the run's end."""
        events = [anthropic_message_start(),
                  {"type": "content_block_start", "index": 0,
                   "content_block": {"type": "text", "text": 5}},
                  {"type": "content_block_stop", "index": 0},
                  *anthropic_tool_block(1, "toolu_1", "read_file", '{"path": "/a"}'),
                  *anthropic_tail()]
        emits = feed(assembler(), anthropic_run("r1", tools_for(ANTHROPIC, TOOLS), events))
        assert [c["call_id"] for c in committed(emits)] == ["toolu_1"]
        assert len(finals(emits)) == 1

    @pytest.mark.parametrize("provider", [ANTHROPIC, RESPONSES])
    @pytest.mark.parametrize("call_id, name", [("call_1", {"x": 1}), ("call_1", ["noop"]),
                                               (7, "noop"), (["call_1"], "noop")],
                             ids=["dict_name", "list_name", "int_id", "list_id"])
    def test_non_string_id_or_name_is_no_id_or_name(self, provider: str, call_id: Any,
                                                    name: Any) -> None:
        """An id or name that is not a string neither crashes the worker (an unhashable name
        once did) nor reaches the runner: the call fails ``missing_id_or_name`` with a
        string ``tool_call_id`` and ``name``."""
        if provider == ANTHROPIC:
            events = [anthropic_message_start(),
                      {"type": "content_block_start", "index": 0, "content_block": {
                          "type": "tool_use", "id": call_id, "name": name, "input": {}}},
                      {"type": "content_block_stop", "index": 0}, *anthropic_tail()]
        else:
            item = {"type": "function_call", "id": "fc_0", "call_id": call_id, "name": name,
                    "arguments": "{}"}
            events = [*responses_head(),
                      {"type": "response.output_item.added", "output_index": 0, "item": item},
                      {"type": "response.output_item.done", "output_index": 0, "item": item},
                      responses_tail()]
        emits = feed(assembler(execute_before_stream_end=True, allow_pipelined_execute=("x",)),
                     run_envelopes("r1", provider, tools_for(provider, TOOLS), events))
        check_outputs(emits)
        error = only_error(emits)
        assert error["reason"] == "missing_id_or_name"
        assert isinstance(error["tool_call_id"], str) and isinstance(error["name"], str)

    def test_garbage_between_runs_does_not_stop_the_next_run(self) -> None:
        """Undecodable records go to the DLQ and a run fed afterwards completes."""
        asm = assembler()
        junk = feed(asm, [b"\x00\xff", b"{", b"[]", b'{"v": 1}', b"null"])
        assert len(dlq(junk)) == 5
        emits = feed(asm, provider_run(CHAT, "r1", TOOLS, [("c1", "read_file", '{"path": "/a"}')]))
        assert len(committed(emits)) == 1


# ===========================================================================================
# Reason codes, one class each.
# ===========================================================================================


class TestReasonArgumentsExceedMaxBytes:
    """``arguments_exceed_max_bytes``: the text is longer than the limit in UTF-8 bytes."""

    @each_provider
    def test_oversize_fails(self, provider: str) -> None:
        """A text longer than ``max_tool_argument_bytes`` fails, and the content names the
        limit, not the text."""
        text = fill('{"path": "@"}', "x" * 100)
        error = only_error(run_calls(provider, [("call_1", "read_file", text)],
                                     max_tool_argument_bytes=64))
        assert error["reason"] == "arguments_exceed_max_bytes"
        assert "64" in error["content"]
        assert "xxxx" not in error["content"]

    @each_provider
    def test_counted_in_utf8_bytes(self, provider: str) -> None:
        """Multibyte characters count by their UTF-8 bytes: a text of 16 characters but
        21 bytes fails a 16-byte limit (and a 20-byte one), and passes a 21-byte one."""
        text = '{"path": "\u00e9\u00e9\u00e9\u6f22"}'
        assert (len(text), len(text.encode())) == (16, 21)
        for limit in (16, 20):
            fail = run_calls(provider, [("call_1", "read_file", text)],
                             max_tool_argument_bytes=limit)
            assert only_error(fail)["reason"] == "arguments_exceed_max_bytes"
        ok = run_calls(provider, [("call_1", "read_file", text)], max_tool_argument_bytes=21)
        assert len(committed(ok)) == 1

    def test_other_calls_unaffected(self) -> None:
        """One oversize call does not fail the other calls of the run."""
        emits = run_calls(CHAT, [("call_1", "read_file", fill('{"path": "@"}', "x" * 80)),
                                 ("call_2", "read_file", '{"path": "/b"}')],
                          max_tool_argument_bytes=32)
        assert [o for o in outcome_ids(emits)] == ["call_1", "call_2"]
        assert [c["call_id"] for c in committed(emits)] == ["call_2"]


class TestReasonTooManyToolCalls:
    """``too_many_tool_calls``: more calls being assembled at once than allowed."""

    def test_surplus_gets_a_failed_placeholder(self) -> None:
        """With a limit of 2, the third simultaneous chat call fails with its own id and
        name, in its place; the first two commit. Nothing is silently dropped."""
        calls = [(f"call_{i}", "read_file", fill('{"path": "/@"}', i)) for i in range(3)]
        emits = run_calls(CHAT, calls, max_tool_calls_in_flight_assemble=2)
        assert [c["call_id"] for c in committed(emits)] == ["call_0", "call_1"]
        [error] = errors(emits)
        assert (error["tool_call_id"], error["name"], error["reason"], error["index"]) == (
            "call_2", "read_file", "too_many_tool_calls", 2)
        assert outcome_ids(emits) == ["call_0", "call_1", "call_2"]

    def test_anthropic_overlapping_blocks(self) -> None:
        """Anthropic blocks that are open at the same time count against the limit."""
        one = anthropic_tool_block(0, "toolu_0", "read_file", '{"path": "/0"}')
        two = anthropic_tool_block(1, "toolu_1", "read_file", '{"path": "/1"}')
        events = [anthropic_message_start(), one[0], two[0], *one[1:], *two[1:],
                  *anthropic_tail()]
        emits = feed(assembler(max_tool_calls_in_flight_assemble=1),
                     anthropic_run("r1", tools_for(ANTHROPIC, TOOLS), events))
        assert [c["call_id"] for c in committed(emits)] == ["toolu_0"]
        assert reasons(emits) == ["too_many_tool_calls"]

    def test_finished_blocks_are_no_longer_in_flight(self) -> None:
        """Sequential Anthropic blocks, each closed before the next opens, all commit under
        a limit of 1: the limit counts calls being assembled, not calls of the run."""
        calls = [(f"toolu_{i}", "read_file", fill('{"path": "/@"}', i)) for i in range(3)]
        emits = run_calls(ANTHROPIC, calls, max_tool_calls_in_flight_assemble=1)
        assert len(committed(emits)) == 3


class TestReasonStreamError:
    """``stream_error``: the transport failed, or ended before the provider's end."""

    @each_provider
    def test_stream_error_envelope(self, provider: str) -> None:
        """``stream.error`` fails every open call ``stream_error`` and ends the run
        ``failed``; the transport's own message is not echoed."""
        events = provider_calls(provider, [("call_1", "read_file", '{"path": "/a"}'),
                                           ("call_2", "noop", "{}")], complete=False)
        envs = run_envelopes("r1", provider, tools_for(provider, TOOLS),
                             [*events, stream_error(error=f"reset {SECRET}")], end=False)
        emits = feed(assembler(), envs)
        check_outputs(emits)
        assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
            ("call_1", "stream_error"), ("call_2", "stream_error")]
        assert committed(emits) == []
        assert finals(emits)[0]["status"] == "failed"
        no_secret(emits)

    @pytest.mark.parametrize("provider", [ANTHROPIC, RESPONSES])
    def test_stream_end_before_the_provider_end(self, provider: str) -> None:
        """For Anthropic and Responses, ``stream.end`` without ``message_stop`` /
        ``response.completed`` fails the calls ``stream_error``, even complete ones."""
        events = provider_calls(provider, [("call_1", "read_file", '{"path": "/a"}')],
                                complete=False)
        envs = run_envelopes("r1", provider, tools_for(provider, TOOLS), events, end=True)
        assert reasons(feed(assembler(), envs)) == ["stream_error"]

    def test_chat_stream_end_completes(self) -> None:
        """For chat ``stream.end`` is the normal end (the ``[DONE]`` line)."""
        envs = run_envelopes("r1", CHAT, tools_for(CHAT, TOOLS),
                             provider_calls(CHAT, [("c1", "noop", "{}")], complete=False))
        assert len(committed(feed(assembler(), envs))) == 1

    @pytest.mark.parametrize("provider", [ANTHROPIC, RESPONSES])
    def test_stream_end_after_the_provider_end_is_harmless(self, provider: str) -> None:
        """``stream.end`` after the provider's own end changes nothing and is no DLQ record."""
        asm = assembler()
        emits = feed(asm, provider_run(provider, "r1", TOOLS, [("c1", "noop", "{}")]))
        assert emits[-1].topic is Topic.FINAL
        assert feed(asm, [stream_end("r1", 999)]) == []


class TestReasonUpstreamError:
    """``upstream_error``: the provider reported an error in the stream."""

    @pytest.mark.parametrize("provider, event", [
        (ANTHROPIC, {"type": "error", "error": {"type": "overloaded_error",
                                                "message": "Overloaded"}}),
        (RESPONSES, {"type": "error", "code": "server_error", "message": "boom",
                     "param": None, "sequence_number": 9}),
        (RESPONSES, responses_tail("response.failed")),
    ], ids=["anthropic_error", "responses_error", "responses_failed"])
    def test_provider_error_event(self, provider: str, event: dict[str, Any]) -> None:
        """The error event fails every uncommitted call ``upstream_error`` (also one whose
        block already ended) and ends the run ``failed``."""
        events = provider_calls(provider, [("call_1", "read_file", '{"path": "/a"}')],
                                complete=False)
        emits = feed(assembler(), run_envelopes("r1", provider, tools_for(provider, TOOLS),
                                                [*events, event], end=False))
        check_outputs(emits)
        assert reasons(emits) == ["upstream_error"]
        assert finals(emits)[0]["status"] == "failed"

    def test_events_after_the_error_are_not_calls(self) -> None:
        """After an upstream error, the stream's end neither revives nor re-fails calls."""
        events = provider_calls(ANTHROPIC, [("call_1", "read_file", '{"path": "/a"}')],
                                complete=False)
        envs = run_envelopes("r1", ANTHROPIC, tools_for(ANTHROPIC, TOOLS),
                             [*events, {"type": "error", "error": {"type": "api_error"}}])
        emits = feed(assembler(), envs)
        assert reasons(emits) == ["upstream_error"]
        assert len(finals(emits)) == 1


class TestReasonCancelled:
    """``cancelled``: a cancel envelope reached the run before its end."""

    @each_provider
    def test_cancel_mid_stream(self, provider: str) -> None:
        """A cancel cancels every uncommitted call: error results with state
        ``cancelled`` are emitted at once, and the run ends ``cancelled``."""
        events = provider_calls(provider, [("call_1", "read_file", '{"path": "/a"}'),
                                           ("call_2", "noop", "{}")], complete=False)
        envs = run_envelopes("r1", provider, tools_for(provider, TOOLS),
                             [*events[:-1], cancel()], end=False)
        per = feed_each(assembler(), envs)
        assert all(out == [] for out in per[:-1])
        emits = per[-1]
        check_outputs(emits)
        assert [(e["tool_call_id"], e["state"], e["reason"]) for e in errors(emits)] == [
            ("call_1", "cancelled", "cancelled"), ("call_2", "cancelled", "cancelled")]
        assert finals(emits)[0]["status"] == "cancelled"

    @each_provider
    def test_later_events_are_ignored(self, provider: str) -> None:
        """After a cancel, the rest of the stream emits nothing and goes nowhere (no DLQ)."""
        envs = provider_run(provider, "r1", TOOLS, [("call_1", "read_file", '{"path": "/a"}')])
        asm = assembler()
        assert feed(asm, envs[:4]) == []
        assert reasons(feed(asm, [cancel("r1")])) == ["cancelled"]
        assert feed(asm, envs[4:]) == []

    @each_provider
    def test_cancel_after_finish_changes_nothing_and_is_counted(self, provider: str) -> None:
        """A cancel after the run ended emits nothing and is counted in ``stats``."""
        asm = assembler()
        feed(asm, provider_run(provider, "r1", TOOLS, [("c1", "noop", "{}")]))
        before = Counter(asm.stats)
        assert feed(asm, [cancel("r1")]) == []
        delta = asm.stats - before
        assert sum(delta.values()) == 1
        assert not any(k.startswith("dlq") for k in delta)

    def test_cancel_after_early_commit_keeps_the_commit(self) -> None:
        """A call committed early stays committed; only the others are cancelled."""
        events = provider_calls(ANTHROPIC, [("toolu_1", "read_file", '{"path": "/a"}'),
                                            ("toolu_2", "noop", "{}")], complete=False)
        first_stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop")
        envs = run_envelopes("r1", ANTHROPIC, tools_for(ANTHROPIC, TOOLS),
                             [*events[:first_stop + 2], cancel()], end=False)
        emits = feed(assembler(execute_before_stream_end=True,
                               allow_pipelined_execute=("read_file",)), envs)
        check_outputs(emits)
        assert [c["call_id"] for c in committed(emits)] == ["toolu_1"]
        assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
            ("toolu_2", "cancelled")]

    def test_cancel_of_an_ended_block(self) -> None:
        """A call whose block ended but whose message did not is still cancelled."""
        events = provider_calls(ANTHROPIC, [("toolu_1", "read_file", '{"path": "/a"}')],
                                complete=False)
        envs = run_envelopes("r1", ANTHROPIC, tools_for(ANTHROPIC, TOOLS), [*events, cancel()],
                             end=False)
        assert reasons(feed(assembler(), envs)) == ["cancelled"]


class TestReasonAssembleIdleTimeout:
    """``assemble_idle_timeout``: a run that stopped receiving events, seen by a tick."""

    def idle_run(self, provider: str) -> tuple[list[dict[str, Any]], int]:
        events = provider_calls(provider, [("call_1", "read_file", '{"path": "/a"}')],
                                complete=False)
        envs = run_envelopes("r1", provider, tools_for(provider, TOOLS), events, end=False,
                             ts=1_000_000, ts_step=10)
        return envs, envs[-1]["ts"]

    @each_provider
    def test_tick_after_the_timeout_fails_open_calls(self, provider: str) -> None:
        """A tick at ``last event + assemble_idle_timeout_s`` fails the open calls and
        ends the run ``idle_timeout``."""
        envs, last = self.idle_run(provider)
        asm = assembler()
        assert feed(asm, envs) == []
        emits = feed(asm, [tick(last + 60_000)])
        check_outputs(emits)
        assert reasons(emits) == ["assemble_idle_timeout"]
        assert finals(emits)[0]["status"] == "idle_timeout"
        assert asm.open_runs == 0

    @each_provider
    def test_not_before_the_timeout(self, provider: str) -> None:
        """A tick one millisecond before the timeout changes nothing."""
        envs, last = self.idle_run(provider)
        asm = assembler()
        feed(asm, envs)
        assert feed(asm, [tick(last + 59_999)]) == []
        assert asm.open_runs == 1

    def test_an_event_restarts_the_idle_clock(self) -> None:
        """An event before the timeout moves the deadline to that event plus the timeout."""
        envs, last = self.idle_run(CHAT)
        asm = assembler(assemble_idle_timeout_s=5)
        feed(asm, envs)
        later = {**envs[-1], "seq": envs[-1]["seq"] + 1, "ts": last + 4_000}
        feed(asm, [later])
        assert feed(asm, [tick(last + 5_000)]) == []
        assert reasons(feed(asm, [tick(last + 9_000)])) == ["assemble_idle_timeout"]

    def test_only_idle_runs_expire(self) -> None:
        """A tick expires the idle run and leaves a run that is receiving events open."""
        asm = assembler(assemble_idle_timeout_s=10)
        feed(asm, run_envelopes("idle", CHAT, tools_for(CHAT, TOOLS), [], end=False, ts=0))
        feed(asm, run_envelopes("busy", CHAT, tools_for(CHAT, TOOLS), [], end=False,
                                ts=8_000))
        emits = feed(asm, [tick(10_000)])
        assert [f["run_id"] for f in finals(emits)] == ["idle"]
        assert asm.open_run_ids() == ["busy"]


class TestReasonDuplicateCallId:
    """``duplicate_call_id``: two calls of one run claim the same id."""

    @each_provider
    def test_both_calls_fail(self, provider: str) -> None:
        """Neither of two calls with one id commits (a runner could not pair their results);
        each gets its own error result with a distinct idempotency key."""
        emits = run_calls(provider, [("call_1", "read_file", '{"path": "/a"}'),
                                     ("call_1", "read_file", '{"path": "/b"}')])
        assert committed(emits) == []
        errs = errors(emits)
        assert [(e["tool_call_id"], e["reason"]) for e in errs] == [
            ("call_1", "duplicate_call_id"), ("call_1", "duplicate_call_id")]
        assert errs[0]["idempotency_key"] != errs[1]["idempotency_key"]

    def test_same_id_across_runs_is_fine(self) -> None:
        """Ids are unique per run: the same id in two runs commits twice."""
        asm = assembler()
        for run_id in ("r1", "r2"):
            emits = feed(asm, provider_run(CHAT, run_id, TOOLS, [("c1", "noop", "{}")]))
            assert len(committed(emits)) == 1

    def test_repeated_id_at_the_same_chat_index_is_one_call(self) -> None:
        """The same id repeated on continuation chunks of one index is not a duplicate."""
        chunks = [chat_chunk([chat_tool_delta(0, "call_1", "read_file", p)])
                  for p in split('{"path": "/a"}', 3)]
        emits = feed(assembler(), chat_run("r1", tools_for(CHAT, TOOLS), chunks))
        assert reasons(emits) == []


class TestReasonProtocolError:
    """``protocol_error``: the stream broke its provider's own protocol (the full set of
    breaks, per provider: ``test_anthropic_messages.py``, ``test_openai_responses_breaks.py``,
    ``test_bedrock_converse.py``, ``test_gemini.py``)."""

    def test_spliced_anthropic_message_fails_the_open_call_and_the_run(self) -> None:
        """A second ``message_start`` with another id while a call is complete but undecided:
        the call fails ``protocol_error`` (never committed) and the run ends ``failed``."""
        settings, envs = SCENARIOS[Reason.PROTOCOL_ERROR]
        emits = feed(assembler(**settings), envs)
        check_outputs(emits)
        assert committed(emits) == [] and reasons(emits) == ["protocol_error"]
        assert finals(emits)[0]["status"] == "failed"


#: read_file's calls wait for approval, at most 10 s of record time (issue 26).
GATED = ApprovalSettings(require_approval=("read_file",), approval_timeout_s=10.0)


class TestReasonApprovalDenied:
    """``approval_denied``: a person denied a call waiting for approval (issue 26; the flow
    itself: ``test_waiting.py``)."""

    def test_a_denied_call_fails_naming_who_denied(self) -> None:
        """The held call goes to the pending topic, the denial gives its one error result,
        naming who denied and why, never the arguments; then the final message."""
        settings, envs = SCENARIOS[Reason.APPROVAL_DENIED]
        emits = feed(assembler(**settings), envs)
        check_outputs(emits)
        assert [e.topic for e in emits] == [Topic.PENDING, Topic.ERRORS, Topic.AUDIT,
                                              Topic.FINAL]
        (error,) = errors(emits)
        assert error["reason"] == "approval_denied" and "ops@example.com" in error["content"]
        assert SECRET not in error["content"]


class TestReasonApprovalTimeout:
    """``approval_timeout``: no decision within ``approval_timeout_s`` of record time."""

    def test_a_call_not_decided_in_time_fails_at_a_tick(self) -> None:
        """The first tick at or past the timeout fails the held call and ends the run."""
        settings, envs = SCENARIOS[Reason.APPROVAL_TIMEOUT]
        emits = feed(assembler(**settings), envs)
        check_outputs(emits)
        assert [e.topic for e in emits] == [Topic.PENDING, Topic.ERRORS, Topic.AUDIT,
                                              Topic.FINAL]
        assert reasons(emits) == ["approval_timeout"]


# ===========================================================================================
# Across all reasons: shape, secrecy, redelivery, order and determinism.
# ===========================================================================================


def scenarios() -> dict[Reason, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """For each reason code, settings and a run that fails one call with it; argument text
    carries :data:`SECRET` wherever the scenario has text."""
    good = fill('{"path": "/@"}')
    tools = tools_for(CHAT, TOOLS)

    def chat(calls: list[tuple[str | None, str | None, str]], **kw: Any) -> list[dict[str, Any]]:
        return chat_run("r1", tools, chat_calls(calls), **kw)

    def bedrock(stop: str) -> list[dict[str, Any]]:
        return run_envelopes("r1", BEDROCK, tools_for(BEDROCK, TOOLS),
                             bedrock_calls([("c1", "read_file", good)], stop_reason=stop))

    open_calls = chat_calls([("c1", "read_file", good)])[:-1]
    return {
        Reason.INVALID_JSON: ({}, chat([("c1", "read_file", fill('{"path": "@",}'))])),
        Reason.ARGUMENTS_NOT_OBJECT: ({}, chat([("c1", "read_file", fill('["@"]'))])),
        Reason.ARGUMENTS_EXCEED_MAX_BYTES: ({"max_tool_argument_bytes": 8},
                                            chat([("c1", "read_file", good)])),
        Reason.TOO_MANY_TOOL_CALLS: ({"max_tool_calls_in_flight_assemble": 1},
                                     chat([("c0", "noop", "{}"), ("c1", "read_file", good)])),
        Reason.MISSING_ID_OR_NAME: ({}, chat([(None, "read_file", good)])),
        Reason.UNKNOWN_TOOL: ({}, chat([("c1", "nope", good)])),
        Reason.SCHEMA_INVALID: ({}, chat([("c1", "read_file", fill('{"path": 1, "@": 1}'))])),
        Reason.BUDGET_EXCEEDED: ({"max_tool_calls_per_run": 1},
                                 chat([("c0", "noop", "{}"), ("c1", "read_file", good)])),
        Reason.TRUNCATED: ({}, chat_run("r1", tools, chat_calls(
            [("c1", "read_file", good)], finish_reason="length"))),
        Reason.STREAM_ERROR: ({}, chat_run("r1", tools, [*open_calls, stream_error()],
                                           end=False)),
        Reason.UPSTREAM_ERROR: ({}, anthropic_run(
            "r1", tools_for(ANTHROPIC, TOOLS),
            [*anthropic_calls([("c1", "read_file", good)])[:-2],
             {"type": "error", "error": {"type": "overloaded_error"}}], end=False)),
        Reason.CANCELLED: ({}, chat_run("r1", tools, [*open_calls, cancel()], end=False)),
        Reason.ASSEMBLE_IDLE_TIMEOUT: ({}, [*chat_run("r1", tools, open_calls, end=False, ts=0),
                                           tick(60_000)]),
        Reason.DUPLICATE_CALL_ID: ({}, chat([("c1", "read_file", good),
                                             ("c1", "read_file", good)])),
        Reason.CONTENT_FILTERED: ({}, bedrock("content_filtered")),
        Reason.MALFORMED_OUTPUT: ({}, bedrock("malformed_model_output")),
        Reason.PROTOCOL_ERROR: ({}, anthropic_run(
            "r1", tools_for(ANTHROPIC, TOOLS),
            [*anthropic_calls([("c1", "read_file", good)])[:-2],
             anthropic_message_start("msg_spliced"), *anthropic_tail()], end=False)),
        Reason.RECORD_TOO_LARGE: (
            {"max_tool_argument_bytes": 20 * 1024 * 1024, "max_buffered_bytes": 40 * 1024 * 1024},
            chat_run("r1", tools_for(CHAT, {"any": {"type": "object"}}), chat_calls([(
                "c1", "any", fill('{"p": "@", "n": [0' + ",1e15" * 3_500_000 + "]}"))]))),
        Reason.POLICY_DENIED: ({"policy": Forbidding()}, chat([("c1", "read_file", good)])),
        # a registry toolset the assembler has no lookup for (worker/runtime/governance/registry.py)
        Reason.UNKNOWN_TOOLSET: ({}, chat_run("r1", {"toolset": "files", "version": 1},  # type: ignore[arg-type]
                                              chat_calls([("c1", "read_file", good)]))),
        Reason.APPROVAL_DENIED: ({"approvals": GATED}, [*chat([("c1", "read_file", good)]),
                                                        decision("r1", "deny", "c1")]),
        Reason.APPROVAL_TIMEOUT: ({"approvals": GATED}, [*chat([("c1", "read_file", good)], ts=0),
                                                         tick(30_000)]),
        # two declarations of read_file (worker/core/identity.py)
        Reason.AMBIGUOUS_TOOL: ({}, chat_run("r1", tools + tools_for(CHAT, {"read_file": {}}),
                                             chat_calls([("c1", "read_file", good)]))),
        # the run's tenant (t1) must name a registered toolset; it sent its tools inline
        Reason.TOOLSET_REQUIRED: ({"require_toolsets_for": ("t1",)},
                                  chat([("c1", "read_file", good)])),
        # Anthropic paused the turn (pause_turn): its client call is made again when it goes on
        Reason.TURN_PAUSED: ({}, anthropic_run("r1", tools_for(ANTHROPIC, TOOLS), anthropic_calls(
            [("c1", "read_file", good)], stop_reason="pause_turn"), end=False)),
    }


SCENARIOS = scenarios()
every_reason = pytest.mark.parametrize("reason", list(Reason), ids=[r.value for r in Reason])


class TestEveryReason:
    """Properties every reason code's error results share."""

    def test_every_reason_has_a_scenario_and_a_class(self) -> None:
        """Adding a reason code without a test here fails: every member of ``Reason`` has a
        scenario and a ``TestReason...`` class in this file or in test_latch.py (the reasons
        the latch decides), and every rule a ``TestRule...`` class in one of them."""
        import test_latch  # (here: it imports this file's helpers)

        classes = {*globals(), *vars(test_latch)}
        assert set(SCENARIOS) == set(Reason)
        for n in range(1, 10):
            assert any(name.startswith(f"TestRule{n}") for name in classes), n
        names = {name for name in classes if name.startswith("TestReason")}
        expected = {"TestReason" + "".join(p.title() for p in r.value.split("_")) for r in Reason}
        assert expected <= names

    @every_reason
    def test_error_result_shape(self, reason: Reason) -> None:
        """The scenario yields an error result with this reason, ``is_error: true``, the
        right ``state``, content that starts with the reason, and an idempotency key."""
        settings, envs = SCENARIOS[reason]
        emits = feed(assembler(**settings), envs)
        check_outputs(emits)
        errs = [e for e in errors(emits) if e["reason"] == reason.value]
        assert errs
        for e in errs:
            assert e["is_error"] is True
            assert e["state"] == ("cancelled" if reason is Reason.CANCELLED else "failed")
            assert e["idempotency_key"]
            assert e["content"].startswith(f"{reason.value}: ")

    @every_reason
    def test_error_content_never_holds_argument_text(self, reason: Reason) -> None:
        """No error result (of any reason) carries the secret argument text anywhere."""
        settings, envs = SCENARIOS[reason]
        no_secret(feed(assembler(**settings), envs))

    @every_reason
    def test_same_input_same_bytes(self, reason: Reason) -> None:
        """Two fresh assemblers fed the same input emit byte-identical output lines."""
        settings, envs = SCENARIOS[reason]
        first = lines(feed(assembler(**settings), envs))
        second = lines(feed(assembler(**settings), envs))
        assert first and first == second

    @every_reason
    def test_redelivered_envelopes_change_nothing(self, reason: Reason) -> None:
        """Feeding every envelope twice in a row gives the same outcomes as once; each
        re-delivered sequenced envelope is counted as a duplicate."""
        settings, envs = SCENARIOS[reason]
        once = lines(feed(assembler(**settings), envs))
        asm = assembler(**settings)
        # (a decision is not re-delivered: a second one is a decision for a decided call,
        # which goes to the DLQ; the events log's offsets keep the worker from applying a
        # record twice)
        twice = lines(feed(asm, [env for env in envs
                                 for _ in ((0,) if env.get("type") in DECISIONS else (0, 1))]))
        assert twice == once
        sequenced = sum(1 for env in envs if "seq" in env)
        assert asm.stats["duplicates"] == sequenced


class TestRedeliveryAndOrder:
    """Re-delivered ``seq`` changes nothing; outcomes come in provider index order."""

    @each_provider
    def test_replaying_a_finished_run_changes_nothing(self, provider: str) -> None:
        """A whole run delivered again after it finished emits nothing (no DLQ either) and
        every replayed envelope is counted as a duplicate."""
        envs = provider_run(provider, "r1", TOOLS, [("c1", "read_file", '{"path": "/a"}')])
        asm = assembler()
        feed(asm, envs)
        before = asm.stats["duplicates"]
        trailing = 1 if provider != CHAT else 0  # stream.end after the provider's own end
        assert feed(asm, envs) == []
        assert asm.stats["duplicates"] - before == len(envs) - trailing

    def test_older_seq_arriving_late_is_ignored(self) -> None:
        """An envelope with a seq below the last applied one is a re-delivery: ignored."""
        envs = chat_run("r1", tools_for(CHAT, TOOLS),
                        chat_calls([("c1", "read_file", '{"path": "/a"}')]))
        stale = {**envs[2], "event": chat_chunk([chat_tool_delta(0, arguments="garbage")])}
        emits = feed(assembler(), [*envs[:-1], stale, envs[-1]])
        assert [c["arguments"] for c in committed(emits)] == [{"path": "/a"}]

    @each_provider
    def test_outcomes_in_index_order_whatever_the_arrival(self, provider: str) -> None:
        """Outcomes are emitted by provider index, failures and commits interleaved in
        that order, and the final message comes last."""
        calls = [("c0", "read_file", '{"path": "/0"}'), ("c1", "read_file", "{bad"),
                 ("c2", "noop", "{}")]
        if provider == CHAT:
            chunks = [chat_call_chunks(i, *call) for i, call in enumerate(calls)]
            events = [*chunks[2], *chunks[0], *chunks[1], chat_chunk(finish_reason="tool_calls")]
        elif provider == ANTHROPIC:
            blocks = [anthropic_tool_block(i, *call) for i, call in enumerate(calls)]
            events = [anthropic_message_start(), *(b[0] for b in reversed(blocks)),
                      *(e for b in blocks for e in b[1:]), *anthropic_tail()]
        else:
            items = [responses_call(i, *call) for i, call in enumerate(calls)]
            events = [*responses_head(), *items[2], *items[1], *items[0], responses_tail()]
        emits = feed(assembler(), run_envelopes("r1", provider, tools_for(provider, TOOLS),
                                                events))
        check_outputs(emits)
        assert outcome_ids(emits) == ["c0", "c1", "c2"]
        assert [e.topic for e in emits] == [Topic.COMMITTED, Topic.AUDIT, Topic.ERRORS,
                                            Topic.AUDIT, Topic.COMMITTED, Topic.AUDIT,
                                            Topic.FINAL]

    def test_mixed_corpus_is_byte_identical_across_fresh_assemblers(self) -> None:
        """Every reason scenario, one run per provider, garbage and a tick, interleaved into
        one input: two fresh assemblers emit the same bytes in the same order."""
        corpus: list[dict[str, Any] | bytes] = [b"garbage", b"[]"]
        for n, (_, envs) in enumerate(SCENARIOS.values()):
            corpus += [{**env, "run_id": f"s{n}"} if "run_id" in env else env for env in envs]
        for provider in PROVIDERS:
            corpus += provider_run(provider, f"p-{provider}", TOOLS, [
                ("c0", "read_file", '{"path": "/0"}'), ("c1", "noop", "[]")])
        corpus.append(tick(10**12))
        settings = {"max_tool_argument_bytes": 64, "max_tool_calls_per_run": 3}
        first = lines(feed(assembler(**settings), corpus))
        second = lines(feed(assembler(**settings), corpus))
        assert len(first) > 40
        assert first == second

    def test_runs_do_not_mix(self) -> None:
        """Two runs interleaved record by record keep their own calls and outcomes."""
        a = provider_run(CHAT, "ra", TOOLS, [("c1", "read_file", '{"path": "/a"}')])
        b = provider_run(ANTHROPIC, "rb", TOOLS, [("c1", "read_file", '{"path": "/b"}')])
        mixed = [x for pair in zip(a, b[:len(a)], strict=True) for x in pair] + b[len(a):]
        emits = feed(assembler(), mixed)
        got = {(c["run_id"], c["provider"]): c["arguments"] for c in committed(emits)}
        assert got == {("ra", CHAT): {"path": "/a"}, ("rb", ANTHROPIC): {"path": "/b"}}

    def test_committed_call_carries_the_run_identity(self) -> None:
        """A committed call has the contract's fields: run, tenant, provider, id, name,
        index, arguments and ``run_id:call_id`` as idempotency key."""
        emits = feed(assembler(), provider_run(ANTHROPIC, "r1", TOOLS,
                                               [("toolu_1", "read_file", '{"path": "/a"}')]))
        [call] = committed(emits)
        assert call == {"v": 1, "run_id": "r1", "tenant": "t1", "provider": ANTHROPIC,
                        "call_id": "toolu_1", "name": "read_file", "index": 0,
                        "arguments": {"path": "/a"}, "idempotency_key": "r1:toolu_1"}
        assert emits[0].key == "r1"

    def test_final_message_lists_every_outcome(self) -> None:
        """The final message holds each call's outcome in index order."""
        emits = run_calls(CHAT, [("c0", "read_file", '{"path": "/0"}'),
                                 ("c1", "nope", "{}")])
        [final] = finals(emits)
        assert [(o["tool_call_id"], o["state"], o.get("reason")) for o in final["outcomes"]] == [
            ("c0", "committed", None), ("c1", "failed", "unknown_tool")]
        assert final["message"]["tool_calls"][0]["function"]["arguments"] == '{"path": "/0"}'


def test_responses_final_message_keeps_call_id() -> None:
    """Responses items restated by ``response.completed``'s output replace the streamed form
    in the final message (the call item keeps the streamed ``call_id``)."""
    output = [responses_item(0, "call_1", "read_file", '{"path": "/a"}')]
    events = [*responses_head(), *responses_call(0, "call_1", "read_file", '{"path": "/a"}'),
              responses_tail(output=output)]
    emits = feed(assembler(), responses_run("r1", tools_for(RESPONSES, TOOLS), events))
    [final] = finals(emits)
    assert final["message"]["output"][0]["call_id"] == "call_1"
    assert final["message"]["status"] == "completed"
