"""Reading captured provider streams: raw SSE, JSON-Lines chunk files, VCR cassettes.

A pure incremental Server-Sent Events decoder (the WHATWG rules: ``field: value`` lines,
one optional space after the colon, ``data`` lines joined by ``\\n``, a blank line dispatches,
``:`` starts a comment) plus the glue that turns a capture into stream envelopes, so that
``latch assemble --from-sse PROVIDER FILE`` runs a recorded stream through the worker's code.

Formats (``../shared/fixtures/providers/README.md``):

* raw SSE: OpenAI chat (``data: {...}`` and ``data: [DONE]``) and Anthropic
  (``event:`` + ``data:`` lines);
* JSON Lines: one decoded ``data`` payload per line;
* a VCR cassette (``.yaml``): the SSE body in ``interactions[].response.body.string``, or
  the binary AWS event stream (``!!binary``) of a Bedrock ``ConverseStream``; an answer with an
  HTTP error status (Bedrock's 400 with a JSON body) is a ``stream.error``; :func:`responses`
  gives each interaction (a model turn) on its own, which the CLI runs as a run each;
* a binary AWS event stream (Bedrock, :mod:`worker.tools.eventstream`), CRCs checked;
* Gemini's ``streamGenerateContent`` as SSE (``alt=sse``), JSON Lines, or one JSON array.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import yaml

from worker.tools import eventstream
from worker.tools.eventstream import StreamFailed


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    data: str


class SSEDecoder:
    """Feed lines, get events. Holds only the event being built."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def line(self, line: str) -> SSEEvent | None:
        """Take one line (without its end of line); return an event on a blank line."""
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None


def sse_payloads(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` of each event in an SSE text, in order."""
    decoder = SSEDecoder()
    for raw in [*lines, ""]:
        event = decoder.line(raw.rstrip("\r\n"))
        if event is not None:
            yield event.data


#: One item of a capture: a provider event, a raw payload that is not one (kept as its bytes,
#: so that it reaches the assembler as an undecodable record, a DLQ line, instead of
#: vanishing), or the end of a stream that failed (an HTTP error answer, an event stream
#: ``error`` message), which becomes a ``stream.error`` envelope.
CaptureItem = dict[str, Any] | bytes | StreamFailed


def provider_events(data: str | bytes, name: str = "") -> tuple[list[CaptureItem], bool]:
    """The provider events in a capture, and whether it carried OpenAI's ``[DONE]``.

    ``data`` is SSE or JSON Lines text, a JSON array of responses (Gemini without
    ``alt=sse``), a binary AWS event stream (Bedrock), or a VCR cassette (``name`` ends in
    ``.yaml``) whose bodies are any of those; a cassette answer with an HTTP error status
    ends the capture with a :class:`StreamFailed`.
    """
    if name.endswith((".yaml", ".yml")):
        return _cassette(data)
    if isinstance(data, bytes):
        if eventstream.looks_like(data):
            return eventstream.sdk_events(data), False
        data = data.decode("utf-8")
    return _text_events(data)


def _cassette(data: str | bytes) -> tuple[list[CaptureItem], bool]:
    events: list[CaptureItem] = []
    done = False
    for interaction in _interactions(data):
        found, found_done = _response(interaction)
        events += found
        done = done or found_done
        if found and isinstance(found[-1], StreamFailed):
            break
    return events, done


def responses(data: str | bytes, name: str = "") -> list[list[CaptureItem]]:
    """The model responses in a capture, each as its own list of events: one per interaction
    of a VCR cassette (an agent loop records one per model turn, and each is a run of its
    own), else the whole capture as one."""
    if name.endswith((".yaml", ".yml")):
        return [_response(i)[0] for i in _interactions(data)] or [[]]
    return [provider_events(data, name)[0]]


def _response(interaction: dict[str, Any]) -> tuple[list[CaptureItem], bool]:
    """The events of one cassette interaction; an HTTP error answer is a StreamFailed."""
    response = interaction["response"]
    code = (response.get("status") or {}).get("code", 200)
    if not isinstance(code, int) or code >= 400:
        return [StreamFailed(f"HTTP {code}")], False
    field = response.get("body")
    body = field.get("string") if isinstance(field, dict) else None
    if not isinstance(body, (str, bytes)):
        raise ValueError("a cassette response without a text or !!binary body")
    return provider_events(body)


def _interactions(data: str | bytes) -> list[dict[str, Any]]:
    """The cassette's ``interactions``, each a mapping with a ``response`` mapping; anything
    else (empty or malformed YAML, another document) is a :class:`ValueError` that says so."""
    try:
        document = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML ({type(exc).__name__})") from None
    interactions = document.get("interactions") if isinstance(document, dict) else None
    if not isinstance(interactions, list) or not all(
            isinstance(i, dict) and isinstance(i.get("response"), dict) for i in interactions):
        raise ValueError("not a VCR cassette (no list of interactions with a response each)")
    return interactions


def _text_events(text: str) -> tuple[list[CaptureItem], bool]:
    stripped = text.lstrip()
    if stripped.startswith("["):  # a JSON array of responses (Gemini streaming without SSE)
        try:
            whole = orjson.loads(text)
        except orjson.JSONDecodeError:
            whole = None
        if isinstance(whole, list):
            return [e if isinstance(e, dict) else orjson.dumps(e) for e in whole], False
    if stripped.startswith(("{", "[")) and "\ndata:" not in text:
        payloads: Iterable[str] = (line for line in text.splitlines() if line.strip())
    else:
        payloads = sse_payloads(text.splitlines())
    events: list[CaptureItem] = []
    done = False
    for payload in payloads:
        if payload.strip() == "[DONE]":
            done = True
            continue
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            event = None
        events.append(event if isinstance(event, dict) else payload.encode())
    return events, done


def envelopes(
    provider: str, events: Sequence[CaptureItem], tools: list[Any],
    run_id: str = "capture", tenant: str | None = None,
) -> list[dict[str, Any] | bytes]:
    """The stream envelopes a gateway would publish for one captured response.

    Raw (undecodable) payloads pass through as they are, between the envelopes. The stream
    ends with ``stream.end``, or with ``stream.error`` at a :class:`StreamFailed`.
    """
    start: dict[str, Any] = {"v": 1, "run_id": run_id, "seq": 0, "type": "run.start",
                             "provider": provider, "tools": tools}
    if tenant is not None:
        start["tenant"] = tenant
    out: list[dict[str, Any] | bytes] = [start]
    seq = 0
    for event in events:
        if isinstance(event, bytes):
            out.append(event)
            continue
        if isinstance(event, StreamFailed):
            out.append({"v": 1, "run_id": run_id, "seq": seq + 1, "type": "stream.error",
                        "error": event.error})
            return out
        seq += 1
        out.append({"v": 1, "run_id": run_id, "seq": seq, "type": "provider.event",
                    "event": event})
    out.append({"v": 1, "run_id": run_id, "seq": seq + 1, "type": "stream.end"})
    return out
