"""``latch worker``: the configuration read, the engine chosen, its topics checked, run.

Engine-neutral: ``worker.engine`` picks the kafka engine
(:class:`~worker.runtime.kafka_engine.KafkaEngine`, decision 0011; the default, decision 0021)
or the faust engine (:class:`~worker.runtime.faust_engine.FaustEngine`), and only the chosen one is
imported, so ``worker.engine: kafka`` loads no faust (tests/runtime/unit/test_engine.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from worker.runtime import admin
from worker.runtime.config import Config, ConfigError, load_config
from worker.runtime.governance.policy_source import assembler_policy
from worker.runtime.observability import logs
from worker.runtime.observability.telemetry import TelemetryError

__all__ = ["build", "main"]


class Engine(Protocol):
    """What ``latch worker`` runs: either engine."""

    def run(self) -> int: ...


def main(argv: Sequence[str] | None = None) -> int:
    """``latch worker [--config FILE] [--faust-setting NAME=VALUE ...]``."""
    parser = argparse.ArgumentParser(prog="latch worker", description="Run the Kafka worker.")
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    parser.add_argument("--faust-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="set a faust setting directly (advanced; value parsed as YAML), "
                             "e.g. broker_session_timeout=10")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        assembler_policy(config)  # (a policy.file that cannot be used stops here, with its place)
        latch = build(config, args.faust_setting)
    # ValueError covers the faust engine's KafkaSetupError (an unsupported security setting)
    except (ConfigError, TelemetryError, admin.TopicsError, ValueError) as exc:
        print(f"latch worker: {exc}", file=sys.stderr)
        return 2
    except KafkaException as exc:
        print(f"latch worker: Kafka error: {exc.args[0].str()}", file=sys.stderr)
        return 1
    return latch.run()


def build(config: Config, faust_settings: Sequence[str] = ()) -> Engine:
    """The engine ``config`` selects, its topics checked; only its own modules imported."""
    if config.worker.engine == "kafka":
        return _kafka_engine(config, faust_settings)
    from worker.runtime.faust_engine import FaustEngine

    latch = FaustEngine(config, _parse_settings(faust_settings))
    _check_topics(config)
    return latch


def _kafka_engine(config: Config, faust_settings: Sequence[str]) -> Engine:
    """``worker.engine: kafka`` (decision 0011): every topic must exist, the changelog too
    (this engine does not create it); faust settings do not apply."""
    from worker.runtime import kafka_engine

    if faust_settings:
        print("latch worker: the kafka engine ignores --faust-setting (set librdkafka "
              "settings under kafka:)", file=sys.stderr)
    _check_topics(config, changelog=True)
    return kafka_engine.build(config)


def _parse_settings(pairs: Sequence[str]) -> dict[str, Any]:
    settings = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--faust-setting {pair!r}: expected NAME=VALUE")
        settings[name] = yaml.safe_load(text)
    return settings


def _check_topics(config: Config, changelog: bool = False) -> None:
    """Fail fast on a missing topic (a send to it would wait) or on events, control or heads
    changelog partitions that differ (runs would not be co-partitioned). The changelog may
    be missing: faust creates it, as it creates its leader topic when that is missing (made
    by ``latch topics create`` since issue 34, not by an older one)."""
    settings: dict[str, str | int | float | bool] = {**config.kafka.confluent_config()}
    unused = {config.topics.results, config.topics.journal, admin.faust_leader(config)} | (
        set() if changelog else {admin.heads_changelog(config)})
    required = [s.name for s in admin.specs(config) if s.name not in unused]
    admin.verify(AdminClient(logs.kafka_config(settings)), required, admin.copartitioned(config))
