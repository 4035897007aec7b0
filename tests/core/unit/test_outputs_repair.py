"""Repair and feedback to the model (``core/outputs.py``; docs/contract.md, "Repair and feedback to
the model"; docs/decisions/0017-protocol-repair.md): ``on_invalid_json: drop_with_protocol_repair``
leaves a call failing ``invalid_json`` out of the final message, per provider, while its error
result stays its one outcome (``dropped: true``); ``echo_invalid_input_tenants`` adds the text
the model sent to the error result of listed tenants only, bounded, and never to the audit."""

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
    check_outputs,
    check_schemas,
    errors,
    feed,
    finals,
    gemini_chunk,
    provider_run,
    run_envelopes,
    tools_for,
    values,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.outputs import ECHO_MAX_BYTES, echoed

SECRET = "sk-live-51HxSECRETtokenDoNotLeak0000"
BAD = '{"path": "/a", "token": "' + SECRET + '"'  # the closing brace never came
TOOLS = {"read_file": PATH_SCHEMA}
DROP = "drop_with_protocol_repair"
TEXT_PROVIDERS = (CHAT, ANTHROPIC, RESPONSES, BEDROCK)


def run(envelopes: list[dict[str, Any]], **settings: Any) -> list[Emit]:
    emits = feed(Assembler(AssembleSettings(**settings)), envelopes)
    check_schemas(emits)
    check_outputs(emits)
    return emits


def two_calls(provider: str, tenant: str | None = "t1") -> list[dict[str, Any]]:
    return provider_run(provider, "r1", TOOLS, [("call_ok", "read_file", '{"path": "/b"}'),
                                                ("call_bad", "read_file", BAD)], tenant=tenant)


def message_calls(provider: str, message: dict[str, Any]) -> list[str]:
    """The call ids the final message holds, read the provider's way."""
    if provider == CHAT:
        return [c["id"] for c in message.get("tool_calls", [])]
    if provider == ANTHROPIC:
        return [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
    if provider == RESPONSES:
        return [i["call_id"] for i in message["output"] if i.get("type") == "function_call"]
    if provider == BEDROCK:
        return [b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b]
    return [p["functionCall"]["id"] for p in message["parts"] if "functionCall" in p]


def one_outcome_per_id(emits: list[Emit]) -> dict[str, dict[str, Any]]:
    """Each call id has exactly one committed call or error result; returns them by id."""
    records = [(e.value.get("call_id") or e.value["tool_call_id"], e.value) for e in emits
               if e.topic in (Topic.COMMITTED, Topic.ERRORS)]
    ids = [i for i, _ in records]
    assert len(ids) == len(set(ids))
    return dict(records)


@pytest.mark.parametrize("provider", TEXT_PROVIDERS)
def test_drop_leaves_the_failed_call_out_of_the_message_and_keeps_one_outcome_per_id(
        provider: str) -> None:
    """Under ``drop_with_protocol_repair`` the final message holds the valid call and not the
    one failing ``invalid_json`` (no tool call, block or item for it, and no trace of its
    text); its error result is still its one outcome and says ``dropped``; the final's
    outcomes list both calls, once each, the dropped one with its reason and ``dropped``."""
    emits = run(two_calls(provider), on_invalid_json=DROP)
    by_id = one_outcome_per_id(emits)
    assert set(by_id) == {"call_ok", "call_bad"}
    bad = by_id["call_bad"]
    assert bad["reason"] == "invalid_json" and bad["dropped"] is True
    assert "dropped" not in by_id["call_ok"]
    [final] = finals(emits)
    assert message_calls(provider, final["message"]) == ["call_ok"]
    assert SECRET not in orjson.dumps(final["message"]).decode()
    outcomes = {o["tool_call_id"]: o for o in final["outcomes"]}
    assert len(final["outcomes"]) == 2
    assert outcomes["call_bad"]["reason"] == "invalid_json"
    assert outcomes["call_bad"]["dropped"] is True and "dropped" not in outcomes["call_ok"]


@pytest.mark.parametrize("provider", TEXT_PROVIDERS)
def test_error_result_is_the_default_and_keeps_the_call_in_the_message(provider: str) -> None:
    """By default (``error_result``) the failed call stays in the final message, to be
    answered by its error result, and no record says ``dropped``."""
    emits = run(two_calls(provider))
    [final] = finals(emits)
    assert message_calls(provider, final["message"]) == ["call_ok", "call_bad"]
    assert all("dropped" not in o for o in final["outcomes"])
    assert all("dropped" not in e for e in errors(emits))


@pytest.mark.parametrize("provider", TEXT_PROVIDERS)
def test_drop_touches_only_invalid_json(provider: str) -> None:
    """A call failing for another reason (``schema_invalid``) stays in the message under the
    drop policy: only ``invalid_json`` is repaired by dropping."""
    emits = run(provider_run(provider, "r1", TOOLS, [("call_s", "read_file", '{"path": 7}')]),
                on_invalid_json=DROP)
    [error] = errors(emits)
    assert error["reason"] == "schema_invalid" and "dropped" not in error
    [final] = finals(emits)
    assert message_calls(provider, final["message"]) == ["call_s"]


def gemini_chunks() -> list[dict[str, Any]]:
    """c1 streams a string that never ends (invalid_json) and carries the step's
    thoughtSignature; c2 is whole and commits."""
    return [gemini_chunk([{"functionCall": {"name": "read_file", "id": "c1",
                                            "willContinue": True},
                           "thoughtSignature": "sig-1"}]),
            gemini_chunk([{"functionCall": {"willContinue": True, "partialArgs": [
                {"jsonPath": "$.path", "stringValue": SECRET, "willContinue": True}]}}]),
            gemini_chunk([{"functionCall": {"name": "read_file", "id": "c2",
                                            "args": {"path": "/b"}}}]),
            gemini_chunk([{"text": ""}], finish_reason="STOP")]


def test_gemini_drop_moves_the_thought_signature_to_the_next_call() -> None:
    """Gemini: the dropped call's functionCall part is left out, and its thoughtSignature (which
    Gemini checks on a step's first functionCall part) moves to the next call kept; one outcome
    per id, the dropped one marked."""
    envelopes = run_envelopes("r1", GEMINI, tools_for(GEMINI, TOOLS), gemini_chunks())
    emits = run(envelopes, on_invalid_json=DROP)
    by_id = one_outcome_per_id(emits)
    assert by_id["c1"]["dropped"] is True and "call_id" in by_id["c2"]
    [final] = finals(emits)
    parts = [p for p in final["message"]["parts"] if "functionCall" in p]
    assert [(p["functionCall"]["id"], p.get("thoughtSignature")) for p in parts] == [
        ("c2", "sig-1")]
    [kept] = finals(run(envelopes))  # the default keeps both
    assert [p["functionCall"]["id"] for p in kept["message"]["parts"]
            if "functionCall" in p] == ["c1", "c2"]


def test_gemini_partial_args_are_never_echoed() -> None:
    """Gemini's streamed arguments are values (partialArgs), not text: a listed tenant's
    ``invalid_json`` error result gets no echo (and so never Latch's own record format)."""
    envelopes = run_envelopes("r1", GEMINI, tools_for(GEMINI, TOOLS), gemini_chunks())
    [error] = errors(run(envelopes, echo_invalid_input_tenants=("t1",)))
    assert error["reason"] == "invalid_json" and "INVALID_JSON" not in error["content"]
    assert SECRET not in error["content"]


@pytest.mark.parametrize("provider", TEXT_PROVIDERS)
def test_echo_is_off_by_default(provider: str) -> None:
    """With no tenant listed, an ``invalid_json`` error result holds no argument text."""
    [error] = errors(run(two_calls(provider)))
    assert error["reason"] == "invalid_json"
    assert SECRET not in error["content"] and "INVALID_JSON" not in error["content"]


@pytest.mark.parametrize("provider", TEXT_PROVIDERS)
def test_echo_only_for_listed_tenants(provider: str) -> None:
    """A listed tenant's ``invalid_json`` error result has, on its second line,
    ``{"INVALID_JSON": "<the text sent>"}``; its first line still starts with the reason. Another
    tenant, and a run without a tenant, get no echo under the same settings."""
    settings = {"echo_invalid_input_tenants": ("t1",)}
    [error] = errors(run(two_calls(provider, tenant="t1"), **settings))
    first, second = error["content"].split("\n")
    assert first.startswith("invalid_json: ") and first.endswith("the text sent follows")
    assert orjson.loads(second) == {"INVALID_JSON": BAD}
    for other in ("t2", None):
        [error] = errors(run(two_calls(provider, tenant=other), **settings))
        assert SECRET not in error["content"] and "\n" not in error["content"]


def test_echo_applies_to_invalid_json_only() -> None:
    """A listed tenant's error results for other reasons (``schema_invalid``) echo nothing."""
    emits = run(provider_run(CHAT, "r1", TOOLS, [("c", "read_file", f'{{"path": 7, "k": '
                                                                      f'"{SECRET}"}}')]),
                echo_invalid_input_tenants=("t1",))
    [error] = errors(emits)
    assert error["reason"] == "schema_invalid" and SECRET not in error["content"]


def test_echo_is_bounded_on_a_character_boundary() -> None:
    """A long text is cut at ``ECHO_MAX_BYTES`` UTF-8 bytes, never inside a character, and the
    first line says how many bytes of how many it shows; a short one is whole."""
    text = '{"path": "' + "é" * 5000  # 2 bytes each: 10,010 bytes, never closed
    note, body = echoed(text).split("\n")
    shown = orjson.loads(body)["INVALID_JSON"]
    size = len(shown.encode())
    assert size <= ECHO_MAX_BYTES and text.startswith(shown) and ECHO_MAX_BYTES - size < 2
    assert note == f"; the text sent follows, its first {size} of {len(text.encode())} bytes"
    assert echoed("{") == '; the text sent follows\n{"INVALID_JSON":"{"}'
    assert echoed("") == ""


def test_echo_in_a_run_is_bounded_and_fits_the_schema() -> None:
    """Through the assembler, a 20 KiB invalid text echoes at most ``ECHO_MAX_BYTES`` of it."""
    text = '{"path": "' + "x" * 20_000
    emits = run(provider_run(ANTHROPIC, "r1", TOOLS, [("c", "read_file", text)]),
                echo_invalid_input_tenants=("t1",))
    [error] = errors(emits)
    shown = orjson.loads(error["content"].split("\n")[1])["INVALID_JSON"]
    assert len(shown.encode()) == ECHO_MAX_BYTES and text.startswith(shown)


@pytest.mark.parametrize("provider", TEXT_PROVIDERS)
def test_the_audit_record_never_carries_the_echoed_text(provider: str) -> None:
    """With echo and drop on, the error result holds the text, but its audit record (and the
    final message) does not: the audit keeps the size and digest only."""
    emits = run(two_calls(provider), echo_invalid_input_tenants=("t1",), on_invalid_json=DROP)
    [error] = errors(emits)
    assert SECRET in error["content"]
    audits = values(emits, Topic.AUDIT)
    assert len(audits) == 2
    assert SECRET not in orjson.dumps(audits).decode()
    assert SECRET not in orjson.dumps(finals(emits)).decode()
