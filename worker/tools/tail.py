"""``latch tail``: print the records on Latch's topics, one readable line each.

::

    latch tail [--config FILE] [--from-beginning] [--topics committed,errors,final,dlq]
               [--run PREFIX] [--max N] [--timeout S] [--json]

Lines (times are the records' timestamps, local time)::

    14:02:07 committed r1 call_abc read_file {"path": "/tmp/a"}
    14:02:07 errors r1 call_x read_file failed invalid_json: ...
    14:02:07 final r1 completed 2 calls (1 committed, 1 failed)
    14:02:07 dlq <key> unknown_run no run.start for this run
    14:02:07 progress r1 call_abc read_file 128 bytes
    14:02:07 audit r1 call_abc read_file committed policy=log_only:deny(forbid-rm) 16 bytes
    14:02:07 pending r1 call_abc delete_file waits for approval {"path": "/tmp/a"}
    14:02:07 results r1 call_abc read_file error tool_timeout by latch: tool_timeout: no ...
    14:02:07 turns r1 anthropic.messages 2 calls (answered, tool_timeout), 1 message

``--json`` prints ``{"topic", "key", "value"}`` lines instead, the shape ``latch assemble``
writes, with ``topic`` the logical name (``committed``, ``errors``, ...). ``--topics`` takes
logical names: the six output topics, ``pending`` (calls waiting for approval), ``turns``
(the result latch's turn records), ``results`` (the runners' results, and the latch's
``tool_timeout`` answers), and ``events`` / ``control`` for the inputs. A result's or a turn
record's text is cut as arguments are (``--json`` prints it whole).

The consumer is assigned its partitions directly and never commits, so a tail leaves no
consumer group behind and never moves the worker's offsets. It stops after ``--max``
records or ``--timeout`` seconds without one (default: never). Exit 0, or 2 when the
configuration is unusable, the cluster does not answer or none of the topics exists.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from worker.runtime.config import Config, ConfigError, load_config
from worker.runtime.observability import logs

__all__ = [
    "DEFAULT_TOPICS",
    "LOGICAL_TOPICS",
    "Record",
    "format_record",
    "main",
    "open_consumer",
    "outcome_text",
    "records",
    "topic_names",
]

#: Every logical topic name ``--topics`` accepts, outputs first.
LOGICAL_TOPICS = ("committed", "errors", "final", "progress", "dlq", "audit", "pending",
                  "turns", "results", "events", "control")
DEFAULT_TOPICS = ("committed", "errors", "final", "dlq")
#: Argument JSON longer than this is cut in readable lines (``--json`` prints it whole).
MAX_ARGUMENTS_CHARS = 200

EXIT_OK = 0
EXIT_FAILED = 2


class TailError(Exception):
    """The topics cannot be read; the message says why."""


@dataclass(frozen=True, slots=True)
class Record:
    """One record read back: its logical topic, key, decoded value and timestamp (ms)."""

    topic: str
    key: str | None
    value: Any
    timestamp_ms: int | None

    def as_line(self) -> dict[str, Any]:
        """The ``latch assemble`` output line shape."""
        return {"topic": self.topic, "key": self.key, "value": self.value}


def topic_names(config: Config) -> dict[str, str]:
    """Logical name -> the configured Kafka topic name."""
    return {name: getattr(config.topics, name) for name in LOGICAL_TOPICS}


# -- formatting ---------------------------------------------------------------------------


def format_record(record: Record) -> str:
    """One readable line for a record (never more than one line)."""
    clock = _clock(record.timestamp_ms)
    value = record.value
    if not isinstance(value, dict):
        size = len(value) if isinstance(value, str | bytes) else 0
        return _line(clock, record.topic, record.key or "-", f"<{size} bytes, not a JSON object>")
    run_id = value.get("run_id") or record.key or "-"
    formatter = _FORMATTERS.get(record.topic, _other)
    return _line(clock, record.topic, *formatter(run_id, record.key, value))


def _committed(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    arguments = json.dumps(v.get("arguments"), ensure_ascii=False)
    if len(arguments) > MAX_ARGUMENTS_CHARS:
        arguments = arguments[: MAX_ARGUMENTS_CHARS - 3] + "..."
    return [run_id, _s(v.get("call_id")), _s(v.get("name")), arguments]


def _pending(run_id: str, key: str | None, v: dict[str, Any]) -> list[str]:
    words = _committed(run_id, key, v)
    return [*words[:3], "waits for approval", words[3]]


def _errors(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    return [run_id, _s(v.get("tool_call_id")), _s(v.get("name")), _s(v.get("state")),
            _s(v.get("content") or v.get("reason"))]


def _final(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    outcomes = v.get("outcomes")
    outcomes = outcomes if isinstance(outcomes, list) else []
    states = Counter(_s(o.get("state")) for o in outcomes if isinstance(o, dict))
    n = len(outcomes)
    words = [run_id, _s(v.get("status")), f"{n} call{'s' * (n != 1)}"]
    if states:
        words.append("(" + ", ".join(f"{count} {state}" for state, count in states.items()) + ")")
    return words


def _dlq(_run_id: str, key: str | None, v: dict[str, Any]) -> list[str]:
    return [key if key is not None else "-", _s(v.get("reason")), _s(v.get("detail"))]


def _progress(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    call = v.get("tool_call_id") or v.get("call_key")
    return [run_id, _s(call), _s(v.get("name")), f"{_s(v.get('bytes'))} bytes"]


def _audit(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    outcome = _s(v.get("outcome"))
    if v.get("reason"):
        outcome += f" {v['reason']}"
    policy = v.get("policy")
    policy = policy if isinstance(policy, dict) else {}
    decision = _s(policy.get("mode"))
    if "allow" in policy:
        decision += ":" + ("allow" if policy["allow"] else "deny")
        ids = policy.get("policies")
        if isinstance(ids, list) and ids:
            decision += "(" + ",".join(map(str, ids)) + ")"
    arguments = v.get("arguments")
    arguments = arguments if isinstance(arguments, dict) else {}
    return [run_id, _s(v.get("tool_call_id")), _s(v.get("name")), outcome,
            f"policy={decision}", f"{_s(arguments.get('bytes'))} bytes"]


def _results(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    words = [run_id, _s(v.get("tool_call_id")), _s(v.get("name")),
             "error" if v.get("is_error") else "ok"]
    if v.get("reason"):
        words.append(_s(v["reason"]))
    if v.get("by"):
        words.append(f"by {v['by']}")
    content = _s(v.get("content"))
    if len(content) > MAX_ARGUMENTS_CHARS:
        content = content[: MAX_ARGUMENTS_CHARS - 3] + "..."
    return [*words[:-1], words[-1] + ":", content]


def _turns(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    outcomes = v.get("outcomes")
    outcomes = [o for o in outcomes if isinstance(o, dict)] if isinstance(outcomes, list) else []
    messages = v.get("messages")
    m = len(messages) if isinstance(messages, list) else 0
    n = len(outcomes)
    words = [run_id, _s(v.get("provider")), f"{n} call{'s' * (n != 1)}"]
    if outcomes:
        words.append("(" + ", ".join(outcome_text(o) for o in outcomes) + "),")
    return [*words, f"{m} message{'s' * (m != 1)}"]


def outcome_text(outcome: Mapping[str, Any]) -> str:
    """A turn record's outcome in a word: ``answered``, ``tool_timeout``, ``failed
    invalid_json`` (a failed or dropped call's reason after it)."""
    text = _s(outcome.get("outcome"))
    reason = outcome.get("reason")
    if reason and reason != outcome.get("outcome"):
        text += f" {reason}"
    return text


def _events(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    kind = _s(v.get("type"))
    words = [run_id, f"#{v['seq']}" if "seq" in v else "-", kind]
    event = v.get("event")
    if kind == "provider.event" and isinstance(event, dict):
        words.append(_s(event.get("type") or event.get("object")))
    elif kind == "run.start":
        words.append(_s(v.get("provider")))
    elif kind in ("stream.error", "cancel"):
        words.append(_s(v.get("error") or v.get("reason")))
    return words


def _control(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    return [run_id, _s(v.get("type")), _s(v.get("reason"))]


def _other(run_id: str, _key: str | None, v: dict[str, Any]) -> list[str]:
    return [run_id, json.dumps(v, ensure_ascii=False)[:MAX_ARGUMENTS_CHARS]]


_FORMATTERS = {
    "committed": _committed,
    "errors": _errors,
    "final": _final,
    "dlq": _dlq,
    "progress": _progress,
    "audit": _audit,
    "pending": _pending,
    "results": _results,
    "turns": _turns,
    "events": _events,
    "control": _control,
}


def _s(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _line(*words: str) -> str:
    return " ".join(words).replace("\r", "\\r").replace("\n", "\\n")


def _clock(timestamp_ms: int | None) -> str:
    seconds = time.time() if timestamp_ms is None else timestamp_ms / 1000
    return time.strftime("%H:%M:%S", time.localtime(seconds))


# -- consuming ----------------------------------------------------------------------------


def consumer_config(config: Config) -> dict[str, Any]:
    """A consumer that is only ever assigned partitions and never commits."""
    return {
        **config.kafka.confluent_config(),
        "group.id": f"latch-tail-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
    }


def open_consumer(
    config: Config, topics: Sequence[str], *, from_beginning: bool, exact_end: bool = False,
    timeout: float = 10.0,
) -> tuple[Consumer, list[str]]:
    """A consumer assigned every partition of the ``topics`` (Kafka names) that exist, and
    the names of those that do not.

    Each partition starts at its beginning, or at its end; with ``exact_end`` the end is
    read now (the high watermark) rather than when the first fetch happens, so that no record
    written after this call can be missed.
    """
    consumer = Consumer(logs.kafka_config(consumer_config(config)))
    try:
        metadata = consumer.list_topics(timeout=timeout)
    except KafkaException as exc:
        consumer.close()
        servers = config.kafka.bootstrap_servers
        raise TailError(f"no answer from {servers}: {_describe(exc)}") from None
    partitions: list[TopicPartition] = []
    missing: list[str] = []
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            missing.append(topic)
            continue
        for partition in sorted(meta.partitions):
            if from_beginning:
                offset = OFFSET_BEGINNING
            elif exact_end:
                _, offset = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout
                )
            else:
                offset = OFFSET_END
            partitions.append(TopicPartition(topic, partition, offset))
    if partitions:
        consumer.assign(partitions)
    return consumer, missing


def records(
    consumer: Consumer, names: Mapping[str, str], *, timeout: float | None = None,
    max_records: int | None = None, run_prefix: str | None = None,
) -> Iterator[Record]:
    """The records the consumer reads, decoded; ``names`` maps Kafka names to logical ones.

    Stops after ``max_records`` records or ``timeout`` seconds without a record (``None``:
    never). ``run_prefix`` keeps only the records whose key starts with it.
    """
    count = 0
    last = time.monotonic()
    while max_records is None or count < max_records:
        wait = 0.5
        if timeout is not None:
            left = timeout - (time.monotonic() - last)
            if left <= 0:
                return
            wait = min(wait, left)
        message = consumer.poll(wait)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            if error.fatal():
                raise TailError(f"the consumer failed: {error.str()}")
            continue  # transient (a broker restarting): librdkafka retries
        raw_key = message.key()
        key = None if raw_key is None else raw_key.decode("utf-8", "replace")
        if run_prefix is not None and not (key or "").startswith(run_prefix):
            continue
        last = time.monotonic()
        count += 1
        yield Record(names.get(message.topic() or "", message.topic() or "?"), key,
                     _decode(message.value()), _timestamp(message.timestamp()))


def _decode(value: bytes | None) -> Any:
    if value is None:
        return None
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value.decode("utf-8", "replace")


def _timestamp(stamp: tuple[int, int]) -> int | None:
    kind, value = stamp
    return None if kind == TIMESTAMP_NOT_AVAILABLE else value


def _describe(exc: KafkaException) -> str:
    first = exc.args[0] if exc.args else None
    return first.str() if isinstance(first, KafkaError) else type(exc).__name__


# -- the command --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latch tail", description="Print the records on Latch's topics, one line each."
    )
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    parser.add_argument("--from-beginning", action="store_true",
                        help="start at the oldest record (default: only new records)")
    parser.add_argument("--topics", default=",".join(DEFAULT_TOPICS), type=_topic_list,
                        help=f"logical topics, comma-separated, from {','.join(LOGICAL_TOPICS)}"
                        " (default: %(default)s)")
    parser.add_argument("--run", metavar="PREFIX", help="only records whose key (run_id) "
                        "starts with PREFIX")
    parser.add_argument("--max", type=int, metavar="N", help="stop after N records")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="stop after S seconds without a record (default: never)")
    parser.add_argument("--json", action="store_true",
                        help='print {"topic","key","value"} lines (as latch assemble writes)')
    return parser


def _topic_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in LOGICAL_TOPICS]
    if unknown or not names:
        choices = ",".join(LOGICAL_TOPICS)
        raise argparse.ArgumentTypeError(
            f"unknown topic {', '.join(unknown) or '(none)'}; choose from {choices}"
        )
    return list(dict.fromkeys(names))


def main(argv: Sequence[str] | None = None) -> int:
    """``latch tail``; see the module docstring."""
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        return _fail(str(exc))
    logical = topic_names(config)
    wanted = [logical[name] for name in args.topics]
    try:
        consumer, missing = open_consumer(config, wanted, from_beginning=args.from_beginning)
    except (TailError, KafkaException) as exc:
        return _fail(str(exc))
    try:
        for topic in missing:
            print(f"latch tail: topic {topic} does not exist; skipped", file=sys.stderr)
        if len(missing) == len(wanted):
            return _fail("none of the topics exists (run `latch topics create`)")
        names = {kafka: name for name, kafka in logical.items()}
        out = sys.stdout
        for record in records(consumer, names, timeout=args.timeout, max_records=args.max,
                              run_prefix=args.run):
            if args.json:
                out.write(orjson.dumps(record.as_line()).decode() + "\n")
            else:
                out.write(format_record(record) + "\n")
            out.flush()
    except TailError as exc:
        return _fail(str(exc))
    except BrokenPipeError:  # `latch tail | head`
        sys.stderr.close()
    finally:
        consumer.close()
    return EXIT_OK


def _fail(message: str) -> int:
    print(f"latch tail: {message}", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
