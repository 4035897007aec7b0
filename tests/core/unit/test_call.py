"""What an open call and an open run hold: argument fragments folded as they arrive, and no
per-run copy of orjson's oversized output buffer (bench/bench_memory.py measures the bytes)."""

from __future__ import annotations

import tracemalloc

import orjson
from builders import CHAT, chat_chunk, chat_tool, chat_tool_delta, run_start

from worker.core import Assembler, AssembleSettings
from worker.core.call import FOLD_PIECES, Call
from worker.core.tools import ValidatorCache


def test_fold_keeps_the_text_and_few_pieces() -> None:
    """Folding after every FOLD_PIECES fragments never changes the joined text (ASCII, wide
    characters, lone surrogates, empty fragments), and a call of n fragments holds at most
    log2(n) + FOLD_PIECES pieces."""
    call = Call("0.0", 0, 0, 0)
    pieces = [f"{n}\u00e9\ud800{'x' * (n % 7)}" if n % 3 else "" for n in range(5000)]
    for piece in pieces:
        call.parts.append(piece)
        if len(call.parts) - call.folded >= FOLD_PIECES:
            call.fold()
        assert len(call.parts) <= 13 + FOLD_PIECES
    assert "".join(call.parts) == "".join(pieces)


def test_an_assembled_call_holds_folded_text() -> None:
    """Through the assembler, 2,000 fragments of one call end up in a handful of pieces whose
    text is the fragments in order; a replacing SetArgs-style restart starts the fold over."""
    assembler = Assembler(AssembleSettings(emit_progress=False))
    def event(seq: int, chunk: dict[str, object]) -> bytes:
        return orjson.dumps({"v": 1, "run_id": "r", "seq": seq, "type": "provider.event",
                             "event": chunk})

    assembler.feed_record(b"r", orjson.dumps(run_start("r", CHAT, [chat_tool("f", {})])), 1)
    assembler.feed_record(b"r", event(1, chat_chunk([chat_tool_delta(0, "call_0", "f", "")])), 1)
    for seq in range(2, 2002):
        assert not assembler.feed_record(
            b"r", event(seq, chat_chunk([chat_tool_delta(0, arguments=f"{seq:05d}")])), 1)
    call = assembler._runs["r"].calls["0.0"]
    assert len(call.parts) < 12 + FOLD_PIECES
    assert "".join(call.parts) == "".join(f"{seq:05d}" for seq in range(2, 2002))


def test_schema_text_is_exact_size() -> None:
    """A prepared tool schema holds its JSON text in an object of its own size, not orjson's
    output buffer (which keeps at least 4 KiB allocated behind a short result)."""
    cache = ValidatorCache()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [cache.prepare({"type": "object", "properties": {"a": {"type": "string"}}})
                for _ in range(100)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(k.text is not None for k in kept)
    assert held < 100 * 400  # about 180 bytes each; with orjson's buffer, over 4,000


def test_runs_registering_one_schema_share_its_text() -> None:
    """The runs that register the same schema share one prepared tool (its text held once
    per process, not once per run); another schema gets its own; the shared ones are bounded
    like the compiled ones (``size`` most recently used)."""
    cache = ValidatorCache(size=2)
    first = cache.prepare({"type": "object", "properties": {"a": {"type": "string"}}})
    again = cache.prepare({"properties": {"a": {"type": "string"}}, "type": "object"})
    assert again is first
    other = cache.prepare({"type": "object"})
    assert other is not first and other.text == b'{"type":"object"}'
    cache.prepare({"type": "array"})  # a third text: the least recently used one goes
    assert cache.prepare({"type": "object", "properties": {"a": {"type": "string"}}}) is not first


def test_an_open_run_holds_under_2_kib() -> None:
    """2,000 open chat runs, each with one registered tool and one call opened (id and name,
    no argument or assistant text yet), hold less than 2 KiB each in all (issue 13's target;
    bench/bench_memory.py measures it for 10,000)."""
    tool = chat_tool("write_file", {"type": "object", "properties": {"path": {"type": "string"}},
                                    "required": ["path"]})
    assembler = Assembler(AssembleSettings())
    records = []
    for n in range(2000):
        run_id = f"run-{n:06d}-{'x' * 20}"
        records.append((run_id.encode(), orjson.dumps(run_start(run_id, CHAT, [tool]))))
        records.append((run_id.encode(), orjson.dumps({
            "v": 1, "run_id": run_id, "seq": 1, "type": "provider.event",
            "event": chat_chunk([chat_tool_delta(0, f"call_{n:08d}", "write_file", "")])})))
    assembler.feed_record(records[0][0], records[0][1], 1)  # the shared tool, prepared once
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for key, value in records[2:]:
            assert assembler.feed_record(key, value, 1) == []
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert assembler.open_runs == 2000
    assert held / 1999 < 2048, f"{held / 1999:.0f} bytes per open run"
