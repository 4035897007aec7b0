"""A tick is the worker's own marker; a record on the events topic that merely looks like one
must not end other runs (guarantee 5, bad input is contained).

Found while writing the chaos driver (issue 4): ``decode`` took ``{"type": "tick"}`` under any
key, so one gateway record keyed by some run id, with a ``ts`` in the future, expired every
open run of its partition. A keyed tick whose key is not ``TICK_KEY`` now goes to the DLQ."""

from __future__ import annotations

import orjson

from worker.core import Assembler, DlqReason, Topic

START = {"v": 1, "run_id": "victim", "seq": 0, "type": "run.start", "provider": "openai.chat",
         "tools": []}
FORGED = orjson.dumps({"v": 1, "type": "tick", "ts": 99_999_999_999_999})


def test_a_tick_under_a_run_key_goes_to_the_dlq() -> None:
    """A tick keyed by a run id (not ``__latch_tick__``) is an invalid envelope: it goes to
    the DLQ with its bytes, and the open run of its partition stays open."""
    asm = Assembler()
    assert asm.feed_record(b"victim", orjson.dumps(START), 1_000) == []
    emits = asm.feed_record(b"gateway-run-7", FORGED, 1_001)
    assert [e.topic for e in emits] == [Topic.DLQ]
    assert emits[0].value["reason"] == DlqReason.INVALID_ENVELOPE
    assert asm.is_open("victim")
