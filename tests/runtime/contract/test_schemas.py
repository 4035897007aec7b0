"""The JSON Schemas in ``schemas/`` are valid, documented, consistent, and say what the contract
says: its examples validate and records that break it do not."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from worker.runtime.schemas import load_schema, schema_names, schema_path, validator

ALL = schema_names()
OUTPUTS = ("committed-call", "error-result", "final-message", "progress", "dlq-record",
           "audit", "turn")

#: The contract's committed-call example, verbatim.
CONTRACT_COMMITTED: dict[str, Any] = {
    "v": 1, "run_id": "r1", "tenant": "t1", "provider": "openai.chat",
    "call_id": "call_abc", "name": "read_file", "index": 0,
    "arguments": {"path": "/tmp/a"}, "idempotency_key": "r1:call_abc",
}  # fmt: skip

#: The contract's error-result example, verbatim (it shows neither index nor idempotency_key).
CONTRACT_ERROR_VERBATIM: dict[str, Any] = {
    "v": 1, "run_id": "r1", "tenant": "t1", "provider": "openai.chat",
    "tool_call_id": "call_abc", "name": "read_file", "is_error": True,
    "state": "failed", "reason": "invalid_json", "content": "invalid_json: ...",
}  # fmt: skip

CONTRACT_ERROR = CONTRACT_ERROR_VERBATIM | {"index": 0, "idempotency_key": "r1:call_abc"}

#: The contract's 14 reason codes, in its order.
CONTRACT_REASONS = [
    "invalid_json", "arguments_not_object", "arguments_exceed_max_bytes",
    "too_many_tool_calls", "missing_id_or_name", "unknown_tool", "schema_invalid",
    "budget_exceeded", "truncated", "stream_error", "upstream_error", "cancelled",
    "assemble_idle_timeout", "duplicate_call_id",
    # issue 11: the Bedrock and Gemini stops for content and for malformed output
    "content_filtered", "malformed_output",
    # issue 11: a stream that breaks its own provider's protocol
    "protocol_error",
    # issue 23: a record that would outgrow the output topics' record size
    "record_too_large",
    # issue 25: the run's Cedar policies, in enforce, did not permit the call; the run named a
    # registry toolset version the registry did not hold in time
    "policy_denied", "unknown_toolset",
    # issue 26: a person denied a call waiting for approval, or did not decide in time
    "approval_denied", "approval_timeout",
    # issue 32: two of the run's tools would share the call's name
    "ambiguous_tool",
    # issue 32: the run's tenant must name a registered toolset (registry.require_toolsets_for)
    "toolset_required",
    # issue 33: the provider paused the turn (Anthropic pause_turn); its client calls wait
    "turn_paused",
]  # fmt: skip

PROVIDERS = ["openai.chat", "openai.responses", "anthropic.messages", "bedrock.converse",
             "google.gemini"]

RUN_START = {
    "v": 1, "run_id": "r1", "seq": 0, "type": "run.start", "provider": "openai.chat",
    "tenant": "t1", "tools": [{"type": "function", "function": {"name": "read_file"}}],
    "limits": {"max_tool_calls": 8},
}  # fmt: skip

FINAL_CHAT = {
    "v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat", "status": "completed",
    "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_abc", "type": "function",
                        "function": {"name": "read_file", "arguments": "{\"path\":\"/tmp/a\"}"}}],
    },
    "outcomes": [
        {"tool_call_id": "call_abc", "name": "read_file", "index": 0, "state": "committed"},
        {"tool_call_id": "call_def", "name": "unknown", "index": 1, "state": "failed",
         "reason": "missing_id_or_name"},
    ],
    "idempotency_key": "r1",
}  # fmt: skip

DLQ = {
    "v": 1, "reason": "undecodable", "detail": "not UTF-8 at byte 3",
    "source": {"topic": "llm.stream.events", "partition": 0, "offset": 42, "key_b64": "cjE="},
    "original_b64": "eyJ2Ijox", "run_id": None,
}  # fmt: skip


def valid(name: str, instance: object) -> bool:
    return bool(validator(name).is_valid(instance))


def walk_properties(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (path, subschema) that defines a field: under ``properties``, at any depth of
    ``properties``, ``items``, ``additionalProperties`` and ``$defs`` (not the conditions in
    ``if``/``then``/``anyOf``, which only restate fields defined elsewhere)."""
    for name, sub in schema.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from walk_properties(sub, f"{path}.{name}")
    for name, sub in schema.get("$defs", {}).items():
        yield from walk_properties(sub, f"{path}/$defs/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from walk_properties(schema[key], f"{path}/{key}")


# -- every file -----------------------------------------------------------------------------


def test_the_expected_files_exist() -> None:
    """schemas/ holds exactly the record kinds the contract, the worker and the runner need
    (issue 26: pending-call, a call waiting for approval; run-ended, decision 0015; issue 25:
    audit; issue 36: turn, the next turn's tool-result messages)."""
    assert set(ALL) == {
        "stream-envelope", "control-envelope", "tick-envelope", "committed-call",
        "error-result", "final-message", "progress", "dlq-record", "output-line", "config",
        "tool-result", "journal-entry", "registry", "pending-call", "run-ended", "audit",
        "turn",
    }  # fmt: skip


@pytest.mark.parametrize("name", ALL)
def test_schema_is_valid_2020_12(name: str) -> None:
    """Each file is itself a valid draft 2020-12 schema and declares that dialect."""
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("name", ALL)
def test_schema_is_identified_and_titled(name: str) -> None:
    """Each file has $id https://latch.dev/schemas/<name>.json, a title and a description."""
    schema = load_schema(name)
    assert schema["$id"] == f"https://latch.dev/schemas/{name}.json"
    assert schema["title"] and schema["description"]
    assert schema_path(name).name == f"{name}.schema.json"


@pytest.mark.parametrize("name", ALL)
def test_every_field_is_documented(name: str) -> None:
    """Every named property, at any depth, has a title and a description (or is a $ref to a
    definition that has them)."""
    schema = load_schema(name)
    for path, sub in walk_properties(schema):
        if "$ref" in sub and sub["$ref"].startswith("#/$defs/"):
            sub = schema["$defs"][sub["$ref"].removeprefix("#/$defs/")]
        if "$ref" in sub:
            continue  # a whole other file (output-line), documented there
        assert sub.get("title") and sub.get("description"), f"{name}{path}"


@pytest.mark.parametrize("name", [*OUTPUTS, "tick-envelope", "output-line"])
def test_outputs_reject_unknown_fields(name: str) -> None:
    """Records the worker writes are closed: a misspelled or stray field is a bug to catch."""
    assert load_schema(name)["additionalProperties"] is False


def test_provider_enums_agree() -> None:
    """Every schema that names a provider names the contract's three, so they cannot drift."""
    found = 0
    for name in ALL:
        schema = load_schema(name)
        for path, sub in walk_properties(schema):
            if path.endswith(".provider") and "enum" in sub:
                assert sub["enum"] == PROVIDERS, f"{name}{path}"
                found += 1
        if "provider" in schema.get("$defs", {}):
            assert schema["$defs"]["provider"]["enum"] == PROVIDERS
            found += 1
    assert found >= 5


def test_reason_codes_are_the_contracts() -> None:
    """The error result and the final message's outcomes use exactly the contract's codes
    (its fourteen, the three that issue 11 added and the one of issue 23), and so does
    ``Reason``."""
    from worker.core import Reason
    assert [r.value for r in Reason] == CONTRACT_REASONS
    assert load_schema("error-result")["$defs"]["reason"]["enum"] == CONTRACT_REASONS
    assert load_schema("final-message")["$defs"]["reason"]["enum"] == CONTRACT_REASONS


def test_config_topic_defaults_are_the_contracts() -> None:
    """The configured topic names default to the contract's topic table."""
    topics = load_schema("config")["properties"]["topics"]["properties"]
    assert {k: v["default"] for k, v in topics.items() if isinstance(v["default"], str)} == {
        "events": "llm.stream.events", "control": "llm.stream.control",
        "committed": "tool.calls.committed", "errors": "tool.calls.errors",
        "final": "llm.messages.final", "progress": "llm.stream.progress",
        "dlq": "llm.stream.dlq", "audit": "latch.audit", "results": "tool.calls.results",
        "journal": "tool.calls.journal", "pending": "tool.calls.pending",
        "registry": "latch.registry", "run_ended": "llm.runs.ended", "turns": "llm.turns",
    }  # fmt: skip
    assert topics["partitions"]["default"] == 12


# -- the contract's examples --------------------------------------------------------------


def test_contract_committed_example_validates() -> None:
    """The contract's committed-call example, verbatim, is a valid committed call."""
    assert valid("committed-call", CONTRACT_COMMITTED)


def test_contract_error_example_validates_with_index_and_key() -> None:
    """The contract's error-result example is valid once it carries index and
    idempotency_key, which every error result has (order and deduplication need them)."""
    assert valid("error-result", CONTRACT_ERROR)


def test_contract_error_example_verbatim_lacks_only_index_and_key() -> None:
    """The verbatim example fails only because it omits index and idempotency_key: the
    schema is stricter than the abbreviated example, and in nothing else."""
    errors = list(validator("error-result").iter_errors(CONTRACT_ERROR_VERBATIM))
    assert sorted(e.message for e in errors) == [
        "'idempotency_key' is a required property",
        "'index' is a required property",
    ]


def test_contract_control_example_validates() -> None:
    """The contract's control envelope example is valid, and so is it without reason."""
    control = {"v": 1, "run_id": "r1", "type": "cancel", "reason": "user_stop"}
    assert valid("control-envelope", control)
    assert valid("control-envelope", {"v": 1, "run_id": "r1", "type": "cancel"})


# -- stream envelopes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "envelope",
    [
        RUN_START,
        {"v": 1, "run_id": "r1", "seq": 0, "type": "run.start", "provider": "anthropic.messages",
         "tools": []},
        {"v": 1, "run_id": "r1", "seq": 0, "type": "run.start", "provider": "openai.responses"},
        RUN_START | {"tenant": None, "limits": None},
        RUN_START | {"limits": {"max_tool_calls": None, "max_cost": 3}},
        {"v": 1, "run_id": "r1", "seq": 1, "type": "provider.event", "ts": 1700000000000,
         "event": {"type": "message_stop"}},
        {"v": 1, "run_id": "r1", "seq": 2, "type": "stream.end"},
        {"v": 1, "run_id": "r1", "seq": 2, "type": "stream.error", "error": "reset"},
        {"v": 1, "run_id": "r1", "type": "cancel", "reason": "user_stop"},
        {"v": 1, "run_id": "r1", "seq": 2, "type": "stream.end", "gateway_extra": {"x": 1}},
        {"v": 1, "run_id": "r1", "seq": 2, "type": "stream.end", "provider": "other", "tools": 1},
    ],
)  # fmt: skip
def test_stream_envelope_accepts(envelope: dict[str, Any]) -> None:
    """Each envelope type in its documented shape is valid: tools, tenant and limits are
    optional on run.start (tenant and limits may be null), cancel markers need no seq, and
    unknown extra fields are allowed (forward compatibility), even ones that share a name with
    another type's field."""
    assert valid("stream-envelope", envelope)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"v": 2}, "only version 1 exists"),
        ({"run_id": ""}, "run_id must be non-empty"),
        ({"seq": -1}, "seq is >= 0"),
        ({"type": "run.stop"}, "unknown type"),
        ({"provider": "cohere.chat"}, "unknown provider"),
        ({"tools": {"read_file": {}}}, "tools is an array"),
        ({"limits": {"max_tool_calls": -1}}, "limits are >= 0"),
        ({"tenant": 7}, "tenant is a string"),
        ({"limits": [8]}, "limits is an object"),
        ({"ts": -1}, "ts is >= 0"),
        ({"seq": True}, "a boolean is not a seq"),
    ],
)
def test_stream_envelope_rejects(change: dict[str, Any], why: str) -> None:
    """A run.start that breaks one rule of the contract is invalid."""
    assert not valid("stream-envelope", RUN_START | change), why


@pytest.mark.parametrize(
    ("envelope", "why"),
    [
        ({"v": 1, "run_id": "r1", "seq": 0, "type": "run.start", "tools": []}, "no provider"),
        ({"v": 1, "run_id": "r1", "seq": 1, "type": "provider.event"}, "no event"),
        ({"v": 1, "run_id": "r1", "seq": 1, "type": "provider.event", "event": "data: {}"},
         "event is an object"),
        ({"v": 1, "run_id": "r1", "seq": 2, "type": "stream.error"}, "no error"),
        ({"v": 1, "run_id": "r1", "type": "stream.end"}, "no seq"),
        ({"run_id": "r1", "seq": 2, "type": "stream.end"}, "no v"),
    ],
)  # fmt: skip
def test_stream_envelope_requires_per_type(envelope: dict[str, Any], why: str) -> None:
    """Each type's required fields are required: provider for run.start, event for
    provider.event, error for stream.error, seq for all but cancel."""
    assert not valid("stream-envelope", envelope), why


def test_tick_envelope() -> None:
    """The internal tick is {v, type: tick, ts} and nothing else."""
    assert valid("tick-envelope", {"v": 1, "type": "tick", "ts": 1700000000000})
    assert not valid("tick-envelope", {"v": 1, "type": "tick"})
    assert not valid("tick-envelope", {"v": 1, "type": "tick", "ts": 1, "run_id": "r1"})


# -- outputs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"call_id": ""}, "call_id must be non-empty"),
        ({"index": -1}, "index is >= 0"),
        ({"choice": -1}, "choice is >= 0"),
        ({"provider": "openai"}, "unknown provider"),
        ({"arguments_text": "{}"}, "no stray fields"),
    ],
)
def test_committed_call_rejects(change: dict[str, Any], why: str) -> None:
    """A committed call that breaks one rule is invalid."""
    assert not valid("committed-call", CONTRACT_COMMITTED | change), why


def test_committed_call_optional_choice_and_null_tenant() -> None:
    """choice is optional (chat n > 1) and tenant may be null; arguments may be any JSON."""
    assert valid("committed-call", CONTRACT_COMMITTED | {"choice": 1, "tenant": None})
    assert valid("committed-call", CONTRACT_COMMITTED | {"arguments": [1, 2]})
    missing = {k: v for k, v in CONTRACT_COMMITTED.items() if k != "tenant"}
    assert not valid("committed-call", missing)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"reason": "timeout"}, "not one of the 14 codes"),
        ({"is_error": False}, "is_error is always true"),
        ({"state": "committed"}, "an error result is failed or cancelled"),
        ({"tool_call_id": ""}, "tool_call_id is non-empty"),
        ({"arguments": {}}, "no arguments on an error result"),
    ],
)
def test_error_result_rejects(change: dict[str, Any], why: str) -> None:
    """An error result that breaks one rule is invalid."""
    assert not valid("error-result", CONTRACT_ERROR | change), why


def test_dropped_marks_an_error_result_and_an_outcome_only_as_true() -> None:
    """``dropped`` (on_invalid_json: drop_with_protocol_repair) is allowed on an error result
    and on a final message's outcome, as ``true`` only; the config takes the policy and the
    echo tenants, and refuses a policy it does not know."""
    assert valid("error-result", CONTRACT_ERROR | {"dropped": True})
    assert not valid("error-result", CONTRACT_ERROR | {"dropped": False})
    outcome = {"tool_call_id": "call_abc", "name": "read_file", "index": 0, "state": "failed",
               "reason": "invalid_json"}
    final = FINAL_CHAT | {"outcomes": [outcome | {"dropped": True}]}
    assert valid("final-message", final)
    assert not valid("final-message", final | {"outcomes": [outcome | {"dropped": False}]})
    section = {"on_invalid_json": "drop_with_protocol_repair",
               "echo_invalid_input_tenants": ["acme"]}
    assert valid("config", {"agent_stream_assemble": section})
    assert not valid("config", {"agent_stream_assemble": {"on_invalid_json": "repair"}})


def test_final_message_in_each_provider_format() -> None:
    """A final message validates with a chat, an Anthropic and a Responses message."""
    anthropic = {
        "role": "assistant",
        "id": "msg_1",
        "model": "claude",
        "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
    }
    responses = {"id": "resp_1", "status": "completed",
                 "output": [{"type": "function_call", "call_id": "call_1", "name": "f",
                             "arguments": "{}"}]}  # fmt: skip
    assert valid("final-message", FINAL_CHAT)
    assert valid("final-message", FINAL_CHAT | {"provider": "anthropic.messages",
                                                "message": anthropic})  # fmt: skip
    assert valid("final-message", FINAL_CHAT | {"provider": "openai.responses",
                                                "message": responses})  # fmt: skip


def test_final_message_with_choices() -> None:
    """Chat with n > 1 lists each choice with its finish_reason (may be null), and its message
    except for the first choice's, which is the top-level message."""
    choices = [
        {"index": 0, "finish_reason": "tool_calls"},
        {"index": 1, "message": {"role": "assistant", "content": "hi"}, "finish_reason": None},
    ]
    assert valid("final-message", FINAL_CHAT | {"choices": choices})
    assert not valid("final-message", FINAL_CHAT | {"choices": [{"index": 0}]})


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda f: f["message"].clear(), "a message has role or output"),
        (lambda f: f.update(status="done"), "unknown status"),
        (lambda f: f["outcomes"][0].update(reason="invalid_json"), "committed has no reason"),
        (lambda f: f["outcomes"][1].pop("reason"), "a failed outcome has a reason"),
        (lambda f: f["outcomes"][1].update(state="pending"), "unknown state"),
        (lambda f: f.pop("outcomes"), "outcomes are required"),
    ],
)
def test_final_message_rejects(mutate: Any, why: str) -> None:
    """A final message that breaks one rule is invalid."""
    final = copy.deepcopy(FINAL_CHAT)
    mutate(final)
    assert not valid("final-message", final), why


def test_progress_record() -> None:
    """Progress carries a byte count; id and name may still be null; partial text optional."""
    progress = {
        "v": 1,
        "run_id": "r1",
        "tenant": None,
        "provider": "openai.chat",
        "call_key": "0:0",
        "tool_call_id": None,
        "name": None,
        "index": 0,
        "bytes": 12,
    }
    assert valid("progress", progress)
    assert valid("progress", progress | {"arguments_offset": 3, "arguments_delta": '{"pa'})
    assert not valid("progress", progress | {"arguments_delta": '{"pa'})
    assert not valid("progress", progress | {"bytes": -1})
    assert not valid("progress", {k: v for k, v in progress.items() if k != "bytes"})


def test_dlq_record() -> None:
    """A DLQ record has a known reason, the source key and the original bytes in base64."""
    assert valid("dlq-record", DLQ)
    assert valid("dlq-record", DLQ | {"source": {"key_b64": None}, "original_b64": ""})
    assert not valid("dlq-record", DLQ | {"reason": "oops"})
    assert not valid("dlq-record", DLQ | {"original_b64": "not base64!"})
    assert not valid("dlq-record", DLQ | {"source": {"topic": "t"}})


def test_output_refused_dlq_record() -> None:
    """The DLQ record of an output Kafka refused (``worker.runtime.refusals``) validates: the
    refused record's topic, key, size and error, no value; ``refused`` takes nothing else."""
    from worker.core.envelope import Source
    from worker.runtime import refusals

    emit = refusals.dlq_record("tool.calls.committed", b"r1", 2_000_000, "MSG_SIZE_TOO_LARGE",
                               "too large", Source("llm.stream.events", 0, 7), b"r1", "r1")
    assert valid("dlq-record", emit.value)
    assert emit.value["original_b64"] == "" and emit.value["refused"]["bytes"] == 2_000_000
    assert not valid("dlq-record", emit.value | {"refused": emit.value["refused"] | {"x": 1}})


# -- latch assemble output lines ----------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "value"),
    [
        ("committed", CONTRACT_COMMITTED),
        ("errors", CONTRACT_ERROR),
        ("final", FINAL_CHAT),
        ("dlq", DLQ),
    ],
)
def test_output_line_accepts_each_topic(topic: str, value: dict[str, Any]) -> None:
    """An output line validates its value by the schema of its topic, across files."""
    assert valid("output-line", {"topic": topic, "key": "r1", "value": value})


def test_output_line_checks_value_against_its_topic() -> None:
    """An error result labelled committed, or a broken value, makes the line invalid."""
    assert not valid("output-line", {"topic": "committed", "key": "r1", "value": CONTRACT_ERROR})
    broken = CONTRACT_COMMITTED | {"index": "0"}
    assert not valid("output-line", {"topic": "committed", "key": "r1", "value": broken})
    assert not valid("output-line", {"topic": "stdout", "key": "r1", "value": {}})
