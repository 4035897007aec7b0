"""What a worker owns of its topics (worker/runtime/assignment.py): the events partitions'
states and the control partitions' forwarded offsets, what a revocation drops, readiness
through the hooks, and whether the control backlog is read (the tick rule's input)."""

from __future__ import annotations

from typing import Any

import pytest

from worker.core import Assembler
from worker.runtime.assignment import Assignment, control_behind
from worker.runtime.config import load_config
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import PartitionState


def _config() -> Any:
    return load_config(None, env={"LATCH_WORKER__HTTP_PORT": "0"})


def test_control_behind_reads_each_partition_against_its_end() -> None:
    """``control_behind``: a control partition whose next offset to forward is below its end,
    or whose end is unknown (missing, None or negative), is behind; none forwarded is not."""
    assert not control_behind({}, {})
    assert not control_behind({0: 5, 1: 2}, {0: 5, 1: 2})
    assert not control_behind({0: 6}, {0: 5})
    assert control_behind({0: 4}, {0: 5})
    assert control_behind({0: 5, 1: 2}, {0: 5})
    assert control_behind({0: 5}, {0: None})
    assert control_behind({0: 0}, {0: -1})


def test_the_assignment_drops_what_a_revoked_partition_held(
        caplog: pytest.LogCaptureFixture) -> None:
    """``Assignment`` (both engines' bookkeeping, issue 24): a revocation drops the events
    partitions' states and the control partitions' offsets and makes the worker not ready;
    the control backlog counts a control partition without an offset as unread; the log line
    of an assignment is the one the tests and tools read."""
    hooks = EngineHooks(_config())
    owned = Assignment(hooks)
    owned.assigned([0, 1])
    owned.partitions.update({p: PartitionState(Assembler(_config().assemble), 0) for p in (0, 1)})
    owned.control_next.update({0: 3, 1: 4})
    assert [v.partition for v in owned.views(lambda p, s: 0)] == [0, 1]
    assert not owned.control_behind({0: 3, 1: 4}) and owned.control_behind({0: 3, 1: 4}, [0, 2])
    owned.revoked([1], [0])
    assert list(owned.partitions) == [0] and owned.control_next == {1: 4}
    assert hooks.health.ready()[1]["owned"] == [0]
    with caplog.at_level("INFO", logger="latch.worker"):
        owned.log_assigned({3: None, 1: None}, dropped=2)
    assert "events partitions assigned: [1, 3] (dropped 2 heads of partitions owned " \
           "elsewhere)" in caplog.text


def test_the_assignment_reports_control_partitions_forwarded_to_their_ends() -> None:
    """``Assignment.control_forwarding`` (both engines, once their forwards are in the
    events log) reports as forwarding each owned control partition whose next offset reached
    its known end; one with an unknown end, or records left, is not."""
    hooks = EngineHooks(load_config(None, env={}))
    owned = Assignment(hooks)
    owned.assigned([0], [0, 1, 2])
    owned.control_next.update({0: 3, 1: 4})
    owned.control_forwarding({0: 3, 1: 9}, [0, 1, 2])
    assert hooks.health.ready()[1]["control_not_forwarding"] == [1, 2]
    owned.control_next.update({1: 9, 2: 0})
    owned.control_forwarding({0: 3, 1: 9, 2: None})
    assert hooks.health.ready()[1]["control_not_forwarding"] == [2]
    owned.control_forwarding({0: 3, 1: 9, 2: 0})
    assert hooks.health.ready()[1]["control_not_forwarding"] == []
    # a transaction's commit marker ends partition 1: read past it, the partition forwards
    owned.revoked([], [1])
    owned.assigned([0], [0, 1])
    owned.control_next[1] = 9
    owned.control_forwarding({0: 3, 1: 10})
    assert hooks.health.ready()[1]["control_not_forwarding"] == [1]
    owned.control_forwarding({0: 3, 1: 10}, read={1: 10})
    assert hooks.health.ready()[1]["control_not_forwarding"] == []
