"""Rebuild ``examples/demo.jsonl`` from the recorded provider streams.

    python examples/make_demo.py [FIXTURES]  (default: <clone>/../shared/fixtures/providers)

Every provider event is copied verbatim from a recorded stream (``README.md`` here names the
files, their repositories, commits and licences), with two marked exceptions: the broken
stream stops where its transport "fails", and one argument fragment of the invalid-JSON run
gets a trailing comma. The runs are interleaved round-robin, as a gateway serving them at
once would publish them, and the cancel of ``chat-cancelled`` follows its first events.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from worker.tools import capture  # noqa: E402

TENANT = "acme"

GET_WEATHER_ARGS = {
    "type": "function",
    "function": {
        "name": "GetWeatherArgs",
        "description": "Get the temperature for the given country/city combo",
        "strict": True,
        "parameters": {
            "type": "object",
            "title": "GetWeatherArgs",
            "properties": {
                "city": {"title": "City", "type": "string"},
                "country": {"title": "Country", "type": "string"},
                "units": {"title": "Units", "type": "string", "enum": ["c", "f"], "default": "c"},
            },
            "required": ["city", "country", "units"],
            "additionalProperties": False,
        },
    },
}
GET_STOCK_PRICE = {
    "type": "function",
    "function": {
        "name": "get_stock_price",
        "description": "Fetch the latest price for a given ticker",
        "strict": True,
        "parameters": {
            "type": "object",
            "title": "GetStockPrice",
            "properties": {
                "ticker": {"title": "Ticker", "type": "string"},
                "exchange": {"title": "Exchange", "type": "string"},
            },
            "required": ["ticker", "exchange"],
            "additionalProperties": False,
        },
    },
}
CHAT_GET_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ANTHROPIC_GET_WEATHER = {
    "name": "get_weather",
    "description": "Get the weather at a specific location",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "City name"}},
        "required": ["location"],
    },
}
ANTHROPIC_UPDATE_ISSUES = {
    "name": "updateIssueList",
    "description": "Refresh the list of open issues",
    "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
}
RESPONSES_GET_CAPITAL = {  # as sent in the cassette's request
    "type": "function",
    "name": "get_capital",
    "description": "",
    "parameters": {
        "type": "object",
        "properties": {"country": {"type": "string"}},
        "required": ["country"],
        "additionalProperties": False,
    },
    "strict": True,
}

BEDROCK_GLOB_SEARCH = {  # a toolConfig.tools entry, Converse's own format
    "toolSpec": {
        "name": "glob_search",
        "description": "Find files whose path matches a glob pattern",
        "inputSchema": {"json": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}},
            "required": ["pattern"],
            "additionalProperties": False,
        }},
    },
}
GEMINI_WRITE_ITEMS = {  # a Gemini tools entry; parameters in Google's OpenAPI subset
    "functionDeclarations": [{
        "name": "writeItems",
        "description": "Add, update or remove items of the inventory",
        "parameters": {
            "type": "OBJECT",
            "properties": {"operations": {"type": "ARRAY", "items": {
                "type": "OBJECT",
                "properties": {
                    "action": {"type": "STRING", "enum": ["add", "update", "remove"]},
                    "itemid": {"type": "STRING"},
                    "description": {"type": "STRING"},
                    "price": {"type": "NUMBER"},
                },
                "required": ["action", "itemid"],
            }}},
            "required": ["operations"],
        },
    }],
}

OPENAI_PY = "openai-python/.inline-snapshot/external/"
SOURCES = {
    "chat-parallel": OPENAI_PY
    + "f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin",
    "anthropic-tool-use": "anthropic-sdk-python/tests/lib/streaming/fixtures/tool_use_response.txt",
    "responses-call": "pydantic-ai/tests/models/cassettes/test_openai_responses/"
    "test_openai_responses_stream.yaml",
    "chat-cancelled": OPENAI_PY
    + "2018feb66ae13fcf5333d61b95849decc68d3f63bd38172889367e1afb1e04f7.bin",
    "anthropic-broken-stream": "vercel-ai/packages/anthropic/src/__fixtures__/"
    "anthropic-tool-no-args.chunks.txt",
    "chat-invalid-json": OPENAI_PY
    + "c6aa7e397b7123c3501f25df3a05d4daf7e8ad6d61ffa406ab5361fe36a8d5b1.bin",
    "bedrock-kimi-tool-use": "vercel-ai/packages/amazon-bedrock/src/__fixtures__/"
    "issue-11409-kimi-k2-thinking-glob-search.chunks.txt",
    "gemini-partial-args": "vercel-ai/packages/google/src/__fixtures__/"
    "google-stream-tool-call-array-arguments-missing-terminal-function-call.chunks.txt",
}
#: Where the cancel goes in chat-cancelled: after run.start and this many provider events.
CANCEL_AFTER_EVENTS = 4


def events(fixtures: Path, run: str) -> list[dict[str, Any]]:
    path = fixtures / SOURCES[run]
    found, _ = capture.provider_events(path.read_text(encoding="utf-8"), str(path))
    if run == "responses-call":  # the cassette holds two responses; the first has the call
        end = next(i for i, e in enumerate(found) if e["type"] == "response.completed")
        found = found[: end + 1]
    return found


def runs(fixtures: Path) -> dict[str, list[dict[str, Any]]]:
    def envs(run: str, provider: str, tools: list[Any], evs: list[dict[str, Any]],
             end: bool = True) -> list[dict[str, Any]]:
        out = capture.envelopes(provider, evs, tools, run_id=run, tenant=TENANT)
        return out if end else out[:-1]

    out = {
        "chat-parallel": envs("chat-parallel", "openai.chat",
                              [GET_WEATHER_ARGS, GET_STOCK_PRICE],
                              events(fixtures, "chat-parallel")),
        "anthropic-tool-use": envs("anthropic-tool-use", "anthropic.messages",
                                   [ANTHROPIC_GET_WEATHER], events(fixtures, "anthropic-tool-use")),
        "responses-call": envs("responses-call", "openai.responses", [RESPONSES_GET_CAPITAL],
                               events(fixtures, "responses-call")),
        "bedrock-kimi-tool-use": envs("bedrock-kimi-tool-use", "bedrock.converse",
                                      [BEDROCK_GLOB_SEARCH],
                                      events(fixtures, "bedrock-kimi-tool-use")),
        "gemini-partial-args": envs("gemini-partial-args", "google.gemini",
                                    [GEMINI_WRITE_ITEMS], events(fixtures, "gemini-partial-args")),
    }

    cancelled = envs("chat-cancelled", "openai.chat", [CHAT_GET_WEATHER],
                     events(fixtures, "chat-cancelled"))
    cancel = {"v": 1, "run_id": "chat-cancelled", "type": "cancel", "reason": "user_stop"}
    cut = 1 + CANCEL_AFTER_EVENTS
    out["chat-cancelled"] = [*cancelled[:cut], cancel, *cancelled[cut:]]

    # The transport fails after the tool block closed but before message_delta/message_stop.
    broken = events(fixtures, "anthropic-broken-stream")
    stop = next(i for i, e in enumerate(broken) if e["type"] == "message_delta")
    envelopes = envs("anthropic-broken-stream", "anthropic.messages",
                     [ANTHROPIC_UPDATE_ISSUES], broken[:stop], end=False)
    envelopes.append({"v": 1, "run_id": "anthropic-broken-stream", "seq": stop + 1,
                      "type": "stream.error", "error": "upstream connection reset"})
    out["anthropic-broken-stream"] = envelopes

    # One fragment edited: the closing '"}' becomes '",}' (a trailing comma, not JSON).
    invalid = events(fixtures, "chat-invalid-json")
    last = max(i for i, e in enumerate(invalid)
               if e["choices"] and e["choices"][0]["delta"].get("tool_calls"))
    call = invalid[last]["choices"][0]["delta"]["tool_calls"][0]["function"]
    assert call["arguments"] == '"}', call
    call["arguments"] = '",}'
    out["chat-invalid-json"] = envs("chat-invalid-json", "openai.chat", [GET_WEATHER_ARGS],
                                    invalid)
    return out


def interleave(streams: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    merged = []
    for step in range(max(len(s) for s in streams)):
        merged += [s[step] for s in streams if step < len(s)]
    return merged


def main() -> None:
    default = HERE.parent.parent / "shared" / "fixtures" / "providers"
    fixtures = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    lines = interleave(list(runs(fixtures).values()))
    (HERE / "demo.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    print(f"wrote {len(lines)} envelopes to {HERE / 'demo.jsonl'}")


if __name__ == "__main__":
    main()
