"""The gateway-side publisher, without a broker: a fake confluent-kafka producer records what
it is given and plays back delivery reports. Also ``latch publish`` on files, and the shipped
``examples/demo.jsonl`` run offline through the core (``latch tail``'s lines: test_tail.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException
from fixtures_lib import fixture, load_events

from worker.client import publisher as publisher_module
from worker.client.publisher import FORCED_SETTINGS, Delivery, Publisher, PublishError
from worker.core import Assembler
from worker.runtime.config import Config, KafkaSettings, TopicNames

REPO = Path(__file__).resolve().parents[3]
DEMO = REPO / "examples" / "demo.jsonl"
SECRET = "sk-live-do-not-log-me"


class FakeMessage:
    def __init__(self, topic: str, key: bytes, value: bytes, partition: int, offset: int) -> None:
        self._topic, self._key, self._value = topic, key, value
        self._partition, self._offset = partition, offset

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class FakeProducer:
    """Records produce() calls; delivers them (or fails them) on poll/flush."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config or {}
        self.produced: list[tuple[str, bytes, bytes]] = []
        self.headers: list[list[tuple[str, bytes]] | None] = []
        self.pending: list[tuple[Callable[..., None], FakeMessage]] = []
        self.fail_with: KafkaError | None = None
        self.raise_on_produce: Exception | None = None
        self.full_times = 0
        self.undelivered = 0

    def produce(self, topic: str, value: bytes, key: bytes,
                on_delivery: Callable[..., None],
                headers: list[tuple[str, bytes]] | None = None) -> None:
        if self.raise_on_produce is not None:
            raise self.raise_on_produce
        if self.full_times:
            self.full_times -= 1
            raise BufferError("Local: Queue full")
        self.produced.append((topic, key, value))
        self.headers.append(headers)
        message = FakeMessage(topic, key, value, partition=len(key) % 3,
                              offset=len(self.produced) - 1)
        self.pending.append((on_delivery, message))

    def poll(self, timeout: float = 0) -> int:
        if not timeout:  # not acknowledged yet: reports come on a waiting poll or flush
            return 0
        served, self.pending = self.pending, []
        for callback, message in served:
            callback(self.fail_with, message)
        return len(served)

    def flush(self, timeout: float = 0) -> int:
        self.poll(1)
        return self.undelivered

    def list_topics(self, timeout: float = 0) -> Any:
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))


def make_publisher(**kwargs: Any) -> tuple[Publisher, FakeProducer]:
    fake = FakeProducer()
    config = Config(topics=TopicNames(events="ev", control="ctl"))
    clock = kwargs.pop("clock", lambda: 1_700_000_000_000)
    return Publisher(config, producer=fake, clock=clock, **kwargs), fake  # type: ignore[arg-type]


def sent(fake: FakeProducer) -> list[tuple[str, str, dict[str, Any]]]:
    return [(topic, key.decode(), orjson.loads(value)) for topic, key, value in fake.produced]


# -- envelopes ----------------------------------------------------------------------------


def test_run_numbers_seq_from_zero_and_closes_once() -> None:
    """A ``Publisher`` run numbers its envelopes' seq from 0 on the events topic under the run id,
    writes run.start's fields and ``ts``, and refuses an event after its end."""
    pub, fake = make_publisher()
    tools = [{"type": "function", "function": {"name": "read_file"}}]
    run = pub.run("r1", "openai.chat", tools, tenant="t1", limits={"max_tool_calls": 2})
    assert run.event({"choices": []}) == 1
    assert run.event({"choices": [{"index": 0, "delta": {}}]}) == 2
    assert run.end() == 3
    with pytest.raises(RuntimeError, match="already ended"):
        run.event({"choices": []})
    records = sent(fake)
    assert [topic for topic, _, _ in records] == ["ev"] * 4
    assert {key for _, key, _ in records} == {"r1"}
    assert [v["seq"] for _, _, v in records] == [0, 1, 2, 3]
    start, first, _, end = (v for _, _, v in records)
    assert start == {"v": 1, "run_id": "r1", "seq": 0, "type": "run.start",
                     "provider": "openai.chat", "tenant": "t1", "tools": tools,
                     "limits": {"max_tool_calls": 2}, "ts": 1_700_000_000_000}
    assert first == {"v": 1, "run_id": "r1", "seq": 1, "type": "provider.event",
                     "event": {"choices": []}, "ts": 1_700_000_000_000}
    assert end == {"v": 1, "run_id": "r1", "seq": 3, "type": "stream.end",
                   "ts": 1_700_000_000_000}


def test_runs_number_independently_and_optional_fields_are_left_out() -> None:
    """Two runs number their seqs independently, an error ends a run (``end`` then raises), and
    without a clock or tenant no ``ts``, ``tenant`` or ``limits`` field is written."""
    pub, fake = make_publisher(clock=None)
    a = pub.run("a", "anthropic.messages", [])
    b = pub.run("b", "openai.responses", [])
    a.event({"type": "message_start"})
    b.event({"type": "response.created"})
    a.event({"type": "ping"})
    assert b.error("connection reset") == 2
    with pytest.raises(RuntimeError):
        b.end()
    records = sent(fake)
    assert [(k, v["seq"]) for _, k, v in records] == [
        ("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert records[0][2] == {"v": 1, "run_id": "a", "seq": 0, "type": "run.start",
                             "provider": "anthropic.messages", "tools": []}
    assert records[-1][2] == {"v": 1, "run_id": "b", "seq": 2, "type": "stream.error",
                              "error": "connection reset"}


def test_cancel_goes_to_the_control_topic_keyed_by_run_id() -> None:
    """A cancel, from a run or by run id, goes to the control topic keyed by the run id with
    reason ``user_stop`` unless another is given."""
    pub, fake = make_publisher(clock=None)
    run = pub.run("r9", "openai.chat", [])
    run.cancel("user_stop")
    pub.cancel("r10")
    assert sent(fake)[1:] == [
        ("ctl", "r9", {"v": 1, "run_id": "r9", "type": "cancel", "reason": "user_stop"}),
        ("ctl", "r10", {"v": 1, "run_id": "r10", "type": "cancel", "reason": "user_stop"}),
    ]


def test_decisions_go_to_the_control_topic_keyed_by_run_id() -> None:
    """``approve``, ``deny`` and ``edit`` (issue 26) go to the control topic keyed by the run
    id, naming the call, who decided and why; an edit's arguments are sent as JSON text; a
    decision without its decider is refused before anything is sent."""
    pub, fake = make_publisher(clock=None)
    pub.approve("r1", "c1", by="ann", reason="ok")
    pub.deny("r1", "c2", by="bob")
    pub.edit("r1", "c3", {"path": "/a"}, by="ann", reason="narrowed")
    head = {"v": 1, "run_id": "r1"}
    assert sent(fake) == [
        ("ctl", "r1", {**head, "type": "approve", "tool_call_id": "c1", "by": "ann",
                       "reason": "ok"}),
        ("ctl", "r1", {**head, "type": "deny", "tool_call_id": "c2", "by": "bob",
                       "reason": ""}),
        ("ctl", "r1", {**head, "type": "edit", "tool_call_id": "c3", "by": "ann",
                       "reason": "narrowed", "arguments": '{"path":"/a"}'}),
    ]
    with pytest.raises(ValueError):
        pub.approve("r1", "c1", by="")
    assert len(sent(fake)) == 3


def test_send_envelope_routes_by_type_and_keeps_the_envelope() -> None:
    """``send_envelope`` sends a cancel to the control topic and the rest to events, keeps an
    envelope's own ``ts`` (stamping one otherwise) and refuses an envelope without a run_id."""
    pub, fake = make_publisher()
    assert pub.send_envelope({"v": 1, "run_id": "x", "seq": 4, "type": "stream.end",
                              "ts": 5}) == "ev"
    assert pub.send_envelope({"v": 1, "run_id": "x", "type": "cancel"}) == "ctl"
    (_, _, end), (_, _, cancel) = sent(fake)
    assert end["ts"] == 5  # an envelope's own ts is kept
    assert cancel["ts"] == 1_700_000_000_000
    for bad in ({"v": 1, "type": "stream.end"}, {"run_id": ""}, {"run_id": 7}):
        with pytest.raises(ValueError, match="run_id"):
            pub.send_envelope(bad)


def test_bad_arguments_are_refused_before_anything_is_sent() -> None:
    """An unknown provider, an empty run_id or a non-dict event raises before anything is
    produced."""
    pub, fake = make_publisher()
    with pytest.raises(ValueError, match="provider"):
        pub.run("r1", "openai.completions", [])
    with pytest.raises(ValueError, match="run_id"):
        pub.run("", "openai.chat", [])
    with pytest.raises(ValueError, match="run_id"):
        pub.cancel("")
    with pytest.raises(TypeError):
        pub.run("r2", "openai.chat", []).event("data: {}")  # type: ignore[arg-type]
    assert [v["type"] for _, _, v in sent(fake)] == ["run.start"]


# -- producer settings and delivery ---------------------------------------------------------


def test_producer_settings_force_the_java_compatible_partitioner() -> None:
    """The producer's settings force ``murmur2_random``, idempotence and ``acks=all`` over the
    configuration's extras, which may tune everything else."""
    kafka = KafkaSettings(bootstrap_servers="b:9092",
                          extra={"partitioner": "consistent_random", "linger_ms": "20"})
    pub = Publisher(Config(kafka=kafka), producer=FakeProducer())  # type: ignore[arg-type]
    settings = pub.producer_config()
    assert settings["partitioner"] == "murmur2_random" == FORCED_SETTINGS["partitioner"]
    assert settings["enable.idempotence"] == "true"
    assert settings["acks"] == "all"
    assert settings["linger.ms"] == "20"  # the configuration may tune the rest
    assert settings["bootstrap.servers"] == "b:9092"


def test_a_failed_delivery_raises_with_topic_and_error_but_no_payload() -> None:
    """A failed delivery raises ``PublishError`` once, naming topic, count and broker error but
    never the payload or the run id."""
    pub, fake = make_publisher()
    fake.fail_with = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    run = pub.run("secret-run", "openai.chat", [{"api_key": SECRET}])
    run.event({"choices": [{"delta": {"content": SECRET}}]})
    with pytest.raises(PublishError) as caught:
        pub.flush(1)
    text = str(caught.value)
    assert caught.value.topic == "ev"
    assert caught.value.count == 2
    assert "ev" in text and "Broker: Message size too large" in text
    assert SECRET not in text and "secret-run" not in text and SECRET not in repr(caught.value)
    pub.flush(1)  # reported once


def test_a_failure_surfaces_on_the_next_send_too() -> None:
    """A delivery failure reported in the background raises on the next send, not only at
    ``flush``."""
    pub, fake = make_publisher()
    fake.fail_with = KafkaError(KafkaError._MSG_TIMED_OUT)
    run = pub.run("r1", "openai.chat", [])
    fake.poll(1)  # the run.start is delivered (and fails) in the background
    with pytest.raises(PublishError, match="Local: Message timed out"):
        run.event({"choices": []})


def test_produce_errors_and_leftovers_become_publish_errors() -> None:
    """A ``produce`` that raises, and envelopes still unacknowledged at ``flush``'s deadline, both
    become ``PublishError`` without the payload."""
    pub, fake = make_publisher()
    fake.raise_on_produce = KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC))
    with pytest.raises(PublishError) as caught:
        pub.send_envelope({"v": 1, "run_id": "r1", "type": "stream.end", "seq": 1,
                           "secret": SECRET})
    assert "ev" in str(caught.value) and SECRET not in str(caught.value)
    fake.raise_on_produce = None
    fake.undelivered = 3
    with pytest.raises(PublishError, match="3 envelopes not acknowledged"):
        pub.flush(0.1)


def test_a_full_local_queue_is_waited_out() -> None:
    """A local producer queue full twice (``BufferError``) is waited out: the cancel is
    produced once."""
    pub, fake = make_publisher()
    fake.full_times = 2
    pub.cancel("r1")
    assert len(fake.produced) == 1


def test_deliveries_are_reported() -> None:
    """``on_delivery`` gets each delivery's topic, partition, offset and key, and ``sent`` counts
    them per topic."""
    seen: list[Delivery] = []
    pub, _ = make_publisher(on_delivery=seen.append)
    pub.run("abc", "openai.chat", [])
    pub.cancel("abc")
    pub.flush(1)
    assert seen == [Delivery("ev", 0, 0, "abc"), Delivery("ctl", 0, 1, "abc")]
    assert pub.sent == {"ev": 1, "ctl": 1}


def test_check_topics_names_the_cluster_when_it_does_not_answer() -> None:
    """``check_topics`` against no cluster raises ``PublishError`` naming the bootstrap address."""
    pub, _ = make_publisher()
    with pytest.raises(PublishError, match=r"no answer from 127\.0\.0\.1:9092"):
        pub.check_topics(0.1)


# -- latch publish ------------------------------------------------------------------------


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> list[FakeProducer]:
    made: list[FakeProducer] = []

    def factory(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    monkeypatch.setattr(publisher_module, "Producer", factory)
    monkeypatch.chdir(REPO / "tests")  # no latch.yaml here: defaults
    return made


def test_publish_sends_lines_unchanged_and_summarises(
    tmp_path: Path, fake_kafka: list[FakeProducer], capsys: pytest.CaptureFixture[str]
) -> None:
    """``latch publish`` sends each non-blank line's bytes unchanged (trimmed) to its topic with
    the forced partitioner, and prints a summary per topic; exit 0."""
    lines = [
        b'{"v":1,"run_id":"r1","seq":0,"type":"run.start","provider":"openai.chat","tools":[]}',
        b"",
        b'{"v":1,"run_id":"r1","type":"cancel","reason":"user_stop"}',
        b'  {"v":1,"run_id":"r2","seq":0,"type":"run.start","provider":"openai.chat"}  ',
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert publisher_module.main(["--no-check", str(path)]) == 0
    (producer,) = fake_kafka
    assert producer.config["partitioner"] == "murmur2_random"
    assert producer.produced == [
        ("llm.stream.events", b"r1", lines[0]),
        ("llm.stream.control", b"r1", lines[2]),
        ("llm.stream.events", b"r2", lines[3].strip()),
    ]
    out, err = capsys.readouterr()
    assert out == ("sent 3 envelopes for 2 runs to llm.stream.control (1), "
                   "llm.stream.events (2)\n")
    assert err == ""


def test_publish_reports_bad_lines_by_number_skips_them_and_exits_1(
    tmp_path: Path, fake_kafka: list[FakeProducer], capsys: pytest.CaptureFixture[str]
) -> None:
    """``latch publish`` skips invalid lines naming each by number and reason (never its text),
    sends the good ones and exits 1."""
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"v":1,"run_id":"r1","seq":0,"type":"stream.end"}\n'
        f'{{"v":1,"run_id":"r1","seq":1,"type":"stream.end","x":"{SECRET}"\n'
        '{"v":1,"seq":2,"type":"stream.end"}\n'
        '[1, 2]\n'
        '{"v":1,"run_id":"","seq":3}\n'
    )
    assert publisher_module.main(["--no-check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "sent 1 envelope for 1 run to llm.stream.events (1); skipped 4 lines\n"
    assert "line 2: not valid JSON" in err
    assert "line 3: no run_id" in err
    assert "line 4: not a JSON object" in err
    assert "line 5: no run_id" in err
    assert SECRET not in err


def test_publish_fails_cleanly_without_a_cluster(
    tmp_path: Path, fake_kafka: list[FakeProducer], capsys: pytest.CaptureFixture[str]
) -> None:
    """``latch publish`` exits 2 with a message naming the address when no cluster answers (nothing
    sent), and exits 2 naming a missing input file."""
    path = tmp_path / "in.jsonl"
    path.write_text('{"v":1,"run_id":"r1","seq":0,"type":"stream.end"}\n')
    assert publisher_module.main([str(path)]) == 2
    assert "no answer from 127.0.0.1:9092" in capsys.readouterr().err
    assert fake_kafka[0].produced == []
    assert publisher_module.main(["--no-check", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


# -- the shipped example ------------------------------------------------------------------


def test_the_demo_file_publishes_and_assembles_to_the_documented_outcomes() -> None:
    """Every line of ``examples/demo.jsonl`` is publishable, and the core gives the
    documented outcomes and final statuses with no DLQ record and no run left open."""
    lines = [line for line in DEMO.read_bytes().splitlines() if line.strip()]
    assert all(publisher_module._classify(line)[0] is None for line in lines)
    assembler = Assembler()
    emitted = [e for line in lines for e in assembler.feed_record(None, line)]
    outcomes = {(e.key, e.value.get("name"), e.value.get("state", "committed"),
                 e.value.get("reason")) for e in emitted if e.topic in ("committed", "errors")}
    assert outcomes == {
        ("chat-parallel", "GetWeatherArgs", "committed", None),
        ("chat-parallel", "get_stock_price", "committed", None),
        ("anthropic-tool-use", "get_weather", "committed", None),
        ("responses-call", "get_capital", "committed", None),
        ("chat-cancelled", "get_weather", "cancelled", "cancelled"),
        ("anthropic-broken-stream", "updateIssueList", "failed", "stream_error"),
        ("chat-invalid-json", "GetWeatherArgs", "failed", "invalid_json"),
        ("bedrock-kimi-tool-use", "glob_search", "committed", None),
        ("gemini-partial-args", "writeItems", "committed", None),
    }
    committed = {e.key: e.value for e in emitted if e.topic == "committed"}
    assert committed["bedrock-kimi-tool-use"]["call_id"] == "functions.glob_search:0"
    assert committed["bedrock-kimi-tool-use"]["arguments"] == {"pattern": "**/*cursor*"}
    # The partialArgs call ends at a part without willContinue (no empty functionCall after).
    assert committed["gemini-partial-args"]["call_id"] == "latch-0-0-gemini-partial-args"
    assert [op["itemid"] for op in committed["gemini-partial-args"]["arguments"]["operations"]
            ] == ["apple_001", "banana_001"]
    finals = {e.key: e.value["status"] for e in emitted if e.topic == "final"}
    assert finals == {"chat-parallel": "completed", "anthropic-tool-use": "completed",
                      "responses-call": "completed", "chat-cancelled": "cancelled",
                      "anthropic-broken-stream": "failed", "chat-invalid-json": "completed",
                      "bedrock-kimi-tool-use": "completed", "gemini-partial-args": "completed"}
    assert not [e for e in emitted if e.topic == "dlq"]
    assert assembler.open_runs == 0


# -- latch demo stops what it started, whatever happens ------------------------------------


def test_demo_stops_its_worker_when_a_step_raises_unexpectedly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """When a step of ``latch demo`` raises unexpectedly, the demo stops the worker it started,
    reports the step FAILED and keeps the worker log, then re-raises; it leaves this process's
    environment as it found it (its engine and policy go to its worker only: a demo run in
    process once leaked its enforced policy into every later ``latch assemble``)."""
    import os
    import subprocess
    import sys

    from worker.tools import demo

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def broken_broker(config: Config, started: demo.Started) -> str:
        started.worker = sleeper
        started.workdir, started.log = tmp_path, tmp_path / "worker.log"
        raise RuntimeError("boom")

    monkeypatch.setattr(demo, "ensure_broker", broken_broker)
    monkeypatch.chdir(REPO / "tests")
    environment = dict(os.environ)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            demo.main(["--engine", "kafka"])
        assert dict(os.environ) == environment
        assert sleeper.poll() is not None  # SIGTERMed, not left behind
        out = capsys.readouterr().out
        assert "[1/5] broker ... FAILED: unexpected error" in out
        assert "stopping the worker ... exit status" in out
        assert f"worker log kept: {tmp_path / 'worker.log'}" in out
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_envelopes_carry_the_callers_trace_context() -> None:
    """Under a caller's span, each envelope's headers hold its W3C traceparent (same trace
    id); without a span, no headers at all."""
    from opentelemetry.sdk.trace import TracerProvider

    fake = FakeProducer()
    publisher = Publisher(Config(), producer=fake)  # type: ignore[arg-type]
    publisher.send_envelope({"v": 1, "run_id": "r1", "seq": 0, "type": "stream.end"})
    with TracerProvider().get_tracer("gateway").start_as_current_span("call") as span:
        publisher.send_envelope({"v": 1, "run_id": "r1", "seq": 1, "type": "stream.end"})
    assert fake.headers[0] is None
    (name, value), = fake.headers[1] or []
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert name == "traceparent" and value.decode().split("-")[1] == trace_id


# -- the newer providers through the publisher helpers ---------------------------------------

BEDROCK_KIMI = ("vercel-ai/packages/amazon-bedrock/src/__fixtures__/"
                "issue-11409-kimi-k2-thinking-glob-search.chunks.txt")
GEMINI_TOOL_CALL = "vercel-ai/packages/google/src/__fixtures__/google-tool-call.chunks.txt"
NEW_PROVIDER_RUNS = [
    ("bedrock.converse", BEDROCK_KIMI,
     [{"toolSpec": {"name": "glob_search", "inputSchema": {"json": {
         "type": "object", "properties": {"pattern": {"type": "string"}},
         "required": ["pattern"]}}}}],
     ("functions.glob_search:0", "glob_search", {"pattern": "**/*cursor*"})),
    ("google.gemini", GEMINI_TOOL_CALL,
     [{"functionDeclarations": [{"name": "weather", "parameters": {
         "type": "OBJECT", "properties": {"location": {"type": "STRING"}},
         "required": ["location"]}}]}],
     ("latch-0-0-r-new", "weather", {"location": "San Francisco"})),
]


@pytest.mark.parametrize(("provider", "relative", "tools", "expected"), NEW_PROVIDER_RUNS,
                         ids=["bedrock", "gemini"])
def test_publisher_carries_a_bedrock_and_a_gemini_run_to_the_core(
    provider: str, relative: str, tools: list[Any], expected: tuple[str, str, Any]
) -> None:
    """Publisher.run accepts bedrock.converse and google.gemini with tools in the provider's
    own format; RunHandle sends the recorded events verbatim with seq 1..n and stream.end;
    what the fake producer received, fed to the core in order, commits the recorded call."""
    events = load_events(fixture(relative))
    pub, fake = make_publisher()
    run = pub.run("r-new", provider, tools, tenant="t1")
    assert [run.event(e) for e in events] == list(range(1, len(events) + 1))
    assert run.end() == len(events) + 1
    pub.flush()
    records = sent(fake)
    assert {(topic, key) for topic, key, _ in records} == {("ev", "r-new")}
    assert records[0][2]["provider"] == provider and records[0][2]["tools"] == tools
    assert [v["event"] for _, _, v in records[1:-1]] == events
    assembler = Assembler()
    emitted = [e for _, key, value in fake.produced
               for e in assembler.feed_record(key, value)]
    outcomes = [(e.topic, e.value.get("call_id"), e.value.get("name"), e.value.get("arguments"))
                for e in emitted if e.topic in ("committed", "errors")]
    assert outcomes == [("committed", *expected)]
    assert [e.value["status"] for e in emitted if e.topic == "final"] == ["completed"]


def test_publish_sends_a_bedrock_and_a_gemini_file_unchanged(
    tmp_path: Path, fake_kafka: list[FakeProducer], capsys: pytest.CaptureFixture[str]
) -> None:
    """``latch publish`` takes envelope lines of the newer providers like any other: every
    line of the demo's Bedrock and Gemini runs goes to the events topic unchanged."""
    lines = [line for line in DEMO.read_bytes().splitlines()
             if b'"run_id":"bedrock-' in line or b'"run_id":"gemini-' in line]
    providers = {orjson.loads(line).get("provider") for line in lines} - {None}
    assert providers == {"bedrock.converse", "google.gemini"}
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert publisher_module.main(["--no-check", str(path)]) == 0
    (producer,) = fake_kafka
    assert [value for _, _, value in producer.produced] == lines
    out, _ = capsys.readouterr()
    assert out == f"sent {len(lines)} envelopes for 2 runs to llm.stream.events ({len(lines)})\n"


# -- reserved keys and types at the gateway -----------------------------------------------


class _Producer:
    """Records what the publisher hands to librdkafka (nothing is delivered)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.produced: list[tuple[str, bytes, bytes]] = []

    def produce(self, topic: str, value: bytes, key: bytes,
                on_delivery: Callable[..., None],
                headers: list[tuple[str, bytes]] | None = None) -> None:
        self.produced.append((topic, key, value))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


def _publisher() -> tuple[Publisher, _Producer]:
    fake = _Producer()
    config = Config(topics=TopicNames(events="ev", control="ctl"))
    return Publisher(config, producer=fake), fake  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("send", "problem"),
    [
        (lambda p: p.send_envelope({"v": 1, "type": "tick", "ts": 99_999_999_999_999,
                                    "run_id": "__latch_tick__"}), "type 'tick' is reserved"),
        (lambda p: p.send_envelope({"v": 1, "type": "tick", "ts": 1, "run_id": "r1"}),
         "type 'tick' is reserved"),
        (lambda p: p.send_raw("__latch_tick__", b'{"v":1,"type":"tick","ts":1}'),
         "reserved for the worker"),
        (lambda p: p.run("__latch_x", "openai.chat", []), "reserved for the worker"),
        (lambda p: p.cancel("__latch_tick__"), "reserved for the worker"),
        (lambda p: p.send_raw("__latch_tick__", b"{}", control=True), "reserved for the worker"),
    ],
)
def test_publisher_never_sends_a_tick_or_a_reserved_key(send: Callable[[Publisher], Any],
                                                        problem: str) -> None:
    """The gateway's ``Publisher`` refuses the worker's own envelope type and keys with a
    ``ValueError`` that names the problem, and hands nothing to the producer."""
    pub, fake = _publisher()
    with pytest.raises(ValueError, match=problem):
        send(pub)
    assert fake.produced == []


def test_latch_publish_skips_ticks_and_reserved_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``latch publish`` skips a tick line and a ``__latch_…`` line, naming the line and the
    reason, sends the rest, and exits 1."""
    made: list[_Producer] = []
    monkeypatch.setattr(publisher_module, "Producer",
                        lambda config: made.append(_Producer(config)) or made[-1])
    monkeypatch.chdir(tmp_path)
    good = b'{"v":1,"run_id":"r1","seq":0,"type":"run.start","provider":"openai.chat"}'
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([
        b'{"v":1,"run_id":"__latch_tick__","type":"tick","ts":99999999999999}',
        b'{"v":1,"run_id":"__latch_tick__","type":"cancel","reason":"x"}',
        good]) + b"\n")
    assert publisher_module.main(["--no-check", str(path)]) == 1
    assert [key for _, key, _ in made[0].produced] == [b"r1"]
    err = capsys.readouterr().err
    assert "line 1: type 'tick' is reserved" in err
    assert "line 2: run ids starting with __latch_ are reserved" in err
