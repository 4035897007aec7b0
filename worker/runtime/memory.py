"""Give the C heap's free memory back to the system when the worker goes idle after work.

A burst of records (a backlog, a replay, a rebuild, many runs starting at once) passes
through memory that is freed right after: the fetched batches, the parsed records, the
outputs in flight. glibc keeps what is freed in its heap for reuse; it gives back only the
top of the heap, and a freed block below a live one stays in the process's RSS. Measured
with `bench/bench_memory.py` on the kafka engine, 10,000 run starts left 24 MB of such
memory, about 2.4 KB per run, against a state of about 2 KB per run (docs/benchmarks.md,
"Memory").

:class:`IdleTrim` calls glibc's ``malloc_trim(0)``, which returns every free page of every
arena (``madvise``), once the worker has been idle for a whole interval after processing
records: never during a burst (the memory is reused there), at most once per interval, and
not at all where the C library is not glibc. It costs a few milliseconds on a heap of about
100 MB.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable

__all__ = ["IdleTrim", "malloc_trim"]

log = logging.getLogger(__name__)

#: How long the worker must have been idle, at least, before the heap is trimmed (seconds).
IDLE_S = 0.5


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class IdleTrim:
    """Trim the heap once records have been processed and then none for a whole interval.

    The engine calls :meth:`busy` when it processes records (a flag: nothing else on the
    per-record path) and :meth:`idle` whenever it finds none waiting. The first idle call
    after work starts the interval; one at least ``idle_s`` later trims, unless records came
    in between. ``trim``: :func:`malloc_trim`'s answer (None: nothing is ever trimmed)."""

    def __init__(self, trim: Callable[[int], int] | None, idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self._trim = trim
        self._clock = clock
        self.active = False
        self._idle_since: float | None = None
        #: Trims made (tests and the benchmark's notes read it).
        self.trims = 0

    def busy(self) -> None:
        self.active = True

    def idle(self) -> bool:
        """Called when no record is waiting; True when it trimmed."""
        if self.active:
            self.active = False
            self._idle_since = self._clock()
            return False
        since = self._idle_since
        if since is None or self._trim is None or self._clock() - since < self.idle_s:
            return False
        self._idle_since = None
        started = time.perf_counter()
        self._trim(0)
        self.trims += 1
        log.debug("gave the heap's free memory back after %.1f ms",
                  (time.perf_counter() - started) * 1000)
        return True
