"""``worker/tools/capture.py``, reading captured provider streams: the incremental SSE decoder
(WHATWG rules), SSE and JSON Lines text, a JSON array of responses, a VCR cassette (one run
per interaction, an HTTP error answer a failed stream), and what is not an event kept as its
bytes so that it becomes a DLQ line instead of vanishing. The captures of
``../shared/fixtures`` are run through it by tests/core/contract/test_fixtures.py; a Bedrock
event stream by test_eventstream.py."""

from __future__ import annotations

import pytest

from worker.tools.capture import (
    SSEDecoder,
    SSEEvent,
    provider_events,
    responses,
    sse_payloads,
)
from worker.tools.eventstream import StreamFailed


def test_the_decoder_follows_the_sse_rules() -> None:
    """``field: value`` lines with one optional space, ``data`` lines joined by a newline, a
    comment ignored, an event dispatched at a blank line (named ``message`` by default), and a
    blank line without data dispatching nothing."""
    decoder = SSEDecoder()
    lines = [": a comment", "event: message_start", "data:{\"a\":", "data:  1}", "",
             "", "data: x", ""]
    events = [e for e in (decoder.line(line) for line in lines) if e is not None]
    assert events == [SSEEvent("message_start", '{"a":\n 1}'), SSEEvent("message", "x")]


def test_sse_payloads_end_with_the_text() -> None:
    """``sse_payloads`` yields each event's data in order, the last one too when no blank
    line follows it, with the line ends stripped."""
    assert list(sse_payloads(["data: 1\r\n", "\r\n", "data: 2\n"])) == ["1", "2"]


def test_sse_and_json_lines_give_the_same_events() -> None:
    """Chat's SSE with ``[DONE]`` and the same payloads as JSON Lines give the same events;
    only SSE says it carried ``[DONE]``."""
    sse = 'data: {"id": 1}\n\ndata: {"id": 2}\n\ndata: [DONE]\n\n'
    lines = '{"id": 1}\n{"id": 2}\n'
    assert provider_events(sse) == ([{"id": 1}, {"id": 2}], True)
    assert provider_events(lines) == ([{"id": 1}, {"id": 2}], False)


def test_a_payload_that_is_no_event_is_kept_as_its_bytes() -> None:
    """A payload that is not a JSON object (broken JSON, an array) is kept as its bytes, in
    its place, so that the assembler sends it to the DLQ."""
    events, _ = provider_events('data: {"id": 1}\n\ndata: {broken\n\ndata: [1]\n\n')
    assert events == [{"id": 1}, b"{broken", b"[1]"]


def test_a_json_array_is_one_response_per_element() -> None:
    """Gemini without ``alt=sse``: one JSON array, each object an event, anything else its
    bytes."""
    assert provider_events('[{"a": 1}, 2]') == ([{"a": 1}, b"2"], False)


CASSETTE = """
interactions:
- request: {method: POST}
  response:
    status: {code: 200}
    body: {string: "data: {\\"turn\\": 1}\\n\\n"}
- request: {method: POST}
  response:
    status: {code: 200}
    body: {string: "data: {\\"turn\\": 2}\\n\\n"}
- request: {method: POST}
  response:
    status: {code: 400}
    body: {string: "{\\"message\\": \\"bad\\"}"}
"""


def test_a_cassette_is_one_run_per_interaction_and_an_error_ends_it() -> None:
    """A VCR cassette's interactions are its runs (``responses``); read whole, its events run
    up to an HTTP error answer, which is a failed stream naming the status."""
    turns = responses(CASSETTE, "agent.yaml")
    assert turns[:2] == [[{"turn": 1}], [{"turn": 2}]]
    [failed] = turns[2]
    assert isinstance(failed, StreamFailed) and "HTTP 400" in str(failed)
    events, done = provider_events(CASSETTE, "agent.yaml")
    assert events[:2] == [{"turn": 1}, {"turn": 2}] and isinstance(events[2], StreamFailed)
    assert not done


@pytest.mark.parametrize("text", ["a: [", "just text", "interactions: [{request: {}}]"])
def test_what_is_no_cassette_is_refused_saying_so(text: str) -> None:
    """Malformed YAML, another document, or interactions without a response are a
    ``ValueError`` that says what is wrong, never a traceback from deep inside."""
    with pytest.raises(ValueError, match=r"not YAML|not a VCR cassette"):
        provider_events(text, "x.yaml")
