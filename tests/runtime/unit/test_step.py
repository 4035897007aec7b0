"""``worker.runtime.step``: the per-record step both engines and ``latch replay`` share; idle
expiry follows a tick's record time, never its payload (issue 9).
"""

from __future__ import annotations

from typing import Any

import orjson

from worker.core import Assembler, AssembleSettings, RunStatus, Topic
from worker.runtime import step
from worker.runtime.partition import TICK

# -- idle expiry in record time -----------------------------------------------------------


def _record(key: bytes, doc: dict[str, Any], time_ms: int, offset: int) -> step.Record:
    return step.record(key, orjson.dumps(doc), time_ms, "ev", 0, offset)


def test_a_tick_expires_by_its_record_time_not_its_ts() -> None:
    """A tick whose payload ``ts`` is far in the future (a gateway's skewed or chosen clock)
    expires nothing while its record time is within the idle timeout; a tick whose record
    time is past it expires the run, whatever its ``ts`` says."""
    asm = Assembler(AssembleSettings(assemble_idle_timeout_s=60))
    start = {"v": 1, "run_id": "r1", "seq": 0, "type": "run.start", "provider": "openai.chat",
             "tools": [], "ts": 1_000}
    assert step.step(asm, _record(b"r1", start, 1_000, 0)) == []
    future = {"v": 1, "type": "tick", "ts": 99_999_999_999_999}
    assert step.step(asm, _record(TICK, future, 2_000, 1)) == []
    assert asm.is_open("r1")
    past = {"v": 1, "type": "tick", "ts": 0}
    emits = step.step(asm, _record(TICK, past, 61_000, 2))
    finals = [e for e in emits if e.topic is Topic.FINAL]
    assert len(finals) == 1 and finals[0].value["status"] == RunStatus.IDLE_TIMEOUT
