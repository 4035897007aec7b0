"""``core/ending.py``'s ``run.ended`` record, the core's abort feedback (issue 26, item 4;
decision 0015): one for a run Latch ends for a reason of its own, none for the stream's own
end. The events that reach an ended run, summed up in one DLQ record, are test_remembered.py's.
"""

from __future__ import annotations

from typing import Any

import orjson

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.envelope import Source

TEXT_LIMIT = 600


def _env(run_id: str, seq: int, kind: str, **body: Any) -> bytes:
    return orjson.dumps({"v": 1, "run_id": run_id, "seq": seq, "type": kind, **body})


def _chunk(text: str) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def _feed(asm: Assembler, offset: int, value: bytes, now: int, key: bytes | None = b"r1"
          ) -> list[Emit]:
    return asm.feed_record(key, value, now, Source("ev", 2, offset))


def _tick(asm: Assembler, offset: int, now: int) -> list[Emit]:
    return _feed(asm, offset, orjson.dumps({"v": 1, "type": "tick", "ts": now}), now, None)


def _ended_by_budget(asm: Assembler) -> list[Emit]:
    emits = _feed(asm, 10, _env("r1", 0, "run.start", provider="openai.chat", tools=[],
                                tenant="t"), 1000)
    emits += _feed(asm, 11, _env("r1", 1, "provider.event", event=_chunk("hi")), 1000)
    return emits + _feed(asm, 12, _env("r1", 2, "provider.event",
                                       event=_chunk("x" * 2 * TEXT_LIMIT)), 1000)


def test_budget_end_emits_one_run_ended_with_offsets() -> None:
    """A run ended by its text budget gets exactly one ``run.ended`` record, before its
    outcomes and final, naming the reason, the last seq and the offsets of its start and of
    the record that ended it."""
    asm = Assembler(AssembleSettings(max_run_text_bytes=TEXT_LIMIT))
    emits = _ended_by_budget(asm)
    ended = [e.value for e in emits if e.topic is Topic.RUN_ENDED]
    assert ended == [{"v": 1, "run_id": "r1", "tenant": "t", "provider": "openai.chat",
                      "type": "run.ended", "status": "failed", "reason": "budget_exceeded",
                      "last_seq": 2, "events": {"topic": "ev", "partition": 2,
                                                "first_offset": 10, "last_offset": 12},
                      "idempotency_key": "r1:ended"}]
    assert [e.topic for e in emits][-2:] == [Topic.RUN_ENDED, Topic.FINAL]


def test_stream_end_and_stream_error_emit_no_run_ended() -> None:
    """The stream's own ends are the gateway's: no ``run.ended``."""
    for kind in ("stream.end", "stream.error"):
        asm = Assembler()
        emits = _feed(asm, 0, _env("r1", 0, "run.start", provider="openai.chat", tools=[]), 1)
        emits += _feed(asm, 1, _env("r1", 1, kind, error="x"), 2)
        assert [e.topic for e in emits] == [Topic.FINAL]


def test_idle_and_cancel_emit_run_ended() -> None:
    """An idle timeout and a cancel each give their run one ``run.ended``."""
    asm = Assembler(AssembleSettings(assemble_idle_timeout_s=1))
    _feed(asm, 0, _env("r1", 0, "run.start", provider="openai.chat", tools=[]), 0)
    _feed(asm, 1, _env("r2", 0, "run.start", provider="openai.chat", tools=[]), 0, b"r2")
    cancel = orjson.dumps({"v": 1, "run_id": "r2", "type": "cancel", "reason": "user"})
    emits = _feed(asm, 2, cancel, 10, b"r2") + _tick(asm, 3, 5000)
    assert [(e.value["run_id"], e.value["reason"]) for e in emits
            if e.topic is Topic.RUN_ENDED] == [("r2", "cancelled"),
                                               ("r1", "assemble_idle_timeout")]


def test_protocol_break_emits_run_ended_once_at_the_break() -> None:
    """A protocol break (a second ``message_start`` with another id) gives ``run.ended`` at
    the break, and the run's end later gives none again."""
    asm = Assembler()
    start = {"type": "message_start", "message": {"id": "m1", "type": "message",
                                                  "role": "assistant", "content": []}}
    other = {"type": "message_start", "message": {"id": "m2", "type": "message",
                                                  "role": "assistant", "content": []}}
    emits = _feed(asm, 0, _env("r1", 0, "run.start", provider="anthropic.messages", tools=[]),
                  1)
    emits += _feed(asm, 1, _env("r1", 1, "provider.event", event=start), 1)
    at_break = _feed(asm, 2, _env("r1", 2, "provider.event", event=other), 1)
    assert [(e.topic, e.value["reason"]) for e in at_break] == [
        (Topic.RUN_ENDED, "protocol_error")]
    end = _feed(asm, 3, _env("r1", 3, "stream.end"), 2)
    assert [e.topic for e in end] == [Topic.FINAL]
