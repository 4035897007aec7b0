"""Hostile runs (issue 9): what a run itself sends can neither stall, fool nor leak the core.

``tests/core/unit/test_abuse.py`` lists hostile *records*; this file, its successor for issue 9,
lists hostile *runs*: schemas, argument values, text and id choices a gateway may pass along.
Each test proves one line of this list (the input, then its defined outcome):

* Run ``a:7`` with call ``c`` and run ``a`` with call ``7:c``: different idempotency keys
  (each part is percent-encoded, ``%`` and ``:``).
* A chat run with n > 1 choices: choice 0's message is written once, in ``message``; its
  ``choices`` entry holds only its index and finish reason.
* With block-level early commit, a later block reusing an id whose outcome is out already
  (committed early, or failed early): that outcome stands and the later call gets no record
  at all (the final message lists it ``failed``, ``duplicate_call_id``); every call id gets
  one kind of outcome, so a runner pairing results by id gets one result per id. Without
  early commit, calls sharing an id all fail ``duplicate_call_id``, each under its own key,
  whatever else ended them (an oversize text, a cancel).
* A cancel that reaches the log before its run's ``run.start``: remembered (bounded count,
  expiry in record time) and applied when the run starts: the run ends ``cancelled`` at once
  and nothing of it commits; a cancel older than the expiry, or forgotten beyond the count,
  changes nothing. (That it survives a worker killed before the ``run.start``: a run head at
  the cancel's offset, ``tests/runtime/unit/test_early_cancel_heads.py`` and
  ``tests/runtime/integration/test_early_cancel_takeover.py``.)
* Assistant text or thinking beyond ``max_run_text_bytes``: the run ends ``failed``, its
  uncommitted calls fail ``budget_exceeded``; argument fragments are not counted as text.
* Many runs of big assistant text: the text kept counts in ``max_buffered_bytes``; the least
  recently active runs end ``failed`` to make room, and a run whose text alone exceeds it
  ends (``test_text_budget.py``).
* 2.9 MB of arguments in 1-byte-ish fragments with ``ui_forward_partial_args``: progress
  records carry each fragment and its offset, so their size is linear in the argument bytes.

Every output is checked to serialize and to validate against the schemas, as in
``test_abuse.py``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    CHAT,
    anthropic_message_start,
    anthropic_tail,
    anthropic_tool_block,
    cancel,
    chat_chunk,
    chat_tool_delta,
    committed,
    dlq,
    errors,
    feed,
    finals,
    provider_event,
    provider_run,
    run_envelopes,
    tools_for,
)
from test_assembler import checked

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.outputs import idempotency_key
from worker.runtime.config import load_config
from worker.tools.chaos.plan import CallSpec, Plan, PlanError, RunPlan, check_intent, expected_emits
from worker.tools.chaos.verify import OutRecord, verify

OBJECT = {"type": "object"}
MiB = 1024 * 1024


def make(**settings: Any) -> Assembler:
    return Assembler(AssembleSettings(**settings))


# -- idempotency keys ----------------------------------------------------------------------


def test_idempotency_keys_of_colon_ids_do_not_collide() -> None:
    """Run ``a:7`` with call ``c`` and run ``a`` with call ``7:c`` commit under two different
    keys, where joining the parts with ``:`` alone gave both ``a:7:c``."""
    emits = checked(feed(make(), [*provider_run(CHAT, "a:7", {"f": OBJECT}, [("c", "f", "{}")]),
                                  *provider_run(CHAT, "a", {"f": OBJECT}, [("7:c", "f", "{}")])]))
    keys = [c["idempotency_key"] for c in committed(emits)]
    assert keys == ["a%3A7:c", "a:7%3Ac"]
    assert len({f["idempotency_key"] for f in finals(emits)}) == 2


def test_idempotency_key_parts_are_percent_encoded() -> None:
    """``%`` is encoded too, so an id that already holds ``%3A`` cannot pass for a ``:``; keys
    without either character are unchanged (``run:call``)."""
    assert idempotency_key("a%3A7", "c") == "a%253A7:c" != idempotency_key("a:7", "c")
    assert idempotency_key("r1", "call_1") == "r1:call_1"
    assert idempotency_key("a", "b:c", "0.1") == "a:b%3Ac:0.1"


def test_error_keys_of_shared_ids_are_encoded() -> None:
    """Two calls sharing an id that holds ``:`` fail ``duplicate_call_id`` with keys that add
    the encoded buffer key: distinct, and none ambiguous."""
    emits = checked(feed(make(), provider_run(CHAT, "r", {"f": OBJECT},
                                              [("x:1", "f", "{}"), ("x:1", "f", "{}")])))
    keys = [e["idempotency_key"] for e in errors(emits)]
    assert keys == ["r:x%3A1:0.0", "r:x%3A1:0.1"]


# -- the final message's size ----------------------------------------------------------------


def test_chat_final_with_two_choices_writes_choice_0_once() -> None:
    """A chat run with n = 2 writes choice 0's text once (in ``message``), not also in
    ``choices``: the final message is as big as the text the run holds, not twice that."""
    text0, text1 = "A" * 1000, "B" * 10
    chunks = [{"choices": [{"index": 0, "delta": {"content": text0}}]},
              {"choices": [{"index": 1, "delta": {"content": text1}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"},
                           {"index": 1, "delta": {}, "finish_reason": "stop"}]}]
    emits = checked(feed(make(), run_envelopes("r", CHAT, [], chunks)))
    final = finals(emits)[0]
    assert orjson.dumps(final).count(b"A" * 1000) == 1
    assert final["message"]["content"] == text0
    assert final["choices"] == [{"index": 0, "finish_reason": "stop"},
                                {"index": 1, "message": {"role": "assistant", "content": text1},
                                 "finish_reason": "stop"}]


# -- progress ------------------------------------------------------------------------------


def test_partial_argument_progress_is_linear_in_the_argument_bytes() -> None:
    """With ``ui_forward_partial_args``, 4,000 fragments of 25 bytes give progress records
    holding each fragment once (about 100 KB of text in all, where re-sending the buffer gave
    200 MB); the fragments, applied at their offsets, rebuild the text."""
    fragments = ['{"s": "'] + ["x" * 25] * 4000 + ['"}']
    text = "".join(fragments)
    chunks = [chat_chunk([chat_tool_delta(0, "c1", "f", fragments[0])])]
    chunks += [chat_chunk([chat_tool_delta(0, arguments=f)]) for f in fragments[1:]]
    asm = make(emit_progress=True, ui_forward_partial_args=True, max_tool_argument_bytes=MiB)
    emits = feed(asm, run_envelopes("r", CHAT, tools_for(CHAT, {"f": OBJECT}), chunks))
    progress = [e.value for e in emits if e.topic is Topic.PROGRESS]
    assert len(progress) == len(fragments)
    assert sum(len(p["arguments_delta"]) for p in progress) == len(text)
    rebuilt = b""
    for p in progress:
        rebuilt = rebuilt[:p["arguments_offset"]] + p["arguments_delta"].encode()
    assert rebuilt.decode() == text
    checked(emits[-5:])


# -- one id, one outcome -----------------------------------------------------------------------


def early_commit_reuse_run(run_id: str = "r") -> list[dict[str, Any]]:
    """An Anthropic run whose block 0 (tool ``f``, early commit) and block 2 share id ``X``."""
    events = [anthropic_message_start(), *anthropic_tool_block(0, "X", "f", "{}"),
              *anthropic_tool_block(1, "Y", "f", "{}"), *anthropic_tool_block(2, "X", "f", "{}"),
              *anthropic_tail()]
    return run_envelopes(run_id, ANTHROPIC, tools_for(ANTHROPIC, {"f": OBJECT}), events)


EARLY = {"execute_before_stream_end": True, "allow_pipelined_execute": ("f",)}


def kinds_per_id(emits: list[Emit]) -> dict[str, set[str]]:
    """Per call id, the kinds of outcome its records carry ("committed" or the reason)."""
    kinds: dict[str, set[str]] = {}
    for e in emits:
        if e.topic is Topic.COMMITTED:
            kinds.setdefault(e.value["call_id"], set()).add("committed")
        elif e.topic is Topic.ERRORS:
            kinds.setdefault(e.value["tool_call_id"], set()).add(e.value["reason"])
    return kinds


def test_early_committed_id_reused_later_gets_no_second_outcome() -> None:
    """Block 0 commits ``X`` at its block end; block 2 reuses ``X``: it gets no record (the
    committed ``r:X`` stays the id's only outcome), the final lists it ``failed``,
    ``duplicate_call_id`` after the committed one, and the assembler counts it."""
    asm = make(**EARLY)
    emits = checked(feed(asm, early_commit_reuse_run()))
    done = committed(emits)
    assert [(c["call_id"], c["index"], c["idempotency_key"]) for c in done] == [
        ("X", 0, "r:X"), ("Y", 1, "r:Y")]
    assert errors(emits) == []
    assert kinds_per_id(emits) == {"X": {"committed"}, "Y": {"committed"}}
    assert [(o["tool_call_id"], o["index"], o["state"], o.get("reason"))
            for o in finals(emits)[0]["outcomes"]] == [
        ("X", 0, "committed", None), ("Y", 1, "committed", None),
        ("X", 2, "failed", "duplicate_call_id")]
    assert asm.stats["reused_ids_suppressed"] == 1


def test_early_error_then_a_reused_id_gets_no_second_outcome() -> None:
    """Block 0 (``X``, early commit allowed) fails ``invalid_json`` at its block end; block 1
    reuses ``X`` with valid arguments: no record for it either (not a commit, not a
    ``duplicate_call_id``): ``X`` has the one error result, the final lists both calls."""
    events = [anthropic_message_start(), *anthropic_tool_block(0, "X", "f", '{"a": '),
              *anthropic_tool_block(1, "X", "f", "{}"), *anthropic_tail()]
    asm = make(**EARLY)
    emits = checked(feed(asm, run_envelopes("r", ANTHROPIC, tools_for(ANTHROPIC, {"f": OBJECT}),
                                            events)))
    assert kinds_per_id(emits) == {"X": {"invalid_json"}}
    assert [e["idempotency_key"] for e in errors(emits)] == ["r:X"]
    assert [(o["state"], o.get("reason")) for o in finals(emits)[0]["outcomes"]] == [
        ("failed", "invalid_json"), ("failed", "duplicate_call_id")]
    assert asm.stats["reused_ids_suppressed"] == 1


def test_without_early_commit_calls_sharing_an_id_all_fail_duplicate_call_id() -> None:
    """Without early commit every call sharing an id fails ``duplicate_call_id`` under its
    own key, whatever else ended it: an oversize text or a cancel does not give the id a
    second kind of outcome."""
    run = early_commit_reuse_run()
    emits = checked(feed(make(), run))
    assert kinds_per_id(emits) == {"X": {"duplicate_call_id"}, "Y": {"committed"}}
    assert [e["idempotency_key"] for e in errors(emits)] == ["r:X:0", "r:X:2"]
    big = [anthropic_message_start(), *anthropic_tool_block(0, "X", "f", '{"a": "' + "x" * 99
                                                             + '"}'),
           *anthropic_tool_block(1, "X", "f", "{}"), *anthropic_tail()]
    emits = checked(feed(make(max_tool_argument_bytes=64),
                         run_envelopes("r", ANTHROPIC, tools_for(ANTHROPIC, {"f": OBJECT}), big)))
    assert kinds_per_id(emits) == {"X": {"duplicate_call_id"}}
    cut = run_envelopes("r", ANTHROPIC, tools_for(ANTHROPIC, {"f": OBJECT}), big[:-4], end=False)
    emits = checked(feed(make(max_tool_argument_bytes=64), [*cut, cancel("r")]))
    assert kinds_per_id(emits) == {"X": {"duplicate_call_id"}}
    assert len(errors(emits)) == 2


def _early_reuse_plan(run_id: str) -> tuple[RunPlan, Any]:
    config = load_config(None, env={
        "LATCH_AGENT_STREAM_ASSEMBLE__EXECUTE_BEFORE_STREAM_END": "true",
        "LATCH_AGENT_STREAM_ASSEMBLE__ALLOW_PIPELINED_EXECUTE": "[\"f\"]"})
    envelopes = [orjson.dumps(e) for e in early_commit_reuse_run(run_id)]
    opened = {cid: CallSpec(cid, "f", "{}", "commit", {}) for cid in ("X", "Y")}
    run = RunPlan(run_id, ANTHROPIC, "early", envelopes, None, opened)
    run.expected = expected_emits(run, config)
    return run, config


def _old_rule(emits: list[Emit], run_id: str) -> list[Emit]:
    """``emits`` as the core gave them before (issue 9 item 4): the later call reusing the
    committed id ``X`` also had an error result, ``duplicate_call_id`` under its own key."""
    final = next(e for e in emits if e.topic is Topic.FINAL)
    error = {"v": 1, "run_id": run_id, "tenant": "t1", "provider": ANTHROPIC,
             "tool_call_id": "X", "name": "f", "index": 2, "is_error": True, "state": "failed",
             "reason": "duplicate_call_id", "content": "duplicate_call_id: another call of "
             "this run has the same id", "idempotency_key": idempotency_key(run_id, "X", "2")}
    return [e for e in emits if e is not final] + [Emit(Topic.ERRORS, run_id, error), final]


def test_chaos_checks_demand_one_kind_of_outcome_per_id() -> None:
    """The chaos verifier and the plan's ``check_intent`` accept the run above (the final
    lists the unrecorded reuse), and both refuse the old rule's records (a committed ``X``
    and a ``duplicate_call_id`` result for ``X``), as well as a forged second outcome for
    the committed call."""
    run, _ = _early_reuse_plan("a:b")
    plan = Plan(1, [run], [])

    def records(emits: list[Emit]) -> list[OutRecord]:
        return [OutRecord(e.topic.value, 0, n, b"a:b", orjson.dumps(e.value))
                for n, e in enumerate(emits)]

    verdict = verify(plan, records(run.expected))
    assert verdict.ok, verdict.failures
    check_intent(run)

    old = _old_rule(run.expected, "a:b")
    assert verify(plan, records(old)).contradictions
    old_run = RunPlan("a:b", ANTHROPIC, "early", run.envelopes, None, run.opened, expected=old)
    with pytest.raises(PlanError, match="2 kinds of outcome"):
        check_intent(old_run)

    forged = {**orjson.loads(records(run.expected)[0].value), "is_error": True,
              "state": "failed", "reason": "schema_invalid", "idempotency_key": "other"}
    forged["tool_call_id"] = forged.pop("call_id")
    assert verify(plan, [*records(run.expected),
                         OutRecord("errors", 0, 99, b"a:b", orjson.dumps(forged))]
                  ).contradictions


# -- a cancel before its run.start -----------------------------------------------------------


def _record(asm: Assembler, env: dict[str, Any], ts: int) -> list[Emit]:
    return asm.feed_record(None, orjson.dumps(env), ts)


def _run_after(asm: Assembler, run_id: str, ts: int) -> list[Emit]:
    emits: list[Emit] = []
    for env in provider_run(CHAT, run_id, {"f": OBJECT}, [("c1", "f", "{}")]):
        emits += _record(asm, env, ts)
    return checked(emits)


def test_cancel_before_run_start_cancels_the_run() -> None:
    """A cancel recorded before its run's ``run.start``: the run ends ``cancelled`` when it
    starts, its later events are ignored, nothing commits and nothing goes to the DLQ."""
    asm = make()
    assert _record(asm, cancel("r", reason="user_stop"), 1_000) == []
    emits = _run_after(asm, "r", 2_000)
    assert committed(emits) == [] and dlq(emits) == []
    assert [f["status"] for f in finals(emits)] == ["cancelled"]
    assert not asm.early_cancel_pending("r")
    assert asm.stats["early_cancels_applied"] == 1


def test_early_cancel_expires_in_record_time() -> None:
    """A cancel older than ``early_cancel_ttl_s`` (record time) when its run starts changes
    nothing: the run commits its call."""
    asm = make(early_cancel_ttl_s=10)
    _record(asm, cancel("r"), 1_000)
    emits = _run_after(asm, "r", 11_001)
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
    assert [f["status"] for f in finals(emits)] == ["completed"]
    assert asm.stats["early_cancels_expired"] == 1


def test_early_cancels_are_bounded_in_count() -> None:
    """Beyond ``remember_early_cancels`` the oldest cancel is forgotten: its run commits, the
    newer ones are still applied."""
    asm = make(remember_early_cancels=2)
    for n, run_id in enumerate(("a", "b", "c")):
        _record(asm, cancel(run_id), 1_000 + n)
    assert [asm.early_cancel_pending(r) for r in "abc"] == [False, True, True]
    assert [f["status"] for f in finals(_run_after(asm, "a", 2_000))] == ["completed"]
    assert [f["status"] for f in finals(_run_after(asm, "c", 2_000))] == ["cancelled"]


# -- text a run may hold ---------------------------------------------------------------------


def test_run_text_is_bounded() -> None:
    """Assistant text beyond ``max_run_text_bytes`` ends the run: status ``failed``, the open
    call fails ``budget_exceeded``, later events go nowhere; the final message stays small."""
    asm = make(max_run_text_bytes=50_000)
    head = run_envelopes("r", CHAT, tools_for(CHAT, {"f": OBJECT}),
                         [chat_chunk([chat_tool_delta(0, "c1", "f", "{")])], end=False)
    emits = feed(asm, head)
    for seq in range(2, 40):
        emits += feed(asm, [provider_event("r", seq, chat_chunk(content="x" * 2000))])
    emits = checked(emits)
    [final] = finals(emits)
    assert final["status"] == "failed"
    assert len(final["message"]["content"] or "") <= 50_000
    [error] = errors(emits)
    assert error["reason"] == "budget_exceeded" and "exceeded 50000 bytes" in error["content"]
    assert asm.stats["runs_over_text_bytes"] == 1


def test_argument_fragments_are_not_text() -> None:
    """A 200 KB argument in 20,000 small fragments does not count as the run's text: with a
    tight text bound the call commits."""
    frags = ['{"s": "'] + ["abcdefghij"] * 20_000 + ['"}']
    chunks = [chat_chunk([chat_tool_delta(0, "c1", "f", frags[0])])]
    chunks += [chat_chunk([chat_tool_delta(0, arguments=f)]) for f in frags[1:]]
    emits = feed(make(max_run_text_bytes=10_000),
                 run_envelopes("r", CHAT, tools_for(CHAT, {"f": OBJECT}), chunks))
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
