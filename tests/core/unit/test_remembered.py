"""``core/remembered.py``: what a partition remembers of runs that are not open. A cancel
recorded before its run's ``run.start`` cancels the run when it starts, within
``early_cancel_ttl_s`` of record time and ``remember_early_cancels`` cancels; the events that
reach an ended run are summed up in one DLQ record (decision 0015). Moved out of
test_assembler.py and test_run_ended.py (issue 35, item 5)."""

from __future__ import annotations

from typing import Any

import orjson
from builders import CHAT, cancel, committed, dlq, finals, provider_run
from test_assembler import OBJECT, checked, make
from test_ending import TEXT_LIMIT, _chunk, _ended_by_budget, _env, _feed, _tick

from worker.core import Assembler, AssembleSettings, Emit, Topic

# -- a cancel before its run.start -----------------------------------------------------------


def _record(asm: Assembler, env: dict[str, Any], ts: int) -> list[Emit]:
    return asm.feed_record(None, orjson.dumps(env), ts)


def _run_after(asm: Assembler, run_id: str, ts: int) -> list[Emit]:
    emits: list[Emit] = []
    for env in provider_run(CHAT, run_id, {"f": OBJECT}, [("c1", "f", "{}")]):
        emits += _record(asm, env, ts)
    return checked(emits)


def test_cancel_before_run_start_cancels_the_run() -> None:
    """A cancel recorded before its run's ``run.start``: the run ends ``cancelled`` when it
    starts, its later events are ignored, nothing commits and nothing goes to the DLQ."""
    asm = make()
    assert _record(asm, cancel("r", reason="user_stop"), 1_000) == []
    emits = _run_after(asm, "r", 2_000)
    assert committed(emits) == [] and dlq(emits) == []
    assert [f["status"] for f in finals(emits)] == ["cancelled"]
    assert not asm.early_cancel_pending("r")
    assert asm.stats["early_cancels_applied"] == 1


def test_early_cancel_expires_in_record_time() -> None:
    """A cancel older than ``early_cancel_ttl_s`` (record time) when its run starts changes
    nothing: the run commits its call."""
    asm = make(early_cancel_ttl_s=10)
    _record(asm, cancel("r"), 1_000)
    emits = _run_after(asm, "r", 11_001)
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
    assert [f["status"] for f in finals(emits)] == ["completed"]
    assert asm.stats["early_cancels_expired"] == 1


def test_early_cancels_are_bounded_in_count() -> None:
    """Beyond ``remember_early_cancels`` the oldest cancel is forgotten: its run commits, the
    newer ones are still applied."""
    asm = make(remember_early_cancels=2)
    for n, run_id in enumerate(("a", "b", "c")):
        _record(asm, cancel(run_id), 1_000 + n)
    assert [asm.early_cancel_pending(r) for r in "abc"] == [False, True, True]
    assert [f["status"] for f in finals(_run_after(asm, "a", 2_000))] == ["completed"]
    assert [f["status"] for f in finals(_run_after(asm, "c", 2_000))] == ["cancelled"]


def test_late_events_are_summed_up_in_one_dlq_record() -> None:
    """21 events after the run's end give no DLQ record each; a re-delivered one counts
    nothing; once quiet for the idle timeout, a tick emits one DLQ ``run_finished`` record
    with the count, seqs and offsets, and later events add no record."""
    asm = Assembler(AssembleSettings(max_run_text_bytes=TEXT_LIMIT, assemble_idle_timeout_s=5))
    _ended_by_budget(asm)
    late: list[Emit] = []
    for n in range(21):
        late += _feed(asm, 20 + n, _env("r1", 3 + n, "provider.event", event=_chunk("l")),
                      2000 + n)
    late += _feed(asm, 50, _env("r1", 10, "provider.event", event=_chunk("l")), 2100)
    assert late == []
    assert _tick(asm, 51, 6000) == []  # not quiet long enough yet
    emits = _tick(asm, 52, 2020 + 5000)
    assert len(emits) == 1 and emits[0].topic is Topic.DLQ and emits[0].key == "r1"
    summary = emits[0].value
    assert summary["reason"] == "run_finished" and summary["original_b64"] == ""
    assert summary["late"] == {"count": 21, "first_seq": 3, "last_seq": 23,
                               "first_offset": 20, "last_offset": 40}
    assert summary["source"]["offset"] == 20
    again = _feed(asm, 53, _env("r1", 24, "provider.event", event=_chunk("l")), 8000)
    assert again == [] and _tick(asm, 54, 20000) == []
    assert asm.stats["late_after_summary"] == 1
