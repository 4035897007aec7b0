"""Logging: human lines or one JSON object per line, and the Kafka clients' logs through it.

* ``worker.log_format: json``: :class:`JsonFormatter` writes ``{"ts", "level", "logger",
  "message"}`` plus ``run_id``, ``partition``, ``offset`` and ``topic`` when the call passed
  them (``log.info(..., extra={"partition": 3, "offset": 41})``). An exception is written as
  its type and its frames, never its message (a message may quote a record).
* librdkafka (confluent-kafka clients) logs to the ``latch.kafka`` logger (:func:`kafka_config`
  adds ``logger=`` to a client's settings) instead of writing to stderr itself; aiokafka and
  faust log through ``logging`` already. :func:`quiet_kafka` keeps the ``latch.kafka`` lines out
  of a terminal tool's output (``latch demo``).
* faust logs each record it sends at DEBUG, value included: its ``faust.topics`` logger is held
  at INFO whatever ``worker.log_level`` says, so that argument text never reaches a log.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from typing import Any

__all__ = ["KAFKA_LOGGER", "JsonFormatter", "faust_logging_config", "kafka_config",
           "quiet_kafka", "where"]

#: Where librdkafka's lines go.
KAFKA_LOGGER = "latch.kafka"
#: Loggers that log record contents below INFO.
_CONTENT_LOGGERS = ("faust.topics", "faust.transport.producer", "aiokafka.producer")
_CONTEXT = ("run_id", "partition", "offset", "topic")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; see the module docstring for the fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                  + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _CONTEXT:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = record.exc_info[0].__name__
            entry["frames"] = "".join(traceback.format_tb(record.exc_info[2]))
        return json.dumps(entry, default=str)


def where(topic: str | None = None, partition: int | None = None, offset: int | None = None,
          run_id: str | None = None) -> dict[str, Any]:
    """The ``extra`` of a log call about a record or a run (the JSON lines' context fields)."""
    return {"topic": topic, "partition": partition, "offset": offset, "run_id": run_id}


def faust_logging_config(worker: Any) -> dict[str, Any]:
    """The ``logging.config.dictConfig`` that faust's worker installs for ``worker`` (the
    ``worker`` settings: ``log_format``, ``log_level``)."""
    level = str(worker.log_level).upper()
    formatter = ({"()": f"{__name__}.JsonFormatter"} if worker.log_format == "json" else
                 {"format": "[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s"})
    floor = max(logging.getLevelName(level), logging.INFO)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"latch": formatter},
        "handlers": {"latch": {"class": "logging.StreamHandler", "formatter": "latch",
                               "stream": "ext://sys.stdout", "level": level}},
        "root": {"level": level, "handlers": ["latch"]},
        "loggers": {name: {"level": logging.getLevelName(floor)}
                    for name in _CONTENT_LOGGERS},
    }


def kafka_config(settings: dict[str, Any]) -> dict[str, Any]:
    """A confluent-kafka client's settings whose librdkafka lines go to ``latch.kafka``."""
    return {**settings, "logger": logging.getLogger(KAFKA_LOGGER)}


def quiet_kafka() -> None:
    """Keep librdkafka's lines (``latch.kafka``) out of this process's terminal output."""
    kafka = logging.getLogger(KAFKA_LOGGER)
    kafka.propagate = False
    if not kafka.handlers:
        kafka.addHandler(logging.NullHandler())
