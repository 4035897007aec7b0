"""``latch demo``'s runner and turn records (``worker/tools/demo_runner.py``; issue 36: "``latch
demo`` shows one call that times out (``tool_timeout``) and the turn record of a run, for at
least two providers"), without a broker: which call is left to the latch, what the answers
are, when a turn record is shown, and which two runs' messages are printed."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError

from worker.client.publisher import PublishError
from worker.runtime.config import Config, ResultsSection, WorkerSettings
from worker.tools import demo, tail
from worker.tools.demo_runner import (
    DemoRunner,
    ResultsProducer,
    Turns,
    left_run,
    message_lines,
    results_env,
    shown_runs,
    summary,
)


def call(run: str, call_id: str, name: str = "get_weather") -> dict[str, Any]:
    return {"v": 1, "run_id": run, "tenant": "acme", "provider": "openai.chat",
            "call_id": call_id, "name": name, "index": 0, "arguments": {"city": "Paris"},
            "idempotency_key": f"{run}:{call_id}"}


def turn(run: str, provider: str, outcomes: list[str], messages: int = 1) -> tail.Record:
    value = {"v": 1, "run_id": run, "provider": provider,
             "messages": [{"role": "tool", "content": "x" * 100}] * messages,
             "outcomes": [{"tool_call_id": f"c{n}", "outcome": o,
                           "reason": None if o == "answered" else o}
                          for n, o in enumerate(outcomes)]}
    return tail.Record("turns", run, value, None)


def test_the_left_run_is_the_example_files_first_anthropic_run() -> None:
    """The call left unanswered is the first committed call of the first
    ``anthropic.messages`` run in file order: in the shipped ``demo.jsonl``,
    ``anthropic-tool-use``; a file without one leaves the choice to the first call read."""
    envelopes = demo.load_envelopes(demo.example_file(), "p/")
    assert left_run(envelopes) == "p/anthropic-tool-use"
    assert left_run([{"type": "run.start", "run_id": "a", "provider": "openai.chat"}]) is None


def test_the_demo_worker_gets_a_short_deadline_and_tick_unless_the_latch_is_off() -> None:
    """The demo's worker answers ``tool_timeout`` after 5 s, checked at 1 s ticks (a shorter
    configured tick is kept); with ``results.enabled: false`` nothing is set."""
    assert results_env(Config()) == {"LATCH_RESULTS__DEADLINE_S": "5",
                                     "LATCH_WORKER__TICK_INTERVAL_S": "1"}
    fast = Config(worker=WorkerSettings(tick_interval_s=0.5))
    assert results_env(fast)["LATCH_WORKER__TICK_INTERVAL_S"] == "0.5"
    assert results_env(Config(results=ResultsSection(enabled=False))) == {}


def test_the_runner_answers_every_call_but_the_first_of_the_left_run() -> None:
    """Each committed call gets one made-up result record keyed by its run id (a runner's
    record, ``is_error`` false, never the arguments), the first call of the left run none; a
    committed record read again is neither answered nor left twice; a record that is not a
    call is ignored."""
    sent: list[tuple[str, bytes]] = []
    runner = DemoRunner(lambda run, value: sent.append((run, value)), leave="a", max_bytes=1000)
    assert "answered p c1" in (runner.committed(call("p", "c1")) or "")
    assert "leaves a c2 unanswered" in (runner.committed(call("a", "c2")) or "")
    assert "answered a c3" in (runner.committed(call("a", "c3")) or "")
    assert runner.committed(call("p", "c1")) is None
    assert runner.committed(call("a", "c2")) is None
    assert runner.committed({"run_id": "p"}) is None
    assert runner.answered == [("p", "c1"), ("a", "c3")] and runner.left == ("a", "c2")
    assert [run for run, _ in sent] == ["p", "a"]
    record = orjson.loads(sent[0][1])
    assert record["tool_call_id"] == "c1" and record["idempotency_key"] == "p:c1"
    assert record["is_error"] is False and "made-up" in record["content"]
    assert "Paris" not in sent[0][1].decode()


def test_without_a_left_run_the_first_call_read_is_left() -> None:
    """With no ``anthropic.messages`` run, the first committed call read is the one left; a
    call without the fields a result names is said so and not answered."""
    runner = DemoRunner(lambda run, value: None, leave=None, max_bytes=1000)
    runner.committed(call("x", "c1"))
    assert runner.left == ("x", "c1")
    broken = {k: v for k, v in call("y", "c2").items() if k != "idempotency_key"}
    assert runner.committed(broken) == "(not answered: y c2 has no idempotency_key)"
    assert runner.answered == []


def test_a_turn_record_waits_for_its_final_and_the_latchs_timeout_results() -> None:
    """A turn record is shown once its run's final message was, and (with ``tool_timeout``
    outcomes) once the latch's own results for those calls were read; only the latch's
    results (``"by": "latch"``) count as such; each record is shown once."""
    turns = Turns()
    turns.add(turn("a", "anthropic.messages", ["tool_timeout"]))
    turns.add(turn("b", "openai.chat", ["answered", "answered"]))
    assert turns.ready(["b"]) == [turns.records["b"]]
    assert turns.ready(["a", "b"]) == []
    assert not turns.latch_result({"run_id": "a", "tool_call_id": "c0", "content": "mine"})
    assert turns.ready(["a"]) == []
    assert turns.latch_result({"run_id": "a", "tool_call_id": "c0", "by": "latch"})
    assert [r.key for r in turns.ready(["a", "b"])] == ["a"]
    assert turns.shown == {"a", "b"}


def test_two_runs_of_different_providers_are_shown_the_timed_out_one_first() -> None:
    """The messages shown: the run with a ``tool_timeout``, then the first run of another
    provider with an answered call (not a failed one); without a timeout, the first run with
    messages; one provider only: one run; no messages: none."""
    records = {r.key: r.value for r in [
        turn("f", "openai.chat", ["failed"]), turn("t", "anthropic.messages", ["tool_timeout"]),
        turn("g", "google.gemini", ["answered"]), turn("c", "openai.chat", ["answered"]),
        turn("e", "openai.chat", [], messages=0)]}
    assert shown_runs(records, ["e", "f", "t", "g", "c"]) == ["t", "g"]
    assert shown_runs({k: records[k] for k in "fgc"}, ["f", "g", "c"]) == ["f", "g"]
    assert shown_runs({k: records[k] for k in "fc"}, ["f", "c"]) == ["f"]
    assert shown_runs({"e": records["e"]}, ["e"]) == []


def test_message_lines_keep_the_shape_and_cut_the_text() -> None:
    """Each message is one JSON line whose strings are cut (the fields after a long text,
    ``is_error``, stay visible); a line is never longer than its width."""
    message = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                            "content": "y" * 500, "is_error": True}]}
    [line] = message_lines({"messages": [message]})
    assert line.endswith('..."' + ',"is_error":true}]}') and len(line) < 160
    assert all(len(x) <= 50 for x in message_lines({"messages": [message] * 2}, width=50))


def test_the_summary_counts_the_runners_answers_the_timeouts_and_the_turns() -> None:
    """``results: N answered by the demo's runner, 1 tool_timeout (answered by the latch), T
    turn records``, the timeouts counted from the turn records; ``Turns.messages`` names each
    shown run and its provider above its messages."""
    runner = DemoRunner(lambda run, value: None, leave="t", max_bytes=1000)
    runner.committed(call("t", "c0"))
    runner.committed(call("c", "c1"))
    turns = Turns()
    turns.add(turn("t", "anthropic.messages", ["tool_timeout"]))
    turns.add(turn("c", "openai.chat", ["answered"]))
    assert summary(runner, turns) == ("results: 1 answered by the demo's runner, 1 tool_timeout "
                                      "(answered by the latch), 2 turn records")
    lines = turns.messages(["t", "c"])
    assert lines[0].startswith("t (anthropic.messages): the next request is its history")
    assert lines[2].startswith("c (openai.chat)") and lines[1].startswith('  {"role"')


class FakeProducer:
    """A producer whose deliveries succeed, fail, or never come."""

    def __init__(self, error: KafkaError | None = None, left: int = 0) -> None:
        self.error, self.left = error, left
        self.produced: list[tuple[str, bytes, bytes]] = []
        self._callbacks: list[Any] = []

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any) -> None:
        self.produced.append((topic, key, value))
        self._callbacks.append(on_delivery)

    def flush(self, timeout: float) -> int:
        for callback in self._callbacks:
            callback(self.error, None)
        self._callbacks.clear()
        return self.left


def test_the_results_producer_writes_keyed_by_run_and_raises_on_a_failed_delivery() -> None:
    """A result goes to the configured results topic keyed by its run id; a failed delivery,
    or one not acknowledged in time, is a ``PublishError`` naming the topic."""
    config = Config()
    good = FakeProducer()
    ResultsProducer(config, {}, producer=good).send("r1", b"{}")
    assert good.produced == [(config.topics.results, b"r1", b"{}")]
    timed_out = FakeProducer(KafkaError(KafkaError._MSG_TIMED_OUT))
    failed = ResultsProducer(config, {}, producer=timed_out)
    with pytest.raises(PublishError, match=config.topics.results):
        failed.send("r1", b"{}")
    with pytest.raises(PublishError, match="not acknowledged"):
        ResultsProducer(config, {}, producer=FakeProducer(left=1)).send("r1", b"{}")
