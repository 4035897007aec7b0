"""Envelopes that cannot be applied go to the dead-letter topic (rule 9).

Every :class:`~worker.core.model.DlqReason` is reached through ``Assembler.feed_record``,
as the worker reaches it, and each DLQ record keeps the original bytes (``original_b64``)
and key (``source.key_b64``) so that nothing the gateway sent is lost. Envelopes that are
merely late or repeated are not contract breaks: they are ignored and counted.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    CHAT,
    EMPTY_SCHEMA,
    PROVIDERS,
    cancel,
    chat_chunk,
    chat_tool_delta,
    committed,
    decision,
    dlq,
    feed,
    provider_event,
    provider_run,
    run_start,
    stream_end,
    stream_error,
    tools_for,
)

from worker.core import Assembler, AssembleSettings, DlqReason, Topic, decode
from worker.core.envelope import Cancel, ProviderEvent, Rejected, RunStart, StreamEnd, Tick
from worker.core.settings import ApprovalSettings

TOOLS = {"noop": EMPTY_SCHEMA, "gated": EMPTY_SCHEMA}
#: ``gated``'s calls wait for approval (docs/policies.md, "Approvals").
APPROVALS = ApprovalSettings(require_approval=("gated",))
SECRET = "hunter2-SECRET"


def start(run_id: str = "r1", seq: int = 0, **kw: Any) -> dict[str, Any]:
    return run_start(run_id, CHAT, tools_for(CHAT, TOOLS), seq=seq, **kw)


def finished_run(asm: Assembler, run_id: str = "r1") -> list[dict[str, Any]]:
    envs = provider_run(CHAT, run_id, TOOLS, [("c1", "noop", "{}")])
    feed(asm, envs)
    return envs


def raw(doc: Any) -> bytes:
    return orjson.dumps(doc)


#: (reason, setup, key, value): feeding ``value`` under ``key`` after ``setup(assembler)``
#: must give exactly one DLQ record with ``reason``.
Setup = Callable[[Assembler], Any]


def nothing(asm: Assembler) -> None:
    return None


def open_run(asm: Assembler) -> None:
    feed(asm, [start()])


def finished(asm: Assembler) -> None:
    finished_run(asm)


def held(asm: Assembler) -> None:
    """Run r1 ended, its call c1 waiting for approval (its final message waits too)."""
    feed(asm, provider_run(CHAT, "r1", TOOLS, [("c1", "gated", "{}")]))


def streaming(asm: Assembler) -> None:
    """Run r1 open, its call c1 still streaming."""
    feed(asm, [start(), provider_event("r1", 1, chat_chunk([chat_tool_delta(0, "c1", "gated",
                                                                            "{")]))])


CASES: list[tuple[str, DlqReason, Setup, bytes | None, bytes]] = [
    ("not_json", DlqReason.UNDECODABLE, nothing, None, b"not json"),
    ("invalid_utf8", DlqReason.UNDECODABLE, nothing, b"r1", b'{"v": 1, "run_id": "\xff"}'),
    ("truncated_json", DlqReason.UNDECODABLE, nothing, None, b'{"v": 1, "run_id": "r1"'),
    ("empty", DlqReason.UNDECODABLE, nothing, None, b""),
    ("array", DlqReason.INVALID_ENVELOPE, nothing, None, b"[1, 2]"),
    ("string", DlqReason.INVALID_ENVELOPE, nothing, None, b'"run.start"'),
    ("no_run_id", DlqReason.INVALID_ENVELOPE, nothing, None,
     raw({"v": 1, "seq": 0, "type": "stream.end"})),
    ("empty_run_id", DlqReason.INVALID_ENVELOPE, nothing, None,
     raw({"v": 1, "run_id": "", "seq": 0, "type": "stream.end"})),
    ("run_id_not_string", DlqReason.INVALID_ENVELOPE, nothing, None,
     raw({"v": 1, "run_id": 7, "seq": 0, "type": "stream.end"})),
    ("negative_seq", DlqReason.INVALID_ENVELOPE, open_run, None,
     raw({"v": 1, "run_id": "r1", "seq": -1, "type": "stream.end"})),
    ("string_seq", DlqReason.INVALID_ENVELOPE, open_run, None,
     raw({"v": 1, "run_id": "r1", "seq": "1", "type": "stream.end"})),
    ("bool_seq", DlqReason.INVALID_ENVELOPE, open_run, None,
     raw({"v": 1, "run_id": "r1", "seq": True, "type": "stream.end"})),
    ("float_seq", DlqReason.INVALID_ENVELOPE, open_run, None,
     raw({"v": 1, "run_id": "r1", "seq": 1.5, "type": "stream.end"})),
    ("no_seq", DlqReason.INVALID_ENVELOPE, open_run, None,
     raw({"v": 1, "run_id": "r1", "type": "provider.event", "event": {}})),
    ("unknown_type", DlqReason.INVALID_ENVELOPE, open_run, None,
     raw({"v": 1, "run_id": "r1", "seq": 1, "type": "stream.pause"})),
    ("event_not_object", DlqReason.INVALID_ENVELOPE, open_run, None,
     raw({"v": 1, "run_id": "r1", "seq": 1, "type": "provider.event", "event": [SECRET]})),
    ("tools_not_array", DlqReason.INVALID_ENVELOPE, nothing, None,
     raw({**start(), "tools": {"noop": {}}})),
    ("limits_not_object", DlqReason.INVALID_ENVELOPE, nothing, None,
     raw({**start(), "limits": [8]})),
    ("negative_limit", DlqReason.INVALID_ENVELOPE, nothing, None,
     raw(start(limits={"max_tool_calls": -1}))),
    ("tenant_not_string", DlqReason.INVALID_ENVELOPE, nothing, None, raw(start(tenant=None)
                                                                          | {"tenant": 5})),
    ("negative_ts", DlqReason.INVALID_ENVELOPE, nothing, None, raw({**start(), "ts": -5})),
    ("string_ts", DlqReason.INVALID_ENVELOPE, nothing, None, raw({**start(), "ts": "now"})),
    ("tick_without_ts", DlqReason.INVALID_ENVELOPE, nothing, None, raw({"v": 1, "type": "tick"})),
    ("malformed_provider_event", DlqReason.INVALID_ENVELOPE, open_run, b"r1",
     raw(provider_event("r1", 1, {"choices": [{"delta": {"tool_calls": [SECRET]}}]}))),
    ("version_2", DlqReason.UNSUPPORTED_VERSION, nothing, None, raw({**start(), "v": 2})),
    ("version_missing", DlqReason.UNSUPPORTED_VERSION, nothing, None,
     raw({k: v for k, v in start().items() if k != "v"})),
    ("version_string", DlqReason.UNSUPPORTED_VERSION, nothing, None, raw({**start(), "v": "1"})),
    ("version_true", DlqReason.UNSUPPORTED_VERSION, nothing, None, raw({**start(), "v": True})),
    ("key_mismatch", DlqReason.KEY_MISMATCH, nothing, b"r2", raw(start("r1"))),
    ("key_mismatch_on_event", DlqReason.KEY_MISMATCH, open_run, b"r2",
     raw(provider_event("r1", 1, chat_chunk(content="hi")))),
    ("key_mismatch_on_cancel", DlqReason.KEY_MISMATCH, open_run, b"R1", raw(cancel("r1"))),
    ("unknown_provider", DlqReason.UNKNOWN_PROVIDER, nothing, None,
     raw({**start(), "provider": "cohere.chat"})),
    ("missing_provider", DlqReason.UNKNOWN_PROVIDER, nothing, None,
     raw({k: v for k, v in start().items() if k != "provider"})),
    ("unhashable_provider", DlqReason.UNKNOWN_PROVIDER, nothing, None,
     raw({**start(), "provider": ["openai.chat"]})),
    ("unknown_run_event", DlqReason.UNKNOWN_RUN, nothing, b"r9",
     raw(provider_event("r9", 1, chat_chunk(content="hi")))),
    ("unknown_run_end", DlqReason.UNKNOWN_RUN, open_run, None, raw(stream_end("r9", 1))),
    ("unknown_run_error", DlqReason.UNKNOWN_RUN, nothing, None, raw(stream_error("r9", 1))),
    ("second_start_open", DlqReason.DUPLICATE_RUN_START, open_run, b"r1", raw(start(seq=5))),
    ("second_start_finished", DlqReason.DUPLICATE_RUN_START, finished, None,
     raw(start(seq=99))),
    # issue 26: approvals
    ("decision_unknown_call", DlqReason.UNKNOWN_CALL, held, b"r1",
     raw(decision("r1", "approve", "c9"))),
    ("decision_not_pending", DlqReason.CALL_NOT_PENDING, streaming, b"r1",
     raw(decision("r1", "approve", "c1"))),
    ("decision_already_decided", DlqReason.CALL_ALREADY_DECIDED, finished, b"r1",
     raw(decision("r1", "deny", "c1"))),
    ("decision_unknown_run", DlqReason.UNKNOWN_RUN, nothing, b"r9",
     raw(decision("r9", "approve", "c1"))),
    ("edit_without_arguments", DlqReason.INVALID_ENVELOPE, held, b"r1",
     raw(decision("r1", "edit", "c1"))),
    ("decision_without_by", DlqReason.INVALID_ENVELOPE, held, b"r1",
     raw({**decision("r1", "approve", "c1"), "by": ""})),
    ("event_while_waiting", DlqReason.RUN_FINISHED, held, b"r1",
     raw(provider_event("r1", 99, chat_chunk(content="late")))),
]

#: (name, setup, key, value): ``value`` reaches a finished run. It is no DLQ record of its
#: own: it is counted, and the run's late events are summed up in one ``run_finished`` record
#: (decision 0015).
LATE_CASES: list[tuple[str, Setup, bytes | None, bytes]] = [
    ("event_after_finish", finished, b"r1",
     raw(provider_event("r1", 99, chat_chunk([chat_tool_delta(0, "c2", "noop", "{}")])))),
    ("error_after_finish", finished, None, raw(stream_error("r1", 99))),
]


def make(settings: dict[str, Any] | None = None) -> Assembler:
    return Assembler(AssembleSettings(**(settings or {"max_open_runs": 1,
                                                      "approvals": APPROVALS})))


@pytest.mark.parametrize("reason, setup, key, value", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_dlq_record(reason: DlqReason, setup: Setup, key: bytes | None, value: bytes) -> None:
    """The record goes to the DLQ, alone, with its reason, its original bytes in
    ``original_b64`` and its key in ``source.key_b64`` (and as the record key), a detail that
    quotes no provider text, and a ``dlq_<reason>`` count; the open run is untouched."""
    asm = make()
    setup(asm)
    open_before = asm.open_run_ids()
    before = Counter(asm.stats)
    emits = asm.feed_record(key, value)
    assert [e.topic for e in emits] == [Topic.DLQ]
    [record] = dlq(emits)
    assert record["reason"] == reason.value
    assert base64.b64decode(record["original_b64"]) == value
    expected_key = None if key is None else base64.b64encode(key).decode()
    assert record["source"]["key_b64"] == expected_key
    assert emits[0].key == (None if key is None else key.decode("utf-8", "replace"))
    assert SECRET not in record["detail"]
    assert record["v"] == 1
    assert (asm.stats - before) == Counter({f"dlq_{reason.value}": 1})
    assert asm.open_run_ids() == open_before


@pytest.mark.parametrize("setup, key, value", [c[1:] for c in LATE_CASES],
                         ids=[c[0] for c in LATE_CASES])
def test_late_event_is_summed_up(setup: Setup, key: bytes | None, value: bytes) -> None:
    """An envelope of a finished run gives no DLQ record of its own: it is counted
    (``late_events``), and the run's one summary (reason ``run_finished``, keyed by the run id,
    no original bytes, ``late`` with the count, seqs and offsets) says it came; the open runs
    are untouched (decision 0015)."""
    asm = make()
    setup(asm)
    open_before = asm.open_run_ids()
    before = Counter(asm.stats)
    assert asm.feed_record(key, value) == []
    assert (asm.stats - before) == Counter({"late_events": 1})
    emits = asm.summarise_late()
    assert [(e.topic, e.key) for e in emits] == [(Topic.DLQ, "r1")]
    [record] = dlq(emits)
    assert record["reason"] == DlqReason.RUN_FINISHED.value and record["run_id"] == "r1"
    assert record["original_b64"] == ""
    assert record["source"]["key_b64"] == base64.b64encode(b"r1").decode()
    assert record["late"] == {"count": 1, "first_seq": 99, "last_seq": 99,
                              "first_offset": None, "last_offset": None}
    assert SECRET not in record["detail"] and record["v"] == 1
    assert asm.open_run_ids() == open_before


#: Written by the worker (``worker.runtime.faust_engine.engine``) when the core itself raises,
#: or when Kafka refuses an output record (``worker.runtime.refusals``): the core must never
#: produce them, so no input may reach them through ``feed_record``.
WORKER_ONLY = {DlqReason.INTERNAL_ERROR, DlqReason.OUTPUT_REFUSED}
#: Reasons given only with approvers configured (``Assembler.approvals.approvers``): each is
#: reached in tests/core/unit/test_approvers.py and tests/runtime/unit/test_approver_policy.py.
SIGNED_ONLY = {DlqReason.APPROVAL_UNSIGNED, DlqReason.APPROVER_UNKNOWN_KEY,
               DlqReason.APPROVAL_BAD_SIGNATURE, DlqReason.APPROVER_NOT_ALLOWED}
#: Reasons given only with the result latch on: each is reached in
#: tests/core/unit/test_pairing.py.
RESULTS_ONLY = {DlqReason.RESULT_DUPLICATE, DlqReason.RESULT_LATE}


def test_every_dlq_reason_is_reached() -> None:
    """Every DLQ reason the core can give has a case above: adding a reason without a case
    fails this test."""
    assert ({c[1] for c in CASES} | {DlqReason.RUN_FINISHED} | SIGNED_ONLY | RESULTS_ONLY) == (
        set(DlqReason) - WORKER_ONLY)
    assert LATE_CASES  # run_finished: the summary of late events (test_late_event_is_summed_up)
    assert {c[1] for c in CASES}.isdisjoint(WORKER_ONLY)


def test_dlq_record_names_the_run_when_known() -> None:
    """A contract break in a readable envelope names its run; undecodable bytes cannot."""
    asm = make()
    [bad] = dlq(asm.feed_record(b"r2", raw(start("r1"))))
    assert bad["run_id"] == "r1"
    [junk] = dlq(asm.feed_record(None, b"\x00"))
    assert junk["run_id"] is None


def test_source_coordinates_are_kept() -> None:
    """The caller's source coordinates (topic, partition, offset) are kept beside the key."""
    asm = make()
    source = {"topic": "llm.stream.events", "partition": 3, "offset": 42}
    [record] = dlq(asm.feed_record(b"k", b"nope", source=source))
    assert record["source"] == {**source, "key_b64": base64.b64encode(b"k").decode()}
    assert source == {"topic": "llm.stream.events", "partition": 3, "offset": 42}


def test_binary_key_is_preserved_exactly() -> None:
    """A key that is not UTF-8 is preserved byte for byte in ``source.key_b64``."""
    key = b"\xff\x00r1"
    [record] = dlq(make().feed_record(key, raw(start("r1"))))
    assert base64.b64decode(record["source"]["key_b64"]) == key
    assert record["reason"] == "key_mismatch"


def test_matching_key_is_accepted() -> None:
    """A key equal to the run id (the normal case) is no mismatch."""
    asm = make()
    envs = provider_run(CHAT, "r1", TOOLS, [("c1", "noop", "{}")])
    emits = [e for env in envs for e in asm.feed_record(b"r1", raw(env))]
    assert dlq(emits) == [] and len(committed(emits)) == 1


def test_open_run_limit_ends_the_oldest_run_instead_of_refusing() -> None:
    """With ``max_open_runs: 1`` a second ``run.start`` is no DLQ record: it is accepted, and
    the first run is ended (final status ``failed``) to make room (tests/core/unit/test_assembler.py
    holds the whole policy)."""
    asm = make()
    feed(asm, [start("r1")])
    emits = feed(asm, [start("r2")])
    assert dlq(emits) == [] and [e.value["status"] for e in emits] == ["failed", "failed"]
    # Latch ended it: the gateway is told (``run.ended``) before its final (decision 0015).
    assert [(e.topic, e.value["run_id"]) for e in emits] == [(Topic.RUN_ENDED, "r1"),
                                                             (Topic.FINAL, "r1")]
    assert emits[0].value["reason"] == "budget_exceeded"
    assert asm.open_run_ids() == ["r2"]


def test_run_ended_at_the_limit_is_finished() -> None:
    """A run ended to make room is finished: its later events are counted, and summed up
    in one ``run_finished`` record (decision 0015)."""
    asm = make()
    feed(asm, [start("r1"), start("r2")])
    late = [provider_event("r1", n, chat_chunk(content="x")) for n in (1, 2)]
    assert dlq(feed(asm, late)) == []
    [record] = dlq(asm.summarise_late())
    assert record["reason"] == "run_finished" and record["late"]["count"] == 2


# -- late and repeated envelopes are not contract breaks -------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_redelivered_run_start_is_a_duplicate(provider: str) -> None:
    """``run.start`` delivered again with the same seq (open or finished run) is ignored
    and counted, never a DLQ record."""
    asm = make()
    envs = provider_run(provider, "r1", TOOLS, [("c1", "noop", "{}")])
    assert feed(asm, [envs[0], envs[0]]) == []
    feed(asm, envs[1:])
    assert feed(asm, [envs[0]]) == []
    assert asm.stats["duplicates"] == 2


def test_stream_end_after_finish_is_ignored() -> None:
    """A ``stream.end`` with a new seq after the provider's own end is ignored, not DLQ'd."""
    asm = make()
    feed(asm, provider_run(ANTHROPIC, "r1", TOOLS, [("c1", "noop", "{}")], end=False))
    before = sum(asm.stats.values())
    assert feed(asm, [stream_end("r1", 50)]) == []
    assert sum(asm.stats.values()) == before + 1


def test_events_after_cancel_are_ignored() -> None:
    """After a cancel, any envelope of the run is ignored (not DLQ'd) and counted."""
    asm = make()
    feed(asm, [start("r1"), cancel("r1")])
    late = [provider_event("r1", 1, chat_chunk(content="x")), stream_end("r1", 2),
            stream_error("r1", 3), cancel("r1")]
    before = Counter(asm.stats)
    assert feed(asm, late) == []
    assert sum((asm.stats - before).values()) == len(late)


def test_remembered_runs_are_bounded() -> None:
    """Finished runs are remembered up to ``remember_finished_runs``; beyond that the
    oldest is forgotten (its late events become ``unknown_run``), while the late events of
    the remembered ones are summed up as ``run_finished`` (decision 0015)."""
    asm = make({"remember_finished_runs": 2})
    for run_id in ("a", "b", "c"):
        finished_run(asm, run_id)
    late = {run_id: dlq(feed(asm, [provider_event(run_id, 99, chat_chunk(content="x"))]))
            for run_id in ("a", "b", "c")}
    assert [r["reason"] for r in late["a"]] == ["unknown_run"]
    assert late["b"] == late["c"] == []
    summaries = dlq(asm.summarise_late())
    assert [(r["run_id"], r["reason"]) for r in summaries] == [("b", "run_finished"),
                                                               ("c", "run_finished")]


# -- decode ----------------------------------------------------------------------------------


def test_decode_types() -> None:
    """``decode`` turns each envelope type into its value type, and never raises."""
    assert isinstance(decode(None, raw(start())), RunStart)
    assert isinstance(decode(None, raw(provider_event("r1", 1, {}))), ProviderEvent)
    assert isinstance(decode(None, raw(stream_end("r1", 2))), StreamEnd)
    assert isinstance(decode(None, raw(cancel("r1"))), Cancel)
    assert decode(None, b'{"v": 1, "type": "tick", "ts": 5}') == Tick(5)
    assert isinstance(decode(None, b"\xff"), Rejected)


def test_run_start_fields() -> None:
    """``run.start`` keeps provider, tenant, tools and the run's call limit."""
    env = decode(b"r1", raw(start(limits={"max_tool_calls": 3}, ts=7)))
    assert isinstance(env, RunStart)
    assert (env.run_id, env.seq, env.ts, env.provider, env.tenant, env.max_tool_calls) == (
        "r1", 0, 7, CHAT, "t1", 3)


def test_cancel_reason_is_bounded() -> None:
    """A cancel's reason (control input) is kept bounded, and a non-string one is replaced."""
    env = decode(None, raw({**cancel("r1"), "reason": "x" * 10_000}))
    assert isinstance(env, Cancel) and len(env.reason) <= 64
    env = decode(None, raw({**cancel("r1"), "reason": {"a": 1}}))
    assert isinstance(env, Cancel) and env.reason == "cancelled"


def test_tick_needs_no_run_or_key_match() -> None:
    """A tick is the worker's own marker: no run id, any key."""
    asm = make()
    assert asm.feed_record(b"__latch_tick__", b'{"v": 1, "type": "tick", "ts": 1}') == []
