"""``latch demo``'s runner and turn records (docs/contract.md, "The result latch" and "The turn
record"; issue 36: "``latch demo`` shows one call that times out (``tool_timeout``) and the turn
record of a run, for at least two providers").

The demo plays the runner for the calls its worker commits, as it plays the approver
(:mod:`worker.tools.demo_approver`): each committed call it reads is answered with a short
made-up result (:func:`worker.client.results.answer`, the record a runner writes), produced to
the results topic keyed by its run id, except **one** call it leaves unanswered on purpose,
so that the latch answers it itself, ``tool_timeout`` (``"by": "latch"``), once
``results.deadline_s`` has passed. Which one, deterministically: the first committed call of
the first ``anthropic.messages`` run of the example file (:func:`left_run`), or with no such
run, the first committed call the demo reads. The demo's worker gets a short deadline and tick
(:func:`results_env`) so that the wait is seconds, not the default five minutes.

The demo then waits for each run's turn record and shows them (:class:`Turns`): one line per
run (its provider and its calls' outcomes), and the messages of two runs of different
providers (:func:`shown_runs`), trimmed: what an agent loop appends to its next request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from worker.client.publisher import PublishError
from worker.client.results import answer
from worker.runtime.config import Config
from worker.runtime.observability import logs
from worker.tools import tail

__all__ = ["DEADLINE_S", "LEFT_PROVIDER", "TICK_S", "DemoRunner", "ResultsProducer", "Turns",
           "left_run", "made_up", "message_lines", "results_env", "shown_runs", "summary"]

#: The demo worker's ``results.deadline_s``: how long the call it leaves unanswered waits
#: for the latch's ``tool_timeout``.
DEADLINE_S = 5.0
#: The demo worker's ``worker.tick_interval_s``: the latch's deadlines are checked at ticks
#: (the default 5 s would add up to 5 s to the wait).
TICK_S = 1.0
#: The provider of the run whose first committed call is left unanswered.
LEFT_PROVIDER = "anthropic.messages"
#: A string in a shown turn record's message is cut to this many characters, and the
#: message's JSON line to :data:`MESSAGE_CHARS`.
STRING_CHARS = 60
MESSAGE_CHARS = 240


def results_env(config: Config) -> dict[str, str]:
    """The variables that give the demo's worker a short deadline and tick; none when the
    configuration turns the result latch off (the demo then shows no runner and no turns)."""
    if not config.results.enabled:
        return {}
    return {"LATCH_RESULTS__DEADLINE_S": f"{DEADLINE_S:g}",
            "LATCH_WORKER__TICK_INTERVAL_S": f"{min(TICK_S, config.worker.tick_interval_s):g}"}


def left_run(envelopes: Iterable[Mapping[str, Any]]) -> str | None:
    """The run (in file order) whose first committed call the demo leaves unanswered: the
    first whose ``run.start`` names :data:`LEFT_PROVIDER`; None when there is none."""
    for envelope in envelopes:
        if envelope.get("type") == "run.start" and envelope.get("provider") == LEFT_PROVIDER:
            return str(envelope["run_id"])
    return None


def made_up(call: Mapping[str, Any]) -> str:
    """The demo runner's answer to a call: short, and plainly not a real tool's."""
    return f"made-up result of {call.get('name')} (latch demo)"


class ResultsProducer:
    """Writes result records on the results topic, keyed by run id, with the Publisher's
    producer settings (murmur2 partitioning: the results topic is co-partitioned with the
    events topic); each send waits for its acknowledgement."""

    def __init__(self, config: Config, producer_config: Mapping[str, str],
                 producer: Any = None) -> None:
        self.topic = config.topics.results
        self._producer = producer if producer is not None else Producer(
            logs.kafka_config(dict(producer_config)))
        self._failures: list[str] = []

    def send(self, run_id: str, value: bytes, timeout: float = 10.0) -> None:
        """Produce one result and wait for it; :class:`PublishError` when it is not written."""
        try:
            self._producer.produce(self.topic, key=run_id.encode(), value=value,
                                   on_delivery=self._delivered)
        except (BufferError, KafkaException) as exc:
            raise PublishError(self.topic, type(exc).__name__) from None
        left = self._producer.flush(timeout)
        if self._failures:
            failures, self._failures = self._failures, []
            raise PublishError(self.topic, failures[0], count=len(failures))
        if left:
            raise PublishError(self.topic, f"not acknowledged within {timeout:g}s")

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self._failures.append(error.str())


@dataclass
class DemoRunner:
    """Answers the committed calls the demo reads, but one (:func:`left_run`)."""

    send: Callable[[str, bytes], None]
    #: The run whose first committed call is left unanswered (None: the first call read).
    leave: str | None
    max_bytes: int
    topic: str = "tool.calls.results"
    deadline_s: float = DEADLINE_S
    #: The calls answered, (run id, call id), in order.
    answered: list[tuple[str, str]] = field(default_factory=list)
    #: The call left unanswered, once chosen.
    left: tuple[str, str] | None = None

    def committed(self, call: Mapping[str, Any]) -> str | None:
        """Answer (or leave) a committed call; the line that says so, None for a call read
        before (the faust engine may write a committed record twice) or not a call."""
        run_id, call_id = call.get("run_id"), call.get("call_id")
        if not isinstance(run_id, str) or not isinstance(call_id, str):
            return None
        if (run_id, call_id) in self.answered or (run_id, call_id) == self.left:
            return None
        if self.left is None and self.leave in (None, run_id):
            self.left = (run_id, call_id)
            return (f"(the demo's runner leaves {run_id} {call_id} unanswered on purpose: the "
                    f"latch answers it tool_timeout after results.deadline_s, "
                    f"{self.deadline_s:g}s)")
        try:
            value = answer(call, False, made_up(call), self.max_bytes)
        except KeyError as exc:  # a committed record without a field a result names
            return f"(not answered: {run_id} {call_id} has no {exc.args[0]})"
        self.send(run_id, value)
        self.answered.append((run_id, call_id))
        return f"(the demo's runner answered {run_id} {call_id} on {self.topic})"


@dataclass
class Turns:
    """The turn records read (``latch tail`` records), by run id; a run's is shown after its
    final message."""

    records: dict[str, tail.Record] = field(default_factory=dict)
    shown: set[str] = field(default_factory=set)
    #: The latch's own ``tool_timeout`` results read, (run id, call id).
    timed_out: set[tuple[str, str]] = field(default_factory=set)

    def add(self, record: tail.Record) -> None:
        """Keep a run's turn record (the first: one per run)."""
        if isinstance(record.value, dict) and record.key is not None:
            self.records.setdefault(record.key, record)

    def values(self) -> dict[str, dict[str, Any]]:
        """The turn records' values, by run id."""
        return {run: record.value for run, record in self.records.items()}

    def latch_result(self, value: Any) -> bool:
        """Whether a results record is the latch's own ``tool_timeout`` (then counted)."""
        if not isinstance(value, dict) or value.get("by") != "latch":
            return False
        self.timed_out.add((str(value.get("run_id")), str(value.get("tool_call_id"))))
        return True

    def ready(self, finals_shown: Iterable[str]) -> list[tail.Record]:
        """The turn records not shown yet whose run's final message was, and each of whose
        ``tool_timeout`` results the latch wrote was (now marked shown)."""
        ready = [run for run in finals_shown if run in self.records and run not in self.shown
                 and self.timeouts(run) <= self.timed_out]
        self.shown.update(ready)
        return [self.records[run] for run in ready]

    def timeouts(self, run: str) -> set[tuple[str, str]]:
        """The calls of a run's turn record the latch answered ``tool_timeout``."""
        outcomes = self.records[run].value.get("outcomes")
        return {(run, str(o.get("tool_call_id"))) for o in outcomes or []
                if isinstance(o, dict) and o.get("outcome") == "tool_timeout"}

    def messages(self, runs: Sequence[str]) -> list[str]:
        """The lines showing the messages of two runs of different providers
        (:func:`shown_runs`), each under a line naming its run and provider."""
        values = self.values()
        lines = []
        for run in shown_runs(values, runs):
            count = len(values[run].get("messages") or [])
            lines.append(f"{run} ({values[run].get('provider')}): the next request is its "
                         f"history + the final message + {'this' if count == 1 else 'these'}")
            lines += ["  " + line for line in message_lines(values[run])]
        return lines


def summary(runner: DemoRunner, turns: Turns) -> str:
    """The demo's line on the result latch."""
    answered = len(runner.answered)
    timed_out = sum(len(turns.timeouts(run)) for run in turns.records)
    return (f"results: {answered} answered by the demo's runner, {timed_out} tool_timeout "
            f"(answered by the latch), {len(turns.records)} turn records")


def shown_runs(turns: Mapping[str, Mapping[str, Any]], runs: Sequence[str]) -> list[str]:
    """Two runs of different providers whose messages the demo prints: the first (in
    ``runs`` order) with a ``tool_timeout`` outcome, else with any message; then the first of
    another provider with an ``answered`` call, else with any message."""

    def outcomes(run: str) -> list[str]:
        return [str(o.get("outcome")) for o in turns[run].get("outcomes") or []
                if isinstance(o, dict)]

    have = [run for run in runs if run in turns and turns[run].get("messages")]
    first = next((r for r in have if "tool_timeout" in outcomes(r)), have[0] if have else None)
    if first is None:
        return []
    others = [r for r in have if turns[r].get("provider") != turns[first].get("provider")]
    second = next((r for r in others if "answered" in outcomes(r)),
                  others[0] if others else None)
    return [first] if second is None else [first, second]


def message_lines(turn: Mapping[str, Any], width: int = MESSAGE_CHARS) -> list[str]:
    """A turn record's messages, one JSON line each: every string in them cut to
    :data:`STRING_CHARS` (the message's shape stays whole), the line to ``width``."""
    lines = []
    for message in turn.get("messages") or []:
        text = orjson.dumps(_trimmed(message)).decode()
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    return lines


def _trimmed(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= STRING_CHARS else value[: STRING_CHARS - 3] + "..."
    if isinstance(value, dict):
        return {key: _trimmed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trimmed(item) for item in value]
    return value
