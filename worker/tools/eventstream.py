"""The AWS event stream (``application/vnd.amazon.eventstream``): Bedrock's wire format.

Bedrock's ``ConverseStream`` answers with a sequence of binary messages, which HTTP cassettes
(VCR) record as a ``!!binary`` body. Each message is (all integers big-endian)::

    total length (4) | headers length (4) | prelude CRC32 (4)     <- the prelude, 12 bytes
    headers (headers length bytes) | payload | message CRC32 (4)

The prelude CRC covers the first 8 bytes; the message CRC covers everything before it. A header
is a name length (1 byte), the name (UTF-8), a value type (1 byte) and the value: ``0``/``1``
true/false, ``2`` int8, ``3`` int16, ``4`` int32, ``5`` int64, ``6`` bytes and ``7`` string
(a 2-byte length first), ``8`` timestamp (int64 ms), ``9`` UUID (16 bytes). Bedrock sends
``:message-type`` (``event``, ``exception`` or ``error``), ``:event-type`` or
``:exception-type`` (``contentBlockDelta``, ``throttlingException``...) and ``:content-type``;
the payload is the event's JSON, plus a ``p`` member of random padding that the SDKs drop.

:func:`messages` decodes a whole body, checking both CRCs (``zlib.crc32``) and every length
against what is left; anything wrong is an :class:`EventStreamError` that says what and at
which byte, never quoting the payload. :func:`sdk_events` turns the messages into the objects
the AWS SDKs yield (``{"contentBlockDelta": {...}}``), which is what a gateway publishes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

#: The largest message accepted (the AWS event stream's own limit is 16 MiB).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_PRELUDE = 12
_FIXED = {2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
_SIGNED = {2: ">b", 3: ">h", 4: ">i", 5: ">q", 8: ">q"}


class EventStreamError(ValueError):
    """The bytes are not a well-formed AWS event stream (a corrupt or truncated message)."""


@dataclass(frozen=True, slots=True)
class Message:
    headers: dict[str, Any]
    payload: bytes


@dataclass(frozen=True, slots=True)
class StreamFailed:
    """An ``error`` message: the service ended the stream (its ``:error-code``)."""

    error: str


def looks_like(data: bytes) -> bool:
    """Whether ``data`` starts like an event stream rather than text (SSE, JSON): a message
    is shorter than 16 MiB, so its first byte is 0, which no text capture starts with."""
    return len(data) >= _PRELUDE and data[0] == 0


def messages(data: bytes) -> Iterator[Message]:
    """Each message of a whole event stream body, in order."""
    at = 0
    while at < len(data):
        if len(data) - at < _PRELUDE:
            raise EventStreamError(f"a truncated prelude at byte {at}")
        total, headers_length, prelude_crc = struct.unpack_from(">III", data, at)
        if zlib.crc32(data[at:at + 8]) != prelude_crc:
            raise EventStreamError(f"the prelude CRC does not match at byte {at}")
        if not _PRELUDE + 4 <= total <= MAX_MESSAGE_BYTES or headers_length > total - 16:
            raise EventStreamError(f"a message length out of range at byte {at}")
        if len(data) - at < total:
            raise EventStreamError(f"a truncated message at byte {at}")
        end = at + total
        (message_crc,) = struct.unpack_from(">I", data, end - 4)
        if zlib.crc32(data[at:end - 4]) != message_crc:
            raise EventStreamError(f"the message CRC does not match at byte {at}")
        headers_end = at + _PRELUDE + headers_length
        headers = _headers(data[at + _PRELUDE:headers_end], at)
        yield Message(headers, data[headers_end:end - 4])
        at = end


def _headers(block: bytes, where: int) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    at = 0
    try:
        while at < len(block):
            size = block[at]
            name = block[at + 1:at + 1 + size].decode("utf-8")
            at += 1 + size
            kind = block[at]
            at += 1
            value: Any
            if kind in (0, 1):
                value = kind == 0
            elif kind in _FIXED:
                raw = block[at:at + _FIXED[kind]]
                if len(raw) != _FIXED[kind]:
                    raise IndexError
                value = raw if kind == 9 else struct.unpack(_SIGNED[kind], raw)[0]
                at += _FIXED[kind]
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", block, at)
                raw = block[at + 2:at + 2 + length]
                if len(raw) != length:
                    raise IndexError
                value = raw.decode("utf-8") if kind == 7 else raw
                at += 2 + length
            else:
                raise EventStreamError(f"a header of unknown type {kind} in the message at "
                                       f"byte {where}")
            if name in headers:
                raise EventStreamError(f"a repeated header in the message at byte {where}")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError(f"malformed headers in the message at byte {where}") from exc
    return headers


def sdk_events(data: bytes) -> list[dict[str, Any] | bytes | StreamFailed]:
    """The events of a Bedrock event stream body as the AWS SDKs yield them: an ``event``
    message becomes ``{type: payload}`` (without the ``p`` padding); a payload that is not a
    JSON object is kept as its bytes (the assembler sends it to the DLQ); an ``error`` message
    ends the list with a :class:`StreamFailed`.

    An ``exception`` message ends the stream too, as the SDKs raise it: it becomes
    ``{name: payload}`` when its ``:exception-type`` names an exception (ends in
    ``Exception``, which the adapter reads as the provider's exception), and ends the list;
    any other (``:exception-type`` ``contentBlockDelta``, none, a payload that is not an
    object) ends it with a :class:`StreamFailed`. It is never read as an ordinary event."""
    events: list[dict[str, Any] | bytes | StreamFailed] = []
    for message in messages(data):
        kind = message.headers.get(":message-type")
        if kind == "error":
            code = message.headers.get(":error-code")
            events.append(StreamFailed(code[:64] if isinstance(code, str) else "error"))
            break
        name = message.headers.get(":exception-type" if kind == "exception" else ":event-type")
        try:
            payload = orjson.loads(message.payload) if message.payload else {}
        except orjson.JSONDecodeError:
            payload = None
        if kind == "exception":
            if isinstance(name, str) and name.endswith("Exception") and isinstance(payload,
                                                                                 dict):
                payload.pop("p", None)
                events.append({name: payload})
            else:
                events.append(StreamFailed("exception"))
            break
        if not isinstance(name, str) or not isinstance(payload, dict):
            events.append(message.payload)
            continue
        payload.pop("p", None)
        events.append({name: payload})
    return events


def encode(headers: dict[str, str], payload: bytes) -> bytes:
    """One message with string headers (for tests and demos that build a recorded body)."""
    block = b"".join(
        bytes([len(k.encode())]) + k.encode() + b"\x07" + struct.pack(">H", len(v.encode()))
        + v.encode() for k, v in headers.items())
    total = _PRELUDE + len(block) + len(payload) + 4
    prelude = struct.pack(">II", total, len(block))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + block + payload
    return body + struct.pack(">I", zlib.crc32(body))


def encode_events(events: list[dict[str, Any]]) -> bytes:
    """A Bedrock event stream body carrying ``events`` (SDK-shaped, one member each)."""
    out = []
    for event in events:
        [(name, body)] = event.items()
        kind = "exception" if name.endswith("Exception") else "event"
        headers = {":message-type": kind,
                   (":exception-type" if kind == "exception" else ":event-type"): name,
                   ":content-type": "application/json"}
        out.append(encode(headers, orjson.dumps({**body, "p": "abcdefghijklmnop"})))
    return b"".join(out)
