"""Logs: one JSON object per line with context fields, no exception messages, and the Kafka
clients' lines kept off a terminal tool's output."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from types import SimpleNamespace

from worker.runtime import logs

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
