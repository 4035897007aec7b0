"""The faust engine's Kafka plumbing that is not faust
(``worker/runtime/faust_engine/kafka_io.py``), without a broker: latch.yaml's librdkafka-named
``kafka`` settings as aiokafka's options (an unsupported protocol or mechanism refused by
name, pass-through settings listed as ignored), and the plain reads of the log with a fake
aiokafka consumer: a bounded range, where a group resumes, the end offsets; each consumer
stopped, even when it cannot start. Against the broker they run in every integration test of
the faust engine (``test_worker.py``)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from worker.runtime.config import load_config
from worker.runtime.faust_engine import kafka_io


def _kafka(**settings: str) -> Any:
    return load_config(None, env={f"LATCH_KAFKA__{k.upper()}": v
                                  for k, v in settings.items()}).kafka


def test_plaintext_options_name_each_server_and_the_client() -> None:
    """Plaintext: the bootstrap servers as a list (blanks dropped), the protocol, the client
    id when one is set; no TLS, no SASL."""
    options = kafka_io.aiokafka_options(_kafka(bootstrap_servers="b1:9092, ,b2:9093",
                                               client_id="latch-7"))
    assert options == {"bootstrap_servers": ["b1:9092", "b2:9093"],
                       "security_protocol": "PLAINTEXT", "client_id": "latch-7"}


def test_sasl_over_tls_options_carry_the_mechanism_credentials_and_a_context() -> None:
    """SASL_SSL (in any case): a TLS context and the SASL mechanism, upper-cased, with the
    username and password; SASL_PLAINTEXT has no TLS context."""
    options = kafka_io.aiokafka_options(replace(_kafka(
        security_protocol="SASL_SSL", sasl_mechanism="scram-sha-512", sasl_username="u",
        sasl_password="p"), security_protocol="sasl_ssl"))
    assert options["security_protocol"] == "SASL_SSL"
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert (options["sasl_mechanism"], options["sasl_plain_username"],
            options["sasl_plain_password"]) == ("SCRAM-SHA-512", "u", "p")
    plain = kafka_io.aiokafka_options(_kafka(security_protocol="SASL_PLAINTEXT"))
    assert plain["sasl_mechanism"] == "PLAIN" and "ssl_context" not in plain


@pytest.mark.parametrize(("settings", "named"), [
    # (latch.yaml's schema refuses it first; a settings object made otherwise)
    ({"security_protocol": "KERBEROS"}, "kafka.security_protocol KERBEROS"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "kafka.sasl_mechanism GSSAPI"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER"},
     "kafka.sasl_mechanism OAUTHBEARER"),
])
def test_what_the_clients_cannot_do_is_refused_by_name(settings: dict[str, str],
                                                        named: str) -> None:
    """An unknown protocol, and GSSAPI or OAUTHBEARER, raise :class:`KafkaSetupError` naming
    the setting and its value, for aiokafka's options and faust's credentials alike."""
    kafka = replace(_kafka(), **settings)
    with pytest.raises(kafka_io.KafkaSetupError, match=named):
        kafka_io.aiokafka_options(kafka)
    with pytest.raises(kafka_io.KafkaSetupError, match=named):
        kafka_io.faust_credentials(kafka)


def test_pass_through_settings_are_listed_as_ignored() -> None:
    """librdkafka settings with no aiokafka name (``kafka.extra``) are listed, dotted and
    sorted, for the worker's warning at start; named settings are not."""
    kafka = _kafka(socket_keepalive_enable="true", queued_max_messages_kbytes="1024",
                   client_id="c")
    assert kafka_io.ignored_settings(kafka) == ["queued.max.messages.kbytes",
                                                "socket.keepalive.enable"]
    assert kafka_io.ignored_settings(_kafka()) == []


class _Consumer:
    """aiokafka's consumer over one fake log: ``records`` by partition (offsets may skip, as
    transaction markers make them), ``committed`` by partition, ``first`` the log start;
    its options kept, and whether it stopped."""

    def __init__(self, records: dict[int, Sequence[int]], committed: dict[int, int | None],
                 first: int = 0, fail_start: bool = False, **options: Any) -> None:
        self.records, self.committed_at, self.first = records, committed, first
        self.fail_start, self.options = fail_start, options
        self.stopped = False
        self.positions: dict[Any, int] = {}

    async def start(self) -> None:
        if self.fail_start:
            raise ConnectionError("broker away")

    async def stop(self) -> None:
        self.stopped = True

    def assign(self, tps: list[Any]) -> None:
        self.positions = {tp: self.first for tp in tps}

    def seek(self, tp: Any, offset: int) -> None:
        self.positions[tp] = max(offset, self.first)

    async def position(self, tp: Any) -> int:
        return self.positions[tp]

    async def getmany(self, tp: Any, timeout_ms: int) -> dict[Any, list[Any]]:
        at = self.positions[tp]
        batch = [SimpleNamespace(offset=o) for o in self.records[tp.partition] if o >= at][:2]
        if batch:
            self.positions[tp] = batch[-1].offset + 1
        return {tp: batch}

    async def committed(self, tp: Any) -> int | None:
        return self.committed_at.get(tp.partition)

    async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.first for tp in tps}

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: max(self.records[tp.partition], default=-1) + 1 for tp in tps}


def _log(monkeypatch: pytest.MonkeyPatch, **log: Any) -> list[_Consumer]:
    """aiokafka's consumer replaced by :class:`_Consumer` over ``log``; the consumers made."""
    made: list[_Consumer] = []

    def consumer(**options: Any) -> _Consumer:
        made.append(_Consumer(**log, **options))
        return made[-1]

    monkeypatch.setattr(kafka_io, "AIOKafkaConsumer", consumer)
    return made


def test_a_range_is_read_in_order_up_to_its_end_and_committed_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_range(2, 7)`` yields the records from offset 2 up to, not including, 7 (the
    offsets a marker took are absent), with a consumer of no group at ``read_committed``,
    stopped once the range is read."""
    made = _log(monkeypatch, records={0: [0, 1, 2, 4, 5, 7, 8]}, committed={})

    async def read() -> list[int]:
        return [r.offset async for r in kafka_io.read_range({"x": 1}, "ev", 0, 2, 7)]

    assert asyncio.run(read()) == [2, 4, 5]
    (consumer,) = made
    assert consumer.options["group_id"] is None
    assert consumer.options["isolation_level"] == "read_committed"
    assert consumer.options["x"] == 1 and consumer.stopped


def test_a_range_below_the_log_start_begins_at_the_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets deleted by retention are skipped: the read begins at the log start."""
    _log(monkeypatch, records={0: [3, 4, 5]}, committed={}, first=3)

    async def read() -> list[int]:
        return [r.offset async for r in kafka_io.read_range({}, "ev", 0, 0, 5)]

    assert asyncio.run(read()) == [3, 4]


@pytest.mark.parametrize(("committed", "first", "resume"), [
    (12, 0, 12),    # the group's committed offset
    (None, 0, 0),   # none committed: the log start
    (None, 5, 5),
    (3, 5, 5),      # committed, then deleted by retention: the log start
])
def test_a_group_resumes_at_its_committed_offset_or_the_log_start(
        monkeypatch: pytest.MonkeyPatch, committed: int | None, first: int,
        resume: int) -> None:
    """``resume_offset``: the group's committed offset, or the log start when it has none or
    retention deleted it; asked by a consumer of that group that assigns (never joins)."""
    made = _log(monkeypatch, records={1: []}, committed={1: committed}, first=first)
    assert asyncio.run(kafka_io.resume_offset({}, "app", "ev", 1)) == resume
    assert made[0].options["group_id"] == "app" and made[0].stopped


def test_end_offsets_of_each_partition_and_none_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """``end_offsets``: each partition's next offset to be written; no partition asked, no
    consumer made."""
    made = _log(monkeypatch, records={0: [0, 1, 2], 1: []}, committed={})
    assert asyncio.run(kafka_io.end_offsets({}, "ctl", [])) == {}
    assert made == []
    assert asyncio.run(kafka_io.end_offsets({}, "ctl", [0, 1])) == {0: 3, 1: 0}
    assert made[0].stopped


def test_a_consumer_that_cannot_start_is_stopped_and_the_error_raised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker is away: the error reaches the caller (the control repair retries at its
    next interval), and the consumer is stopped all the same (no connection left open)."""
    made = _log(monkeypatch, records={0: [0]}, committed={}, fail_start=True)
    with pytest.raises(ConnectionError):
        asyncio.run(kafka_io.resume_offset({}, "app", "ev", 0))
    with pytest.raises(ConnectionError):
        asyncio.run(kafka_io.end_offsets({}, "ev", [0]))
    assert [c.stopped for c in made] == [True, True]
