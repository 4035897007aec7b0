"""Conformance over real recorded provider streams (``../shared/fixtures/providers/``).

Every file of the three provider APIs Latch supports is run through the worker's own code
path (``tests/fixtures_lib.run_capture``, which is what ``latch assemble --from-sse`` does),
and the expected outcomes are written here by hand, from reading each file: tool names, call
ids, parsed arguments, committed or error with its reason, the provider order key ``index``,
the final message's text, status and stop reason, and the final record's ``outcomes``.

* ``openai.chat``: openai-python's five ``.inline-snapshot/external/*.bin`` (OpenAI chat SSE),
  and vercel-ai's OpenAI-compatible JSON-Lines captures of mistral (2), groq, xai and deepseek;
* ``anthropic.messages``: anthropic-sdk-python's ``tool_use_response.txt`` and
  ``stream-a-toolrefusal.sse``, vercel-ai's three anthropic captures, and pydantic-ai's
  redacted-thinking cassette;
* ``openai.responses``: vercel-ai's three responses captures and pydantic-ai's Responses
  cassette.

vercel-ai's ``amazon-bedrock`` and ``google`` captures, and pydantic-ai's Bedrock error
cassette, are tested in ``test_fixtures_bedrock_gemini.py``.

Besides each file as recorded, *derived* variants change one thing in a real stream to reach
an outcome no recording shows (a schema the arguments violate, a tool left unregistered, a
``finish_reason`` turned into ``length``, rotating item ids, a dropped fragment). Each says
what it changed. A capture that holds several model responses (the Responses files) is split
at each terminal event into one run per response, as a gateway publishes them.

The fixtures are third-party files (Apache-2.0 / MIT, LICENSE beside each folder); they are
read in place and never copied. If the directory is missing the tests fail, they never skip.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for fixtures_lib

from fixtures_lib import (
    ANTHROPIC_PY,
    FIXTURES,
    OPENAI_PY,
    PYDANTIC,
    VERCEL,
    check_run,
    fixture,
    load_events,
    only_final,
    run_capture,
    run_events,
    split_responses,
    summary,
    topic,
)

from worker.core import Assembler, AssembleSettings
from worker.tools import capture

# -- the files ----------------------------------------------------------------------------

CHAT_TWO_CALLS = f"{OPENAI_PY}/f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin"
CHAT_ONE_CALL = f"{OPENAI_PY}/c6aa7e397b7123c3501f25df3a05d4daf7e8ad6d61ffa406ab5361fe36a8d5b1.bin"
CHAT_ONE_CALL_NYC = (
    f"{OPENAI_PY}/2018feb66ae13fcf5333d61b95849decc68d3f63bd38172889367e1afb1e04f7.bin")
CHAT_N3 = f"{OPENAI_PY}/a491adda08c3d4fde95f5b2ee3f60f7f745f1a56d82e62f58031cc2add502380.bin"
CHAT_LENGTH = f"{OPENAI_PY}/4cc50a6135d254573a502310e6af1246f55edb6ad95fa24059f160996b68866d.bin"
MISTRAL_INCREMENTAL = f"{VERCEL}/mistral/src/__fixtures__/mistral-incremental-tool-call.chunks.txt"
MISTRAL_ONE_CHUNK = f"{VERCEL}/mistral/src/__fixtures__/mistral-tool-call.chunks.txt"
GROQ = f"{VERCEL}/groq/src/__fixtures__/groq-tool-call.chunks.txt"
XAI = f"{VERCEL}/xai/src/__fixtures__/xai-tool-call.chunks.txt"
DEEPSEEK = f"{VERCEL}/deepseek/src/chat/__fixtures__/deepseek-tool-call.chunks.txt"

ANTHROPIC_TOOL_USE = f"{ANTHROPIC_PY}/lib/streaming/fixtures/tool_use_response.txt"
ANTHROPIC_REFUSAL = f"{ANTHROPIC_PY}/fixtures/fable-fallback/stream-a-toolrefusal.sse"
ANTHROPIC_NO_ARGS = f"{VERCEL}/anthropic/src/__fixtures__/anthropic-tool-no-args.chunks.txt"
ANTHROPIC_WEB_FETCH = (
    f"{VERCEL}/anthropic/src/__fixtures__/anthropic-web-fetch-tool-20260209.1.chunks.txt")
ANTHROPIC_DUP_START = f"{VERCEL}/anthropic/src/__fixtures__/duplicate-message-start.chunks.txt"
ANTHROPIC_REDACTED = (
    f"{PYDANTIC}/test_anthropic/test_anthropic_model_thinking_part_redacted_stream.yaml")

RESPONSES_PARALLEL_19067 = (
    f"{VERCEL}/openai/src/responses/__fixtures__/issue-19067-parallel-tool-call-wrapper.chunks.txt")
RESPONSES_ID_ROTATION = (
    f"{VERCEL}/openai/src/responses/__fixtures__/github-copilot-id-rotation.1.chunks.txt")
RESPONSES_FOUR = (
    f"{VERCEL}/openai/src/responses/__fixtures__/openai-reasoning-encrypted-content.1.chunks.txt")
RESPONSES_PARALLEL = (
    f"{VERCEL}/openai/src/responses/__fixtures__/parallel-tool-call-wrapper.1.chunks.txt")
RESPONSES_PYDANTIC = f"{PYDANTIC}/test_openai_responses/test_openai_responses_stream.yaml"

LATCH_FILES = {
    "openai.chat": [CHAT_TWO_CALLS, CHAT_ONE_CALL, CHAT_ONE_CALL_NYC, CHAT_N3, CHAT_LENGTH,
                    MISTRAL_INCREMENTAL, MISTRAL_ONE_CHUNK, GROQ, XAI, DEEPSEEK],
    "anthropic.messages": [ANTHROPIC_TOOL_USE, ANTHROPIC_REFUSAL, ANTHROPIC_NO_ARGS,
                           ANTHROPIC_WEB_FETCH, ANTHROPIC_DUP_START, ANTHROPIC_REDACTED],
    "openai.responses": [RESPONSES_ID_ROTATION, RESPONSES_FOUR, RESPONSES_PARALLEL,
                         RESPONSES_PYDANTIC],
}
ALL_FILES = [(p, f) for p, files in LATCH_FILES.items() for f in files]

# -- tool definitions, in each provider's own format ------------------------------------------

OBJ: dict[str, Any] = {"type": "object"}


def chat_tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def anthropic_tool(name: str, input_schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": f"{name} (test)", "input_schema": input_schema}


def responses_tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": parameters, "strict": True}


def strict_object(properties: dict[str, Any], required: list[str] | None = None
                  ) -> dict[str, Any]:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required,
            "additionalProperties": False}


GET_WEATHER_ARGS = strict_object({
    "city": {"type": "string"}, "country": {"type": "string"},
    "units": {"type": "string", "enum": ["c", "f"]}})
GET_STOCK_PRICE = strict_object({"ticker": {"type": "string"}, "exchange": {"type": "string"}})
CITY_ONLY = strict_object({"city": {"type": "string"}})
LOCATION = strict_object({"location": {"type": "string"}})
LOCATION_OPTIONAL = strict_object({"location": {"type": "string"}}, required=[])
QUERY = strict_object({"query": {"type": "string"}})
NO_PARAMS = strict_object({})
CALCULATOR = strict_object({
    "a": {"type": "number"}, "b": {"type": "number"},
    "op": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]}})
GET_CAPITAL = strict_object({"country": {"type": "string"}})  # as in the cassette's request

# -- helpers ------------------------------------------------------------------------------


def committed(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return topic(lines, "committed")


def errors(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return topic(lines, "errors")


def leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    return [value]


def assert_no_argument_text(content: str, raw_text: str, arguments: Any) -> None:
    """Rule 8 / error results: ``content`` quotes neither the text nor any argument value."""
    assert raw_text not in content
    for leaf in leaves(arguments):
        assert json.dumps(leaf) not in content, (leaf, content)
        if isinstance(leaf, str) and len(leaf) >= 3:
            assert leaf not in content, (leaf, content)


def edited(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return copy.deepcopy(events)


# -- the directory ------------------------------------------------------------------------


def test_every_latch_fixture_is_present() -> None:
    """The fixture directory holds every file these tests cover (fails, never skips)."""
    assert sum(len(files) for files in LATCH_FILES.values()) == 20
    for _provider, relative in ALL_FILES:
        assert fixture(relative).stat().st_size > 0
    assert (FIXTURES / "README.md").is_file()


@pytest.mark.parametrize(("provider", "relative"), ALL_FILES,
                         ids=[Path(f).name[:40] for _, f in ALL_FILES])
def test_redelivered_envelopes_change_nothing(provider: str, relative: str) -> None:
    """Every file, every envelope delivered twice: the output is the same as delivered once
    (contract: a re-delivered envelope is ignored and never changes an outcome)."""
    events = _readable_events(relative)
    runs = split_responses(events) if provider == "openai.responses" else [events]
    for n, run in enumerate(runs):
        once = run_events(provider, run, [], run_id=f"r{n}")
        assembler = Assembler()
        twice: list[dict[str, Any]] = []
        for envelope in capture.envelopes(provider, run, [], run_id=f"r{n}"):
            for _ in range(2):
                twice += [e.as_line() for e in
                          assembler.feed_record(None, orjson.dumps(envelope))]
        assert twice == once
        if provider == "openai.chat":  # stream.end ends the run: all copies are duplicates
            assert assembler.stats["duplicates"] == len(run) + 2
        else:  # the run ended at its terminal event; both stream.end copies come after it
            assert assembler.stats["duplicates"] == len(run) + 1
            assert assembler.stats["ignored_after_end"] == 2
        if topic(once, "final")[0]["status"] != "failed":
            check_run(provider, once, f"r{n}")


def _readable_events(relative: str) -> list[dict[str, Any]]:
    if relative == RESPONSES_PARALLEL:
        return _parallel_events_repaired()
    return load_events(fixture(relative))


# =========================================================================================
# OpenAI chat (openai-python)
# =========================================================================================


def test_chat_two_parallel_calls_commit_in_index_order() -> None:
    """openai-python f82268f2…bin: two parallel tool calls at tool index 0 and 1, both valid
    against their schemas, commit with the provider's ids, in index order, then the final."""
    tools = [chat_tool("GetWeatherArgs", GET_WEATHER_ARGS),
             chat_tool("get_stock_price", GET_STOCK_PRICE)]
    lines = run_capture("openai.chat", fixture(CHAT_TWO_CALLS), tools)
    check_run("openai.chat", lines)
    assert summary(lines) == [
        ("committed", "call_JMW1whyEaYG438VE1OIflxA2", "GetWeatherArgs", 0,
         {"city": "Edinburgh", "country": "GB", "units": "c"}),
        ("committed", "call_DNYTawLBoN8fj3KN6qU9N1Ou", "get_stock_price", 1,
         {"ticker": "AAPL", "exchange": "NASDAQ"}),
    ]
    first = committed(lines)[0]
    assert first == {
        "v": 1, "run_id": "capture", "tenant": None, "provider": "openai.chat",
        "call_id": "call_JMW1whyEaYG438VE1OIflxA2", "name": "GetWeatherArgs", "index": 0,
        "choice": 0, "arguments": {"city": "Edinburgh", "country": "GB", "units": "c"},
        "idempotency_key": "capture:call_JMW1whyEaYG438VE1OIflxA2"}
    final = only_final(lines)
    assert final["status"] == "completed"
    assert "choices" not in final
    assert final["message"] == {
        "role": "assistant", "content": None,
        "tool_calls": [
            {"id": "call_JMW1whyEaYG438VE1OIflxA2", "type": "function",
             "function": {"name": "GetWeatherArgs",
                          "arguments": '{"city": "Edinburgh", "country": "GB", "units": "c"}'}},
            {"id": "call_DNYTawLBoN8fj3KN6qU9N1Ou", "type": "function",
             "function": {"name": "get_stock_price",
                          "arguments": '{"ticker": "AAPL", "exchange": "NASDAQ"}'}},
        ]}
    assert final["outcomes"] == [
        {"tool_call_id": "call_JMW1whyEaYG438VE1OIflxA2", "name": "GetWeatherArgs",
         "index": 0, "choice": 0, "state": "committed"},
        {"tool_call_id": "call_DNYTawLBoN8fj3KN6qU9N1Ou", "name": "get_stock_price",
         "index": 1, "choice": 0, "state": "committed"},
    ]


def test_chat_two_calls_unregistered_tools_fail_unknown_tool() -> None:
    """f82268f2…bin with no tools registered: both calls fail ``unknown_tool``; nothing
    commits; the final message still holds both calls as the provider sent them."""
    lines = run_capture("openai.chat", fixture(CHAT_TWO_CALLS), [])
    check_run("openai.chat", lines)
    assert summary(lines) == [
        ("error", "call_JMW1whyEaYG438VE1OIflxA2", "GetWeatherArgs", 0, "unknown_tool"),
        ("error", "call_DNYTawLBoN8fj3KN6qU9N1Ou", "get_stock_price", 1, "unknown_tool"),
    ]
    assert all(e["state"] == "failed" for e in errors(lines))
    assert [o["reason"] for o in only_final(lines)["outcomes"]] == ["unknown_tool"] * 2


def test_chat_two_calls_one_registered_commits_only_that_one() -> None:
    """f82268f2…bin with only ``get_stock_price`` registered: index 0 fails ``unknown_tool``,
    index 1 commits; records stay in index order."""
    tools = [chat_tool("get_stock_price", GET_STOCK_PRICE)]
    lines = run_capture("openai.chat", fixture(CHAT_TWO_CALLS), tools)
    check_run("openai.chat", lines)
    assert summary(lines) == [
        ("error", "call_JMW1whyEaYG438VE1OIflxA2", "GetWeatherArgs", 0, "unknown_tool"),
        ("committed", "call_DNYTawLBoN8fj3KN6qU9N1Ou", "get_stock_price", 1,
         {"ticker": "AAPL", "exchange": "NASDAQ"}),
    ]


def test_chat_two_calls_schema_violation_never_quotes_arguments() -> None:
    """f82268f2…bin against schemas its arguments violate (units must be "f"; exchange at
    most 4 characters): both fail ``schema_invalid``, and the error content names the
    keyword and schema path only, never an argument value (contract: Outputs)."""
    weather = copy.deepcopy(GET_WEATHER_ARGS)
    weather["properties"]["units"]["enum"] = ["f"]
    stock = copy.deepcopy(GET_STOCK_PRICE)
    stock["properties"]["exchange"]["maxLength"] = 4
    tools = [chat_tool("GetWeatherArgs", weather), chat_tool("get_stock_price", stock)]
    lines = run_capture("openai.chat", fixture(CHAT_TWO_CALLS), tools)
    check_run("openai.chat", lines)
    assert [e["reason"] for e in errors(lines)] == ["schema_invalid", "schema_invalid"]
    first, second = errors(lines)
    assert first["content"] == (
        "schema_invalid: keyword 'enum' failed at schema path /properties/units/enum")
    assert second["content"] == (
        "schema_invalid: keyword 'maxLength' failed at schema path "
        "/properties/exchange/maxLength")
    assert_no_argument_text(first["content"], '{"city": "Edinburgh", "country": "GB", '
                            '"units": "c"}', {"city": "Edinburgh", "country": "GB",
                                              "units": "c"})
    assert_no_argument_text(second["content"], '{"ticker": "AAPL", "exchange": "NASDAQ"}',
                            {"ticker": "AAPL", "exchange": "NASDAQ"})
    assert not committed(lines)


def test_chat_length_on_a_tool_call_message_truncates_parsable_calls() -> None:
    """Derived from f82268f2…bin: its ``finish_reason: "tool_calls"`` turned into
    ``"length"``. Both calls' text parses and is schema-valid, yet both fail ``truncated``
    (rule 5), and the run's status is ``truncated``."""
    events = edited(load_events(fixture(CHAT_TWO_CALLS)))
    finishes = [c for e in events for c in e["choices"] if c.get("finish_reason")]
    assert [c["finish_reason"] for c in finishes] == ["tool_calls"]
    finishes[0]["finish_reason"] = "length"
    tools = [chat_tool("GetWeatherArgs", GET_WEATHER_ARGS),
             chat_tool("get_stock_price", GET_STOCK_PRICE)]
    lines = run_events("openai.chat", events, tools)
    check_run("openai.chat", lines)
    assert summary(lines) == [
        ("error", "call_JMW1whyEaYG438VE1OIflxA2", "GetWeatherArgs", 0, "truncated"),
        ("error", "call_DNYTawLBoN8fj3KN6qU9N1Ou", "get_stock_price", 1, "truncated"),
    ]
    assert only_final(lines)["status"] == "truncated"


def test_chat_dropped_fragment_is_invalid_json_without_quoting_text() -> None:
    """Derived from f82268f2…bin: the last fragment of call 1 (``"}"``) is dropped. Call 1
    fails ``invalid_json`` (no repair of truncated text, rule 1) with a position and a byte
    count only; call 0 still commits."""
    events = edited(load_events(fixture(CHAT_TWO_CALLS)))
    last = [e for e in events if e["choices"] and any(
        tc.get("index") == 1 and tc["function"].get("arguments") == "}"
        for tc in e["choices"][0]["delta"].get("tool_calls") or ())]
    assert len(last) == 1
    events.remove(last[0])
    tools = [chat_tool("GetWeatherArgs", GET_WEATHER_ARGS),
             chat_tool("get_stock_price", GET_STOCK_PRICE)]
    lines = run_events("openai.chat", events, tools)
    check_run("openai.chat", lines)
    assert [s[0] for s in summary(lines)] == ["committed", "error"]
    error = errors(lines)[0]
    assert error["reason"] == "invalid_json"
    assert error["tool_call_id"] == "call_DNYTawLBoN8fj3KN6qU9N1Ou"
    assert error["content"] == ("invalid_json: unexpected end of data at line 1 column 40 "
                                "(char 39); 39 bytes received")
    assert_no_argument_text(error["content"], '{"ticker": "AAPL", "exchange": "NASDAQ"',
                            {"ticker": "AAPL", "exchange": "NASDAQ"})


def test_chat_one_call_commits() -> None:
    """openai-python c6aa7e39…bin: one call, id and name in the first chunk together with
    ``role``, arguments in 13 fragments; it commits as ``GetWeatherArgs`` at index 0."""
    tools = [chat_tool("GetWeatherArgs", GET_WEATHER_ARGS)]
    lines = run_capture("openai.chat", fixture(CHAT_ONE_CALL), tools)
    check_run("openai.chat", lines)
    assert summary(lines) == [
        ("committed", "call_c91SqDXlYFuETYv8mUHzz6pp", "GetWeatherArgs", 0,
         {"city": "Edinburgh", "country": "UK", "units": "c"})]
    final = only_final(lines)
    assert final["status"] == "completed"
    assert final["message"] == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_c91SqDXlYFuETYv8mUHzz6pp", "type": "function",
                        "function": {"name": "GetWeatherArgs", "arguments":
                                     '{"city":"Edinburgh","country":"UK","units":"c"}'}}]}


def test_chat_tools_in_another_providers_format_are_not_registered() -> None:
    """c6aa7e39…bin with the tool given in Anthropic's format (``input_schema``): the chat run
    registers no tool from it, so the call fails ``unknown_tool`` rather than running with
    no schema check."""
    tools = [anthropic_tool("GetWeatherArgs", GET_WEATHER_ARGS)]
    lines = run_capture("openai.chat", fixture(CHAT_ONE_CALL), tools)
    check_run("openai.chat", lines)
    assert [e["reason"] for e in errors(lines)] == ["unknown_tool"]


def test_chat_one_call_new_york() -> None:
    """openai-python 2018feb6…bin: one ``get_weather`` call, ``{"city":"New York City"}``."""
    tools = [chat_tool("get_weather", CITY_ONLY)]
    lines = run_capture("openai.chat", fixture(CHAT_ONE_CALL_NYC), tools)
    check_run("openai.chat", lines)
    assert summary(lines) == [("committed", "call_4XzlGBLtUe9dy3GVNV4jhq7h", "get_weather", 0,
                               {"city": "New York City"})]
    assert only_final(lines)["message"]["tool_calls"][0]["function"] == {
        "name": "get_weather", "arguments": '{"city":"New York City"}'}


def test_chat_one_call_budget_and_size_limits() -> None:
    """2018feb6…bin under limits: with ``max_tool_calls_per_run: 0`` the valid call fails
    ``budget_exceeded``; with ``max_tool_argument_bytes: 10`` (its text is 24 bytes) it
    fails ``arguments_exceed_max_bytes``. Neither content quotes the text."""
    tools = [chat_tool("get_weather", CITY_ONLY)]
    path = fixture(CHAT_ONE_CALL_NYC)
    lines = run_capture("openai.chat", path, tools, AssembleSettings(max_tool_calls_per_run=0))
    check_run("openai.chat", lines)
    assert summary(lines) == [("error", "call_4XzlGBLtUe9dy3GVNV4jhq7h", "get_weather", 0,
                               "budget_exceeded")]
    lines = run_capture("openai.chat", path, tools,
                        AssembleSettings(max_tool_argument_bytes=10))
    check_run("openai.chat", lines)
    assert summary(lines) == [("error", "call_4XzlGBLtUe9dy3GVNV4jhq7h", "get_weather", 0,
                               "arguments_exceed_max_bytes")]
    content = errors(lines)[0]["content"]
    assert_no_argument_text(content, '{"city":"New York City"}', {"city": "New York City"})


def test_chat_n3_choices_kept_apart() -> None:
    """openai-python a491adda…bin: ``n=3``, three interleaved choices of content only (JSON
    text, temperatures 65, 61 and 59). The final record keeps them apart in ``choices``, each
    with its own text and ``finish_reason: "stop"``; ``message`` is choice 0, whose entry in
    ``choices`` does not repeat it; no calls."""
    lines = run_capture("openai.chat", fixture(CHAT_N3), [chat_tool("get_weather", CITY_ONLY)])
    check_run("openai.chat", lines)
    final = only_final(lines)
    assert final["status"] == "completed"
    assert final["outcomes"] == []

    def text(temperature: int) -> str:
        return f'{{"city":"San Francisco","temperature":{temperature},"units":"f"}}'

    assert final["message"] == {"role": "assistant", "content": text(65)}
    assert final["choices"] == [{"index": 0, "finish_reason": "stop"}] + [
        {"index": i, "message": {"role": "assistant", "content": text(t)},
         "finish_reason": "stop"} for i, t in ((1, 61), (2, 59))]


def test_chat_n3_tool_calls_are_keyed_by_choice() -> None:
    """Derived from a491adda…bin: in each of the three choices the content deltas are
    replaced by the same text streamed as ``arguments`` of a call at tool index 0 with a
    per-choice id. The three calls share tool index 0 but are keyed by (choice, index) (rule
    2): three separate commits with their choice's temperature, each carrying ``choice``."""
    events = edited(load_events(fixture(CHAT_N3)))
    opened: set[int] = set()
    for event in events:
        for choice in event["choices"]:
            delta = choice["delta"]
            content = delta.pop("content", None)
            if not content:
                continue
            ci = choice["index"]
            entry: dict[str, Any] = {"index": 0, "function": {"arguments": content}}
            if ci not in opened:
                opened.add(ci)
                entry.update(id=f"call_choice_{ci}", type="function")
                entry["function"]["name"] = "report_weather"
            delta["tool_calls"] = [entry]
    schema = strict_object({"city": {"type": "string"}, "temperature": {"type": "integer"},
                            "units": {"type": "string"}})
    lines = run_events("openai.chat", events, [chat_tool("report_weather", schema)])
    check_run("openai.chat", lines)
    got = [(v["choice"], v["index"], v["call_id"], v["arguments"]["temperature"])
           for v in committed(lines)]
    assert got == [(0, 0, "call_choice_0", 65), (1, 0, "call_choice_1", 61),
                   (2, 0, "call_choice_2", 59)]
    final = only_final(lines)
    messages = [final["message"]] + [c["message"] for c in final["choices"][1:]]
    assert [m["tool_calls"][0]["id"] for m in messages] == [
        "call_choice_0", "call_choice_1", "call_choice_2"]
    assert [o["choice"] for o in final["outcomes"]] == [0, 1, 2]


def test_chat_finish_reason_length_marks_the_run_truncated() -> None:
    """openai-python 4cc50a61…bin: content ``{"`` then ``finish_reason: "length"``. There
    is no call to fail, but the run's final status is ``truncated`` (the provider reported
    truncation), and the partial text is kept as content."""
    lines = run_capture("openai.chat", fixture(CHAT_LENGTH), [])
    check_run("openai.chat", lines)
    final = only_final(lines)
    assert final["status"] == "truncated"
    assert final["message"] == {"role": "assistant", "content": '{"'}
    assert final["outcomes"] == []


# =========================================================================================
# OpenAI-compatible chat (vercel-ai): mistral, groq, xai, deepseek
# =========================================================================================


def test_mistral_id_less_continuation_with_empty_name() -> None:
    """vercel-ai mistral-incremental-tool-call: the first chunk opens index 0 with id and
    name ``webSearchTool`` and empty arguments; the second carries no id, ``"name": ""`` and
    the whole argument text. Empty means absent (rule 2): one call, named by the first chunk,
    never renamed to "" nor split in two."""
    tools = [chat_tool("webSearchTool", QUERY)]
    lines = run_capture("openai.chat", fixture(MISTRAL_INCREMENTAL), tools)
    check_run("openai.chat", lines)
    assert summary(lines) == [("committed", "chatcmpl-tool-9f149c74c42f265b", "webSearchTool",
                               0, {"query": "current Berlin weather"})]
    final = only_final(lines)
    assert final["message"] == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "chatcmpl-tool-9f149c74c42f265b", "type": "function",
                        "function": {"name": "webSearchTool",
                                     "arguments": '{"query": "current Berlin weather"}'}}]}


def test_mistral_call_without_id_fails_missing_id() -> None:
    """Derived from mistral-incremental-tool-call: the opening chunk's ``id`` removed. The
    call is still assembled at index 0 but fails ``missing_id_or_name``; its error result
    falls back to the buffer key ``"0.0"`` (choice 0, tool index 0) for ``tool_call_id``."""
    events = edited(load_events(fixture(MISTRAL_INCREMENTAL)))
    del events[0]["choices"][0]["delta"]["tool_calls"][0]["id"]
    lines = run_events("openai.chat", events, [chat_tool("webSearchTool", QUERY)])
    check_run("openai.chat", lines)
    assert summary(lines) == [("error", "0.0", "webSearchTool", 0, "missing_id_or_name")]
    assert errors(lines)[0]["content"] == (
        "missing_id_or_name: the provider sent no id for this call")


def test_mistral_whole_call_in_one_chunk_without_index() -> None:
    """vercel-ai mistral-tool-call: the whole call (id, name, arguments) in one chunk that
    has no ``index`` and also carries ``finish_reason``; it commits at index 0."""
    tools = [chat_tool("weather", LOCATION)]
    lines = run_capture("openai.chat", fixture(MISTRAL_ONE_CHUNK), tools)
    check_run("openai.chat", lines)
    assert summary(lines) == [("committed", "gSIMJiOkT", "weather", 0,
                               {"location": "San Francisco"})]
    assert only_final(lines)["message"]["content"] is None


def test_groq_empty_object_arguments_commit() -> None:
    """vercel-ai groq-tool-call: a whole call in one chunk with arguments ``"{}"``; a schema
    with no required property accepts it, so ``{}`` commits."""
    tools = [chat_tool("weather", LOCATION_OPTIONAL)]
    lines = run_capture("openai.chat", fixture(GROQ), tools)
    check_run("openai.chat", lines)
    assert summary(lines) == [("committed", "tk85n1k4m", "weather", 0, {})]
    assert only_final(lines)["message"]["tool_calls"][0]["function"]["arguments"] == "{}"


def test_groq_empty_arguments_against_required_property() -> None:
    """groq-tool-call against a schema that requires ``location``: ``{}`` fails
    ``schema_invalid`` on the ``required`` keyword."""
    lines = run_capture("openai.chat", fixture(GROQ), [chat_tool("weather", LOCATION)])
    check_run("openai.chat", lines)
    assert [(e["reason"], e["content"]) for e in errors(lines)] == [
        ("schema_invalid", "schema_invalid: keyword 'required' failed at schema path /required")]


def test_xai_reasoning_then_whole_call() -> None:
    """vercel-ai xai-tool-call: five ``reasoning_content`` deltas, then the whole call in one
    chunk; the call commits and the final message keeps the reasoning text."""
    lines = run_capture("openai.chat", fixture(XAI), [chat_tool("weather", LOCATION)])
    check_run("openai.chat", lines)
    assert summary(lines) == [("committed", "call_55117580", "weather", 0,
                               {"location": "San Francisco"})]
    assert only_final(lines)["message"] == {
        "role": "assistant", "content": None, "reasoning_content": "First, the user is",
        "tool_calls": [{"id": "call_55117580", "type": "function", "function": {
            "name": "weather", "arguments": '{"location":"San Francisco"}'}}]}


DEEPSEEK_REASONING = (
    "The user is asking for the weather in San Francisco. I need to use the weather tool to "
    "get this information. Let me invoke the weather tool with the location parameter set to "
    '"San Francisco".')


def test_deepseek_token_by_token_arguments() -> None:
    """vercel-ai deepseek-tool-call: ``reasoning_content`` tokens, then the call opened with
    empty arguments and ``{"location": "San Francisco"}`` streamed in 10 one-token fragments;
    it commits, and the final message keeps the reasoning text."""
    events = load_events(fixture(DEEPSEEK))
    fragments = [tc["function"]["arguments"] for e in events for c in e["choices"]
                 for tc in c["delta"].get("tool_calls") or ()]
    assert len(fragments) == 11 and fragments[0] == ""
    lines = run_capture("openai.chat", fixture(DEEPSEEK), [chat_tool("weather", LOCATION)])
    check_run("openai.chat", lines)
    assert summary(lines) == [("committed", "call_00_ioIn7yN9p1ZOMNpDLwd4MgAF", "weather", 0,
                               {"location": "San Francisco"})]
    message = only_final(lines)["message"]
    assert message["content"] is None
    assert message["reasoning_content"] == DEEPSEEK_REASONING
    assert message["tool_calls"][0]["function"]["arguments"] == '{"location": "San Francisco"}'


def test_deepseek_without_stream_end_event_still_needs_done() -> None:
    """deepseek-tool-call fed without its ``stream.end`` (the gateway never saw the end of the
    stream) and then ``stream.error``: the complete-looking call fails ``stream_error``; the
    latch holds only at stream end (rule 4)."""
    events = load_events(fixture(DEEPSEEK))
    envelopes = capture.envelopes("openai.chat", events, [chat_tool("weather", LOCATION)])
    envelopes[-1] = {"v": 1, "run_id": "capture", "seq": envelopes[-1]["seq"],
                     "type": "stream.error", "error": "connection reset"}
    assembler = Assembler()
    lines = [e.as_line() for env in envelopes
             for e in assembler.feed_record(None, orjson.dumps(env))]
    check_run("openai.chat", lines)
    assert summary(lines) == [("error", "call_00_ioIn7yN9p1ZOMNpDLwd4MgAF", "weather", 0,
                               "stream_error")]
    assert only_final(lines)["status"] == "failed"


# =========================================================================================
# Anthropic Messages
# =========================================================================================

PARIS_TEXT = "I'll check the current weather in Paris for you."


def test_anthropic_tool_use_commits_at_block_index() -> None:
    """anthropic-sdk-python tool_use_response.txt: a text block (index 0, with a ``ping``
    in the middle) and a ``tool_use`` block (index 1) whose start has ``input: {}`` and
    whose ``partial_json`` fragments make ``{"location": "Paris"}``. It commits with
    ``index`` 1 (the content block index); the final message holds both blocks and
    ``stop_reason: "tool_use"``."""
    tools = [anthropic_tool("get_weather", LOCATION)]
    lines = run_capture("anthropic.messages", fixture(ANTHROPIC_TOOL_USE), tools)
    check_run("anthropic.messages", lines)
    assert summary(lines) == [("committed", "toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather", 1,
                               {"location": "Paris"})]
    assert "choice" not in committed(lines)[0]
    final = only_final(lines)
    assert final["status"] == "completed"
    assert final["message"] == {
        "id": "msg_019Q1hrJbZG26Fb9BQhrkHEr", "model": "claude-sonnet-4-20250514",
        "role": "assistant", "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": PARIS_TEXT},
            {"type": "tool_use", "id": "toolu_01NRLabsLyVHZPKxbKvkfSMn", "name": "get_weather",
             "caller": {"type": "direct"}, "input": {"location": "Paris"}},
        ]}
    assert final["outcomes"] == [{"tool_call_id": "toolu_01NRLabsLyVHZPKxbKvkfSMn",
                                  "name": "get_weather", "index": 1, "state": "committed"}]


def test_anthropic_tool_use_unregistered_keeps_input_in_final() -> None:
    """tool_use_response.txt with no tools: ``unknown_tool``. The final message is the
    assistant message the provider sent whatever the outcome: its ``tool_use`` block keeps
    ``input: {"location": "Paris"}`` (not ``{}``), as the chat and Responses finals keep the
    argument text of failed calls."""
    lines = run_capture("anthropic.messages", fixture(ANTHROPIC_TOOL_USE), [])
    check_run("anthropic.messages", lines)
    assert summary(lines) == [("error", "toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather", 1,
                               "unknown_tool")]
    block = only_final(lines)["message"]["content"][1]
    assert block["input"] == {"location": "Paris"}


def test_anthropic_tool_use_pipelined_commit_at_block_stop() -> None:
    """tool_use_response.txt with ``execute_before_stream_end`` and ``get_weather`` in
    ``allow_pipelined_execute``: the call commits on its ``content_block_stop`` (rule 4),
    before ``message_delta`` and ``message_stop``; the final still comes last and the call
    has one outcome only."""
    settings = AssembleSettings(execute_before_stream_end=True,
                                allow_pipelined_execute=("get_weather",))
    events = load_events(fixture(ANTHROPIC_TOOL_USE))
    envelopes = capture.envelopes("anthropic.messages", events,
                                  [anthropic_tool("get_weather", LOCATION)])
    assembler = Assembler(settings)
    per_event = [(env.get("event", {}).get("type", env["type"]),
                  [e.as_line() for e in assembler.feed_record(None, orjson.dumps(env))])
                 for env in envelopes]
    emitting = [(kind, [line["topic"] for line in lines]) for kind, lines in per_event if lines]
    assert emitting == [("content_block_stop", ["committed", "audit"]),
                        ("message_stop", ["final"])]
    stops = [kind for kind, _ in per_event if kind == "content_block_stop"]
    assert len(stops) == 2  # the text block's stop commits nothing
    lines = [line for _, lines in per_event for line in lines]
    check_run("anthropic.messages", lines)
    assert committed(lines)[0]["arguments"] == {"location": "Paris"}


def test_anthropic_server_tool_refusal_commits_nothing() -> None:
    """anthropic-sdk-python stream-a-toolrefusal.sse (data lines with trailing spaces): a
    ``server_tool_use`` web_search block, its ``web_search_tool_result``, a text block, and
    ``stop_reason: "refusal"``. Even with a client tool of the same name registered, the
    server block is never a call (rule 6); it appears in the final message only. The run ends
    ``failed``: ``refusal`` is a stop for the message's content (docs/contract.md, "Stop and
    incomplete reasons"), as Bedrock's guardrail and Gemini's SAFETY stops are."""
    tools = [anthropic_tool("web_search", QUERY),
             {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]
    lines = run_capture("anthropic.messages", fixture(ANTHROPIC_REFUSAL), tools)
    check_run("anthropic.messages", lines)
    assert summary(lines) == []
    final = only_final(lines)
    assert final["status"] == "failed"
    assert final["outcomes"] == []
    message = final["message"]
    assert message["id"] == "msg_fixture_atool_0001"
    assert message["model"] == "claude-fable-5"
    assert message["stop_reason"] == "refusal"
    content = message["content"]
    assert [b["type"] for b in content] == ["server_tool_use", "web_search_tool_result", "text"]
    assert content[0] == {"type": "server_tool_use", "id": "srvtoolu_fixture_a_0001",
                          "name": "web_search",
                          "input": {"query": "solar eclipse viewing safety news 2026"}}
    assert content[1]["tool_use_id"] == "srvtoolu_fixture_a_0001"
    assert [r["url"] for r in content[1]["content"]] == [
        "https://www.example.com/eclipse-viewing-safety",
        "https://www.example.com/eclipses-2026"]
    assert content[2] == {"type": "text", "text":
                          "Here's a summary of this year's solar eclipses and how"}


def test_anthropic_tool_with_no_args_commits_empty_object() -> None:
    """vercel-ai anthropic-tool-no-args: ``updateIssueList`` starts with ``input: {}`` and
    gets one empty ``partial_json``, with ``ping`` events between; missing arguments mean
    ``{}`` (rule 3), which a parameterless schema accepts."""
    tools = [anthropic_tool("updateIssueList", NO_PARAMS)]
    lines = run_capture("anthropic.messages", fixture(ANTHROPIC_NO_ARGS), tools)
    check_run("anthropic.messages", lines)
    assert summary(lines) == [("committed", "toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList",
                               1, {})]
    assert only_final(lines)["message"] == {
        "id": "msg_01GE2RKp1VYsPzdFs3sS9z5S", "model": "claude-sonnet-4-5-20250929",
        "role": "assistant", "stop_reason": "tool_use",
        "content": [{"type": "text", "text": "I'll update the issue list for you."},
                    {"type": "tool_use", "id": "toolu_01QE1WLsSVp5hy5Q3GmGTmjP",
                     "name": "updateIssueList", "input": {}}]}


def test_anthropic_tool_with_no_args_then_the_schema_decides() -> None:
    """anthropic-tool-no-args against a schema that requires a property: ``{}`` fails
    ``schema_invalid`` (rule 3: "then the schema decides")."""
    tools = [anthropic_tool("updateIssueList", strict_object({"issues": {"type": "array"}}))]
    lines = run_capture("anthropic.messages", fixture(ANTHROPIC_NO_ARGS), tools)
    check_run("anthropic.messages", lines)
    assert summary(lines) == [("error", "toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList", 1,
                               "schema_invalid")]


WEB_FETCH_CODE = (
    '\nimport json\nresult = await web_fetch({"url": "https://example.com"})\n'
    'if isinstance(result, list):\n    print(result[0]["content"][:500])\n'
    'else:\n    print(result)\n')


def test_anthropic_web_fetch_server_tools_are_never_committed() -> None:
    """vercel-ai anthropic-web-fetch-tool-20260209: ``code_execution`` (input streamed) and
    ``web_fetch`` (full input in the block start, no deltas) are ``server_tool_use`` blocks;
    with client tools of both names registered, nothing commits and there are no outcomes.
    The final message holds all five blocks, server inputs included."""
    tools = [anthropic_tool("web_fetch", strict_object({"url": {"type": "string"}})),
             anthropic_tool("code_execution", strict_object({"code": {"type": "string"}}))]
    lines = run_capture("anthropic.messages", fixture(ANTHROPIC_WEB_FETCH), tools)
    check_run("anthropic.messages", lines)
    assert summary(lines) == []
    final = only_final(lines)
    assert final["outcomes"] == []
    message = final["message"]
    assert message["stop_reason"] == "end_turn"
    content = message["content"]
    assert [b["type"] for b in content] == [
        "server_tool_use", "server_tool_use", "web_fetch_tool_result",
        "code_execution_tool_result", "text"]
    assert content[0] == {"type": "server_tool_use", "id": "srvtoolu_01LKcA5qc1HwvLQSe3cLKmcK",
                          "name": "code_execution", "input": {"code": WEB_FETCH_CODE},
                          "caller": {"type": "direct"}}
    assert content[1] == {"type": "server_tool_use", "id": "srvtoolu_01SyXFZ4vqqE144ySoN6b5UG",
                          "name": "web_fetch", "input": {"url": "https://example.com"},
                          "caller": {"type": "code_execution_20260120",
                                     "tool_id": "srvtoolu_01LKcA5qc1HwvLQSe3cLKmcK"}}
    assert content[2]["content"]["url"] == "https://example.com"
    assert content[3]["content"]["return_code"] == 0
    assert content[4] == {"type": "text", "text": (
        "The page at **example.com** is a simple placeholder page explaining that the domain "
        "is reserved for use in illustrative documentation examples and does not require "
        "prior permission to reference.")}


def test_anthropic_duplicate_message_start_is_ignored() -> None:
    """vercel-ai duplicate-message-start: ``message_start`` sent twice. The result is the
    same, record for record, as the same stream with the repeat removed: one text block
    ``Hello, World!``, ``stop_reason: "end_turn"``, no calls."""
    events = load_events(fixture(ANTHROPIC_DUP_START))
    assert [e["type"] for e in events[:2]] == ["message_start", "message_start"]
    lines = run_events("anthropic.messages", events, [])
    check_run("anthropic.messages", lines)
    without = run_events("anthropic.messages", events[1:], [])
    assert lines == without
    assert only_final(lines)["message"] == {
        "id": "msg_dup", "model": "claude-3-haiku-20240307", "role": "assistant",
        "content": [{"type": "text", "text": "Hello, World!"}], "stop_reason": "end_turn"}
    assert only_final(lines)["status"] == "completed"


REDACTED_TEXT = (
    "I notice that you've sent what appears to be some kind of test string or command. "
    "I don't have any special \"magic string\" triggers or backdoor commands that would "
    "expose internal systems or change my behavior.\n\nI'm Claude, an AI assistant created "
    "by Anthropic to be helpful, harmless, and honest. How can I assist you today with a "
    "legitimate task or question?")


def test_anthropic_redacted_thinking_kept_in_final() -> None:
    """pydantic-ai test_anthropic_model_thinking_part_redacted_stream.yaml (a VCR cassette):
    two ``redacted_thinking`` blocks (opaque ``data``, no deltas) and a text block. No calls;
    the final message keeps both ``data`` strings unchanged, so the conversation can be sent
    back to the API, and the text in full."""
    lines = run_capture("anthropic.messages", fixture(ANTHROPIC_REDACTED), [])
    check_run("anthropic.messages", lines)
    message = only_final(lines)["message"]
    assert message["id"] == "msg_018XZkwvj9asBiffg3fXt88s"
    assert message["stop_reason"] == "end_turn"
    content = message["content"]
    assert [b["type"] for b in content] == ["redacted_thinking", "redacted_thinking", "text"]
    assert content[0]["data"].startswith("EqkECkYIBxgCKkA8AZ4noDfV5VcOJe")
    assert content[0]["data"].endswith("4ewJ/hgB") and len(content[0]["data"]) == 744
    assert content[1]["data"] == (
        "EtgBCkYIBxgCKkDQfGkwzflEJP5asG3oQfJXcTwJLoRznn8CmuczWCsJ36dv93X9H0NCeaJRbi5BrCA2DyMg"
        "FnRKRuzZx8VTv5axEgwkFmcHJk8BSiZMZRQaDDYv2KZPfbFgRa2QjyIwm47f5YYsSK9CT/oh/WWpU1HJJVHr"
        "8lrC6HG1ItRdtMvYQYmEGy+KhyfcIACfbssVKkDGv/NKqNMOAcu0bd66gJ2+R1R0PX11Jxn2Nd1JtZqkxx7v"
        "MT/PXtHDhm9jkDZ2k/6RjRRFuab/DBV3yRYdZ1J0GAE=")
    starts = [e["content_block"] for e in load_events(fixture(ANTHROPIC_REDACTED))
              if e["type"] == "content_block_start"]
    assert content[:2] == starts[:2]
    assert content[2] == {"type": "text", "text": REDACTED_TEXT}


def test_anthropic_thinking_signature_and_tool_use_after_redacted_thinking() -> None:
    """Derived from the redacted-thinking cassette (no recording here has a signed
    ``thinking`` block): a ``thinking`` block with two ``thinking_delta`` and a
    ``signature_delta`` is inserted at index 2, the text moves to 3, and a ``tool_use`` block
    with streamed input is added at 4. The final keeps the redacted data, the thinking text
    with its signature, the text; the call commits with ``index`` 4."""
    events = edited(load_events(fixture(ANTHROPIC_REDACTED)))
    for event in events:
        if event.get("index") == 2:
            event["index"] = 3
    at = next(i for i, e in enumerate(events) if e.get("index") == 3)
    thinking = [
        {"type": "content_block_start", "index": 2,
         "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "thinking_delta", "thinking": "The user sent a "}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "thinking_delta", "thinking": "magic string."}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}},
        {"type": "content_block_stop", "index": 2},
    ]
    events[at:at] = thinking
    end = next(i for i, e in enumerate(events) if e["type"] == "message_delta")
    events[end:end] = [
        {"type": "content_block_start", "index": 4, "content_block": {
            "type": "tool_use", "id": "toolu_derived_1", "name": "report", "input": {}}},
        {"type": "content_block_delta", "index": 4,
         "delta": {"type": "input_json_delta", "partial_json": '{"topic": '}},
        {"type": "content_block_delta", "index": 4,
         "delta": {"type": "input_json_delta", "partial_json": '"magic string"}'}},
        {"type": "content_block_stop", "index": 4},
    ]
    tools = [anthropic_tool("report", strict_object({"topic": {"type": "string"}}))]
    lines = run_events("anthropic.messages", events, tools)
    check_run("anthropic.messages", lines)
    assert summary(lines) == [("committed", "toolu_derived_1", "report", 4,
                               {"topic": "magic string"})]
    content = only_final(lines)["message"]["content"]
    assert [b["type"] for b in content] == [
        "redacted_thinking", "redacted_thinking", "thinking", "text", "tool_use"]
    assert content[2] == {"type": "thinking", "thinking": "The user sent a magic string.",
                          "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}
    assert content[3] == {"type": "text", "text": REDACTED_TEXT}
    assert content[4]["input"] == {"topic": "magic string"}


def test_anthropic_max_tokens_truncates_tool_use() -> None:
    """Derived from tool_use_response.txt: ``stop_reason: "tool_use"`` turned into
    ``"max_tokens"``. The call's text parses and is valid, yet it fails ``truncated``
    (rule 5) and the run's status is ``truncated``."""
    events = edited(load_events(fixture(ANTHROPIC_TOOL_USE)))
    delta = next(e for e in events if e["type"] == "message_delta")
    delta["delta"]["stop_reason"] = "max_tokens"
    lines = run_events("anthropic.messages", events, [anthropic_tool("get_weather", LOCATION)])
    check_run("anthropic.messages", lines)
    assert summary(lines) == [("error", "toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather", 1,
                               "truncated")]
    final = only_final(lines)
    assert final["status"] == "truncated"
    assert final["message"]["stop_reason"] == "max_tokens"


def test_anthropic_stream_end_without_message_stop_fails() -> None:
    """Derived from tool_use_response.txt: ``message_stop`` removed, so ``stream.end``
    arrives before the provider's own end: the call, though its block stopped, fails
    ``stream_error`` (rule 4: complete at ``message_stop``)."""
    events = load_events(fixture(ANTHROPIC_TOOL_USE))
    assert events[-1] == {"type": "message_stop"}
    lines = run_events("anthropic.messages", events[:-1],
                       [anthropic_tool("get_weather", LOCATION)])
    check_run("anthropic.messages", lines)
    assert summary(lines) == [("error", "toolu_01NRLabsLyVHZPKxbKvkfSMn", "get_weather", 1,
                               "stream_error")]
    assert only_final(lines)["status"] == "failed"


# =========================================================================================
# OpenAI Responses
# =========================================================================================

STRAWBERRY = ("There are **3** letter **\u201cr\u201d**s in **\u201cstrawberry.\u201d**\n\n"
              "Breakdown: **s t r a w b e r r y**  \n"
              "You can see **r** at positions **3, 8, and 9**.")


def test_responses_id_rotation_capture_has_no_calls() -> None:
    """vercel-ai github-copilot-id-rotation: a reasoning item and a message whose item ids
    change on every event (``capture-id-N``). Text deltas are placed by ``output_index``;
    there is no function call, so no outcome; the final output is the completed response's
    two items with the full text."""
    lines = run_capture("openai.responses", fixture(RESPONSES_ID_ROTATION), [])
    check_run("openai.responses", lines)
    final = only_final(lines)
    assert final["status"] == "completed"
    assert final["outcomes"] == []
    message = final["message"]
    assert (message["id"], message["model"], message["status"]) == (
        "capture-id-69", "gpt-5.3-codex", "completed")
    assert [i["type"] for i in message["output"]] == ["reasoning", "message"]
    assert message["output"][0]["summary"] == [
        {"text": "**Counting character occurrences**", "type": "summary_text"}]
    assert message["output"][1]["content"][0]["text"] == STRAWBERRY


def test_responses_id_rotation_on_a_function_call_keys_by_output_index() -> None:
    """Derived: the github-copilot rotation applied to the function call of the pydantic-ai
    Responses cassette (first response): every event of the item gets a new item id
    (``fc_rot_N``). The call is keyed by ``output_index``, never by item id, and commits once
    with the provider's ``call_id`` (not an ``fc_`` item id)."""
    first = split_responses(load_events(fixture(RESPONSES_PYDANTIC)))[0]
    events = edited(first)
    n = 0
    for event in events:
        for holder in (event, event.get("item") or {}):
            key = "item_id" if holder is event else "id"
            if key in holder and str(holder[key]).startswith("fc_"):
                n += 1
                holder[key] = f"fc_rot_{n}"
        for item in (event.get("response") or {}).get("output") or ():
            item["id"] = "fc_rot_final"
    assert n == 8
    lines = run_events("openai.responses", events, [responses_tool("get_capital", GET_CAPITAL)])
    check_run("openai.responses", lines)
    assert summary(lines) == [("committed", "call_kL0PCQV7M2WMoVX8V8OtYSAL", "get_capital", 0,
                               {"country": "France"})]


CALCULATOR_RUNS = [
    ("resp_01830d662ab3856501693c321345c88190b0de00f3b9975691",
     [("committed", "call_AB6AaRZ1FYZB2RwS6A5vbdqn", "calculator", 1,
       {"a": 12, "b": 7, "op": "add"})], ["reasoning", "function_call"]),
    ("resp_01830d662ab3856501693c3215903881909b710d150ff65014",
     [("committed", "call_Q6pW65MUgW9vF59BmItYGos3", "calculator", 0,
       {"a": 19, "b": 3, "op": "multiply"})], ["function_call"]),
    ("resp_01830d662ab3856501693c3216bef88190bf0e034cff24137b",
     [("committed", "call_Zl5vIMnD7dVAjgU6FkhmiCZh", "calculator", 0,
       {"a": 57, "b": 10, "op": "multiply"})], ["function_call"]),
    ("resp_01830d662ab3856501693c3217ba4c8190a3ddf6c839d4f12a", [], ["message"]),
]


def test_responses_four_concatenated_responses_split_into_four_runs() -> None:
    """vercel-ai openai-reasoning-encrypted-content: four responses back to back (reasoning
    + calculator add; multiply; multiply; the answer). Split at each ``response.completed``
    into four runs of one assembler, as a gateway publishes one run per model response: each
    run commits its own call (``index`` = its ``output_index``: 1 in the first, after the
    reasoning item) and ends with its own final; the last has only the text."""
    runs = split_responses(load_events(fixture(RESPONSES_FOUR)))
    assert len(runs) == 4
    tools = [responses_tool("calculator", CALCULATOR)]
    assembler = Assembler()
    for n, (run, (response_id, expected, kinds)) in enumerate(
            zip(runs, CALCULATOR_RUNS, strict=True)):
        lines = run_events("openai.responses", run, tools, run_id=f"r{n}", assembler=assembler)
        check_run("openai.responses", lines, f"r{n}")
        assert summary(lines) == expected
        final = only_final(lines)
        assert final["status"] == "completed"
        assert final["message"]["id"] == response_id
        assert final["message"]["model"] == "gpt-5.1-codex-max"
        assert [i["type"] for i in final["message"]["output"]] == kinds
    assert final["message"]["output"][0]["content"][0]["text"] == "The final result is **570**."
    assert assembler.open_runs == 0


def test_responses_four_responses_reasoning_item_kept_with_encrypted_content() -> None:
    """openai-reasoning-encrypted-content, first response: the final output keeps the
    reasoning item with its summary and ``encrypted_content`` (needed to continue the
    conversation), and the call item with its ``call_id`` and argument text."""
    first = split_responses(load_events(fixture(RESPONSES_FOUR)))[0]
    lines = run_events("openai.responses", first, [responses_tool("calculator", CALCULATOR)])
    reasoning, call = only_final(lines)["message"]["output"]
    assert reasoning["id"] == "rs_01830d662ab3856501693c321405c88190be3ab04d5782d5f9"
    assert reasoning["encrypted_content"].startswith("gAAAAABpPDIV")
    assert reasoning["summary"][0]["text"].startswith(
        "**Calculating step-by-step using calculator**")
    assert call["call_id"] == "call_AB6AaRZ1FYZB2RwS6A5vbdqn"
    assert call["id"] == "fc_01830d662ab3856501693c32151234819091cfca267e98cc5f"
    assert call["arguments"] == '{"a":12,"b":7,"op":"add"}'


def test_responses_four_responses_as_one_run_dead_letters_the_rest() -> None:
    """openai-reasoning-encrypted-content published (wrongly) as one run: the first
    ``response.completed`` ends the run, so only the first call gets an outcome; every later
    provider event is a contract break for a finished run, counted and summed up in one DLQ
    ``run_finished`` record (decision 0015), and the trailing ``stream.end`` is ignored."""
    events = load_events(fixture(RESPONSES_FOUR))
    lines = run_events("openai.responses", events, [responses_tool("calculator", CALCULATOR)])
    assert summary(lines) == CALCULATOR_RUNS[0][1]
    assert len(topic(lines, "final")) == 1
    dlq = topic(lines, "dlq")
    assert len(dlq) == 1 and lines[-1]["topic"] == "dlq"  # summed up at the input's end
    assert dlq[0]["reason"] == "run_finished"
    assert dlq[0]["late"]["count"] == len(events) - 56


def _parallel_events_repaired() -> list[dict[str, Any]]:
    """The parallel-tool-call-wrapper events, with its two malformed lines repaired.

    The file is hand-written upstream (S) and its ``response.created`` and
    ``response.completed`` lines lack the outer closing brace. The repair appends it and
    nothing else; the test asserts that exactly those two lines need it.
    """
    events, repaired = [], []
    for n, line in enumerate(fixture(RESPONSES_PARALLEL).read_text().splitlines()):
        try:
            events.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            events.append(orjson.loads(line + "}"))
            repaired.append(n)
    assert repaired == [0, 5]
    return events


PARALLEL_ARGS = ('{"tool_uses":[{"recipient_name":"functions.weather","parameters":'
                 '{"location":"San Francisco"}},{"recipient_name":"functions.cityAttractions",'
                 '"parameters":{"city":"Rome"}}]}')


def test_responses_parallel_wrapper_is_unwrapped() -> None:
    """vercel-ai parallel-tool-call-wrapper (repaired, see ``_parallel_events_repaired``): the
    model's ``multi_tool_use.parallel`` wrapper arrives as a function call named
    ``parallel``, which the run did not register. Latch unwraps it (docs/providers.md, "The parallel
    wrapper"): ``functions.weather`` and ``functions.cityAttractions`` become two calls with
    ids ``call_parallel#0`` and ``call_parallel#1``, each checked on its own and committed. The
    ``response.completed`` output is empty: the streamed items stay the final message
    (decision 0005), the wrapper's item replaced by the two calls' items (no item id)."""
    tools = [responses_tool("weather", LOCATION),
             responses_tool("cityAttractions", CITY_ONLY)]
    lines = run_events("openai.responses", _parallel_events_repaired(), tools)
    check_run("openai.responses", lines)
    assert summary(lines) == [
        ("committed", "call_parallel#0", "weather", 0, {"location": "San Francisco"}),
        ("committed", "call_parallel#1", "cityAttractions", 0, {"city": "Rome"})]
    final = only_final(lines)
    assert final["status"] == "completed"
    assert final["message"]["id"] == "resp_parallel"
    assert final["message"]["output"] == [
        {"type": "function_call", "call_id": "call_parallel#0", "name": "weather",
         "arguments": '{"location":"San Francisco"}', "status": "completed"},
        {"type": "function_call", "call_id": "call_parallel#1", "name": "cityAttractions",
         "arguments": '{"city":"Rome"}', "status": "completed"}]


def test_responses_parallel_wrapper_one_inner_call_unregistered() -> None:
    """The same wrapper with only ``weather`` registered: each unwrapped call is checked on
    its own, so ``weather`` commits and ``cityAttractions`` fails ``unknown_tool``, whose
    error never quotes its arguments."""
    lines = run_events("openai.responses", _parallel_events_repaired(),
                       [responses_tool("weather", LOCATION)])
    check_run("openai.responses", lines)
    assert summary(lines) == [
        ("committed", "call_parallel#0", "weather", 0, {"location": "San Francisco"}),
        ("error", "call_parallel#1", "cityAttractions", 0, "unknown_tool")]
    assert "Rome" not in errors(lines)[0]["content"]


def test_responses_parallel_wrapper_registered_name_is_not_unwrapped() -> None:
    """A run that registered a tool named ``parallel`` gets the wrapper as the call it is:
    one call ``call_parallel`` to ``parallel`` with the whole ``tool_uses`` object."""
    lines = run_events("openai.responses", _parallel_events_repaired(),
                       [responses_tool("parallel", OBJ)])
    check_run("openai.responses", lines)
    assert summary(lines) == [("committed", "call_parallel", "parallel", 0,
                               orjson.loads(PARALLEL_ARGS))]


def test_responses_parallel_wrapper_issue_19067_is_unwrapped() -> None:
    """vercel-ai issue-19067-parallel-tool-call-wrapper (well-formed JSON, the same events as
    the older file): unwrapped into ``call_parallel#0`` (``weather``, San Francisco) and
    ``call_parallel#1`` (``cityAttractions``, Rome), both committed; run ``completed``."""
    tools = [responses_tool("weather", LOCATION),
             responses_tool("cityAttractions", CITY_ONLY)]
    lines = run_capture("openai.responses", fixture(RESPONSES_PARALLEL_19067), tools)
    check_run("openai.responses", lines)
    assert summary(lines) == [
        ("committed", "call_parallel#0", "weather", 0, {"location": "San Francisco"}),
        ("committed", "call_parallel#1", "cityAttractions", 0, {"city": "Rome"})]
    assert only_final(lines)["status"] == "completed"


def test_responses_parallel_wrapper_verbatim_never_completes() -> None:
    """parallel-tool-call-wrapper as recorded: its ``response.created`` and
    ``response.completed`` lines are not JSON. A gateway can forward only the four events it
    can decode; without ``response.completed`` the ``stream.end`` fails the call
    ``stream_error`` (never committed, even with a tool named ``parallel`` registered)."""
    decodable = []
    for line in fixture(RESPONSES_PARALLEL).read_text().splitlines():
        try:
            decodable.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    assert [e["type"] for e in decodable] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]
    tools = [responses_tool("parallel", OBJ)]
    lines = run_events("openai.responses", decodable, tools)
    check_run("openai.responses", lines)
    assert summary(lines) == [("error", "call_parallel", "parallel", 0, "stream_error")]
    assert only_final(lines)["status"] == "failed"


def test_responses_pydantic_cassette_two_responses() -> None:
    """pydantic-ai test_openai_responses_stream.yaml: two interactions, i.e. two responses.
    Run 1 commits ``get_capital`` ``{"country": "France"}`` with ``call_id``
    ``call_kL0P…`` (not the item id ``fc_67e5…``); run 2 has the message
    ``The capital of France is Paris.`` and no calls."""
    runs = split_responses(load_events(fixture(RESPONSES_PYDANTIC)))
    assert len(runs) == 2
    tools = [responses_tool("get_capital", GET_CAPITAL)]
    assembler = Assembler()
    first = run_events("openai.responses", runs[0], tools, run_id="r0", assembler=assembler)
    check_run("openai.responses", first, "r0")
    assert summary(first) == [("committed", "call_kL0PCQV7M2WMoVX8V8OtYSAL", "get_capital", 0,
                               {"country": "France"})]
    assert committed(first)[0]["idempotency_key"] == "r0:call_kL0PCQV7M2WMoVX8V8OtYSAL"
    final = only_final(first)
    assert final["message"]["id"] == "resp_67e554a155508191900ee113293c4c830794405d35281ae2"
    assert final["message"]["output"][0]["call_id"] == "call_kL0PCQV7M2WMoVX8V8OtYSAL"
    second = run_events("openai.responses", runs[1], tools, run_id="r1", assembler=assembler)
    check_run("openai.responses", second, "r1")
    assert summary(second) == []
    output = only_final(second)["message"]["output"]
    assert [i["type"] for i in output] == ["message"]
    assert output[0]["content"][0]["text"] == "The capital of France is Paris."


def test_responses_pydantic_cassette_additional_properties_violation() -> None:
    """pydantic-ai Responses cassette, first response, against a schema that allows only a
    ``city`` property: ``{"country": "France"}`` fails ``schema_invalid`` and the content
    names neither the key nor the value."""
    first = split_responses(load_events(fixture(RESPONSES_PYDANTIC)))[0]
    tools = [responses_tool("get_capital", CITY_ONLY)]
    lines = run_events("openai.responses", first, tools)
    check_run("openai.responses", lines)
    assert summary(lines) == [("error", "call_kL0PCQV7M2WMoVX8V8OtYSAL", "get_capital", 0,
                               "schema_invalid")]
    content = errors(lines)[0]["content"]
    assert "France" not in content and "country" not in content


def test_responses_incomplete_truncates() -> None:
    """Derived from the pydantic-ai cassette's first response: ``response.completed``
    replaced by ``response.incomplete`` (``max_output_tokens``). The call fails
    ``truncated`` (rule 5) and the run's status is ``truncated``."""
    events = edited(split_responses(load_events(fixture(RESPONSES_PYDANTIC)))[0])
    last = events[-1]
    assert last["type"] == "response.completed"
    last["type"] = "response.incomplete"
    last["response"]["status"] = "incomplete"
    last["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    lines = run_events("openai.responses", events, [responses_tool("get_capital", GET_CAPITAL)])
    check_run("openai.responses", lines)
    assert summary(lines) == [("error", "call_kL0PCQV7M2WMoVX8V8OtYSAL", "get_capital", 0,
                               "truncated")]
    assert only_final(lines)["status"] == "truncated"


def test_responses_pipelined_commit_at_output_item_done() -> None:
    """pydantic-ai cassette, first response, with ``get_capital`` allowed to pipeline: the
    call commits at ``response.output_item.done`` (rule 4), before ``response.completed``,
    which then emits only the final."""
    settings = AssembleSettings(execute_before_stream_end=True,
                                allow_pipelined_execute=("get_capital",))
    first = split_responses(load_events(fixture(RESPONSES_PYDANTIC)))[0]
    envelopes = capture.envelopes("openai.responses", first,
                                  [responses_tool("get_capital", GET_CAPITAL)])
    assembler = Assembler(settings)
    emitting = []
    for env in envelopes:
        got = [e.as_line()["topic"] for e in assembler.feed_record(None, orjson.dumps(env))]
        if got:
            emitting.append((env.get("event", {}).get("type"), got))
    assert emitting == [("response.output_item.done", ["committed", "audit"]),
                        ("response.completed", ["final"])]


# =========================================================================================
# latch assemble --from-sse, as a subprocess
# =========================================================================================


def _latch(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    script = Path(sys.executable).with_name("latch")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "worker"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATCH_")}
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True,
                          timeout=120, check=False)


CLI_CASES = [
    ("openai.chat", CHAT_TWO_CALLS, [chat_tool("GetWeatherArgs", GET_WEATHER_ARGS)]),
    ("openai.chat", DEEPSEEK, [chat_tool("weather", LOCATION)]),
    ("anthropic.messages", ANTHROPIC_TOOL_USE, [anthropic_tool("get_weather", LOCATION)]),
    ("anthropic.messages", ANTHROPIC_REDACTED, []),
    ("openai.responses", RESPONSES_ID_ROTATION, []),
    ("openai.responses", RESPONSES_FOUR, [responses_tool("calculator", CALCULATOR)]),
]


@pytest.mark.parametrize(("provider", "relative", "tools"), CLI_CASES,
                         ids=[f"{p}-{Path(f).name[:24]}" for p, f, _ in CLI_CASES])
def test_cli_assemble_from_sse_matches_in_process(
        provider: str, relative: str, tools: list[Any], tmp_path: Path) -> None:
    """``latch assemble --from-sse PROVIDER --tools FILE CAPTURE`` on a real capture (one
    or more per provider; a cassette, SSE and JSON Lines): exit 0, every stdout line is JSON
    ``{topic, key, value}``, and the lines equal the in-process run, in order."""
    path = fixture(relative)
    tools_file = tmp_path / "tools.json"
    tools_file.write_bytes(orjson.dumps(tools))
    done = _latch("assemble", "--from-sse", provider, "--tools", str(tools_file), str(path),
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert all(set(line) == {"topic", "key", "value"} for line in lines)
    assert lines == run_capture(provider, path, tools)
    assert lines[0]["topic"] in ("committed", "errors", "final")
    assert "final" in [line["topic"] for line in lines]


def test_cli_assemble_split_responses_run(tmp_path: Path) -> None:
    """The second response of openai-reasoning-encrypted-content written as its own JSON-Lines
    capture and run through the CLI: exit 0, one committed ``multiply`` call, one final."""
    second = split_responses(load_events(fixture(RESPONSES_FOUR)))[1]
    capture_file = tmp_path / "second.chunks.txt"
    capture_file.write_bytes(b"\n".join(orjson.dumps(e) for e in second) + b"\n")
    tools_file = tmp_path / "tools.json"
    tools_file.write_bytes(orjson.dumps([responses_tool("calculator", CALCULATOR)]))
    done = _latch("assemble", "--from-sse", "openai.responses", "--tools", str(tools_file),
                  "--run-id", "second", str(capture_file), cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    check_run("openai.responses", lines, "second")
    assert summary(lines) == CALCULATOR_RUNS[1][1]


def test_cli_assemble_dead_letters_the_malformed_parallel_lines(tmp_path: Path) -> None:
    """parallel-tool-call-wrapper as recorded has two lines that are not JSON: the CLI still
    exits 0 (the input could be read), writes each unreadable line as a DLQ record with its
    original bytes, and, with no ``response.completed`` left, fails the two calls unwrapped
    from the wrapper (its item was done, so it was unwrapped) ``stream_error``."""
    tools_file = tmp_path / "tools.json"
    tools_file.write_bytes(b"[]")
    path = fixture(RESPONSES_PARALLEL)
    done = _latch("assemble", "--from-sse", "openai.responses", "--tools", str(tools_file),
                  str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    dlq = [line["value"] for line in lines if line["topic"] == "dlq"]
    raw = path.read_text().splitlines()
    assert [base64.b64decode(d["original_b64"]).decode() for d in dlq] == [raw[0], raw[5]]
    assert {d["reason"] for d in dlq} == {"undecodable"}
    errors = [line["value"] for line in lines if line["topic"] == "errors"]
    assert [(e["tool_call_id"], e["reason"]) for e in errors] == [
        ("call_parallel#0", "stream_error"), ("call_parallel#1", "stream_error")]


def test_cli_assemble_runs_each_cassette_interaction_on_its_own(tmp_path: Path) -> None:
    """pydantic-ai test_openai_responses_stream.yaml (two interactions) through the CLI: two
    runs, ``capture-1`` and ``capture-2``, whose lines are exactly those of the two responses
    run one by one; no DLQ record (read as one run, the second response's 15 events went to
    the DLQ as ``run_finished``)."""
    tools = [responses_tool("get_capital", GET_CAPITAL)]
    tools_file = tmp_path / "tools.json"
    tools_file.write_bytes(orjson.dumps(tools))
    done = _latch("assemble", "--from-sse", "openai.responses", "--tools", str(tools_file),
                  str(fixture(RESPONSES_PYDANTIC)), cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    runs = split_responses(load_events(fixture(RESPONSES_PYDANTIC)))
    assert lines == [line for n, run in enumerate(runs, start=1)
                     for line in run_events("openai.responses", run, tools,
                                            run_id=f"capture-{n}")]
    assert [(line["key"], line["topic"]) for line in lines] == [
        ("capture-1", "committed"), ("capture-1", "audit"), ("capture-1", "final"),
        ("capture-2", "final")]
