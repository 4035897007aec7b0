"""``latch results RUN``: one run's next turn, or its calls and their answers, for an agent loop
that resumes.

::

    latch results [--config FILE] RUN [--table] [--calls] [--timeout S]
                  [--progress | --no-progress]

Reads the run's turn record (``llm.turns``, ``topics.turns``), its committed calls
(``tool.calls.committed``), error results (``tool.calls.errors``) and the runners' results
(``tool.calls.results``), at ``read_committed`` (an aborted transaction's record is never
shown), from each partition's beginning to its end as it is when the command starts.

**When the run has its turn record** (the result latch writes it once every call of the run
has its one result: docs/contract.md, "The turn record"), that is what it prints: one JSON
line, the record as the worker wrote it (``schemas/turn.schema.json``), whose ``messages`` are
the tool results in the provider's own format, ready to append to the next request after the
final message, and whose ``outcomes`` say what became of each call (``answered``,
``tool_timeout``, ``failed``, ...)::

    {"v": 1, "run_id": "r1", "tenant": "acme", "provider": "openai.chat",
     "final_idempotency_key": "r1:final", "messages": [{"role": "tool",
     "tool_call_id": "call_1", "content": "5"}], "outcomes": [{"tool_call_id": "call_1",
     "name": "add", "outcome": "answered", "reason": null, "is_error": false, "size": 1}]}

**Otherwise** (the turn is not complete yet, the result latch is off, or there is no turns
topic), and with ``--calls`` always, it joins the other three by call id. One JSON line per
call, in the run's call order (``index``)::

    {"run_id": "r1", "call_id": "toolu_1", "name": "add", "index": 0,
     "idempotency_key": "r1:toolu_1", "status": "result", "is_error": false, "content": "5"}

``status`` is ``result`` (a runner answered: ``is_error`` and ``content`` are its result's),
``error`` (the call did not commit: ``is_error: true``, ``content``, ``state`` and
``reason`` from the error result) or ``pending`` (committed, no result yet: run it, or wait
for the runner). A resuming loop keeps the calls with an answer and waits for, or runs, the
pending ones. Arguments are never printed. ``--table`` prints a readable table instead
(content cut to 60 characters; for a turn record, its outcomes, with the messages' count).

The read is bounded: ``--timeout`` seconds (default 60); a read that does not reach the ends
in time prints nothing on standard output and says how far it got (a partial join would show
answered calls as pending). A progress bar over the records to read goes to standard error
(by default on a terminal only). Exit 0; 1 when the read timed out; 2 when the configuration
is unusable, the cluster does not answer or a topic is missing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence, Set
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition
from tqdm import tqdm

from worker.runtime.config import Config, ConfigError, load_config
from worker.runtime.observability import logs
from worker.tools.tail import consumer_config

__all__ = ["ResultsError", "join", "main", "read_run", "turn_of", "turn_table"]

EXIT_OK, EXIT_TIMEOUT, EXIT_FAILED = 0, 1, 2
CONTENT_CHARS = 60
#: How long a metadata or watermark lookup may take (apart from the read's --timeout).
LOOKUP_S = 10.0


class ResultsError(Exception):
    """The topics cannot be read; the message says why."""


class Incomplete(ResultsError):
    """The read did not reach the topics' ends within the time allowed."""


def read_run(config: Config, run_id: str, *, timeout_s: float = 60.0,
             progress: bool | None = None) -> dict[str, list[dict[str, Any]]]:
    """The run's records on the committed, errors, results and turns topics (logical name ->
    the decoded values, in offset order), read to the ends the partitions have now. A turns
    topic that does not exist is read as empty (a deployment from before the result latch)."""
    names = {config.topics.committed: "committed", config.topics.errors: "errors",
             config.topics.results: "results", config.topics.turns: "turns"}
    settings = {**consumer_config(config), "isolation.level": "read_committed"}
    consumer = Consumer(logs.kafka_config(settings))
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in names.values()}
    key = run_id.encode()
    try:
        ends = _ends(consumer, list(names), optional={config.topics.turns})
        total = sum(high - low for low, high in ends.values())
        consumer.assign([TopicPartition(t, p, low) for (t, p), (low, _) in ends.items()])
        left = {tp: high for tp, (low, high) in ends.items() if high > low}
        deadline = time.monotonic() + timeout_s
        done = 0
        at = {where: low for where, (low, _) in ends.items()}
        with tqdm(total=total, unit="rec", desc="results", file=sys.stderr, mininterval=0.5,
                  disable=None if progress is None else not progress) as bar:
            while left:
                if time.monotonic() > deadline:
                    raise Incomplete(
                        f"read {done:,} of {total:,} records in {timeout_s:.0f} s: the topics "
                        "are large; give --timeout more seconds (nothing printed: a partial "
                        "join would show answered calls as pending)")
                batch = consumer.consume(1000, timeout=0.2)
                for msg in batch:
                    error = msg.error()
                    if error is not None:
                        if error.fatal():
                            raise ResultsError(error.str())
                        continue
                    if msg.key() == key:
                        try:
                            value = orjson.loads(msg.value() or b"")
                        except orjson.JSONDecodeError:
                            continue
                        if isinstance(value, dict):
                            found[names[msg.topic() or ""]].append(value)
                # positions pass the transaction markers that no record follows
                for tp in consumer.position([TopicPartition(t, p) for t, p in left]):
                    where = (tp.topic, tp.partition)
                    at[where] = min(max(tp.offset, ends[where][0]), ends[where][1])
                    if tp.offset >= left[where]:
                        del left[where]
                read = sum(at[where] - ends[where][0] for where in at)
                bar.update(read - done)
                done = read
    except KafkaException as exc:
        raise ResultsError(f"no answer from {config.kafka.bootstrap_servers}: "
                           f"{exc.args[0].str()}") from None
    finally:
        consumer.close()
    return found


def _ends(consumer: Consumer, topics: Sequence[str], optional: Set[str] = frozenset()
          ) -> dict[tuple[str, int], tuple[int, int]]:
    metadata = consumer.list_topics(timeout=LOOKUP_S)
    ends: dict[tuple[str, int], tuple[int, int]] = {}
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            if topic in optional:
                continue
            raise ResultsError(f"topic {topic} does not exist (run `latch topics create`)")
        for partition in sorted(meta.partitions):
            ends[(topic, partition)] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=LOOKUP_S, cached=False)
    return ends


def join(run_id: str, records: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One line per call id of the run: its committed call or error result, and the first
    result a runner gave it; in the calls' order (``index``, then the order they were read)."""
    calls: dict[str, dict[str, Any]] = {}
    for call in records.get("committed", []):
        call_id = call.get("call_id")
        if isinstance(call_id, str) and call_id not in calls:
            calls[call_id] = {"run_id": run_id, "call_id": call_id, "name": call.get("name"),
                              "index": call.get("index"),
                              "idempotency_key": call.get("idempotency_key"),
                              "status": "pending"}
    for error in records.get("errors", []):
        call_id = error.get("tool_call_id")
        if isinstance(call_id, str) and call_id not in calls:
            calls[call_id] = {"run_id": run_id, "call_id": call_id, "name": error.get("name"),
                              "index": error.get("index"),
                              "idempotency_key": error.get("idempotency_key"),
                              "status": "error", "is_error": True,
                              "state": error.get("state"), "reason": error.get("reason"),
                              "content": error.get("content")}
    for result in records.get("results", []):
        call_id = result.get("tool_call_id")
        if not isinstance(call_id, str):
            continue
        line = calls.setdefault(call_id, {
            "run_id": run_id, "call_id": call_id, "name": result.get("name"), "index": None,
            "idempotency_key": result.get("idempotency_key"), "status": "pending"})
        if line["status"] == "pending":
            line.update(status="result", is_error=result.get("is_error"),
                        content=result.get("content"))
    order = {call_id: n for n, call_id in enumerate(calls)}
    return sorted(calls.values(), key=lambda line: (
        line["index"] if isinstance(line["index"], int) else 1 << 30, order[line["call_id"]]))


def turn_of(run_id: str, records: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The run's turn record: the first one read that names the run and has its messages and
    outcomes (the faust engine may write a turn record twice, the same); None when none."""
    for turn in records.get("turns", []):
        if (turn.get("run_id") == run_id and isinstance(turn.get("messages"), list)
                and isinstance(turn.get("outcomes"), list)):
            return turn
    return None


def turn_table(turn: dict[str, Any]) -> str:
    """A turn record as a readable table: a line on the run, one row per call's outcome."""
    count = len(turn["messages"])
    head = (f"turn record of {turn.get('run_id')} ({turn.get('provider')}), after the final "
            f"message {turn.get('final_idempotency_key')}: {count} message{'s' * (count != 1)} "
            "to append (the JSON line has them)")
    rows = [("CALL", "NAME", "OUTCOME", "ERROR", "REASON", "SIZE")]
    for outcome in turn["outcomes"]:
        if not isinstance(outcome, dict):
            continue
        size = outcome.get("size")
        rows.append((str(outcome.get("tool_call_id")), str(outcome.get("name") or "-"),
                     str(outcome.get("outcome")), "yes" if outcome.get("is_error") else "-",
                     str(outcome.get("reason") or "-"), "-" if size is None else str(size)))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join([head, *("  ".join([*(cell.ljust(w) for cell, w in zip(
        row, widths, strict=False)), row[5]]).rstrip() for row in rows)])


def table(lines: Sequence[dict[str, Any]]) -> str:
    """The joined lines as a readable table."""
    rows = [("CALL", "NAME", "STATUS", "ERROR", "CONTENT")]
    for line in lines:
        content = str(line.get("content") or line.get("reason") or "")
        content = content.replace("\n", " ")
        if len(content) > CONTENT_CHARS:
            content = content[: CONTENT_CHARS - 3] + "..."
        rows.append((str(line["call_id"]), str(line.get("name") or "-"), line["status"],
                     "yes" if line.get("is_error") else "-", content))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)),
                                row[4]]).rstrip() for row in rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latch results", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", metavar="RUN", help="the run id")
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    parser.add_argument("--table", action="store_true", help="a readable table, not JSON lines")
    parser.add_argument("--calls", action="store_true",
                        help="the calls joined with their answers, even when the run has its "
                             "turn record")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds the read may take (default 60)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction,
                        help="show the progress bar on stderr (default: on a terminal only)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``latch results``; see the module docstring."""
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_FAILED)
    try:
        records = read_run(config, args.run, timeout_s=args.timeout, progress=args.progress)
    except Incomplete as exc:
        return _fail(str(exc), EXIT_TIMEOUT)
    except ResultsError as exc:
        return _fail(str(exc), EXIT_FAILED)
    turn = None if args.calls else turn_of(args.run, records)
    try:
        if turn is not None:
            sys.stdout.write((turn_table(turn) if args.table else orjson.dumps(turn).decode())
                             + "\n")
        elif args.table:
            sys.stdout.write(table(join(args.run, records)) + "\n")
        else:
            sys.stdout.write("".join(orjson.dumps(line).decode() + "\n"
                                     for line in join(args.run, records)))
        sys.stdout.flush()
    except BrokenPipeError:  # `latch results RUN | head`
        sys.stderr.close()
    return EXIT_OK


def _fail(message: str, status: int) -> int:
    print(f"latch results: {message}", file=sys.stderr)
    return status
