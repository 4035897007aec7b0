"""Gemini chunks in the proto JSON mapping's snake_case give the outcomes of their camelCase.

The proto3 JSON mapping lets a producer write every field in its original snake_case name
(``function_call``, ``partial_args``, ``json_path``, ``string_value``, ``will_continue``,
``finish_reason``, ``thought_signature``...) instead of the lowerCamelCase one, and parsers
accept both (but not both at once). Each recorded Gemini stream of ``../shared/fixtures/
providers`` (vercel-ai ``google``, Apache-2.0) is rendered in snake_case, key by key (the
call's ``args`` is a ``Struct``, whose keys are the model's and stay as they are), and must give
exactly the records of the original: the same calls, ids, arguments, reasons and final
message. Refusals of an object with both spellings of one field are tested too.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for fixtures_lib

from fixtures_lib import VERCEL, check_run, fixture, load_events, run_events, summary, topic

GEMINI = "google.gemini"
_GO = f"{VERCEL}/google/src/__fixtures__"
FILES = [f"{_GO}/google-tool-call.chunks.txt", f"{_GO}/google-stream-no-args-tool-call.chunks.txt",
         f"{_GO}/google-stream-tool-call-array-arguments-missing-terminal-function-call"
         ".chunks.txt"]
OBJ: dict[str, Any] = {"type": "object"}
TOOLS = [{"functionDeclarations": [{"name": n, "parametersJsonSchema": OBJ} for n in
                                   ("weather", "read_theme", "read_screen", "writeItems")]}]


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def to_snake(node: Any) -> Any:
    """``node`` with every object key in snake_case, except the keys inside ``args``."""
    if isinstance(node, list):
        return [to_snake(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {snake(k): (v if k == "args" else to_snake(v)) for k, v in node.items()}


def test_the_rendering_changes_the_fields_that_matter() -> None:
    """The snake_case rendering does rename the protocol's camelCase fields (else the
    comparisons below would prove nothing), and leaves a call's args alone."""
    text = repr([to_snake(e) for f in FILES for e in load_events(fixture(f))])
    for name in ("function_call", "partial_args", "json_path", "string_value", "number_value",
                 "will_continue", "finish_reason", "thought_signature"):
        assert f"'{name}'" in text, name
    assert not re.search(r"'(functionCall|partialArgs|willContinue|finishReason)'", text)
    assert snake("thoughtSignature") == "thought_signature"
    assert to_snake({"functionCall": {"args": {"aB": 1}}}) == {
        "function_call": {"args": {"aB": 1}}}


@pytest.mark.parametrize("relative", FILES, ids=lambda f: f.rsplit("/", 1)[-1][:40])
@pytest.mark.parametrize("finish", [None, "MAX_TOKENS", "SAFETY"])
def test_snake_case_chunks_give_the_same_records(relative: str, finish: str | None) -> None:
    """Each fixture (and derived: its last finishReason replaced) in snake_case emits, line
    for line, what the camelCase original emits; the run's invariants hold and nothing goes
    to the DLQ."""
    events = [copy.deepcopy(e) for e in load_events(fixture(relative))]
    if finish is not None:
        events[-1]["candidates"][0]["finishReason"] = finish
    camel = run_events(GEMINI, events, TOOLS)
    snaked = run_events(GEMINI, [to_snake(e) for e in events], TOOLS)
    check_run(GEMINI, snaked)
    assert snaked == camel
    assert summary(camel)  # every file has calls


def test_chunks_mixing_the_spellings_give_the_same_records() -> None:
    """Alternate chunks in each spelling (a gateway that re-serialises only some): the
    partialArgs call is still built whole, with the same records as the original."""
    events = load_events(fixture(FILES[2]))
    mixed = [to_snake(e) if n % 2 else e for n, e in enumerate(events)]
    assert run_events(GEMINI, mixed, TOOLS) == run_events(GEMINI, events, TOOLS)


def test_both_spellings_of_one_field_are_refused() -> None:
    """A part with ``functionCall`` and ``function_call`` at once is ambiguous (protobuf's JSON
    parser refuses it): that event goes to the DLQ, never picks one of the two silently; the
    run still ends with one outcome per call it did open."""
    events = load_events(fixture(FILES[0]))
    part = events[0]["candidates"][0]["content"]["parts"][0]
    part["function_call"] = {"name": "weather", "args": {"location": "Elsewhere"}}
    lines = run_events(GEMINI, events, TOOLS)
    assert [d["reason"] for d in topic(lines, "dlq")] == ["invalid_envelope"]
    assert not topic(lines, "committed") and not topic(lines, "errors")
    assert topic(lines, "final")[0]["status"] == "completed"


def test_a_partial_arg_in_both_spellings_fails_the_call_invalid_json() -> None:
    """A PartialArg with ``stringValue`` and ``string_value`` (or ``jsonPath`` and
    ``json_path``) makes a record the builder refuses: the call fails invalid_json at its
    end and quotes no value."""
    for field, extra in (("stringValue", {"string_value": "x"}),
                         ("jsonPath", {"json_path": "$.other"})):
        events = [copy.deepcopy(e) for e in load_events(fixture(FILES[2]))]
        partial = events[1]["candidates"][0]["content"]["parts"][0]["functionCall"][
            "partialArgs"][0]
        assert field in partial
        partial.update(extra)
        lines = run_events(GEMINI, events, TOOLS)
        check_run(GEMINI, lines)
        [error] = topic(lines, "errors")
        assert error["reason"] == "invalid_json" and "both spellings" in error["content"]
