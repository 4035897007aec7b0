"""The send-side checks of issue 23 (items 1 and 8) without a broker: which records count as
too large for their topic, how batches are kept under the smallest limit, which aiokafka
errors refuse a record for its own sake, and the consumer's client id that names the
worker's instance."""

from __future__ import annotations

from aiokafka.errors import (  # type: ignore[import-untyped]
    KafkaConnectionError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    RecordListTooLargeError,
)
from confluent_kafka import KafkaError, KafkaException

from worker.runtime import admin, refusals
from worker.runtime.config import load_config
from worker.runtime.faust_engine.sends import refusal as _refusal
from worker.runtime.kafka_engine import instance


def test_a_record_is_over_its_topics_limit_with_its_batch_around_it() -> None:
    """A record fits when its one-record batch (value, key, headers, the batch's own bytes)
    is within the topic's limit; a topic not read takes the producer's limit."""
    limits = refusals.Limits({"small": 20_000})
    assert limits.over("small", b"r1", b"x" * 10_000) is None
    assert limits.over("small", b"r1", b"x" * 19_950) == refusals.batch_size(b"r1",
                                                                              b"x" * 19_950)
    headers = [("traceparent", b"0" * 55)]
    near = 20_000 - refusals.batch_size(b"r1", b"", headers)
    assert limits.over("small", b"r1", b"x" * near, headers) is None
    assert limits.over("small", b"r1", b"x" * (near + 1), headers) is not None
    assert limits.over("other", None, b"x" * 30_000) is None
    assert limits.limit("other") == admin.OUTPUT_MAX_BYTES


def test_batches_stay_under_the_smallest_limit_and_a_change_is_noticed() -> None:
    """The batch size is the default unless a topic takes less; updating limits says whether
    one changed."""
    limits = refusals.Limits({"a": 64 << 20, "b": 1_048_588})
    assert limits.batch_bytes(1_000_000) == 1_000_000
    assert not limits.update({"b": 1_048_588})
    assert limits.update({"b": 20_000})
    assert limits.batch_bytes(1_000_000) == 20_000
    assert limits.over("b", b"k", b"x" * 25_000) is not None


def test_only_errors_of_the_record_itself_are_refusals_in_the_faust_engine() -> None:
    """aiokafka's size errors are refusals; a connection or leadership error is the
    cluster's (the worker stops as before)."""
    assert _refusal(MessageSizeTooLargeError()) == "MSG_SIZE_TOO_LARGE"
    assert _refusal(RecordListTooLargeError()) == "RECORD_LIST_TOO_LARGE"
    assert _refusal(KafkaConnectionError()) is None
    assert _refusal(NotLeaderForPartitionError()) is None
    assert _refusal(None) is None


def test_the_consumer_client_id_names_the_instance_only_when_one_is_set() -> None:
    """With worker.instance_id the consumer's client.id is the configured client id (or
    latch-worker) and the instance; without one, librdkafka's default stays."""
    assert instance.client_id(load_config(None, env={})) is None
    assert instance.client_id(load_config(None, env={"LATCH_WORKER__INSTANCE_ID": "w-0"})) \
        == "latch-worker-w-0"
    assert instance.client_id(load_config(None, env={"LATCH_WORKER__INSTANCE_ID": "w-0",
                                                     "LATCH_KAFKA__CLIENT_ID": "gw"})) \
        == "gw-w-0"


def test_a_fenced_producers_error_hints_at_a_shared_instance_id() -> None:
    """The error a fenced worker stops with names its instance id; other errors get no
    hint."""
    config = load_config(None, env={"LATCH_WORKER__INSTANCE_ID": "w-0"})
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    try:
        raise RuntimeError("transaction") from fenced
    except RuntimeError as exc:
        assert "worker.instance_id w-0" in instance.fenced_hint(exc, config)
    assert instance.fenced_hint(KafkaException(KafkaError(KafkaError._TRANSPORT)), config) == ""
