"""``core/settings.py``, the assembler's settings (the ``agent_stream_assemble`` section):
frozen values the core only reads, a record bound below the output topics' limit, the largest
records a configuration lets a run make (which ``worker.runtime.config`` refuses above the
bound: tests/runtime/unit/test_config.py), and an audit key that never prints itself. Named
``test_core_settings.py``: each engine has a ``settings.py`` too."""

from __future__ import annotations

import dataclasses

import pytest

from worker.core.settings import (
    MAX_RECORD_BYTES,
    OUTPUT_RECORD_BYTES,
    RECORD_OVERHEAD,
    AssembleSettings,
    AuditKey,
    largest_records,
)


def test_settings_are_frozen() -> None:
    """An ``AssembleSettings`` cannot be changed once made: the core reads it, never writes
    it (a change is a new instance: ``dataclasses.replace``)."""
    settings = AssembleSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_tool_argument_bytes = 1  # type: ignore[misc]
    assert dataclasses.replace(settings, max_tool_argument_bytes=1).max_tool_argument_bytes == 1


def test_a_record_leaves_room_below_the_topics_limit() -> None:
    """The largest record value the core emits is below the output topics'
    ``max.message.bytes``, with room for a key, headers and framing."""
    assert 0 < MAX_RECORD_BYTES < OUTPUT_RECORD_BYTES
    assert OUTPUT_RECORD_BYTES - MAX_RECORD_BYTES >= 1024 * 1024


def test_the_largest_records_grow_with_their_limits() -> None:
    """``largest_records`` names the committed call (argument bytes and a record's
    overhead) and the final message, each with the settings that bound it; raising a limit
    raises its record's size by at least as much."""
    base = AssembleSettings()
    (what, committed, bound), (final_what, final, final_bound) = largest_records(base)
    assert (what, final_what) == ("a committed call", "a final message")
    assert committed == base.max_tool_argument_bytes + RECORD_OVERHEAD
    assert bound == ("max_tool_argument_bytes",) and "max_run_text_bytes" in final_bound
    more_text = dataclasses.replace(base, max_run_text_bytes=base.max_run_text_bytes + 1000)
    assert largest_records(more_text)[1][1] == final + 1000


def test_the_default_settings_fit_a_record() -> None:
    """With the defaults, no record a run can make is above :data:`MAX_RECORD_BYTES` (the
    configuration would refuse them otherwise)."""
    assert all(size <= MAX_RECORD_BYTES for _, size, _ in largest_records(AssembleSettings()))


def test_an_audit_key_never_prints_its_bytes() -> None:
    """An ``AuditKey``'s ``repr`` names its id, never the key (a log line or a traceback
    holding the settings must not leak it)."""
    key = AuditKey("k1", b"very-secret-bytes")
    assert "k1" in repr(key) and "very-secret" not in repr(key)
