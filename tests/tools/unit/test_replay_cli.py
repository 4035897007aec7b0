"""``latch replay`` without a broker: the command line, range resolution, the shadow topics'
names, the replay loop over a fake consumer, and the per-record step it shares with the
worker. The end-to-end proof (replay equals live) is
``tests/tools/integration/test_replay.py``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import zip_longest
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import PATH_SCHEMA, provider_run, stream_error, tick
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, TopicPartition
from fixtures_lib import fixture, load_events

from worker import cli
from worker.core import Assembler, Emit, Topic
from worker.core.envelope import TICK_KEY
from worker.runtime import step
from worker.runtime.config import load_config
from worker.tools import capture, replay

T0 = 1_736_933_400_000  # 2025-01-15T09:30:00Z


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No stray latch.yaml and no LATCH_ variables from the environment."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("LATCH_")]:
        monkeypatch.delenv(name)


def parse(*argv: str) -> argparse.Namespace:
    return replay.build_parser().parse_args(list(argv))


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``latch replay argv``; it must exit 2 with exactly one line on stderr."""
    try:
        status = replay.main(list(argv))
    except SystemExit as exc:  # argparse
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("latch replay: "), err
    return err


# -- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ms"), [
    ("2025-01-15T09:30:00Z", T0),
    ("2025-01-15T10:30:00+01:00", T0),
    ("2025-01-15T09:30:00", T0),  # no zone: UTC
    ("2025-01-15T09:30:00.250Z", T0 + 250),
    ("2025-01-15", T0 - (9 * 3600 + 1800) * 1000),
    (str(T0), T0),
])
def test_times_are_iso_8601_or_epoch_milliseconds(text: str, ms: int) -> None:
    """--from-time/--to-time take ISO 8601 (UTC when no zone is given) or epoch ms."""
    assert replay.parse_time(text) == ms


def test_the_range_and_output_options_parse_to_bounds() -> None:
    """Each start and stop option becomes a Bound; --to-end is the default stop."""
    args = parse("--from-offset", "7", "--to-file", "out.jsonl")
    assert (args.start, args.stop) == (replay.Bound("offset", 7), replay.Bound("end"))
    args = parse("--from-time", "2025-01-15T09:30:00Z", "--to-time", str(T0 + 1),
                 "--partitions", "3,0,3", "--to-topics", "replay.", "--group-id", "g")
    assert args.start == replay.Bound("time", T0) and args.stop == replay.Bound("time", T0 + 1)
    assert (args.partitions, args.to_topics, args.group_id) == ([0, 3], "replay.", "g")
    args = parse("--from-beginning", "--to-offset", "10", "--to-topics", "r-", "--no-progress")
    assert (args.start.kind, args.stop, args.progress) == (
        "beginning", replay.Bound("offset", 10), False)


@pytest.mark.parametrize("argv", [
    ["--to-file", "x"],                                             # no start
    ["--from-beginning"],                                           # no output
    ["--from-beginning", "--from-offset", "1", "--to-file", "x"],   # two starts
    ["--from-beginning", "--to-end", "--to-offset", "3", "--to-file", "x"],
    ["--from-beginning", "--to-file", "x", "--to-topics", "r."],    # two outputs
    ["--from-offset", "-1", "--to-file", "x"],
    ["--from-time", "yesterday", "--to-file", "x"],
    ["--from-beginning", "--partitions", "0,a", "--to-file", "x"],
    ["--from-beginning", "--to-topics", ""],
    ["--from-beginning", "--to-topics", "re/play"],
])
def test_a_bad_command_line_is_one_line_and_exit_2(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's errors come as one line (not the whole usage), exit status 2."""
    one_line_error(capsys, *argv)


@pytest.mark.parametrize(("argv", "words"), [
    (["--from-offset", "9", "--to-offset", "3"], "bad range: the start (offset 9) is after"),
    (["--from-time", "2025-02-01", "--to-time", "2025-01-01"], "bad range"),
    (["--from-beginning", "--group-id", "latch"], "is the live workers' group"),
    (["--from-beginning", "--config", "missing.yaml"], "missing.yaml: no such file"),
])
def test_a_bad_range_group_or_config_fails_before_any_broker(
        argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    """What is plainly wrong is refused before connecting: one line, exit 2."""
    assert words in one_line_error(capsys, *argv, "--to-file", "out.jsonl")
    assert not Path("out.jsonl").exists()


def test_no_broker_is_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listening at the bootstrap address: one line naming it (librdkafka's own
    connection log stays quiet), exit 2."""
    monkeypatch.setattr(replay, "LOOKUP_TIMEOUT_S", 1.0)
    monkeypatch.setenv("LATCH_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:1")
    err = one_line_error(capsys, "--from-beginning", "--to-file", "out.jsonl")
    assert "no answer from 127.0.0.1:1" in err


def test_the_help_states_the_caveat(capsys: pytest.CaptureFixture[str]) -> None:
    """--help says that runs open at the range's start are unknown_run, and why outcomes
    still equal the live ones."""
    with pytest.raises(SystemExit):
        replay.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "run.start precedes the range" in text and "unknown_run" in text
    assert "ticks recorded in the events topic" in text


def test_the_default_group_is_the_app_id_and_the_utc_time() -> None:
    """``<app_id>-replay-<UTC time to the ms>``: fresh per replay, never the live group."""
    moment = datetime(2025, 1, 15, 9, 30, 0, 123456, tzinfo=UTC)
    assert replay.default_group("latch", moment) == "latch-replay-20250115T093000.123Z"


# -- the range ------------------------------------------------------------------------------


@dataclass
class FakeOffsets:
    """Watermarks per partition and record times (one per offset) for offsets_for_times."""

    marks: dict[int, tuple[int, int]]
    times: dict[int, list[int]] = field(default_factory=dict)

    def watermarks(self, partition: int) -> tuple[int, int]:
        return self.marks[partition]

    def offset_for_time(self, partition: int, ms: int) -> int | None:
        low = self.marks[partition][0]
        found = [low + n for n, t in enumerate(self.times.get(partition, [])) if t >= ms]
        return found[0] if found else None


OFFSETS = FakeOffsets({0: (0, 10), 1: (5, 8), 2: (0, 0)},
                      {0: [T0 + 10 * n for n in range(10)], 1: [T0 + 100, T0 + 200, T0 + 300]})


def spans(start: replay.Bound, stop: replay.Bound,
          partitions: Sequence[int] = (0, 1, 2)) -> list[tuple[int, int, int]]:
    found, _ = replay.resolve(start, stop, partitions, OFFSETS)
    return [(s.partition, s.start, s.stop) for s in found]


def test_beginning_to_end_is_each_partitions_watermarks() -> None:
    """--from-beginning --to-end: from the log start to the end as it is now."""
    assert spans(replay.Bound("beginning"), replay.Bound("end")) == [
        (0, 0, 10), (1, 5, 8), (2, 0, 0)]


def test_offsets_are_clamped_to_the_log_and_a_deleted_start_is_noted() -> None:
    """An offset before the log start starts there (with a note); past the end is empty."""
    found, notes = replay.resolve(replay.Bound("offset", 2), replay.Bound("offset", 7),
                                  [0, 1, 2], OFFSETS)
    assert [(s.start, s.stop) for s in found] == [(2, 7), (5, 7), (0, 0)]
    assert notes == ["partition 1: offsets before 5 are no longer in the log; starting at 5"]
    assert spans(replay.Bound("offset", 9), replay.Bound("offset", 50), [0, 1]) == [
        (0, 9, 10), (1, 8, 8)]


def test_times_resolve_through_offsets_for_times() -> None:
    """--from-time is the first record at T or later; --to-time stops before the first
    record at T or later; no such record means the end."""
    assert spans(replay.Bound("time", T0 + 25), replay.Bound("time", T0 + 200)) == [
        (0, 3, 10), (1, 5, 6), (2, 0, 0)]
    assert spans(replay.Bound("time", T0 + 10_000), replay.Bound("end"), [0, 1]) == [
        (0, 10, 10), (1, 8, 8)]


def test_a_start_after_a_partitions_stop_is_an_empty_span() -> None:
    """--from-offset past a --to-time on one partition replays nothing there."""
    assert spans(replay.Bound("offset", 6), replay.Bound("time", T0 + 30), [0]) == [(0, 6, 6)]


# -- shadow topics ---------------------------------------------------------------------------


def test_shadow_topics_are_prefixed_with_the_live_partition_counts() -> None:
    """<PREFIX><topic> for each output; the live topic's partition count, else the events
    topic's."""
    config = load_config(env={})
    names, specs = replay.shadow_topics(config, "replay.", {"tool.calls.committed": 4}, 12)
    assert names[Topic.COMMITTED] == "replay.tool.calls.committed"
    assert names[Topic.DLQ] == "replay.llm.stream.dlq"
    assert {s.name: s.partitions for s in specs} == {
        "replay.tool.calls.committed": 4, "replay.tool.calls.errors": 12,
        "replay.llm.messages.final": 12, "replay.llm.stream.progress": 12,
        "replay.llm.stream.dlq": 12, "replay.llm.runs.ended": 12,
        "replay.tool.calls.pending": 12, "replay.latch.audit": 12,
        # the result latch's: its tool_timeout results and turn records, never the live ones
        "replay.tool.calls.results": 12, "replay.llm.turns": 12}


def test_a_prefix_that_names_a_live_topic_is_refused() -> None:
    """A replay never writes into a topic the worker reads or writes."""
    config = load_config(env={"LATCH_TOPICS__EVENTS": "x.out", "LATCH_TOPICS__COMMITTED": "out"})
    with pytest.raises(replay.ReplayError, match=r"names a live topic: x\.out"):
        replay.shadow_topics(config, "x.", {}, 12)


# -- the loop, over a fake consumer ----------------------------------------------------------


@dataclass
class FakeMessage:
    part: int
    off: int
    k: bytes | None = None
    v: bytes | None = None
    ts: int = 0
    err: KafkaError | None = None

    def error(self) -> KafkaError | None:
        return self.err

    def partition(self) -> int:
        return self.part

    def offset(self) -> int:
        return self.off

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, self.ts


class FakeConsumer:
    """Hands out each assigned partition's log from the assigned offset, a few records at a
    time, then an end-of-partition event, as librdkafka does with enable.partition.eof."""

    def __init__(self, logs: dict[int, list[tuple[bytes | None, bytes, int]]]) -> None:
        self.logs = logs
        self.queue: list[FakeMessage] = []
        self.paused: list[int] = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            log = self.logs[tp.partition]
            self.queue += [FakeMessage(tp.partition, off, k, v, ts)
                           for off, (k, v, ts) in enumerate(log) if off >= tp.offset]
            self.queue.append(FakeMessage(tp.partition, len(log),
                                          err=KafkaError(KafkaError._PARTITION_EOF)))

    def consume(self, num: int, timeout: float) -> list[FakeMessage]:
        batch, self.queue = self.queue[:3], self.queue[3:]
        return batch

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused += [tp.partition for tp in partitions]


class Bar:
    n = 0

    def update(self, count: int) -> None:
        self.n += count


class ListSink:
    def __init__(self) -> None:
        self.emits: list[tuple[Emit, bytes | None]] = []

    def write(self, emits: Sequence[Emit], key: bytes | None) -> None:
        self.emits += [(e, key) for e in emits]

    def close(self) -> None:
        pass


def records(envelopes: list[dict[str, Any]], start_ts: int = T0) -> list[tuple[bytes | None,
                                                                              bytes, int]]:
    out: list[tuple[bytes | None, bytes, int]] = []
    for n, env in enumerate(envelopes):
        key = TICK_KEY.encode() if env.get("type") == "tick" else env["run_id"].encode()
        out.append((key, orjson.dumps(env), start_ts + n))
    return out


def test_the_loop_replays_each_span_through_the_workers_step() -> None:
    """Each partition gets its own assembler; the records of the span (and only those) are
    fed with their record times; the bar ends at the range's record count. A run whose
    run.start is before the span's start is unknown: its records go to the DLQ."""
    run0 = provider_run("openai.chat", "r0", {"read_file": PATH_SCHEMA},
                        [("c0", "read_file", '{"path": "/a"}')])
    run1 = provider_run("anthropic.messages", "r1", {"read_file": PATH_SCHEMA},
                        [("c1", "read_file", '{"path": "/b"}')], end=False)[:4]
    run1 = [*run1, stream_error("r1", 4), tick(T0 + 99)]
    logs = {0: records(run0), 1: [], 2: records(run1)}
    config = load_config(env={})
    spans_ = [replay.Span(0, 1, len(run0) - 1), replay.Span(1, 0, 0),
              replay.Span(2, 0, len(run1))]
    consumer, sink, bar = FakeConsumer(logs), ListSink(), Bar()
    tally, open_runs = replay.run_spans(consumer, "events", spans_, config, sink, bar)

    assert tally.records == sum(s.size for s in spans_) == bar.n
    assert sorted(consumer.paused) == [0, 2] and open_runs == 0
    got = [(e.topic, e.key, e.value.get("reason")) for e, _ in sink.emits]
    assert (Topic.DLQ, "r0", "unknown_run") in got
    assert tally.unknown_run == len(run0) - 2
    assert not any(key == "r0" and topic is not Topic.DLQ for topic, key, _ in got)
    # partition 2, from its beginning: exactly what the worker's step emits
    assembler = Assembler(config.assemble)
    wanted = [e for off, (k, v, ts) in enumerate(logs[2]) for e in step.step(
        assembler, step.record(k, v, ts, "events", 2, off))]
    assert [e for e, _ in sink.emits if e.key == "r1"] == wanted
    assert tally.emitted[Topic.FINAL] == 1 and tally.emitted[Topic.ERRORS] == 1
    assert "1 runs finished" in replay.summary(tally, spans_, "events", open_runs, 0.5, "g")


def test_the_file_sink_writes_latch_assembles_lines(tmp_path: Path) -> None:
    """--to-file writes {"topic","key","value"} lines, the shape of latch assemble."""
    emit = Emit(Topic.COMMITTED, "r1", {"v": 1, "run_id": "r1", "arguments": {"a": "é"}})
    sink = replay.FileSink(str(tmp_path / "out.jsonl"))
    sink.write([emit, emit], b"r1")
    sink.close()
    lines = (tmp_path / "out.jsonl").read_bytes().splitlines()
    assert lines == [orjson.dumps(emit.as_line())] * 2


# -- the newer providers: replay equals latch assemble ---------------------------------------

_BR = "vercel-ai/packages/amazon-bedrock/src/__fixtures__/"
_GO = "vercel-ai/packages/google/src/__fixtures__/"
_OBJ: dict[str, Any] = {"type": "object"}


def test_a_bedrock_and_a_gemini_run_replay_to_the_records_latch_assemble_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Bedrock run (three tool blocks at index gaps) and a Gemini run (a whole call without
    args, then three streamed calls), interleaved in one partition: ``latch replay --to-file``
    writes, line for line, what ``latch assemble`` prints for the same envelopes (its audit
    records also saying which events record decided them): the seven calls committed, two
    final messages, nothing left open. (The Gemini tools are in the
    snake_case spelling.)"""
    bedrock = capture.envelopes(
        "bedrock.converse",
        load_events(fixture(_BR + "amazon-bedrock-json-with-tools.1.chunks.txt")),
        [{"toolSpec": {"name": n, "inputSchema": {"json": _OBJ}}} for n in
         ("tool-a", "tool-b", "json")], run_id="br-1")
    gemini = capture.envelopes(
        "google.gemini",
        load_events(fixture(_GO + "google-stream-no-args-tool-call.chunks.txt")),
        [{"function_declarations": [{"name": n, "parameters_json_schema": _OBJ} for n in
                                    ("read_theme", "read_screen")]}],
        run_id="ge-1")
    envelopes = [e for pair in zip_longest(bedrock, gemini) for e in pair if e is not None]
    assert all(isinstance(e, dict) for e in envelopes)
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in envelopes))

    assert cli.main(["assemble", str(path)]) == 0
    assembled = capsys.readouterr().out.encode().splitlines()

    config = load_config(env={})
    sink = replay.FileSink(str(tmp_path / "replayed.jsonl"))
    log = records([e for e in envelopes if isinstance(e, dict)])
    tally, open_runs = replay.run_spans(FakeConsumer({0: log}), "events",
                                        [replay.Span(0, 0, len(log))], config, sink, Bar())
    sink.close()
    replayed = (tmp_path / "replayed.jsonl").read_bytes().splitlines()

    # the same, but that replay read each record from the events topic: an audit record
    # says which decided it (latch assemble read none)
    outcomes = [orjson.loads(line) for line in replayed]
    sources = [o["value"]["source"] for o in outcomes if o["topic"] == "audit"]
    assert len(sources) == 7 and all(s["topic"] == "events" and s["partition"] == 0
                                     and 0 <= s["offset"] < len(log) for s in sources)
    for o in outcomes:
        if o["topic"] == "audit":
            o["value"]["source"] = None
    assert [orjson.dumps(o) for o in outcomes] == assembled and open_runs == 0
    committed = [(o["key"], o["value"]["name"]) for o in outcomes if o["topic"] == "committed"]
    assert sorted(committed) == sorted([("br-1", "tool-a"), ("br-1", "tool-b"), ("br-1", "json"),
                                        ("ge-1", "read_theme")] + [("ge-1", "read_screen")] * 3)
    assert tally.emitted[Topic.FINAL] == 2 and not tally.emitted[Topic.DLQ]
