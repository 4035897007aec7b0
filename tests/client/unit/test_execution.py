"""A runner keeps its group membership while a tool runs (worker.client.execution): the
tool runs in a thread of its own, and past HOLD_AFTER_S the runner pauses its partitions
and keeps polling, so that a tool longer than max.poll.interval.ms does not hand its
partition (and its call) to another runner. A rebalance that takes the call's partition
waits for the call and records it before the partition goes. A tool past its
``tool_timeout_s`` is answered (``tool_timeout``) and recorded, never run again. No broker:
the fakes of runner_fakes.py; the real broker's test is
tests/client/integration/test_runner_slow_tool_on_kafka.py."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest
from runner_fakes import LoopConsumer, Message, Producer

from worker.client import execution
from worker.client import runner as runner_module
from worker.client.runner import MemoryStore, Runner
from worker.runtime.config import Config

#: How long a test waits for a condition before it fails (never reached when it passes).
PATIENCE_S = 10.0


@pytest.fixture(autouse=True)
def quick_holding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execution, "HOLD_AFTER_S", 0.01)
    monkeypatch.setattr(execution, "POLL_EVERY_S", 0.01)


def committed(call_id: str, name: str = "slow") -> bytes:
    return orjson.dumps({
        "v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat",
        "call_id": call_id, "name": name, "index": 0, "arguments": {"n": call_id},
        "idempotency_key": f"r1:{call_id}"})


def make(messages: list[Message], tools: dict[str, Any], transactional: bool = False,
         **options: Any) -> tuple[Runner, LoopConsumer, Producer, threading.Event]:
    stop = threading.Event()
    consumer, producer = LoopConsumer(messages, stop), Producer()
    runner = Runner(Config(), tools, consumer=consumer, producer=producer, store=MemoryStore(),
                    transactional_id="latch-runner-0" if transactional else None, **options)
    return runner, consumer, producer, stop


def test_a_slow_tool_is_waited_for_with_the_partitions_paused_and_polled() -> None:
    """While the tool runs, the runner polls with every partition paused (the polls keep
    the member in its group) and hands out no other record; the tool is released by the
    fifth such poll; then the call is answered and committed once and the partitions
    resumed."""
    release = threading.Event()
    ran: list[Any] = []
    polls_while_running: list[set[int]] = []

    def slow(args: Any) -> str:
        ran.append(args)
        assert release.wait(PATIENCE_S), "the runner did not poll while the tool ran"
        return "done"

    messages = [Message(committed("c1"), offset=0), Message(committed("c2"), offset=1)]
    runner, consumer, producer, stop = make(messages, {"slow": slow})

    def on_poll(consumer: LoopConsumer) -> None:
        if ran and not release.is_set():
            polls_while_running.append(set(consumer.paused))
            if len(polls_while_running) == 5:
                release.set()

    consumer.on_poll = on_poll
    runner.run(stop, timeout=0)
    assert len(polls_while_running) >= 5 and all(p == {0} for p in polls_while_running)
    assert consumer.commits == [0, 1] and len(ran) == 2 and not consumer.paused
    assert [r["content"] for r in producer.results()] == ["done", "done"]


def test_a_revoke_while_a_tool_runs_records_the_call_before_the_partition_goes() -> None:
    """A rebalance takes the call's partition while its tool runs (journal mode): the revoke
    callback waits for the tool and commits the transaction (result, journal record, offset)
    before it returns, so the partition's next owner finds the call journaled; the call is
    recorded once, not again after the callback."""
    release = threading.Event()
    at_revoke: list[str] = []

    def slow(args: Any) -> str:
        assert release.wait(PATIENCE_S), "the runner did not poll while the tool ran"
        return "done"

    runner, consumer, producer, stop = make([Message(committed("c1"), offset=7)],
                                            {"slow": slow}, transactional=True)

    def on_poll(consumer: LoopConsumer) -> None:
        if consumer.paused and not release.is_set():
            release.set()
            consumer.revoke(0)
            at_revoke.extend(producer.calls)

    consumer.on_poll = on_poll
    runner.run(stop, timeout=0)
    assert at_revoke == ["init", "begin", "offset 0:8", "commit"]
    assert producer.calls == at_revoke and len(producer.results()) == 1


def test_a_tool_past_its_timeout_is_answered_tool_timeout_and_journaled() -> None:
    """A tool that has not returned within tool_timeout_s gets an error result whose content
    starts with tool_timeout, recorded in the same transaction as its journal record
    (is_error) and offset; a copy of the call is then a duplicate (never run again); the
    tool's late return changes nothing."""
    release = threading.Event()
    ran: list[Any] = []

    def hangs(args: Any) -> str:
        ran.append(args)
        release.wait(PATIENCE_S)
        return "too late"

    messages = [Message(committed("c1"), offset=0), Message(committed("c1"), offset=1)]
    runner, _, producer, stop = make(messages, {"slow": hangs}, transactional=True,
                                            tool_timeout_s=0.2)
    try:
        runner.run(stop, timeout=0)
    finally:
        release.set()
    (result,) = producer.results()
    assert result["is_error"] is True and result["content"].startswith("tool_timeout: ")
    (journal,) = [v for t, v in producer.sent if t == "tool.calls.journal"]
    assert journal["is_error"] is True
    assert producer.calls == ["init", "begin", "offset 0:1", "commit",
                              "begin", "offset 0:2", "commit"] and len(ran) == 1


def test_too_many_timed_out_tools_still_running_stop_the_runner_before_the_next_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Python cannot stop a timed-out tool's thread: once MAX_STRAY_TOOLS of them still
    run, the next call stops the runner before it runs (offset not committed: it runs after
    the restart that ends those threads)."""
    monkeypatch.setattr(runner_module, "MAX_STRAY_TOOLS", 1)
    release = threading.Event()
    ran: list[Any] = []

    def hangs(args: Any) -> None:
        ran.append(args)
        release.wait(PATIENCE_S)

    messages = [Message(committed("c1"), offset=0), Message(committed("c2"), offset=1)]
    runner, consumer, _, stop = make(messages, {"slow": hangs}, tool_timeout_s=0.05)
    try:
        with pytest.raises(RuntimeError, match="timed-out tools are still running"):
            runner.run(stop, timeout=0)
    finally:
        release.set()
    assert consumer.commits == [0] and len(ran) == 1


def test_a_record_handed_out_while_holding_is_handled_after_the_running_call() -> None:
    """A partition assigned while a tool runs is not paused yet: the record poll hands out
    from it is kept (its partition paused at once) and handled right after the running call,
    once, before anything else is polled."""
    release = threading.Event()
    order: list[str] = []

    def slow(args: Any) -> str:
        order.append(args["n"])
        if args["n"] == "c1":
            assert release.wait(PATIENCE_S), "the runner did not poll while the tool ran"
        else:
            stop.set()  # (the loop checks it after this call is answered and committed)
        return "done"

    runner, consumer, _, stop = make([Message(committed("c1"), offset=0)], {"slow": slow})
    # The test stops the runner once the kept record ran, not the consumer's empty polls:
    # those also come while c1 runs, and a runner told to stop then leaves a kept record
    # unhandled (uncommitted: its partition's next owner reads it), which is not this case.
    consumer.idle_polls = 10**9
    late = Message(committed("c2"), offset=5, partition=1)

    def on_poll(consumer: LoopConsumer) -> None:
        if 0 in consumer.paused and not release.is_set():
            if 1 not in consumer.partitions:
                consumer.partitions.append(1)  # a rebalance gave partition 1
                consumer.messages.append(late)
            elif not consumer.messages:  # the runner took it (and paused partition 1)
                release.set()

    consumer.on_poll = on_poll
    runner.run(stop, timeout=0)
    assert order == ["c1", "c2"] and consumer.commits == [0, 5] and not consumer.paused


def test_the_tool_thread_runs_inside_the_execution_span() -> None:
    """The tool runs in a thread of its own but in a copy of the runner's context: the span
    current inside the tool is the record's latch.tool.execute span (a tool's own spans are
    its children; the run's trace continues)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    seen: list[int] = []

    def traced(args: Any) -> str:
        seen.append(trace.get_current_span().get_span_context().span_id)
        return "done"

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    runner, _, _, stop = make([Message(committed("c1"), offset=0)], {"slow": traced},
                              tracer=provider.get_tracer("test"))
    runner.run(stop, timeout=0)
    (span,) = exported.get_finished_spans()
    assert span.name == "latch.tool.execute" and seen == [span.context.span_id]


def test_a_tool_reads_its_committed_call_and_nothing_else_does() -> None:
    """Inside a tool, ``current_call()`` is the committed call it runs for (its
    idempotency_key: what an MCP tool passes on in ``_meta``), read only; outside a tool run it
    is None, and a second run sees its own call."""
    seen: list[Any] = []
    writable: list[bool] = []

    def tool(args: Any) -> str:
        call = execution.current_call()
        seen.append(None if call is None else dict(call))
        try:
            call["name"] = "other"  # type: ignore[index]
            writable.append(True)
        except TypeError:
            writable.append(False)
        return "ok"

    runner = Runner(Config(), {"add": tool}, consumer=object(), producer=object())
    for key in ("k-1", "k-2"):
        value = orjson.dumps({"v": 1, "run_id": "r", "tenant": "t", "provider": "openai.chat",
                              "call_id": key, "name": "add", "index": 0, "arguments": {},
                              "idempotency_key": key})
        assert runner.handle(value).status == "executed"
    assert [s["idempotency_key"] for s in seen] == ["k-1", "k-2"]
    assert writable == [False, False]
    assert execution.current_call() is None
