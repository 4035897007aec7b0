"""Logs: one JSON object per line with context fields, no exception messages, and the Kafka
clients' lines kept off a terminal tool's output."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from types import SimpleNamespace

import pytest

from worker.runtime.observability import logs

SECRET = "hunter2-SECRET-token"


def test_json_lines_carry_context_and_never_an_exception_message() -> None:
    """Each record is one JSON object with run_id/partition/offset when given; an exception
    is written as its type and frames, not its message (which may quote a record)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    log = logging.getLogger("latch.test.json")
    log.addHandler(handler)
    log.propagate = False
    log.warning("rebuilt %d runs", 3, extra={"partition": 2, "offset": 41, "run_id": "r1"})
    try:
        raise ValueError(SECRET)
    except ValueError:
        log.exception("failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "rebuilt 3 runs" and first["level"] == "warning"
    assert (first["partition"], first["offset"], first["run_id"]) == (2, 41, "r1")
    assert second["exception"] == "ValueError"
    assert SECRET not in stream.getvalue()


def test_faust_logging_config_holds_content_loggers_at_info() -> None:
    """At log_level debug, faust's send logger (which logs record values) stays at INFO; the
    json format installs the JSON formatter."""
    config = logs.faust_logging_config(SimpleNamespace(log_level="debug", log_format="json"))
    assert config["loggers"]["faust.topics"]["level"] == "INFO"
    assert config["root"]["level"] == "DEBUG"
    assert config["formatters"]["latch"]["()"].endswith("JsonFormatter")
    text = logs.faust_logging_config(SimpleNamespace(log_level="warning", log_format="text"))
    assert text["loggers"]["faust.topics"]["level"] == "WARNING"


def test_quiet_kafka_keeps_librdkafka_lines_off_stderr(capsys: object) -> None:
    """After quiet_kafka(), a warning on the latch.kafka logger (where kafka_config sends
    librdkafka's lines) reaches no handler that prints."""
    settings = logs.kafka_config({"bootstrap.servers": "127.0.0.1:1"})
    assert settings["logger"].name == logs.KAFKA_LOGGER
    logs.quiet_kafka()
    logging.getLogger(logs.KAFKA_LOGGER).warning("FAIL|rdkafka#producer-1| connection refused")
    captured = capsys.readouterr()  # type: ignore[attr-defined]
    assert "connection refused" not in captured.out + captured.err


def test_a_real_clients_connection_failures_reach_the_logger_not_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    """A confluent-kafka producer made with kafka_config, pointed at a port where nothing
    listens: librdkafka's connection-failure lines arrive on the latch.kafka logger (served by
    poll), and after quiet_kafka() nothing of them reaches the process's stdout or stderr
    (file descriptors 1 and 2, where librdkafka writes by itself when given no logger)."""
    import socket

    from confluent_kafka import Producer

    with socket.socket() as sock:  # a port that was free a moment ago: connections refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logs.quiet_kafka()
    kafka = logging.getLogger(logs.KAFKA_LOGGER)
    keep = Keep()
    kafka.addHandler(keep)
    try:
        producer = Producer(logs.kafka_config({"bootstrap.servers": f"127.0.0.1:{port}",
                                               "reconnect.backoff.ms": 50}))
        for _ in range(40):
            producer.poll(0.05)
            if seen:
                break
        del producer
    finally:
        kafka.removeHandler(keep)
    assert any("Connection refused" in line or "failed" in line for line in seen), seen
    captured = capfd.readouterr()
    assert "rdkafka" not in captured.out + captured.err
