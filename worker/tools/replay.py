"""``latch replay``: run a range of the events topic through the worker's code again.

::

    latch replay [--config FILE] (--from-beginning | --from-offset N | --from-time T)
                 [--to-end | --to-offset N | --to-time T] [--partitions 0,3]
                 (--to-file OUT.jsonl | --to-topics PREFIX) [--group-id ID]

Each selected partition of the events topic is read from its start offset up to, not
including, its stop offset, and every record goes through :func:`worker.runtime.step.step`, the
worker's own per-record code: one fresh :class:`~worker.core.Assembler` per partition, the
record time in milliseconds, keyless records and ticks handled as the worker handles them.
What it emits is written

* with ``--to-file``, as ``latch assemble`` writes it: one ``{"topic", "key", "value"}`` JSON
  line per record (``-``: standard output);
* with ``--to-topics PREFIX``, as the worker writes it (same keys, same bytes, the same
  partitioner) to ``<PREFIX><topic>``, e.g. ``replay.tool.calls.committed``, created if
  missing with the partition count of the live topic.

The range, per partition: ``--from-beginning`` is the oldest record still in the log,
``--from-offset N`` offset N (clamped to the log), ``--from-time T`` the first record whose
timestamp is T or later (``offsets_for_times``); the stop is the end of the partition when the
replay starts (``--to-end``, the default), offset N (``--to-offset N``, exclusive) or the first
record at time T or later (``--to-time T``). T is ISO 8601 (a time without a zone is UTC) or
milliseconds since the epoch.

The consumer is assigned its partitions: it never joins a group, so it never takes a partition
from a live worker, and it commits only at the end, into its own group
(``<app_id>-replay-<UTC time>`` or ``--group-id``, never the live ``worker.app_id``), where its
stop offsets record what was replayed. A progress bar over the range's record count goes to
standard error (``--progress`` / ``--no-progress``; by default only on a terminal), then one
summary line.

Exit status: 0 when the range was replayed; 2 with one line on standard error when the
command line, the configuration, the cluster, the topic or the range is unusable, or a
shadow topic cannot be written; 130 when interrupted (nothing is committed then).

Errors::

    Exception
     └── ReplayError   one line for the user; the command exits 2
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import IO, Any, Literal, NoReturn, Protocol

import orjson
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from tqdm import tqdm

from worker.core import Emit, Topic
from worker.runtime import admin
from worker.runtime.config import Config, ConfigError, load_config
from worker.runtime.governance.policy_source import PolicySource, assembler_policy
from worker.runtime.governance.registry import POLICY_MARKER, RegistryState
from worker.runtime.governance.registry_io import RegistryError, read_whole
from worker.runtime.governance.signing import with_audit_key
from worker.runtime.step import out_key, out_value, record, step
from worker.tools.replay_policy import Markers, ScanError, assemblers_for, versions_at

__all__ = ["Bound", "ReplayError", "Span", "build_parser", "main", "parse_time", "resolve"]

#: How long a metadata, watermark or offset lookup may take before the cluster is called
#: unreachable, in seconds.
LOOKUP_TIMEOUT_S = 10.0
#: How long the shadow-topic producer may take to deliver what is left at the end.
FLUSH_TIMEOUT_S = 60.0

CAVEAT = """\
caveat: a run whose run.start precedes the range is unknown to the replay, and its records
in the range go to the DLQ as unknown_run: start the range where no run is open, or at the
beginning. Idle expiry follows the ticks recorded in the events topic, and cancels are
replayed from the markers the worker forwarded there, so the outcomes equal the live ones.
The control topic itself is not read: a control record that was not a cancel went to the
DLQ live and is not replayed."""

#: librdkafka's own log lines (a refused connection, every 50 ms) go here, not to stderr: the
#: command reports what went wrong in one line.
_LIBRDKAFKA_LOG = logging.getLogger("latch.replay.librdkafka")
_LIBRDKAFKA_LOG.addHandler(logging.NullHandler())

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ReplayError(Exception):
    """The replay cannot run or cannot finish; the message is one line for the user."""


# -- the range ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bound:
    """One end of the range, before it is resolved against a partition."""

    kind: Literal["beginning", "end", "offset", "time"]
    #: The offset, or the time in ms since the epoch.
    value: int = 0

    def describe(self) -> str:
        return {"beginning": "the beginning", "end": "the end", "offset": f"offset {self.value}",
                "time": f"time {_iso(self.value)}"}[self.kind]


@dataclass(frozen=True, slots=True)
class Span:
    """The offsets of one partition to replay: ``start <= offset < stop``."""

    partition: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class Offsets(Protocol):
    """The lookups that resolve a range on one topic."""

    def watermarks(self, partition: int) -> tuple[int, int]:
        """The partition's first offset and its end (the next offset to be written)."""

    def offset_for_time(self, partition: int, ms: int) -> int | None:
        """The first offset whose timestamp is ``ms`` or later; None when there is none."""


def check_range(start: Bound, stop: Bound) -> None:
    """Refuse a range whose start is after its stop, when that is plain without a broker."""
    if start.kind == stop.kind and start.kind in ("offset", "time") and start.value > stop.value:
        raise ReplayError(f"bad range: the start ({start.describe()}) is after the end "
                          f"({stop.describe()})")


def resolve(start: Bound, stop: Bound, partitions: Sequence[int],
            offsets: Offsets) -> tuple[list[Span], list[str]]:
    """The span of each partition, and notes for the user (a start the log no longer has).

    Offsets are clamped to what the log holds; a partition whose start is at or after its stop
    gets an empty span.
    """
    spans, notes = [], []
    for partition in partitions:
        low, high = offsets.watermarks(partition)
        first = _position(start, partition, low, high, offsets)
        last = _position(stop, partition, low, high, offsets)
        if start.kind == "offset" and start.value < low:
            notes.append(f"partition {partition}: offsets before {low} are no longer in the "
                         f"log; starting at {low}")
        spans.append(Span(partition, first, max(first, last)))
    return spans, notes


def _position(bound: Bound, partition: int, low: int, high: int, offsets: Offsets) -> int:
    if bound.kind == "beginning":
        return low
    if bound.kind == "end":
        return high
    if bound.kind == "offset":
        return min(max(bound.value, low), high)
    found = offsets.offset_for_time(partition, bound.value)
    return high if found is None else min(max(found, low), high)


def parse_time(text: str) -> int:
    """ISO 8601 (a time without a zone is UTC) or an integer of ms since the epoch -> ms."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time nor milliseconds since the epoch") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _iso(ms: int) -> str:
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")


class _KafkaOffsets:
    """:class:`Offsets` from the cluster, through the replay's consumer."""

    def __init__(self, consumer: Consumer, topic: str) -> None:
        self.consumer, self.topic = consumer, topic

    def watermarks(self, partition: int) -> tuple[int, int]:
        low, high = self.consumer.get_watermark_offsets(
            TopicPartition(self.topic, partition), timeout=LOOKUP_TIMEOUT_S, cached=False)
        return int(low), int(high)

    def offset_for_time(self, partition: int, ms: int) -> int | None:
        [found] = self.consumer.offsets_for_times(
            [TopicPartition(self.topic, partition, ms)], timeout=LOOKUP_TIMEOUT_S)
        return None if found.offset < 0 else int(found.offset)


# -- where the outputs go -----------------------------------------------------------------


class Sink(Protocol):
    """Takes the emits of each input record (keyed ``key``), in order."""

    def write(self, emits: Sequence[Emit], key: bytes | None) -> None: ...

    def close(self) -> None:
        """Finish writing; raise :class:`ReplayError` when something was not written."""


class FileSink:
    """``latch assemble``'s JSON lines, to a file or to standard output (``-``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        try:
            self.out: IO[bytes] = sys.stdout.buffer if name == "-" else open(name, "wb")  # noqa: SIM115
        except OSError as exc:
            raise ReplayError(f"cannot write {name}: {exc.strerror}") from exc

    def write(self, emits: Sequence[Emit], key: bytes | None) -> None:
        for emit in emits:
            self.out.write(orjson.dumps(emit.as_line()) + b"\n")

    def close(self) -> None:
        try:
            self.out.flush()
            if self.out is not sys.stdout.buffer:
                self.out.close()
        except OSError as exc:
            raise ReplayError(f"cannot write {self.name}: {exc.strerror}") from exc


class TopicSink:
    """The worker's records, to the shadow topics (murmur2 keys, as the worker's producer)."""

    def __init__(self, config: Config, names: Mapping[Topic, str]) -> None:
        self.names = names
        self.producer = Producer({**_client_config(config), "linger.ms": 20,
                                  "partitioner": "murmur2_random", "enable.idempotence": True})
        self.failure: str | None = None

    def write(self, emits: Sequence[Emit], key: bytes | None) -> None:
        for emit in emits:
            topic = self.names[emit.topic]
            while True:
                try:
                    self.producer.produce(topic, key=out_key(emit, key), value=out_value(emit),
                                          on_delivery=self._delivered)
                    break
                except BufferError:
                    self.producer.poll(0.1)
            self.producer.poll(0)
        if self.failure:
            raise ReplayError(self.failure)

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is not None and self.failure is None:
            self.failure = f"cannot write to {message.topic()}: {error.str()}"

    def close(self) -> None:
        left = self.producer.flush(FLUSH_TIMEOUT_S)
        if self.failure:
            raise ReplayError(self.failure)
        if left:
            raise ReplayError(f"{left} records were not delivered within {FLUSH_TIMEOUT_S:.0f} s")


def shadow_topics(config: Config, prefix: str, live: Mapping[str, int],
                  events_partitions: int) -> tuple[dict[Topic, str], list[admin.TopicSpec]]:
    """The shadow name of each output topic, and its spec: the live topic's partition count
    (the events topic's when the live one does not exist)."""
    names = {topic: prefix + getattr(config.topics, topic.value) for topic in Topic}
    taken = {s.name for s in admin.specs(config)} & set(names.values())
    if taken:
        raise ReplayError(f"--to-topics {prefix!r} names a live topic: {', '.join(sorted(taken))}")
    too_long = [name for name in names.values() if len(name) > 249]
    if too_long:
        raise ReplayError(f"--to-topics {prefix!r}: {too_long[0]} is longer than 249 characters")
    specs = [admin.TopicSpec(names[topic], live.get(getattr(config.topics, topic.value),
                                                    events_partitions),
                             config.topics.replication_factor) for topic in Topic]
    return names, specs


# -- the replay ---------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """What the replay read and emitted."""

    records: int = 0
    emitted: Counter[Topic] = field(default_factory=Counter)
    unknown_run: int = 0

    def add(self, emits: Sequence[Emit]) -> None:
        self.records += 1
        for emit in emits:
            self.emitted[emit.topic] += 1
            if emit.topic is Topic.DLQ and emit.value.get("reason") == "unknown_run":
                self.unknown_run += 1


def summary(tally: Tally, spans: Sequence[Span], topic: str, open_runs: int,
            elapsed: float, group: str) -> str:
    """The final line: records read, runs finished, counts per output, elapsed time."""
    counts = ", ".join(f"{t.value} {tally.emitted[t]}" for t in Topic)
    unknown = f" ({tally.unknown_run} unknown_run)" if tally.unknown_run else ""
    return (f"latch replay: {tally.records} records read from {len(spans)} partitions of "
            f"{topic}; {tally.emitted[Topic.FINAL]} runs finished, {open_runs} still open; "
            f"{counts}{unknown}; {elapsed:.1f} s; group {group}")


def run_spans(consumer: Consumer, topic: str, spans: Sequence[Span], config: Config,
              sink: Sink, bar: Any, registry: RegistryState | None = None,
              starting: Mapping[int, int] | None = None) -> tuple[Tally, int]:
    """Feed every record of ``spans`` to its partition's assembler; write what it emits; return
    the tally and how many runs are open at the end. ``registry``: as read whole (None: empty);
    ``starting``: the policy set version in force at each span's start (:func:`versions_at`)."""
    registry = registry or RegistryState()
    state = _Progress(consumer, topic, spans, bar)
    policies = PolicySource(config)  # decided as the live worker decides
    assemblers = assemblers_for(config, policies, registry, state.active, starting or {})
    markers = Markers(policies, registry, assemblers, starting or {})
    tally = Tally()
    consumer.assign([TopicPartition(topic, s.partition, s.start) for s in state.active.values()])
    while state.active:
        for message in consumer.consume(500, timeout=0.5):
            partition, offset = message.partition(), message.offset()
            if partition is None or offset is None or not state.wanted(message, partition,
                                                                        offset):
                continue
            key = message.key()
            if key == POLICY_MARKER:  # the version in force from here on, as live (driver.py)
                markers.apply(partition, message.value() or b"", _ms(message.timestamp()))
                state.advance(partition, offset + 1)
                continue
            emits = step(assemblers[partition], record(
                key, message.value() or b"", _ms(message.timestamp()), topic, partition, offset))
            sink.write(emits, key)
            tally.add(emits)
            state.advance(partition, offset + 1)
    return tally, sum(a.open_runs for a in assemblers.values())


def read_registry(config: Config) -> RegistryState:
    """The registry read whole: a run naming a toolset, and a policy marker, decide as they
    did live."""
    try:
        return read_whole(config)
    except RegistryError as exc:
        raise ReplayError(str(exc)) from exc


class _Progress:
    """Which partitions still have records to replay, and the progress bar over them."""

    def __init__(self, consumer: Consumer, topic: str, spans: Sequence[Span], bar: Any) -> None:
        self.consumer, self.topic, self.bar = consumer, topic, bar
        self.active = {s.partition: s for s in spans if s.size}
        self.position = {p: s.start for p, s in self.active.items()}

    def wanted(self, message: Message, partition: int, offset: int) -> bool:
        """Whether ``message`` is a record to replay; ends the partitions it shows are done."""
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._end_if_past(partition, offset)
            elif error.fatal():
                raise ReplayError(f"the consumer failed: {error.str()}")
            return False  # else transient (a broker restarting): librdkafka retries
        return partition in self.active and not self._end_if_past(partition, offset)

    def advance(self, partition: int, position: int) -> None:
        """The record before ``position`` is replayed."""
        self.bar.update(position - self.position[partition])
        self.position[partition] = position
        self._end_if_past(partition, position)

    def _end_if_past(self, partition: int, position: int) -> bool:
        span = self.active.get(partition)
        if span is None or position < span.stop:
            return False
        self.bar.update(span.stop - self.position[partition])
        self.consumer.pause([TopicPartition(self.topic, partition)])
        del self.active[partition]
        return True


def _client_config(config: Config) -> dict[str, Any]:
    """librdkafka settings from the ``kafka`` section, logging to :data:`_LIBRDKAFKA_LOG`."""
    return {**config.kafka.confluent_config(), "logger": _LIBRDKAFKA_LOG}


def _ms(stamp: tuple[int, int]) -> int | None:
    kind, value = stamp
    return None if kind == TIMESTAMP_NOT_AVAILABLE else int(value)


def _describe(exc: Exception) -> str:
    first = exc.args[0] if exc.args else None
    return first.str() if isinstance(first, KafkaError) else str(exc)


def default_group(app_id: str, now: datetime | None = None) -> str:
    """``<app_id>-replay-<UTC time to the ms>``."""
    moment = now or datetime.now(UTC)
    return f"{app_id}-replay-{moment.strftime('%Y%m%dT%H%M%S.%f')[:-3]}Z"


def replay(args: argparse.Namespace) -> str:
    """Run the replay the parsed command line asks for; return the summary line."""
    check_range(args.start, args.stop)
    try:
        config = with_audit_key(load_config(args.config))  # the worker's audit digests
        assembler_policy(config)  # (a policy.file that cannot be used stops the replay here)
    except (ConfigError, ValueError) as exc:  # (a PolicyFileError is a ValueError)
        raise ReplayError(str(exc)) from exc
    app_id, topic = config.worker.app_id, config.topics.events
    group = args.group_id or default_group(app_id)
    if group == app_id:
        raise ReplayError(f"--group-id {group} is the live workers' group; a replay never "
                          "commits there")
    consumer = Consumer({**_client_config(config), "group.id": group,
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         # as both engines read (decision 0009): the kafka engine's aborted
                         # ticks and cancels never happened
                         "isolation.level": "read_committed"})
    try:
        return _replay(args, config, consumer, topic, group)
    except (KafkaException, ScanError) as exc:
        raise ReplayError(f"Kafka error: {_describe(exc)}") from exc
    finally:
        consumer.close()


def _replay(args: argparse.Namespace, config: Config, consumer: Consumer, topic: str,
            group: str) -> str:
    servers = config.kafka.bootstrap_servers
    try:
        metadata = consumer.list_topics(timeout=LOOKUP_TIMEOUT_S)
    except KafkaException as exc:
        raise ReplayError(f"no answer from {servers}: {_describe(exc)}") from None
    live = {name: len(meta.partitions) for name, meta in metadata.topics.items()
            if meta.error is None and meta.partitions}
    if topic not in live:
        raise ReplayError(f"the events topic {topic} does not exist on {servers}")
    partitions = args.partitions or list(range(live[topic]))
    unknown = [p for p in partitions if p >= live[topic]]
    if unknown:
        raise ReplayError(f"{topic} has partitions 0-{live[topic] - 1}; no partition "
                          f"{', '.join(map(str, unknown))}")
    spans, notes = resolve(args.start, args.stop, partitions, _KafkaOffsets(consumer, topic))
    starting = versions_at(config, _client_config(config), topic, spans, notes)
    for note in notes:
        print(f"latch replay: {note}", file=sys.stderr)
    sink: Sink
    if args.to_topics is not None:
        names, specs = shadow_topics(config, args.to_topics, live, live[topic])
        try:
            admin.create(AdminClient(_client_config(config)), specs)
        except admin.TopicsError as exc:
            raise ReplayError(f"--to-topics: {exc}") from exc
        sink = TopicSink(config, names)
    else:
        sink = FileSink(args.to_file)
    started = time.monotonic()
    total = sum(s.size for s in spans)
    try:
        with tqdm(total=total, unit="rec", desc="replay", file=sys.stderr, mininterval=0.5,
                  disable=None if args.progress is None else not args.progress) as bar:
            tally, open_runs = run_spans(consumer, topic, spans, config, sink, bar,
                                         read_registry(config), starting)
    except BaseException:
        with contextlib.suppress(ReplayError):  # keep what was written; report the cause
            sink.close()
        raise
    sink.close()
    consumer.commit(offsets=[TopicPartition(topic, s.partition, s.stop) for s in spans],
                    asynchronous=False)
    return summary(tally, spans, topic, open_runs, time.monotonic() - started, group)


# -- the command line ---------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, exit 2 (argparse prints the whole usage first)."""
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _offset(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset (an integer >= 0)")
    return int(text)


def _partitions(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of partition numbers (0,3)")
    return sorted({int(part) for part in parts})


def _prefix(text: str) -> str:
    if not _TOPIC_NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a topic name prefix (letters, digits, '.', '_', '-')")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="latch replay", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Re-run a range of the events topic through the worker's per-record code "
                    "(one fresh assembler per partition, the records' own times) and write "
                    "what it emits to a file or to shadow topics.",
        epilog=CAVEAT)
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--from-beginning", dest="start", action="store_const",
                       const=Bound("beginning"), help="from the oldest record in the log")
    start.add_argument("--from-offset", dest="start", metavar="N",
                       type=lambda t: Bound("offset", _offset(t)),
                       help="from offset N of each partition")
    start.add_argument("--from-time", dest="start", metavar="T",
                       type=lambda t: Bound("time", parse_time(t)),
                       help="from the first record at time T or later (ISO 8601, UTC unless a "
                            "zone is given, or ms since the epoch)")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--to-end", dest="stop", action="store_const", const=Bound("end"),
                      help="to the end of each partition as the replay starts (default)")
    stop.add_argument("--to-offset", dest="stop", metavar="N",
                      type=lambda t: Bound("offset", _offset(t)),
                      help="to offset N of each partition, N not included")
    stop.add_argument("--to-time", dest="stop", metavar="T",
                      type=lambda t: Bound("time", parse_time(t)),
                      help="to the last record before time T")
    parser.set_defaults(stop=Bound("end"))
    parser.add_argument("--partitions", type=_partitions, metavar="LIST",
                        help="only these events partitions, e.g. 0,3 (default: all)")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--to-file", metavar="OUT.jsonl",
                     help="write latch assemble's JSON lines to this file (- for stdout)")
    out.add_argument("--to-topics", metavar="PREFIX", type=_prefix,
                     help="write to <PREFIX><topic> (e.g. replay.tool.calls.committed), "
                          "created if missing with the live topic's partition count")
    parser.add_argument("--group-id", metavar="ID",
                        help="the replay's own consumer group (default: "
                             "<app_id>-replay-<UTC time>); never the live group")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction,
                        help="show the progress bar on stderr (default: on a terminal only)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``latch replay``; see the module docstring."""
    args = build_parser().parse_args(argv)
    try:
        line = replay(args)
    except ReplayError as exc:
        print(f"latch replay: {exc}", file=sys.stderr)
        return 2
    print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
