"""What ``choice``, ``index`` and Latch's generated Gemini id mean, as the records hold them and
as the schemas say: the records of every provider are fed through the core, and the schemas'
descriptions must name what the records do (issue 23 item 12: Gemini's calls carry ``choice``,
the candidate's index, while the schemas said it was OpenAI Chat's only)."""

from __future__ import annotations

from typing import Any

import builders
import pytest

from worker.core import Assembler
from worker.runtime.schemas import load_schema, validator

PROVIDERS = (builders.CHAT, builders.ANTHROPIC, builders.RESPONSES, builders.BEDROCK,
             builders.GEMINI)
#: The providers whose calls carry ``choice``: chat's choice index, Gemini's candidate index.
WITH_CHOICE = {builders.CHAT, builders.GEMINI}
SCHEMAS = {"committed": "committed-call", "errors": "error-result"}


def _records(provider: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                     dict[str, Any]]:
    """One run of ``provider`` without call ids where the provider may omit them: a committed
    call and an ``unknown_tool`` error result; its committed, error and final records."""
    calls = [(None if provider == builders.GEMINI else "c1", "read_file", '{"path": "/a"}'),
             (None if provider == builders.GEMINI else "c2", "nope", "{}")]
    emits = builders.feed(Assembler(), builders.provider_run(
        provider, "r1", {"read_file": builders.PATH_SCHEMA}, calls))
    final, = builders.finals(emits)
    return builders.committed(emits), builders.errors(emits), final


def _property(schema: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = load_schema(schema)["properties"][name]
    return found


def _outcome_property(name: str) -> dict[str, Any]:
    found: dict[str, Any] = (
        load_schema("final-message")["properties"]["outcomes"]["items"]["properties"][name])
    return found


@pytest.mark.parametrize("provider", PROVIDERS)
def test_choice_is_on_the_records_of_chat_and_gemini_only(provider: str) -> None:
    """A committed call, an error result and each final outcome carry ``choice`` exactly for
    openai.chat and google.gemini (0 for one choice or candidate), and validate."""
    committed, errors, final = _records(provider)
    assert len(committed) == 1 and len(errors) == 1
    for record, schema in ((committed[0], "committed-call"), (errors[0], "error-result"),
                           (final, "final-message")):
        assert not list(validator(schema).iter_errors(record)), (provider, schema)
    for record in (committed[0], errors[0], *final["outcomes"]):
        assert ("choice" in record) == (provider in WITH_CHOICE), (provider, record)
        if provider in WITH_CHOICE:
            assert record["choice"] == 0


def test_a_gemini_record_with_choice_validates_and_its_generated_id_is_candidate_and_index(
) -> None:
    """Gemini's calls of candidate 1 carry ``choice: 1``; ``index`` counts the candidate's
    calls from 0; an id-less call's id is ``latch-<choice>-<index>-<run_id>``; both records
    validate."""
    chunks = [builders.gemini_chunk(c["candidates"][0]["content"]["parts"], candidate=1)
              for c in builders.gemini_calls([(None, "read_file", '{"path": "/a"}'),
                                              (None, "nope", "{}")], finish_reason=None)
              if "candidates" in c]
    chunks.append(builders.gemini_chunk([{"text": ""}], finish_reason="STOP", candidate=1))
    emits = builders.feed(Assembler(), builders.run_envelopes(
        "r1", builders.GEMINI, builders.tools_for(builders.GEMINI,
                                                  {"read_file": builders.PATH_SCHEMA}), chunks))
    committed, = builders.committed(emits)
    error, = builders.errors(emits)
    assert (committed["choice"], committed["index"], committed["call_id"]) == (1, 0,
                                                                              "latch-1-0-r1")
    assert (error["choice"], error["index"], error["tool_call_id"]) == (1, 1, "latch-1-1-r1")
    assert not list(validator("committed-call").iter_errors(committed))
    assert not list(validator("error-result").iter_errors(error))


def test_the_descriptions_say_what_the_records_hold() -> None:
    """Every ``choice`` description names the providers that write it and no other, every
    ``index`` description says what it is for each of the five providers, the committed,
    error and outcome descriptions are the same text, and the id fields say what
    ``<candidate>`` and ``<n>`` of a generated Gemini id are."""
    others = set(PROVIDERS) - WITH_CHOICE
    choices = [_property("committed-call", "choice"), _property("error-result", "choice"),
               _outcome_property("choice")]
    indexes = [_property("committed-call", "index"), _property("error-result", "index"),
               _outcome_property("index"), _property("progress", "index")]
    for field in choices:
        present, _, absent = field["description"].partition("Absent for")
        assert all(p in present for p in WITH_CHOICE), present
        assert not any(p in present for p in others), present
        assert all(p in absent for p in others), absent
    assert len({f["description"] for f in choices}) == 1
    for field in indexes:
        text = field["description"]
        for word in ("openai.chat", "anthropic.messages", "openai.responses",
                     "bedrock.converse", "google.gemini", "contentBlockIndex", "candidate"):
            assert word in text, (word, text)
    assert len({f["description"] for f in indexes[:3]}) == 1
    for field in (_property("committed-call", "call_id"), _property("error-result",
                                                                    "tool_call_id")):
        text = field["description"]
        assert "latch-<candidate>-<n>-<run_id>" in text, text
        assert "<n> is the call's index" in text, text
    assert "candidate" in load_schema("final-message")["properties"]["choices"]["items"][
        "properties"]["index"]["description"]
