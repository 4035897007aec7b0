"""The faust engine's settings (``worker/runtime/faust_engine/settings.py``): latch.yaml
translated into faust's app settings (brokers, credentials, store, topics, the guarantees and
time-outs the engine relies on, faust's web off), ``--faust-setting`` overrides last; and the
lean Monitor that keeps only what faust's consumer reads. The web server's defaults are pinned
in ``test_faust_engine.py``."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import faust
from faust.sensors import Monitor
from faust.types import TP

from worker.runtime import admin
from worker.runtime.config import load_config
from worker.runtime.faust_engine.settings import LeanMonitor, app_settings


def test_the_configuration_becomes_fausts_settings() -> None:
    """Each bootstrap server is a ``kafka://`` broker; the store, partitions and replication
    come from the configuration; plaintext has no credentials; the engine's own choices
    (at least once, earliest, no standby, a 15 s session, outputs up to the largest, no
    autodiscovery) are set."""
    config = load_config(None, env={
        "LATCH_KAFKA__BOOTSTRAP_SERVERS": "b1:9092, b2:9093", "LATCH_TOPICS__PARTITIONS": "6",
        "LATCH_TOPICS__REPLICATION_FACTOR": "3", "LATCH_WORKER__STORE": "rocksdb://"})
    settings = app_settings(config, {})
    assert settings["broker"] == ["kafka://b1:9092", "kafka://b2:9093"]
    assert settings["broker_credentials"] is None
    assert (settings["store"], settings["topic_partitions"],
            settings["topic_replication_factor"]) == ("rocksdb://", 6, 3)
    assert settings["processing_guarantee"] == "at_least_once"
    assert settings["consumer_auto_offset_reset"] == "earliest"
    assert settings["table_standby_replicas"] == 0
    assert settings["broker_session_timeout"] == 15
    assert settings["producer_max_request_size"] == admin.OUTPUT_MAX_BYTES
    assert settings["autodiscover"] is False
    assert "broker_client_id" not in settings


def test_a_client_id_and_sasl_credentials_reach_faust() -> None:
    """``kafka.client_id`` names faust's clients; SASL settings become faust's SASL
    credentials with the mechanism upper-cased."""
    config = load_config(None, env={
        "LATCH_KAFKA__CLIENT_ID": "latch-7", "LATCH_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "LATCH_KAFKA__SASL_MECHANISM": "scram-sha-256", "LATCH_KAFKA__SASL_USERNAME": "u",
        "LATCH_KAFKA__SASL_PASSWORD": "p"})
    settings = app_settings(config, {})
    assert settings["broker_client_id"] == "latch-7"
    credentials = settings["broker_credentials"]
    assert isinstance(credentials, faust.SASLCredentials)
    assert (credentials.username, credentials.mechanism.value) == ("u", "SCRAM-SHA-256")


def test_faust_setting_overrides_come_last() -> None:
    """``--faust-setting`` values replace the engine's (a longer session time-out) and add
    settings it does not set."""
    settings = app_settings(load_config(None, env={}),
                            {"broker_session_timeout": 60, "stream_buffer_maxsize": 1000})
    assert settings["broker_session_timeout"] == 60
    assert settings["stream_buffer_maxsize"] == 1000


def test_the_lean_monitor_keeps_only_what_the_consumer_reads() -> None:
    """An event into a stream stamps its partition's last inbound time (faust's consumer
    reads it for its "slow processing" warnings); the per-message counts faust's Monitor
    keeps for its web pages are not kept."""
    lean, full = LeanMonitor(), Monitor()
    tp = TP("ev", 0)
    message: Any = SimpleNamespace()
    before = time.monotonic()
    for monitor in (lean, full):
        monitor.on_message_in(tp, 7, message)
    lean.on_stream_event_in(tp, 7, object(), object())
    lean.on_stream_event_out(tp, 7, object(), object())
    lean.on_message_out(tp, 7, message)
    assert not hasattr(message, "time_out")
    assert lean.stream_inbound_time[tp] >= before
    assert lean.messages_received_total == 0 and lean.messages_active == 0
    assert full.messages_received_total == 1  # (what the lean one leaves out)
