"""What an open call and an open run hold: argument fragments folded as they arrive, and no
per-run copy of orjson's oversized output buffer (bench/bench_memory.py measures the bytes)."""

from __future__ import annotations

import tracemalloc

import orjson
from builders import CHAT, chat_chunk, chat_tool, chat_tool_delta, run_start

from worker.core import Assembler, AssembleSettings
from worker.core.run import FOLD_PIECES, Call
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
