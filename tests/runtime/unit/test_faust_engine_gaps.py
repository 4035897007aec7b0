"""The watch on a partition whose next record faust does not deliver
(``worker/runtime/faust_engine/gaps.py``, :class:`StallWatch`): a range is read by the worker
itself only once it was already in the log at the previous look and the next offset to apply
has not moved since; what it reads runs to the log end as it is now. The engine's use of it
(the control repair): ``test_faust_engine_forwarding.py`` and ``test_faust_engine.py``; with a
broker, ``tests/runtime/integration/test_control_gap.py``."""

from __future__ import annotations

from worker.runtime.faust_engine.gaps import StallWatch


def test_stall_watch_reads_a_range_only_after_it_stood_still() -> None:
    """A partition is read by the worker itself only when its next offset to apply is below
    the log end and has not moved between two looks (faust may be about to deliver it)."""
    watch = StallWatch()
    assert watch.stalled({0: 5, 1: 3}, {0: 6, 1: 3}) == {}  # first look: remember
    assert watch.stalled({0: 5, 1: 3}, {0: 6, 1: 4}) == {0: (5, 6)}  # 1: offset 3 is new
    assert watch.stalled({0: 6, 1: 3}, {0: 7, 1: 4}) == {1: (3, 4)}  # 0 moved
    assert watch.stalled({0: 6, 1: 4}, {0: 9, 1: 4}) == {0: (6, 9)}  # 1 caught up



def test_a_partition_that_keeps_moving_is_never_read() -> None:
    """Records arrive and are applied between every two looks: nothing stalls, however far
    behind the end the next offset is at each look."""
    watch = StallWatch()
    for applied, end in ((0, 10), (4, 12), (9, 20), (15, 20), (20, 25)):
        assert watch.stalled({0: applied}, {0: end}) == {}


def test_a_partition_without_an_end_or_no_longer_owned_is_forgotten() -> None:
    """A partition whose end is unknown at a look (not read) is not stalled and is not
    remembered; a partition no longer owned (gone from ``applied``) is forgotten: owned
    again, it needs two looks before it counts as stalled."""
    watch = StallWatch()
    assert watch.stalled({0: 2, 1: 2}, {0: 5, 1: 5}) == {}
    assert watch.stalled({0: 2, 1: 2}, {1: 5}) == {1: (2, 5)}  # 0's end unknown
    assert watch.stalled({0: 2}, {0: 5}) == {}  # 0 forgotten above: a first look again
    assert watch.stalled({0: 2}, {0: 5}) == {0: (2, 5)}
    assert watch.stalled({1: 2}, {1: 5}) == {}  # 1 was not owned at the last look


def test_an_empty_range_at_the_previous_look_is_not_a_stall() -> None:
    """The next offset was at the end at the previous look (nothing to deliver then): a
    record that arrived since is not stalled yet, whatever the end now."""
    watch = StallWatch()
    assert watch.stalled({0: 7}, {0: 7}) == {}
    assert watch.stalled({0: 7}, {0: 12}) == {}
    assert watch.stalled({0: 7}, {0: 12}) == {0: (7, 12)}
