"""Hand-made envelope sequences for the unit tests of the pure core.

Every helper returns plain JSON-able dicts shaped as the contract and the providers' own
streaming documentation describe them, so that a test reads like the stream it feeds:

* envelopes: :func:`run_start`, :func:`provider_event`, :func:`stream_end`,
  :func:`stream_error`, :func:`cancel`, :func:`decision`, :func:`tick`, and
  :func:`run_envelopes`, which numbers the ``seq`` of a whole run;
* tool definitions in each provider's own format: :func:`chat_tool`,
  :func:`anthropic_tool`, :func:`responses_tool`, :func:`tools_for`;
* provider events: ``chat_*`` (Chat Completions chunks), ``anthropic_*`` (Messages stream
  events), ``responses_*`` (Responses API stream events);
* whole runs: :func:`chat_run`, :func:`anthropic_run`, :func:`responses_run`, and
  :func:`provider_run`, which builds the same calls for any of the three providers;
* :func:`feed`, which sends envelopes through ``Assembler.feed_record`` exactly as the worker
  does (JSON bytes, no key), and small selectors over the emitted records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from worker.core import Assembler, AssembleSettings, Emit, Topic

CHAT = "openai.chat"
ANTHROPIC = "anthropic.messages"
RESPONSES = "openai.responses"
PROVIDERS = (CHAT, ANTHROPIC, RESPONSES)
BEDROCK = "bedrock.converse"
GEMINI = "google.gemini"
#: The providers added by issue 11, built by the same helpers (``tools_for``,
#: ``provider_calls``, ``provider_run``).
NEW_PROVIDERS = (BEDROCK, GEMINI)
#: Every provider Latch reads.
ALL_PROVIDERS = (*PROVIDERS, *NEW_PROVIDERS)

#: An object schema with one required string property ``path`` and nothing else allowed.
PATH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
    "additionalProperties": False,
}
#: A schema that takes no arguments at all.
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


# -- envelopes ---------------------------------------------------------------------------


def run_start(run_id: str, provider: str, tools: list[Any], *, seq: int = 0,
              tenant: str | None = "t1", limits: dict[str, Any] | None = None,
              ts: int | None = None) -> dict[str, Any]:
    """A ``run.start`` envelope."""
    env: dict[str, Any] = {"v": 1, "run_id": run_id, "seq": seq, "type": "run.start",
                           "provider": provider, "tools": tools}
    if tenant is not None:
        env["tenant"] = tenant
    if limits is not None:
        env["limits"] = limits
    if ts is not None:
        env["ts"] = ts
    return env


def provider_event(run_id: str, seq: int, event: dict[str, Any],
                   ts: int | None = None) -> dict[str, Any]:
    """A ``provider.event`` envelope around one raw provider event."""
    env: dict[str, Any] = {"v": 1, "run_id": run_id, "seq": seq, "type": "provider.event",
                           "event": event}
    if ts is not None:
        env["ts"] = ts
    return env


def stream_end(run_id: str | None = None, seq: int | None = None) -> dict[str, Any]:
    """A ``stream.end`` envelope (run_id and seq may be filled by :func:`run_envelopes`)."""
    return _marker("stream.end", run_id, seq)


def stream_error(run_id: str | None = None, seq: int | None = None,
                 error: str = "connection reset") -> dict[str, Any]:
    """A ``stream.error`` envelope."""
    return {**_marker("stream.error", run_id, seq), "error": error}


def cancel(run_id: str | None = None, reason: str = "user_stop") -> dict[str, Any]:
    """A control ``cancel`` envelope (no seq: it is forwarded into the run's history)."""
    env: dict[str, Any] = {"v": 1, "type": "cancel", "reason": reason}
    if run_id is not None:
        env["run_id"] = run_id
    return env


def decision(run_id: str, kind: str, tool_call_id: str, *, by: str = "ops@example.com",
             reason: str = "looked at it", arguments: str | None = None) -> dict[str, Any]:
    """A control ``approve``, ``deny`` or ``edit`` envelope (no seq: forwarded like a cancel)."""
    env: dict[str, Any] = {"v": 1, "run_id": run_id, "type": kind, "tool_call_id": tool_call_id,
                           "by": by, "reason": reason}
    if arguments is not None:
        env["arguments"] = arguments
    return env


def tick(ts: int) -> dict[str, Any]:
    """The worker's idle-expiry marker carrying record time ``ts``."""
    return {"v": 1, "type": "tick", "ts": ts}


def tool_result(call: dict[str, Any], content: str = "ok", *, is_error: bool = False,
                structured: Any = None, source: tuple[int, int] | None = None,
                size: int | None = None, keep_content: bool = True, **changes: Any
                ) -> dict[str, Any]:
    """The ``tool.result`` marker the worker forwards into the events log for a runner's result
    answering the committed ``call`` (a committed call record's value); ``changes`` replace
    fields (a forged name or key)."""
    counted = len(content.encode()) + (len(orjson.dumps(structured)) if structured is not None
                                       else 0)
    env: dict[str, Any] = {"v": 1, "run_id": call["run_id"], "type": "tool.result",
                           "tool_call_id": call["call_id"], "name": call["name"],
                           "idempotency_key": call["idempotency_key"], "is_error": is_error,
                           "size": counted if size is None else size}
    if keep_content:
        env["content"] = content
        if structured is not None:
            env["structured"] = structured
    if source is not None:
        env["source"] = list(source)
    env.update(changes)
    return env


def _marker(kind: str, run_id: str | None, seq: int | None) -> dict[str, Any]:
    env: dict[str, Any] = {"v": 1, "type": kind}
    if run_id is not None:
        env["run_id"] = run_id
    if seq is not None:
        env["seq"] = seq
    return env


def run_envelopes(run_id: str, provider: str, tools: list[Any], events: Iterable[dict[str, Any]],
                  *, end: bool = True, tenant: str | None = "t1",
                  limits: dict[str, Any] | None = None, ts: int | None = None,
                  ts_step: int = 0) -> list[dict[str, Any]]:
    """``run.start``, then ``events`` in order, then ``stream.end`` when ``end``.

    A raw provider event is wrapped in ``provider.event``; an item that is already an
    envelope (it has ``"v"``) is passed through with its ``run_id`` filled in and, unless it is
    a cancel or a tick, the next ``seq``. ``seq`` counts from 0 at ``run.start``. With ``ts``,
    envelopes carry ``ts, ts + ts_step, ...``.
    """
    out = [run_start(run_id, provider, tools, tenant=tenant, limits=limits, ts=ts)]
    seq = 0
    items = list(events) + ([stream_end()] if end else [])
    for position, item in enumerate(items, start=1):
        stamp = None if ts is None else ts + ts_step * position
        if "v" in item:
            env = dict(item)
            if env.get("type") == "tick":
                out.append(env)
                continue
            env.setdefault("run_id", run_id)
            if env.get("type") != "cancel":
                seq += 1
                env.setdefault("seq", seq)
            if stamp is not None:
                env.setdefault("ts", stamp)
            out.append(env)
        else:
            seq += 1
            out.append(provider_event(run_id, seq, item, stamp))
    return out


# -- tool definitions, each in its provider's own format ----------------------------------


def chat_tool(name: str, parameters: Any = None) -> dict[str, Any]:
    """An OpenAI Chat Completions function tool."""
    fn: dict[str, Any] = {"name": name, "description": f"the {name} tool"}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def anthropic_tool(name: str, input_schema: Any = None) -> dict[str, Any]:
    """An Anthropic client tool (no ``type``)."""
    tool: dict[str, Any] = {"name": name, "description": f"the {name} tool"}
    if input_schema is not None:
        tool["input_schema"] = input_schema
    return tool


def responses_tool(name: str, parameters: Any = None) -> dict[str, Any]:
    """An OpenAI Responses function tool (flat: ``name`` beside ``type``)."""
    tool: dict[str, Any] = {"type": "function", "name": name, "description": f"the {name} tool"}
    if parameters is not None:
        tool["parameters"] = parameters
    return tool


def bedrock_tool(name: str, schema: Any = None) -> dict[str, Any]:
    """A Bedrock ``toolConfig.tools`` entry (``toolSpec``)."""
    spec: dict[str, Any] = {"name": name, "description": f"the {name} tool"}
    if schema is not None:
        spec["inputSchema"] = {"json": schema}
    return {"toolSpec": spec}


def tools_for(provider: str, schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """Tool definitions for ``provider`` from ``{name: schema}``."""
    if provider == GEMINI:
        return [{"functionDeclarations": [
            {"name": name, "description": f"the {name} tool",
             **({} if schema is None else {"parametersJsonSchema": schema})}
            for name, schema in schemas.items()]}]
    make = {CHAT: chat_tool, ANTHROPIC: anthropic_tool, RESPONSES: responses_tool,
            BEDROCK: bedrock_tool}[provider]
    return [make(name, schema) for name, schema in schemas.items()]


def split(text: str, pieces: int = 3) -> list[str]:
    """``text`` cut into up to ``pieces`` consecutive fragments (none empty unless text is)."""
    if not text:
        return []
    size = max(1, -(-len(text) // pieces))
    return [text[i:i + size] for i in range(0, len(text), size)]


# -- OpenAI Chat Completions chunks --------------------------------------------------------


def chat_chunk(tool_calls: list[dict[str, Any]] | None = None, *, content: str | None = None,
               finish_reason: str | None = None, choice: int = 0) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
            "model": "gpt-4o", "choices": [{"index": choice, "delta": delta,
                                            "finish_reason": finish_reason}]}


def chat_tool_delta(index: int | None, call_id: str | None = None, name: str | None = None,
                    arguments: str | None = None) -> dict[str, Any]:
    """One ``delta.tool_calls[]`` entry; ``None`` fields are left out."""
    entry: dict[str, Any] = {}
    if index is not None:
        entry["index"] = index
    if call_id is not None:
        entry["id"] = call_id
        entry["type"] = "function"
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if arguments is not None:
        fn["arguments"] = arguments
    if fn:
        entry["function"] = fn
    return entry


def chat_call_chunks(index: int, call_id: str | None, name: str | None, arguments: str,
                     *, pieces: int = 3, choice: int = 0) -> list[dict[str, Any]]:
    """A call as OpenAI streams it: id and name with empty arguments, then fragments."""
    first = chat_chunk([chat_tool_delta(index, call_id, name, "")], choice=choice)
    rest = [chat_chunk([chat_tool_delta(index, arguments=part)], choice=choice)
            for part in split(arguments, pieces)]
    return [first, *rest]


def chat_calls(calls: Sequence[tuple[str | None, str | None, str]], *,
               finish_reason: str = "tool_calls", pieces: int = 3) -> list[dict[str, Any]]:
    """Chunks for ``calls`` (``(id, name, arguments)``) at tool index 0, 1, ... of choice 0."""
    chunks: list[dict[str, Any]] = []
    for index, (call_id, name, arguments) in enumerate(calls):
        chunks += chat_call_chunks(index, call_id, name, arguments, pieces=pieces)
    chunks.append(chat_chunk(finish_reason=finish_reason))
    return chunks


def chat_custom_tool(name: str, fmt: Any = None) -> dict[str, Any]:
    """A chat custom (free-form) tool: ``{"type": "custom", "custom": {"name", "format"?}}``."""
    custom: dict[str, Any] = {"name": name}
    if fmt is not None:
        custom["format"] = fmt
    return {"type": "custom", "custom": custom}


def chat_custom_chunks(index: int, call_id: str | None, name: str | None, text: str,
                       *, pieces: int = 3) -> list[dict[str, Any]]:
    """A chat custom tool call as it streams (openai-python #2530): id, type and
    ``custom.name`` with empty input, then ``custom.input`` pieces."""
    head: dict[str, Any] = {"index": index, "type": "custom", "custom": {"input": ""}}
    if call_id is not None:
        head["id"] = call_id
    if name is not None:
        head["custom"]["name"] = name
    return [chat_chunk([head]), *(chat_chunk([{"index": index, "custom": {"input": part}}])
                                  for part in split(text, pieces))]


def chat_run(run_id: str, tools: list[Any], chunks: Iterable[dict[str, Any]],
             **kwargs: Any) -> list[dict[str, Any]]:
    """A whole ``openai.chat`` run: ``run.start``, the chunks, ``stream.end``."""
    return run_envelopes(run_id, CHAT, tools, chunks, **kwargs)


# -- Anthropic Messages stream events ------------------------------------------------------


def anthropic_message_start(message_id: str = "msg_1") -> dict[str, Any]:
    return {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1}}}


def anthropic_text_block(index: int, text: str) -> list[dict[str, Any]]:
    return [{"type": "content_block_start", "index": index,
             "content_block": {"type": "text", "text": ""}},
            *({"type": "content_block_delta", "index": index,
               "delta": {"type": "text_delta", "text": part}} for part in split(text)),
            {"type": "content_block_stop", "index": index}]


def anthropic_tool_block(index: int, call_id: str | None, name: str | None, arguments: str,
                         *, pieces: int = 3, kind: str = "tool_use",
                         stop: bool = True) -> list[dict[str, Any]]:
    """A ``tool_use`` (or ``server_tool_use``...) block: start, ``input_json_delta``s, stop."""
    block: dict[str, Any] = {"type": kind, "input": {}}
    if call_id is not None:
        block["id"] = call_id
    if name is not None:
        block["name"] = name
    events = [{"type": "content_block_start", "index": index, "content_block": block}]
    events += [{"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": part}}
               for part in split(arguments, pieces)]
    if stop:
        events.append({"type": "content_block_stop", "index": index})
    return events


def anthropic_tail(stop_reason: str = "tool_use", *, message_stop: bool = True
                   ) -> list[dict[str, Any]]:
    """``message_delta`` with ``stop_reason``, then ``message_stop``."""
    events: list[dict[str, Any]] = [{"type": "message_delta", "delta": {
        "stop_reason": stop_reason, "stop_sequence": None}, "usage": {"output_tokens": 42}}]
    if message_stop:
        events.append({"type": "message_stop"})
    return events


def anthropic_calls(calls: Sequence[tuple[str | None, str | None, str]], *,
                    stop_reason: str = "tool_use", message_stop: bool = True,
                    pieces: int = 3) -> list[dict[str, Any]]:
    """A whole message whose content blocks 0, 1, ... are ``tool_use`` blocks for ``calls``."""
    events = [anthropic_message_start()]
    for index, (call_id, name, arguments) in enumerate(calls):
        events += anthropic_tool_block(index, call_id, name, arguments, pieces=pieces)
    return events + anthropic_tail(stop_reason, message_stop=message_stop)


def anthropic_run(run_id: str, tools: list[Any], events: Iterable[dict[str, Any]],
                  **kwargs: Any) -> list[dict[str, Any]]:
    """A whole ``anthropic.messages`` run: ``run.start``, the events, ``stream.end``."""
    return run_envelopes(run_id, ANTHROPIC, tools, events, **kwargs)


# -- OpenAI Responses stream events --------------------------------------------------------


def responses_head(response_id: str = "resp_1") -> list[dict[str, Any]]:
    body = {"id": response_id, "object": "response", "status": "in_progress",
            "model": "gpt-4.1", "output": []}
    return [{"type": "response.created", "response": body},
            {"type": "response.in_progress", "response": body}]


def responses_item(output_index: int, call_id: str | None, name: str | None, arguments: str,
                   item_id: str | None = None) -> dict[str, Any]:
    """A ``function_call`` output item."""
    item: dict[str, Any] = {"type": "function_call", "id": item_id or f"fc_{output_index}",
                            "status": "completed", "arguments": arguments}
    if call_id is not None:
        item["call_id"] = call_id
    if name is not None:
        item["name"] = name
    return item


def responses_call(output_index: int, call_id: str | None, name: str | None, arguments: str,
                   *, item_id: str | None = None, pieces: int = 3, done: bool = True,
                   by_item_id: bool = False) -> list[dict[str, Any]]:
    """``output_item.added``, argument deltas, ``arguments.done`` and ``output_item.done``.

    With ``by_item_id`` the argument events carry only ``item_id`` (no ``output_index``).
    """
    item_id = item_id or f"fc_{output_index}"
    added = {**responses_item(output_index, call_id, name, "", item_id), "status": "in_progress"}
    where: dict[str, Any] = {"item_id": item_id}
    if not by_item_id:
        where["output_index"] = output_index
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": output_index, "item": added}]
    events += [{"type": "response.function_call_arguments.delta", **where, "delta": part}
               for part in split(arguments, pieces)]
    if done:
        events.append({"type": "response.function_call_arguments.done", **where,
                       "arguments": arguments})
        events.append({"type": "response.output_item.done", "output_index": output_index,
                       "item": responses_item(output_index, call_id, name, arguments, item_id)})
    return events


def responses_tail(kind: str = "response.completed", *,
                   output: list[dict[str, Any]] | None = None,
                   error_code: str = "server_error") -> dict[str, Any]:
    """The terminal event: ``response.completed``, ``response.incomplete`` or ``.failed``."""
    body: dict[str, Any] = {"id": "resp_1", "object": "response", "model": "gpt-4.1",
                            "status": kind.removeprefix("response."), "output": output or []}
    if kind == "response.incomplete":
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    if kind == "response.failed":
        body["error"] = {"code": error_code, "message": "the model failed"}
    return {"type": kind, "response": body}


def responses_calls(calls: Sequence[tuple[str | None, str | None, str]], *,
                    terminal: str | None = "response.completed",
                    pieces: int = 3) -> list[dict[str, Any]]:
    """A whole response whose output items 0, 1, ... are ``function_call`` items."""
    events = responses_head()
    output = []
    for index, (call_id, name, arguments) in enumerate(calls):
        events += responses_call(index, call_id, name, arguments, pieces=pieces)
        output.append(responses_item(index, call_id, name, arguments))
    if terminal is not None:
        events.append(responses_tail(terminal, output=output))
    return events


def item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """An output item added (``status: in_progress``), then done as ``item``."""
    return [{"type": "response.output_item.added", "output_index": index,
             "item": {**item, "status": "in_progress"}},
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def shell_call(call_id: str, commands: list[str], *, item_id: str = "sh_1",
               environment: Any = None) -> dict[str, Any]:
    """A finished Responses ``shell_call`` item (openai-python
    ``ResponseFunctionShellToolCall``)."""
    item = {"type": "shell_call", "id": item_id, "call_id": call_id,
            "action": {"commands": commands, "timeout_ms": 5000, "max_output_length": 4096},
            "status": "completed", "created_by": "resp_1"}
    if environment is not None:
        item["environment"] = environment
    return item


def apply_patch_call(call_id: str, operation: dict[str, Any], *,
                     item_id: str = "ap_1") -> dict[str, Any]:
    """A finished Responses ``apply_patch_call`` item (``ResponseApplyPatchToolCall``)."""
    return {"type": "apply_patch_call", "id": item_id, "call_id": call_id,
            "operation": operation, "status": "completed"}


def responses_run(run_id: str, tools: list[Any], events: Iterable[dict[str, Any]],
                  **kwargs: Any) -> list[dict[str, Any]]:
    """A whole ``openai.responses`` run: ``run.start``, the events, ``stream.end``."""
    return run_envelopes(run_id, RESPONSES, tools, events, **kwargs)


# -- Bedrock ConverseStream events (as the AWS SDKs yield them) ------------------------------


def bedrock_tool_block(index: int, call_id: str | None, name: str | None, arguments: str,
                       *, pieces: int = 3, stop: bool = True) -> list[dict[str, Any]]:
    """A ``toolUse`` content block: start, ``input`` fragments, stop."""
    tool: dict[str, Any] = {}
    if call_id is not None:
        tool["toolUseId"] = call_id
    if name is not None:
        tool["name"] = name
    events: list[dict[str, Any]] = [
        {"contentBlockStart": {"contentBlockIndex": index, "start": {"toolUse": tool}}}]
    events += [{"contentBlockDelta": {"contentBlockIndex": index,
                                      "delta": {"toolUse": {"input": part}}}}
               for part in split(arguments, pieces) or [""]]
    if stop:
        events.append({"contentBlockStop": {"contentBlockIndex": index}})
    return events


def bedrock_calls(calls: Sequence[tuple[str | None, str | None, str]], *,
                  stop_reason: str | None = "tool_use", pieces: int = 3
                  ) -> list[dict[str, Any]]:
    """A whole message whose content blocks 0, 1, ... are ``toolUse`` blocks for ``calls``;
    ``messageStop`` (unless ``stop_reason`` is None), then ``metadata``."""
    events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
    for index, (call_id, name, arguments) in enumerate(calls):
        events += bedrock_tool_block(index, call_id, name, arguments, pieces=pieces)
    if stop_reason is not None:
        events.append({"messageStop": {"stopReason": stop_reason}})
    events.append({"metadata": {"usage": {"inputTokens": 10, "outputTokens": 20,
                                          "totalTokens": 30}, "metrics": {"latencyMs": 100}}})
    return events


# -- Gemini streamGenerateContent chunks ----------------------------------------------------


def gemini_chunk(parts: list[dict[str, Any]], *, finish_reason: str | None = None,
                 candidate: int = 0) -> dict[str, Any]:
    """One ``GenerateContentResponse`` with one candidate."""
    body: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": candidate}
    if finish_reason is not None:
        body["finishReason"] = finish_reason
    return {"candidates": [body], "modelVersion": "gemini-3-pro-preview", "responseId": "resp-1"}


def partial_args(arguments: Any, pieces: int = 3, path: str = "$") -> list[dict[str, Any]]:
    """``partialArgs`` for a JSON value (object members and array elements in order), each
    string cut into ``pieces`` parts that say ``willContinue`` but the last."""
    if isinstance(arguments, dict):
        return [p for k, v in arguments.items()
                for p in partial_args(v, pieces, _member(path, k))]
    if isinstance(arguments, list):
        return [p for i, v in enumerate(arguments)
                for p in partial_args(v, pieces, f"{path}[{i}]")]
    if isinstance(arguments, str):
        texts = split(arguments, pieces) or [""]
        return [{"jsonPath": path, "stringValue": t, **({"willContinue": True}
                                                         if i < len(texts) - 1 else {})}
                for i, t in enumerate(texts)]
    if arguments is None:
        return [{"jsonPath": path, "nullValue": "NULL_VALUE"}]
    kind = "boolValue" if isinstance(arguments, bool) else "numberValue"
    return [{"jsonPath": path, kind: arguments}]


def _member(path: str, key: str) -> str:
    """``path`` extended by member ``key``: ``.key`` when RFC 9535's shorthand allows it, else
    ``['key']`` with ``\\`` and ``'`` escaped."""
    if key and (key[0].isalpha() or key[0] == "_") and all(c.isalnum() or c == "_" for c in key):
        return f"{path}.{key}"
    return "{}['{}']".format(path, key.replace("\\", "\\\\").replace("'", "\\'"))


def gemini_call_chunks(call_id: str | None, name: str | None, arguments: str, *,
                       pieces: int = 3, streamed: bool = True) -> list[dict[str, Any]]:
    """A call as Gemini streams it: ``{name, id, willContinue}``, then one chunk per
    ``PartialArg``, then ``functionCall: {}``; or, not ``streamed``, one whole part."""
    head: dict[str, Any] = {"name": name} if name is not None else {}
    if call_id is not None:
        head["id"] = call_id
    value = orjson.loads(arguments) if arguments.strip() else {}
    if not streamed:
        return [gemini_chunk([{"functionCall": {**head, "args": value}}])]
    first = gemini_chunk([{"functionCall": {**head, "willContinue": True}}])
    body = [gemini_chunk([{"functionCall": {"partialArgs": [p], "willContinue": True}}])
            for p in partial_args(value, pieces)]
    return [first, *body, gemini_chunk([{"functionCall": {}}])]


def gemini_calls(calls: Sequence[tuple[str | None, str | None, str]], *,
                 finish_reason: str | None = "STOP", pieces: int = 3,
                 streamed: bool = True) -> list[dict[str, Any]]:
    """Chunks for ``calls`` in order, then the finishing chunk (unless ``finish_reason`` is
    None) and a usage-only chunk."""
    chunks: list[dict[str, Any]] = []
    for call_id, name, arguments in calls:
        chunks += gemini_call_chunks(call_id, name, arguments, pieces=pieces, streamed=streamed)
    if finish_reason is not None:
        chunks.append(gemini_chunk([{"text": ""}], finish_reason=finish_reason))
    chunks.append({"usageMetadata": {"promptTokenCount": 10, "totalTokenCount": 30}})
    return chunks


# -- the same calls for any provider -------------------------------------------------------


def provider_calls(provider: str, calls: Sequence[tuple[str | None, str | None, str]], *,
                   complete: bool = True, pieces: int = 3) -> list[dict[str, Any]]:
    """Provider events for ``calls``; ``complete=False`` leaves out the provider's end event
    (Anthropic ``message_stop``, Responses terminal event) and, for chat, ``finish_reason``."""
    if provider == CHAT:
        chunks = chat_calls(calls, pieces=pieces)
        return chunks if complete else chunks[:-1]
    if provider == ANTHROPIC:
        return anthropic_calls(calls, message_stop=complete, pieces=pieces)
    if provider == BEDROCK:
        return bedrock_calls(calls, stop_reason="tool_use" if complete else None, pieces=pieces)
    if provider == GEMINI:
        return gemini_calls(calls, finish_reason="STOP" if complete else None, pieces=pieces)
    return responses_calls(calls, terminal="response.completed" if complete else None,
                           pieces=pieces)


def provider_run(provider: str, run_id: str, schemas: dict[str, Any],
                 calls: Sequence[tuple[str | None, str | None, str]], *,
                 pieces: int = 3, **kwargs: Any) -> list[dict[str, Any]]:
    """A complete, well-formed run of ``provider`` that makes ``calls`` (id, name, args)."""
    return run_envelopes(run_id, provider, tools_for(provider, schemas),
                         provider_calls(provider, calls, pieces=pieces), **kwargs)


def split_open_run(provider: str, run_id: str, arguments: str = '{"path": "/c"}'
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A run of ``provider`` with one ``read_file`` call (``call_1``, its argument text in
    two fragments), split after the call's first fragment: the head (the call is open) and
    the rest (``stream.end`` last)."""
    envelopes = provider_run(provider, run_id, {"read_file": PATH_SCHEMA},
                             [("call_1", "read_file", arguments)], pieces=2)
    # Gemini streams the value of "path" as partialArgs string pieces, the others its text.
    first = split(orjson.loads(arguments)["path"] if provider == GEMINI else arguments, 2)[0]
    needle = orjson.dumps(first)
    cut = next(n for n, env in enumerate(envelopes) if needle in orjson.dumps(env))
    return envelopes[:cut + 1], envelopes[cut + 1:]


# -- feeding and reading the output --------------------------------------------------------


def feed(assembler: Assembler, envelopes: Iterable[dict[str, Any] | bytes]) -> list[Emit]:
    """Feed each envelope as the worker does (``feed_record(None, json bytes)``)."""
    emits: list[Emit] = []
    for env in envelopes:
        raw = env if isinstance(env, bytes) else orjson.dumps(env)
        emits += assembler.feed_record(None, raw)
    return emits


def values(emits: Iterable[Emit], topic: Topic) -> list[dict[str, Any]]:
    return [e.value for e in emits if e.topic is topic]


def committed(emits: Iterable[Emit]) -> list[dict[str, Any]]:
    return values(emits, Topic.COMMITTED)


def errors(emits: Iterable[Emit]) -> list[dict[str, Any]]:
    return values(emits, Topic.ERRORS)


def finals(emits: Iterable[Emit]) -> list[dict[str, Any]]:
    return values(emits, Topic.FINAL)


def dlq(emits: Iterable[Emit]) -> list[dict[str, Any]]:
    return values(emits, Topic.DLQ)


def reasons(emits: Iterable[Emit]) -> list[str]:
    """The ``reason`` of each error result, in emission order."""
    return [e["reason"] for e in errors(emits)]


def outcome_ids(emits: Iterable[Emit]) -> list[str]:
    """The call id of each committed call or error result, in emission order."""
    return [e.value.get("call_id") or e.value["tool_call_id"] for e in emits
            if e.topic in (Topic.COMMITTED, Topic.ERRORS)]


def lines(emits: Iterable[Emit]) -> list[bytes]:
    """The ``latch assemble`` output lines, as bytes, for byte-for-byte comparisons."""
    return [orjson.dumps(e.as_line()) for e in emits]


@dataclass(frozen=True)
class Outcome:
    """One call's outcome, provider-neutral, for compact assertions."""

    call_id: str
    state: str
    reason: str | None


def outcomes(emits: Iterable[Emit]) -> list[Outcome]:
    out = []
    for e in emits:
        if e.topic is Topic.COMMITTED:
            out.append(Outcome(e.value["call_id"], "committed", None))
        elif e.topic is Topic.ERRORS:
            out.append(Outcome(e.value["tool_call_id"], e.value["state"], e.value["reason"]))
    return out


# -- invariants every output must keep -----------------------------------------------------


def check_outputs(emits: Sequence[Emit]) -> None:
    """Assert the shape rules every committed call and error result must keep.

    * an error result has ``is_error: true``, a ``state`` of ``failed`` or ``cancelled``
      (``cancelled`` exactly when the reason is ``cancelled``), a known ``reason``, a non-empty
      ``tool_call_id`` and ``name``, ``content`` that starts with the reason, and an
      ``idempotency_key`` under the run id;
    * a committed call's ``idempotency_key`` is ``run_id:call_id``;
    * no call id is both committed and failed in one run;
    * each run's final message comes after all of its outcomes, and lists them.
    """
    from worker.core import Reason

    known = {r.value for r in Reason}
    seen: dict[tuple[str, str], str] = {}
    finished: set[str] = set()
    for e in emits:
        v = e.value
        if e.topic in (Topic.COMMITTED, Topic.ERRORS):
            assert v["run_id"] not in finished, "an outcome after the run's final message"
            assert e.key == v["run_id"]
        if e.topic is Topic.ERRORS:
            assert v["is_error"] is True
            assert v["reason"] in known
            assert v["state"] == ("cancelled" if v["reason"] == "cancelled" else "failed")
            assert isinstance(v["tool_call_id"], str) and v["tool_call_id"]
            assert isinstance(v["name"], str) and v["name"]
            assert v["content"].startswith(f"{v['reason']}: ")
            assert isinstance(v["idempotency_key"], str)
            assert v["idempotency_key"].startswith(f"{v['run_id']}:{v['tool_call_id']}")
            kind = seen.setdefault((v["run_id"], v["tool_call_id"]), "error")
            assert kind == "error", "a call id both committed and failed"
        elif e.topic is Topic.COMMITTED:
            assert v["idempotency_key"] == f"{v['run_id']}:{v['call_id']}"
            assert (v["run_id"], v["call_id"]) not in seen, "a call id with two outcomes"
            seen[(v["run_id"], v["call_id"])] = "committed"
        elif e.topic is Topic.FINAL:
            finished.add(v["run_id"])
            states = {(o["tool_call_id"], o["state"]) for o in v["outcomes"]}
            for (run_id, call_id), kind in seen.items():
                if run_id == v["run_id"] and kind == "committed":
                    assert (call_id, "committed") in states


def check_schemas(emits: Iterable[Emit]) -> None:
    """Assert that every emitted record, as its ``latch assemble`` line, fits
    ``schemas/output-line.schema.json`` (which references each topic's schema)."""
    from worker.runtime.schemas import validator

    output_line = validator("output-line")
    for e in emits:
        line = orjson.loads(orjson.dumps(e.as_line()))
        problem = next(iter(output_line.iter_errors(line)), None)
        assert problem is None, f"{problem.message} at {list(problem.absolute_path)}"


def checked_run(envelopes: Iterable[dict[str, Any]], **settings: Any) -> list[Emit]:
    """Feed one run through a fresh assembler (``settings``: ``AssembleSettings`` fields);
    every record must fit its schema and the outputs' rules (:func:`check_outputs`)."""
    emits = feed(Assembler(AssembleSettings(**settings)), envelopes)
    check_schemas(emits)
    check_outputs(emits)
    return emits


def call_results(emits: Iterable[Emit]) -> list[tuple[str, str]]:
    """Each call's id with ``committed`` or its error reason, committed calls first."""
    emits = list(emits)
    return ([(c["call_id"], "committed") for c in committed(emits)]
            + [(e["tool_call_id"], e["reason"]) for e in errors(emits)])


def wrapper_text(*uses: tuple[str, Any]) -> str:
    """The text of OpenAI's ``multi_tool_use.parallel`` wrapper calling ``(recipient, params)``."""
    return orjson.dumps({"tool_uses": [{"recipient_name": r, "parameters": p}
                                       for r, p in uses]}).decode()


# -- signed decisions (docs/policies.md, "Approvals": with no approver keys, no decision counts) ---

#: Who :func:`decision` names by default, and so the approver the signed helpers sign as.
APPROVER = "ops@example.com"
#: The variable prefix that holds a test approver's key (``approvers.keys``: ``env:`` refs).
APPROVER_KEY_VAR = "LATCH_TEST_APPROVER_KEY_"


def approver_key_id(approver: str) -> str:
    """The id of ``approver``'s test key (``approvers.keys`` ids: ``[A-Za-z0-9._-]``)."""
    return "test-" + "".join(c if c.isalnum() or c in "._-" else "-" for c in approver)[:59]


def approver_key(approver: str) -> bytes:
    """``approver``'s fixed test key: 64 hex characters derived from its id (tests only: not
    a secret, never a deployment's)."""
    import hashlib

    return hashlib.sha256(f"latch test approver {approver}".encode()).hexdigest().encode()


def approver_env(*approvers: str) -> dict[str, str]:
    """The ``LATCH_`` variables by which ``load_config`` (and a worker given them) knows each
    approver's test key: ``approvers.keys`` as ``env:`` references, ``approvers.owners``, and
    the variables holding the keys (default: :data:`APPROVER` alone)."""
    approvers = approvers or (APPROVER,)
    ids = {a: approver_key_id(a) for a in approvers}
    var = {a: APPROVER_KEY_VAR + ids[a].upper().replace("-", "_").replace(".", "_")
           for a in approvers}
    keys = ", ".join(f"'{ids[a]}': 'env:{var[a]}'" for a in approvers)
    owners = ", ".join(f"'{ids[a]}': '{a}'" for a in approvers)
    return {"LATCH_APPROVERS__KEYS": f"{{{keys}}}", "LATCH_APPROVERS__OWNERS": f"{{{owners}}}",
            **{var[a]: approver_key(a).decode() for a in approvers}}


def signed(doc: dict[str, Any], ts: int = 1) -> dict[str, Any]:
    """A decision envelope signed with the test key of its ``by`` (:func:`approver_key`), as
    an approval tool with that approver's ``approvers.key_id`` signs it."""
    from worker.runtime.governance.approvers import DecisionSigner

    by = doc["by"]
    return DecisionSigner(approver_key_id(by), by, approver_key(by)).sign(doc, ts)


def signed_decision(run_id: str, kind: str, tool_call_id: str, **fields: Any) -> dict[str, Any]:
    """:func:`decision`, signed (:func:`signed`)."""
    return signed(decision(run_id, kind, tool_call_id, **fields))
