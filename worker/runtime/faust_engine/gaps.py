"""Ranges of an owned input partition that faust never delivers, found without waiting for a
later record (issue 9, item 15).

faust can start a newly assigned partition past the group's committed offset (records
fetched during recovery are dropped; faust-streaming/faust#596). The worker repairs such a
range when a later record of the partition arrives (``FaustEngine._in_order``), and every
events partition gets one within ``tick_interval_s``: the worker's own tick. A control
partition gets nothing of the kind: a cancel that was the last record of its partition when
faust skipped it stayed unread, its run ended ``assemble_idle_timeout`` instead of
``cancelled`` (or committed the calls the user stopped, had the stream gone on).

At each tick interval (a timer of its own, so that a slow read never holds the ticks back)
the worker compares, for each control partition it owns, the next offset it
will apply with the partition's log end. A partition whose next offset was already below the
end at the previous tick and has not moved since is *stalled*: the worker reads the range
itself and forwards it, exactly as if faust had delivered it (a record faust delivers later
is a repeat and is dropped). Two looks a tick apart keep the worker from racing faust over
records it is about to deliver; a skipped record is forwarded within two ticks.

Engine-independent: :class:`StallWatch` decides, the engine reads and forwards.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["StallWatch"]


class StallWatch:
    """The partitions with a record that was already in the log at the previous look and is
    still not applied, the next offset to apply not having moved since."""

    def __init__(self) -> None:
        self._previous: dict[int, tuple[int, int]] = {}

    def stalled(self, applied: Mapping[int, int],
                ends: Mapping[int, int]) -> dict[int, tuple[int, int]]:
        """``{partition: (start, end)}`` to read now, from ``applied`` (each owned
        partition's next offset to apply) and ``ends`` (each one's log end offset); remember
        both for the next look."""
        found = {}
        for partition, start in applied.items():
            before = self._previous.get(partition)
            if (partition in ends and before is not None and before[0] == start
                    and before[1] > start):
                found[partition] = (start, ends[partition])
        self._previous = {p: (start, ends[p]) for p, start in applied.items() if p in ends}
        return found
