"""``worker.runtime.memory.IdleTrim``: the heap is trimmed once the worker has been idle for a
whole interval after work, never during a burst, never when nothing was processed."""

from __future__ import annotations

import ctypes
import platform

import pytest

from worker.runtime import memory


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _trim() -> tuple[memory.IdleTrim, Clock, list[int]]:
    calls: list[int] = []
    clock = Clock()

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    return memory.IdleTrim(trim, 0.5, clock), clock, calls


def test_trims_once_after_a_whole_idle_interval_that_follows_work() -> None:
    """``IdleTrim`` trims nothing before any work, trims once a whole idle interval follows work,
    and not again until more work comes."""
    idle_trim, clock, calls = _trim()
    assert not idle_trim.idle()  # nothing processed yet: nothing to give back
    idle_trim.busy()
    assert not idle_trim.idle()  # the first idle call starts the interval
    clock.now += 0.4
    assert not idle_trim.idle()  # not a whole interval yet
    clock.now += 0.1
    assert idle_trim.idle() and calls == [0] and idle_trim.trims == 1
    clock.now += 10
    assert not idle_trim.idle()  # once per burst: nothing came since
    assert calls == [0]


def test_records_in_the_interval_start_it_again() -> None:
    """A record arriving within the idle interval restarts it: the trim waits a whole interval
    after the last record."""
    idle_trim, clock, calls = _trim()
    idle_trim.busy()
    idle_trim.idle()
    clock.now += 0.4
    idle_trim.busy()  # a record came: still a burst
    clock.now += 0.2
    assert not idle_trim.idle()  # the interval starts again here
    clock.now += 0.5
    assert idle_trim.idle() and calls == [0]


def test_no_trim_without_malloc_trim() -> None:
    """Where the C library has no ``malloc_trim`` (musl, macOS), idling does nothing."""
    idle_trim = memory.IdleTrim(None, 0.0, Clock())
    idle_trim.busy()
    idle_trim.idle()
    assert not idle_trim.idle() and idle_trim.trims == 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_malloc_trim_is_found_and_runs() -> None:
    """On glibc (the image, CI) the real ``malloc_trim`` is found and can be called."""
    trim = memory.malloc_trim()
    assert trim is not None
    block = ctypes.create_string_buffer(4 << 20)  # something to give back once freed
    del block
    assert trim(0) in (0, 1)
