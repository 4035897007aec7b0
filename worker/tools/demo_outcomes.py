"""``latch demo``'s step 5, the outcomes: print each record the worker emits for the demo's
runs (``latch tail``'s lines) until every run has its final message and, with the result latch
on, its turn record; approve the call the policy holds (:mod:`worker.tools.demo_approver`),
answer the committed calls as a runner (:mod:`worker.tools.demo_runner`), and send a
cancelled run's held-back envelopes once its final message is shown (``worker/tools/demo.py``
has the steps before)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.client.publisher import Publisher
from worker.runtime.config import Config
from worker.tools import tail
from worker.tools.demo_approver import APPROVER
from worker.tools.demo_runner import DemoRunner, Turns

__all__ = ["Tally", "Timeout", "indented", "say", "watch"]


class Timeout(Exception):
    """The outcomes did not all come within the time allowed; the message says which."""


def say(text: str = "", end: str = "\n") -> None:
    """Print a line of the demo's output at once."""
    print(text, end=end, flush=True)


def indented(text: str, prefix: str = "      ") -> str:
    """``text``'s lines under a step's line."""
    return "\n".join(prefix + line for line in text.rstrip().splitlines())


@dataclass
class Tally:
    """What the demo saw: final statuses by run, records by topic, error reasons, approvals,
    turn records, and its runner's answers."""

    finals: dict[str, str] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    #: The held calls the demo approved: (run id, call id).
    approved: set[tuple[str, str]] = field(default_factory=set)
    turns: Turns = field(default_factory=Turns)
    #: The demo's runner (None: the result latch is off in the configuration).
    runner: DemoRunner | None = None

    def complete(self, runs: Sequence[str]) -> bool:
        """Every run has its final message, and (with the runner) its turn record shown."""
        return len(self.finals) == len(runs) and (
            self.runner is None or len(self.turns.shown) == len(runs))

    def add(self, record: tail.Record) -> None:
        self.counts[record.topic] += 1
        value = record.value if isinstance(record.value, dict) else {}
        if record.topic == "final" and record.key is not None:
            self.finals[record.key] = str(value.get("status"))
        elif record.topic == "errors":
            self.reasons[str(value.get("reason"))] += 1


def watch(config: Config, consumer: Any, publisher: Publisher, runs: list[str], prefix: str,
          timeout: float, tally: Tally, *, held: dict[str, list[dict[str, Any]]],
          alive: Callable[[], None], log: Path | None) -> Tally:
    """Print the records of these runs until every run has its final message (and, with the
    demo's runner, its turn record); :class:`Timeout` after ``timeout`` seconds. ``held``: the
    envelopes of cancelled runs held back until their final message (then sent); ``alive``
    raises when the worker has exited; ``log``: the worker's log, named in a timeout."""
    names = {kafka: name for name, kafka in tail.topic_names(config).items()}
    # The outputs come from several topics, so a run's final message may be read before its
    # last calls: it is shown once every outcome it lists has been shown.
    shown: Counter[str] = Counter()
    finals: dict[str, tail.Record] = {}
    deadline = time.monotonic() + timeout
    while not tally.complete(runs):
        left = deadline - time.monotonic()
        if left <= 0:
            waiting = [r.removeprefix(prefix) for r in runs if r not in tally.finals]
            turnless = [r.removeprefix(prefix) for r in runs if r not in tally.turns.records]
            what = (f"no final message yet for: {', '.join(waiting)}" if waiting else
                    f"no turn record yet for: {', '.join(turnless)}")
            raise Timeout(f"timed out after {timeout:g}s; {what}; worker log: {log}")
        alive()
        for record in tail.records(consumer, names, timeout=min(1.0, left), run_prefix=prefix):
            key = record.key or ""
            if record.topic == "final":
                finals[key] = record
            elif record.topic == "pending":
                say(indented(tail.format_record(record)))
                _approve(publisher, record, tally)
            elif record.topic == "turns":
                tally.turns.add(record)
            elif record.topic == "results":  # the demo's own answers are said as they go
                if tally.turns.latch_result(record.value):
                    say(indented(tail.format_record(record)))
            else:
                say(indented(tail.format_record(record)))
                tally.add(record)
                shown[key] += record.topic in ("committed", "errors")
                if record.topic == "committed" and tally.runner is not None:
                    note = tally.runner.committed(record.value)
                    if note:
                        say(indented(note))
            for run_id, final in list(finals.items()):
                if shown[run_id] >= _outcome_count(final):
                    del finals[run_id]
                    say(indented(tail.format_record(final)))
                    tally.add(final)
                    _release_held(publisher, held, run_id)
            for turn in tally.turns.ready(tally.finals):
                say(indented(tail.format_record(turn)))
            if tally.complete(runs):
                break
    return tally


def _approve(publisher: Publisher, record: tail.Record, tally: Tally) -> None:
    """Approve a call the worker holds for a person's decision (once: a pending record may
    be written again), as an operator would with ``latch approve``."""
    value = record.value if isinstance(record.value, dict) else {}
    run_id, call_id = str(value.get("run_id") or record.key), value.get("call_id")
    if not isinstance(call_id, str) or (run_id, call_id) in tally.approved:
        return
    tally.approved.add((run_id, call_id))
    publisher.approve(run_id, call_id, by=APPROVER, reason="shown by the demo")
    publisher.flush()
    say(indented(f"(approved {run_id} {call_id} on the control topic, signed with the demo "
                 f"approver's key, as `latch approve RUN CALL --by '{APPROVER}'` does; it "
                 "commits next)"))


def _outcome_count(final: tail.Record) -> int:
    outcomes = final.value.get("outcomes") if isinstance(final.value, dict) else None
    return len(outcomes) if isinstance(outcomes, list) else 0


def _release_held(publisher: Publisher, held: dict[str, list[dict[str, Any]]],
                  run_id: str) -> None:
    """Send the envelopes of a cancelled run that followed its cancel in the file."""
    late = held.pop(run_id, None)
    if not late:
        return
    for envelope in late:
        publisher.send_envelope(envelope)
    publisher.flush()
    say(indented(f"(sent the {len(late)} envelopes of {run_id} that follow its cancel; "
                 "the worker ignores them)"))
