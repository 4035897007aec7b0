"""Reading captured provider streams: raw SSE, JSON-Lines chunk files, VCR cassettes.

A pure incremental Server-Sent Events decoder (the WHATWG rules: ``field: value`` lines,
one optional space after the colon, ``data`` lines joined by ``\\n``, a blank line dispatches,
``:`` starts a comment) plus the glue that turns a capture into stream envelopes, so that
``latch assemble --from-sse PROVIDER FILE`` runs a recorded stream through the worker's code.

Formats (``../shared/fixtures/providers/README.md``):

* raw SSE: OpenAI chat (``data: {...}`` and ``data: [DONE]``) and Anthropic
  (``event:`` + ``data:`` lines);
* JSON Lines: one decoded ``data`` payload per line;
* a VCR cassette (``.yaml``): the SSE body in ``interactions[].response.body.string``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import yaml


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


def provider_events(text: str, name: str = "") -> tuple[list[dict[str, Any] | bytes], bool]:
    """The provider events in a capture, and whether it carried OpenAI's ``[DONE]``.

    A payload that is not a JSON object is kept as its raw bytes, so that it reaches the
    assembler as an undecodable record (a DLQ line) instead of vanishing.
    """
    if name.endswith((".yaml", ".yml")):
        bodies = [i["response"]["body"]["string"] for i in yaml.safe_load(text)["interactions"]]
        text = "\n".join(bodies)
    if text.lstrip().startswith(("{", "[")) and "\ndata:" not in text:
        payloads: Iterable[str] = (line for line in text.splitlines() if line.strip())
    else:
        payloads = sse_payloads(text.splitlines())
    events: list[dict[str, Any] | bytes] = []
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
    provider: str, events: list[dict[str, Any] | bytes], tools: list[Any],
    run_id: str = "capture", tenant: str | None = None,
) -> list[dict[str, Any] | bytes]:
    """The stream envelopes a gateway would publish for one captured response.

    Raw (undecodable) payloads pass through as they are, between the envelopes.
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
        seq += 1
        out.append({"v": 1, "run_id": run_id, "seq": seq, "type": "provider.event",
                    "event": event})
    out.append({"v": 1, "run_id": run_id, "seq": seq + 1, "type": "stream.end"})
    return out
