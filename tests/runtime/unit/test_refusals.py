"""The send-side checks of issue 23 (items 1 and 8) without a broker
(worker/runtime/refusals.py): which records count as too large for their topic, and how
batches are kept under the smallest limit. Which aiokafka errors refuse a record for its own
sake: ``test_faust_engine_sends.py``; the client id that names the worker's instance:
``test_kafka_engine_instance.py``."""

from __future__ import annotations

from worker.runtime import admin, refusals


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
