"""Runs that register the same tools share one tool map (``tools.ToolMaps``): the
map is only read, and a copy per run was 184 bytes of every open run (bench/bench_memory.py).
"""

from __future__ import annotations

import orjson
import pytest
from builders import CHAT, PATH_SCHEMA, chat_tool, run_start

from worker.core import Assembler, AssembleSettings
from worker.core import tools as tools_module


def _start(assembler: Assembler, run_id: str, tools: list[object]) -> None:
    assembler.feed_record(run_id.encode(), orjson.dumps(run_start(run_id, CHAT, tools)), 1)


def test_runs_with_the_same_tools_share_one_map_and_others_do_not() -> None:
    """Two runs registering the same tools share one tool map, runs with other tools (or none)
    get their own, and each run still counts its schema text in its bytes."""
    assembler = Assembler()
    _start(assembler, "a", [chat_tool("write_file", PATH_SCHEMA)])
    _start(assembler, "b", [chat_tool("write_file", PATH_SCHEMA)])
    _start(assembler, "c", [chat_tool("read_file", PATH_SCHEMA)])
    _start(assembler, "d", [])
    runs = assembler._runs
    assert runs["a"].latch.tools is runs["b"].latch.tools
    assert runs["a"].latch.tools is not runs["c"].latch.tools
    assert list(runs["c"].latch.tools) == ["read_file"] and runs["d"].latch.tools == {}
    # Each run still counts its tools' schema text in the byte budget, shared or not.
    assert runs["a"].nbytes == runs["b"].nbytes > 0


def test_the_shared_maps_are_bounded() -> None:
    """The assembler keeps the last ``SHARED_TOOL_MAPS`` maps: distinct tool sets of many runs
    do not grow it further."""
    assembler = Assembler(AssembleSettings(max_open_runs=4))
    for n in range(tools_module.SHARED_TOOL_MAPS + 10):
        _start(assembler, f"r{n}", [chat_tool(f"tool_{n}", PATH_SCHEMA)])
    assert len(assembler._tool_maps.maps) == tools_module.SHARED_TOOL_MAPS


def test_the_shared_maps_hold_a_bounded_amount_of_schema_text(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Run starts with ever new tools cannot make the kept maps hold more schema text than
    ``SHARED_TOOL_MAP_BYTES`` (the maps keep their schemas alive after their runs ended); a
    map larger than that on its own is never kept."""
    monkeypatch.setattr(tools_module, "SHARED_TOOL_MAP_BYTES", 2_000)
    assembler = Assembler(AssembleSettings(max_open_runs=4))
    for n in range(40):
        _start(assembler, f"r{n}", [chat_tool(f"tool_{n}", PATH_SCHEMA)])
        kept = sum(cost for _, cost in assembler._tool_maps.maps.values())
        assert kept == assembler._tool_maps.bytes <= 2_000
    assert 1 < len(assembler._tool_maps.maps) < 40
    big = {"type": "object", "description": "x" * 3_000}
    _start(assembler, "big", [chat_tool("big", big)])
    assert all("big" not in tools for tools, _ in assembler._tool_maps.maps.values())
