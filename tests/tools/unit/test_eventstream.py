"""The AWS event stream decoder (``worker.tools.eventstream``) and the Bedrock captures that
``latch assemble --from-sse bedrock.converse`` reads: binary bodies, VCR cassettes with a
``!!binary`` body, JSON Lines of the SDK's event objects.

The encoded messages below are botocore's own test vectors (``tests/unit/test_eventstream.py``
of github.com/boto/botocore, Apache-2.0): an independent encoder's bytes, CRCs included.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import yaml
from builders import BEDROCK, PATH_SCHEMA, bedrock_calls, tools_for

from worker.tools import capture, eventstream

# botocore tests/unit/test_eventstream.py: PAYLOAD_ONE_STR_HEADER, ALL_HEADERS_TYPES,
# ERROR_EVENT_MESSAGE, and its corrupted variants.
ONE_STR_HEADER = (b"\x00\x00\x00=\x00\x00\x00 \x07\xfd\x83\x96\x0ccontent-type\x07\x00\x10"
                  b"application/json{'foo':'bar'}\x8d\x9c\x08\xb1")
ALL_HEADER_TYPES = (
    b"\x00\x00\x00\x62\x00\x00\x00\x52\x03\xb5\xcb\x9c"
    b"\x010\x00\x011\x01\x012\x02\x02\x013\x03\x00\x03"
    b"\x014\x04\x00\x00\x00\x04\x015\x05\x00\x00\x00\x00\x00\x00\x00\x05"
    b"\x016\x06\x00\x05bytes\x017\x07\x00\x04utf8"
    b"\x018\x08\x00\x00\x00\x00\x00\x00\x00\x08\x019\x090123456789abcdef"
    b"\x63\x35\x36\x71")
ERROR_MESSAGE = (b"\x00\x00\x00\x52\x00\x00\x00\x42\xbf\x23\x63\x7e"
                 b"\x0d:message-type\x07\x00\x05error"
                 b"\x0b:error-code\x07\x00\x04code"
                 b"\x0e:error-message\x07\x00\x07message"
                 b"\x6b\x6c\xea\x3d")
CORRUPT = {
    "length": b"\x01\x00\x00\x1d\x00\x00\x00\x00\xfdR\x8cZ{'foo':'bar'}\xc3e96",
    "payload": b"\x00\x00\x00\x1d\x00\x00\x00\x00\xfdR\x8cZ{'foo':'bar'\x8d\xc3e96",
    "headers": (b"\x00\x00\x00=\x00\x00\x00 \x07\xfd\x83\x96\x0ccontent+type\x07\x00\x10"
                b"application/json{'foo':'bar'}\x8d\x9c\x08\xb1"),
    "header_length": (b"\x00\x00\x00=\xff\x00\x01\x02\x07\xfd\x83\x96\x0ccontent-type\x07\x00"
                      b"\x10application/json{'foo':'bar'}\x8d\x9c\x08\xb1"),
    "duplicate_header": (b"\x00\x00\x00\x24\x00\x00\x00\x14\x4b\xb9\x82\xd0"
                         b"\x04test\x04asdf\x04test\x04asdf\xf3\xf4\x75\x63"),
    "truncated": ONE_STR_HEADER[:-3],
}
CALLS = [("c1", "read_file", '{"path": "/a"}'), ("c2", "read_file", '{"path": "/b"}')]


def test_botocore_vectors_decode() -> None:
    """botocore's vectors decode to its expected headers and payloads, all on one buffer."""
    [one, every, error] = list(eventstream.messages(ONE_STR_HEADER + ALL_HEADER_TYPES
                                                    + ERROR_MESSAGE))
    assert one.headers == {"content-type": "application/json"}
    assert one.payload == b"{'foo':'bar'}"
    assert every.headers == {"0": True, "1": False, "2": 2, "3": 3, "4": 4, "5": 5,
                             "6": b"bytes", "7": "utf8", "8": 8, "9": b"0123456789abcdef"}
    assert error.headers[":error-code"] == "code"


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_messages_are_clear_errors(name: str) -> None:
    """Each corrupted vector (and a truncated message) raises EventStreamError naming the
    byte where it is, never another exception."""
    with pytest.raises(eventstream.EventStreamError, match="at byte 0"):
        list(eventstream.messages(CORRUPT[name]))


def test_error_message_ends_the_stream() -> None:
    """An ``error`` message becomes a StreamFailed with its code, and the capture becomes a
    stream.error envelope."""
    events = eventstream.sdk_events(ERROR_MESSAGE)
    assert events == [eventstream.StreamFailed("code")]
    assert capture.envelopes(BEDROCK, events, [])[-1]["type"] == "stream.error"


def test_sdk_events_round_trip_and_drop_padding() -> None:
    """A body built from SDK-shaped events decodes back to the same events (the ``p``
    padding Bedrock adds dropped), exceptions included."""
    events = [*bedrock_calls(CALLS), {"throttlingException": {"message": "slow down"}}]
    assert eventstream.sdk_events(eventstream.encode_events(events)) == events


def _jsonl_and_binary(tmp_path: Path) -> tuple[Path, Path, Path]:
    events = bedrock_calls(CALLS)
    jsonl = tmp_path / "bedrock.jsonl"
    jsonl.write_bytes(b"\n".join(orjson.dumps(e) for e in events))
    binary = tmp_path / "bedrock.bin"
    binary.write_bytes(eventstream.encode_events(events))
    cassette = tmp_path / "bedrock.yaml"
    cassette.write_text(yaml.safe_dump({"interactions": [{"response": {
        "status": {"code": 200, "message": "OK"},
        "headers": {"content-type": ["application/vnd.amazon.eventstream"]},
        "body": {"string": binary.read_bytes()}}}], "version": 1}))
    assert "!!binary" in cassette.read_text()
    return jsonl, binary, cassette


def test_every_bedrock_capture_form_gives_the_same_records(tmp_path: Path) -> None:
    """``latch assemble --from-sse bedrock.converse`` reads JSON Lines of the SDK's events,
    the binary event stream and a VCR cassette with a ``!!binary`` body: the output is the
    same, byte for byte, and both calls commit."""
    tools = tmp_path / "tools.json"
    tools.write_bytes(orjson.dumps(tools_for(BEDROCK, {"read_file": PATH_SCHEMA})))
    outputs = []
    for path in _jsonl_and_binary(tmp_path):
        done = subprocess.run(
            [sys.executable, "-m", "worker", "assemble", "--from-sse", BEDROCK, "--tools",
             str(tools), str(path)], capture_output=True, check=True)
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    lines = [orjson.loads(line) for line in outputs[0].splitlines()]
    assert [line["topic"] for line in lines] == ["committed", "audit", "committed", "audit",
                                                "final"]


def test_a_corrupt_frame_is_a_clear_cli_error(tmp_path: Path) -> None:
    """One flipped payload byte: the CLI exits non-zero with a message that names the CRC
    and the byte, and prints no output record."""
    _, binary, _ = _jsonl_and_binary(tmp_path)
    data = bytearray(binary.read_bytes())
    data[40] ^= 0xFF
    binary.write_bytes(bytes(data))
    tools = tmp_path / "tools.json"
    tools.write_text("[]")
    done = subprocess.run(
        [sys.executable, "-m", "worker", "assemble", "--from-sse", BEDROCK, "--tools",
         str(tools), str(binary)], capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stdout == ""
    assert "CRC does not match at byte 0" in done.stderr


@pytest.mark.parametrize("text", [
    "", "interactions: [\n", "- a\n- b\n", "interactions: 7\n",
    "interactions:\n- response: {status: {code: 200}}\n",
    "interactions:\n- response: {status: {code: 200}, body: {string: 7}}\n",
], ids=["empty", "not-yaml", "a-list", "not-a-list", "no-body", "body-not-text"])
def test_a_malformed_cassette_is_a_clear_cli_error(tmp_path: Path, text: str) -> None:
    """A ``.yaml`` capture that is no VCR cassette (empty, not YAML, no interactions, a
    response without a text or ``!!binary`` body): the CLI exits 2 with one line that says the
    file is not a capture it reads, no traceback and no output record."""
    cassette = tmp_path / "broken.yaml"
    cassette.write_text(text)
    tools = tmp_path / "tools.json"
    tools.write_text("[]")
    done = subprocess.run(
        [sys.executable, "-m", "worker", "assemble", "--from-sse", BEDROCK, "--tools",
         str(tools), str(cassette)], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(f"latch: {cassette} is not a capture this tool reads: ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_a_cassette_of_several_interactions_is_one_run_each(tmp_path: Path) -> None:
    """A VCR cassette recording an agent loop's two model turns (two ``!!binary`` event
    stream bodies), then a retried request answered HTTP 500: three runs, ``capture-1`` to
    ``capture-3``. The first commits c1 and c2, the second c3, each ``completed``; the third
    is a stream error, ``failed``. Read as one run instead, the second turn's events would be
    a protocol break after the first's ``messageStop``."""
    turns = [bedrock_calls(CALLS), bedrock_calls([("c3", "read_file", '{"path": "/c"}')])]
    cassette = tmp_path / "agent.yaml"
    cassette.write_text(yaml.safe_dump({"interactions": [
        *({"response": {"status": {"code": 200, "message": "OK"},
                        "body": {"string": eventstream.encode_events(events)}}}
          for events in turns),
        {"response": {"status": {"code": 500, "message": "Internal Server Error"},
                      "body": {"string": "{}"}}}], "version": 1}))
    tools = tmp_path / "tools.json"
    tools.write_bytes(orjson.dumps(tools_for(BEDROCK, {"read_file": PATH_SCHEMA})))
    done = subprocess.run(
        [sys.executable, "-m", "worker", "assemble", "--from-sse", BEDROCK, "--tools",
         str(tools), str(cassette)], capture_output=True, check=True)
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert [(line["key"], line["topic"], line["value"].get("call_id")) for line in lines] == [
        ("capture-1", "committed", "c1"), ("capture-1", "audit", None),
        ("capture-1", "committed", "c2"), ("capture-1", "audit", None),
        ("capture-1", "final", None), ("capture-2", "committed", "c3"),
        ("capture-2", "audit", None), ("capture-2", "final", None), ("capture-3", "final", None)]
    assert [line["value"]["status"] for line in lines if line["topic"] == "final"] == [
        "completed", "completed", "failed"]


def _exception_message(kind: str, name: str, payload: bytes) -> bytes:
    return eventstream.encode({":message-type": kind, ":exception-type": name,
                               ":content-type": "application/json"}, payload)


def test_an_eventstream_exception_message_is_never_an_ordinary_event() -> None:
    """An ``exception`` message named ``contentBlockDelta`` ends the stream with a
    ``StreamFailed`` (on main it was read as a delta); one named as an exception becomes that
    exception's event, and ends the stream too: nothing after it is read."""
    delta = {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "hi"}}}
    after = eventstream.encode_events([delta])
    forged = _exception_message("exception", "contentBlockDelta",
                                orjson.dumps(delta["contentBlockDelta"]))
    assert eventstream.sdk_events(forged + after) == [eventstream.StreamFailed("exception")]
    real = _exception_message("exception", "throttlingException", b'{"message":"slow"}')
    assert eventstream.sdk_events(real + after) == [{"throttlingException": {"message": "slow"}}]
    odd = _exception_message("exception", "throttlingException", b"[]")
    assert eventstream.sdk_events(odd + after) == [eventstream.StreamFailed("exception")]
