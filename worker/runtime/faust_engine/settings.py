"""The faust engine's settings: faust's app settings from the configuration, and the lean
Monitor the app gets when faust's web is off."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from faust.sensors import Monitor
from faust.types import TP

from worker.runtime import admin
from worker.runtime.config import Config
from worker.runtime.faust_engine import kafka_io

__all__ = ["LeanMonitor", "app_settings"]


class LeanMonitor(Monitor):
    """faust's Monitor without its per-message statistics (message and event counts, times
    in and out), which only faust's web shows: four calls per record less. It keeps each
    partition's last inbound time, which faust's consumer reads for its "slow processing"
    warnings; everything else of the Monitor (commits, sends, assignments) is unchanged."""

    def on_message_in(self, tp: TP, offset: int, message: Any) -> None:
        pass

    def on_stream_event_in(self, tp: TP, offset: int, stream: Any, event: Any) -> None:
        self.stream_inbound_time[tp] = time.monotonic()

    def on_stream_event_out(self, tp: TP, offset: int, stream: Any, event: Any,
                            state: Any = None) -> None:
        pass

    def on_message_out(self, tp: TP, offset: int, message: Any) -> None:
        pass


def app_settings(config: Config, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """faust settings from the configuration, then ``overrides`` (``--faust-setting``)."""
    worker, kafka = config.worker, config.kafka
    settings: dict[str, Any] = {
        "broker": [f"kafka://{server}" for server in kafka_io.servers(kafka)],
        "broker_credentials": kafka_io.faust_credentials(kafka),
        "store": worker.store,
        "topic_partitions": config.topics.partitions,
        "topic_replication_factor": config.topics.replication_factor,
        "processing_guarantee": "at_least_once",
        "consumer_auto_offset_reset": "earliest",
        # faust's web server shows run ids and heads to anyone who connects: off unless
        # asked for, and then on this host only unless configured otherwise.
        "web_enabled": worker.web_enabled and worker.web_port > 0,
        "web_bind": worker.web_host,
        "web_port": worker.web_port or 6066,
        "autodiscover": False,
        # A takeover rebuilds from the events log, so the heads table needs no standby; and
        # faust's standby recovery can crash a worker after a broker restart (docs/chaos.md).
        "table_standby_replicas": 0,
        # faust's default is 60 s: that long before a killed worker's partitions move
        # (docs/recovery.md). --faust-setting overrides it.
        "broker_session_timeout": 15,
        "producer_max_request_size": admin.OUTPUT_MAX_BYTES,
    }
    if kafka.client_id:
        settings["broker_client_id"] = kafka.client_id
    return settings | dict(overrides)
