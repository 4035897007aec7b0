"""The control topic (worker/runtime/control.py): a cancel is forwarded into its run's events
partition as its cancel marker; anything else but a decision goes to the DLQ, refused by the
core's own reasons. Its approvals (issue 26): ``approve``, ``deny`` and ``edit`` are forwarded
into the run's events partition like a cancel, as a canonical envelope of their checked fields
(so take-over and replay read what the live worker applied); a malformed one goes to the DLQ
with its original bytes."""

from __future__ import annotations

import base64

import orjson
import pytest

from worker.core import Emit
from worker.core.envelope import Source
from worker.runtime.control import route
from worker.runtime.step import Record

SOURCE = Source("ctl", 0, 7)


def _route(doc: dict[str, object], key: bytes = b"r1") -> tuple[bytes, bytes] | Emit:
    return route(Record(key, orjson.dumps(doc), None, SOURCE))


@pytest.mark.parametrize("kind", ["approve", "deny", "edit"])
def test_a_decision_is_forwarded_with_its_checked_fields(kind: str) -> None:
    """The forwarded marker holds the decision's fields only (unknown members dropped) and
    the control record it came from (partition, offset: a second forward of it is a repeat),
    keyed by its run."""
    doc = {"v": 1, "run_id": "r1", "type": kind, "tool_call_id": "c1", "by": "ann",
           "reason": "ok", "extra": "dropped", "ts": 5}
    if kind == "edit":
        doc["arguments"] = '{"path": "/a"}'
    routed = _route(doc)
    assert isinstance(routed, tuple)
    key, value = routed
    expected = {"v": 1, "run_id": "r1", "type": kind, "tool_call_id": "c1", "by": "ann",
                "reason": "ok", "control": [0, 7]}
    if kind == "edit":
        expected["arguments"] = '{"path": "/a"}'
    assert key == b"r1" and orjson.loads(value) == expected


@pytest.mark.parametrize("doc", [
    {"v": 1, "run_id": "r1", "type": "approve", "by": "ann", "reason": ""},
    {"v": 1, "run_id": "r1", "type": "deny", "tool_call_id": "c1", "reason": ""},
    {"v": 1, "run_id": "r1", "type": "deny", "tool_call_id": "c1", "by": "a" * 257,
     "reason": ""},
    {"v": 1, "run_id": "r1", "type": "edit", "tool_call_id": "c1", "by": "ann", "reason": "",
     "arguments": {"path": "/a"}},
    {"v": 1, "run_id": "r1", "type": "approve", "tool_call_id": "c1", "by": "ann"},
], ids=["no_call", "no_by", "long_by", "edit_value_not_text", "no_reason"])
def test_a_malformed_decision_goes_to_the_dlq(doc: dict[str, object]) -> None:
    """A decision without its call, its decider or its reason, or an edit whose arguments
    are not text: one DLQ record ``invalid_envelope`` with the original bytes."""
    routed = _route(doc)
    assert isinstance(routed, Emit)
    assert routed.value["reason"] == "invalid_envelope"
    assert base64.b64decode(routed.value["original_b64"]) == orjson.dumps(doc)


def test_a_cancel_is_forwarded_as_its_marker_keyed_by_its_run() -> None:
    """A cancel becomes the events topic's cancel marker (its reason, ``cancelled`` when it
    gives none; nothing else of it), keyed by its run, with or without a source."""
    assert _route({"v": 1, "type": "cancel", "run_id": "r1", "ts": 5, "reason": "user"}) == (
        b"r1", orjson.dumps({"v": 1, "run_id": "r1", "type": "cancel", "reason": "user"}))
    key, value = route(Record(b"r1", orjson.dumps({"v": 1, "type": "cancel", "run_id": "r1",
                                                   "ts": 5}), None, None))  # type: ignore[misc]
    assert key == b"r1" and orjson.loads(value)["reason"] == "cancelled"


@pytest.mark.parametrize(("key", "value", "reason", "detail"), [
    (b"r1", orjson.dumps({"v": 1, "type": "stream.end", "run_id": "r1", "ts": 5, "seq": 0}),
     "invalid_envelope", "the control topic takes only cancel, approve, deny and edit"),
    (b"x", orjson.dumps({"v": 1, "type": "cancel", "run_id": "r1", "ts": 5}),
     "key_mismatch", "the record key differs from run_id"),
    (b"x", b"not json", "undecodable", "not JSON"),
], ids=["events_envelope", "key_mismatch", "not_json"])
def test_any_other_control_record_goes_to_the_dlq(key: bytes, value: bytes, reason: str,
                                                    detail: str) -> None:
    """A valid envelope of the events topic, a cancel under another run's key, or bytes that
    are not JSON: one DLQ record under the control record's key, with the reason, the
    control record it came from and its original bytes; never a forward."""
    routed = route(Record(key, value, None, SOURCE))
    assert isinstance(routed, Emit) and routed.key == key.decode()
    assert routed.value["reason"] == reason and detail in routed.value["detail"]
    assert routed.value["source"]["offset"] == 7
    assert base64.b64decode(routed.value["original_b64"]) == value
