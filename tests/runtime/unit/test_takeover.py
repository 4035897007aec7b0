"""The takeover generator (worker/runtime/takeover.py, issue 35 item 2): both engines drive
one sequence: it yields what to read, is sent the records in chunks of any size, and returns
the rebuilt state and what to send; how the engine cuts its reads never changes the state."""

from __future__ import annotations

from typing import Any

import driving
import pytest
from test_driver import _config, _driver, _records, _run

from worker.core import Assembler
from worker.runtime import takeover
from worker.runtime.partition import PartitionState


def _table() -> dict[bytes, Any]:
    return {b"r2": {"p": 0, "start": 0},
            b"r0": {"p": 0, "done": True, "seq": 3, "status": "completed"}}


@pytest.mark.parametrize("size", [1, 2, 3, 100])
def test_the_rebuild_asks_for_the_open_runs_and_any_chunking_rebuilds_the_same(
        size: int) -> None:
    """The generator's first yield names the range to read (from the earliest open run's
    start to the resume offset); fed in chunks of ``size`` records, then an empty chunk, it
    returns a state that emits for the rest of the open run what a partition that never
    stopped emits, with nothing to send again (no run finished during the read)."""
    records = list(_records(_run("r2")))
    whole = PartitionState(Assembler(_config().assemble), next_offset=0)
    expected = [whole.apply(record) for record in records][-1]
    driver = _driver(_table())
    resume = len(records) - 1
    rebuild = driver.rebuild("ev", 0, resume)
    read = next(rebuild)
    assert read is not None and (read.start, read.end) == (0, resume)
    to_read = records[read.start:read.end]
    for at in range(0, len(to_read), size):
        assert rebuild.send(to_read[at:at + size]) is None
    done = takeover.end(rebuild)
    assert done.work.out == []
    assert done.state.assembler.finished("r0") == (3, "completed")
    applied = driving.apply(driver, done.state, records[-1])
    assert applied is not None
    assert [(e.topic, e.value) for e in applied.emits] == [(e.topic, e.value) for e in expected]


def test_no_open_run_reads_nothing() -> None:
    """With no open run in the heads, the range to read is empty (start == resume): the
    engine reads nothing and ends the rebuild at once."""
    driver = _driver({b"r0": {"p": 0, "done": True, "seq": 3, "status": "completed"}})
    rebuild = driver.rebuild("ev", 0, 7)
    read = next(rebuild)
    assert read is not None and read.start == read.end == 7
    done = takeover.end(rebuild)
    assert done.state.assembler.finished("r0") == (3, "completed")
    assert done.work.out == []
