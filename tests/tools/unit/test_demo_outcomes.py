"""``latch demo``'s step 5 (``worker/tools/demo_outcomes.py``) without a broker: the records
of the demo's runs as a worker would emit them, in an order the topics allow (a final message
before its calls, a turn record before the latch's ``tool_timeout`` result), printed in an
order a person can follow, the held call approved, the committed calls answered but one, and
the wait ending only when every run has its final message and its turn record."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

from worker.runtime.config import Config
from worker.tools.demo_outcomes import Tally, Timeout, watch
from worker.tools.demo_runner import DemoRunner

CONFIG = Config()


class Message:
    """What ``Consumer.poll`` returns, enough of it for ``latch tail``'s reader."""

    def __init__(self, role: str, key: str, value: dict[str, Any]) -> None:
        self._topic = getattr(CONFIG.topics, role)
        self._key, self._value = key.encode(), orjson.dumps(value)

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, 1_700_000_000_000


class Consumer:
    """Hands out the queued records one poll at a time, then nothing."""

    def __init__(self) -> None:
        self.queue: deque[Message] = deque()

    def poll(self, _timeout: float) -> Message | None:
        return self.queue.popleft() if self.queue else None


class Publisher:
    """Records the approves and envelopes the demo sends; an approve makes the held call
    commit, as the worker would."""

    def __init__(self, consumer: Consumer, on_approve: list[Message]) -> None:
        self.consumer, self.on_approve = consumer, on_approve
        self.approved: list[tuple[str, str]] = []
        self.sent: list[dict[str, Any]] = []

    def approve(self, run_id: str, call_id: str, *, by: str, reason: str = "") -> None:
        self.approved.append((run_id, call_id))
        self.consumer.queue.extend(self.on_approve)

    def send_envelope(self, envelope: dict[str, Any]) -> None:
        self.sent.append(envelope)

    def flush(self, timeout: float = 30.0) -> None:
        return None


def committed(run: str, call_id: str) -> Message:
    return Message("committed", run, {
        "v": 1, "run_id": run, "tenant": "acme", "provider": "openai.chat", "call_id": call_id,
        "name": "get_weather", "index": 0, "arguments": {"city": "Paris"},
        "idempotency_key": f"{run}:{call_id}"})


def final(run: str, calls: int) -> Message:
    return Message("final", run, {"v": 1, "run_id": run, "status": "completed",
                                  "outcomes": [{"state": "committed"}] * calls})


def turn(run: str, provider: str, outcome: str, call_id: str) -> Message:
    return Message("turns", run, {
        "v": 1, "run_id": run, "provider": provider,
        "messages": [{"role": "tool", "tool_call_id": call_id, "content": outcome}],
        "outcomes": [{"tool_call_id": call_id, "outcome": outcome,
                      "reason": None if outcome == "answered" else outcome}]})


def latch_timeout(run: str, call_id: str) -> Message:
    return Message("results", run, {
        "v": 1, "run_id": run, "tool_call_id": call_id, "name": "get_weather",
        "is_error": True, "content": "tool_timeout: no result within 5 s",
        "reason": "tool_timeout", "by": "latch"})


def test_the_outcomes_are_shown_in_order_and_the_wait_ends_with_the_turn_records(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Run ``t`` (anthropic, its call left to the latch), ``p`` (answered by the demo's
    runner, a cancelled run's envelopes held until its final) and ``q`` (held for approval,
    then committed and answered): each final is shown after its calls, each turn record
    after its final, ``t``'s after the latch's ``tool_timeout`` result; the runner's own
    result on the results topic is not printed again; two runs' messages follow."""
    consumer = Consumer()
    held = {"p": [{"run_id": "p", "seq": 9, "type": "run.end"}]}
    publisher = Publisher(consumer, [committed("q", "c2"), final("q", 1),
                                     turn("q", "openai.chat", "answered", "c2")])
    consumer.queue.extend([
        final("t", 1), committed("t", "c0"), committed("p", "c1"),
        turn("t", "anthropic.messages", "tool_timeout", "c0"),
        Message("results", "p", {"v": 1, "run_id": "p", "tool_call_id": "c1", "content": "x"}),
        final("p", 1), turn("p", "openai.chat", "answered", "c1"),
        Message("pending", "q", {"v": 1, "run_id": "q", "call_id": "c2", "name": "buy",
                                 "arguments": {}}),
        latch_timeout("t", "c0")])
    sent: list[str] = []
    tally = Tally(runner=DemoRunner(lambda run, value: sent.append(run), leave="t",
                                    max_bytes=1000))
    watch(CONFIG, consumer, publisher, ["t", "p", "q"], "", 10, tally, held=held,
          alive=lambda: None, log=None)
    out = [line.strip() for line in capsys.readouterr().out.splitlines()]
    at = {name: next(n for n, line in enumerate(out) if name in line) for name in (
        "committed t c0", "leaves t c0 unanswered", "final t", "results t c0", "turns t",
        "committed p c1", "answered p c1", "final p", "sent the 1 envelopes of p", "turns p",
        "pending q c2", "approved q c2", "committed q c2", "final q", "turns q")}
    assert at["committed t c0"] < at["leaves t c0 unanswered"] < at["final t"]
    assert at["final t"] < at["results t c0"] < at["turns t"]
    assert at["answered p c1"] < at["final p"] < at["sent the 1 envelopes of p"] < at["turns p"]
    assert at["pending q c2"] < at["approved q c2"] < at["committed q c2"] < at["turns q"]
    assert not any(line.split(" ")[1:2] == ["results"] and " p " in line for line in out)
    assert sent == ["p", "q"] and publisher.approved == [("q", "c2")]
    assert publisher.sent == [{"run_id": "p", "seq": 9, "type": "run.end"}] and not held
    assert tally.complete(["t", "p", "q"]) and tally.runner is not None
    assert tally.runner.left == ("t", "c0")
    assert tally.turns.messages(["t", "p", "q"])[0].startswith("t (anthropic.messages)")


def test_a_run_without_its_turn_record_times_out_naming_it() -> None:
    """Every final message read but one run's turn record missing: the wait ends after its
    time with ``Timeout`` naming the run (and the worker's log); without the demo's runner
    (the result latch off) the final messages suffice."""
    consumer = Consumer()
    consumer.queue.extend([committed("a", "c1"), final("a", 1)])
    tally = Tally(runner=DemoRunner(lambda run, value: None, leave=None, max_bytes=1000))
    with pytest.raises(Timeout, match=r"no turn record yet for: a; worker log: /tmp/w\.log"):
        watch(CONFIG, consumer, Publisher(consumer, []), ["a"], "", 0.5, tally, held={},
              alive=lambda: None, log=Path("/tmp/w.log"))
    consumer.queue.extend([committed("a", "c1"), final("a", 1)])
    off = watch(CONFIG, consumer, Publisher(consumer, []), ["a"], "", 5, Tally(), held={},
                alive=lambda: None, log=None)
    assert off.finals == {"a": "completed"} and off.complete(["a"])
