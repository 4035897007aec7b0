"""A runner never commits past a committed record it neither ran nor answered because it
does not hold the key the record names (``signing.key_id`` switched before every runner held
the key: docs/runner.md, "Rotating"). Such a record stops the runner with an error naming
the key id, before its offset is committed, so that a runner holding the key (or this one,
restarted with it) runs the call. Records that are unsigned or whose signature does not
match stay refused and skipped (a writer that is not the worker: nothing to answer)."""

from __future__ import annotations

import threading

import orjson
import pytest
from runner_fakes import LoopConsumer, Message, Producer

from worker.client.runner import Runner, SigningKeyError
from worker.runtime.config import Config
from worker.runtime.governance.signing import Signer, Verifier

OLD = b"old-key-0123456789abcdef0123456789abcdef"
NEW = b"new-key-0123456789abcdef0123456789abcdef"


def committed(call_id: str) -> bytes:
    return orjson.dumps({
        "v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat",
        "call_id": call_id, "name": "add", "index": 0, "arguments": {"a": 1, "b": 2},
        "idempotency_key": f"r1:{call_id}"})


def loop(messages: list[Message], keys: dict[str, bytes], transactional: bool = False
         ) -> tuple[Runner, LoopConsumer, Producer, list[object]]:
    ran: list[object] = []
    stop = threading.Event()
    consumer, producer = LoopConsumer(messages, stop), Producer()
    runner = Runner(Config(), {"add": lambda args: ran.append(args) or 3}, consumer=consumer,
                    producer=producer, verifier=Verifier(keys))
    runner._stop_for_test = stop  # type: ignore[attr-defined]
    return runner, consumer, producer, ran


def signed(call_id: str, offset: int, signer: Signer) -> Message:
    value = committed(call_id)
    return Message(value, offset=offset, headers=signer.headers(value))


def test_a_record_signed_with_a_key_the_runner_lacks_stops_it_before_the_commit() -> None:
    """The worker switched to k2 while this runner holds only k1: the call signed with k1
    runs and is committed; the call signed with k2 stops the runner with SigningKeyError
    naming k2, its offset (1) not committed and nothing after it consumed; it is counted as
    unknown_key. A runner given k2 then runs it."""
    messages = [signed("c1", 0, Signer("k1", OLD)), signed("c2", 1, Signer("k2", NEW)),
                signed("c3", 2, Signer("k2", NEW))]
    runner, consumer, producer, ran = loop(messages, {"k1": OLD})
    with pytest.raises(SigningKeyError, match="'k2'") as raised:
        runner.run(runner._stop_for_test, timeout=0)  # type: ignore[attr-defined]
    assert "signing.keys" in str(raised.value) and str(OLD) not in str(raised.value)
    assert consumer.commits == [0] and len(ran) == 1 and len(producer.results()) == 1
    assert runner.metrics.rejected["unknown_key"] == 1
    runner.metrics.shutdown()

    rotated, consumer, producer, ran = loop(messages[1:], {"k1": OLD, "k2": NEW})
    rotated.run(rotated._stop_for_test, timeout=0)  # type: ignore[attr-defined]
    assert consumer.commits == [1, 2] and len(ran) == 2
    rotated.metrics.shutdown()


def test_a_forged_record_is_still_skipped_and_committed_past() -> None:
    """An unsigned record and one signed under a held id with another key are refused
    (unsigned, bad_signature), run nothing and are committed past: the runner goes on to the
    next call (nothing the worker committed is lost by skipping them)."""
    forged = committed("c1")
    messages = [Message(forged, offset=0),
                Message(forged, offset=1, headers=Signer("k1", NEW).headers(forged)),
                signed("c2", 2, Signer("k1", OLD))]
    runner, consumer, _, ran = loop(messages, {"k1": OLD})
    runner.run(runner._stop_for_test, timeout=0)  # type: ignore[attr-defined]
    assert consumer.commits == [0, 1, 2] and len(ran) == 1
    assert {k: v for k, v in runner.metrics.rejected.items() if v} == {
        "unsigned": 1, "bad_signature": 1}
    runner.metrics.shutdown()


def test_the_key_id_in_the_error_is_the_writers_text_cut_and_quoted() -> None:
    """The key id header is whoever wrote the record: a 10,000-character id with a newline
    and a non-UTF-8 byte ends up in SigningKeyError's message quoted (repr) and cut to 64
    characters; the message holds no key and the offset is not committed."""
    value = committed("c1")
    key_id = b"\xff\nforged-" + b"x" * 10_000
    headers = [("latch-signature-key", key_id), ("latch-signature", b"0" * 64)]
    runner, consumer, _, ran = loop([Message(value, offset=0, headers=headers)], {"k1": OLD})
    with pytest.raises(SigningKeyError) as raised:
        runner.run(runner._stop_for_test, timeout=0)  # type: ignore[attr-defined]
    message = str(raised.value)
    assert "\\n" in message and "\n" not in message and "x" * 55 in message
    assert "x" * 56 not in message and str(OLD) not in message
    assert consumer.commits == [] and ran == []
    runner.metrics.shutdown()
