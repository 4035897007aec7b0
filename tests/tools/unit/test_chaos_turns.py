"""The chaos verifier's result-latch checks (``verify(..., latch=Latch(...))``, issue 36), without
Kafka: the turn records, latch results, answer audits and result DLQ records are made by the
real result latch (``worker.core.pairing.Pairing``) from a plan's expected records, with the
runners' answers as the plan's misbehaviour says (hang, answer twice) and some answers late;
the correct outputs pass, and each broken promise fails the count it belongs to."""

from __future__ import annotations

import base64
import dataclasses
import itertools
from collections import Counter
from collections.abc import Collection

import orjson
import pytest

from worker.core import Emit, Topic
from worker.core.envelope import ToolResult
from worker.core.outputs import dlq_record
from worker.core.pairing import Pairing
from worker.core.settings import ResultSettings
from worker.runtime.config import load_config
from worker.tools.chaos.plan import HANG, TWICE, Misbehaviour, Plan, build_plan
from worker.tools.chaos.verify import Latch, OutRecord, Verdict, verify, verify_runners

CONFIG = load_config(None, env={"LATCH_AGENT_STREAM_ASSEMBLE__ASSEMBLE_IDLE_TIMEOUT_S": "5"})
BAD = Misbehaviour(seed=5, hang_rate=0.2, twice_rate=0.2)
DEADLINE_MS = 30_000
Records = list[OutRecord]


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(seed=11, runs=80, config=CONFIG)


def _committed(plan: Plan) -> list[dict[str, object]]:
    return [e.value for r in plan.runs for e in r.expected if e.topic is Topic.COMMITTED]


def _late(plan: Plan) -> set[str]:
    """Two committed calls the plan does not make misbehave, whose answers come late."""
    keys = [str(c["idempotency_key"]) for c in _committed(plan)]
    return set([k for k in keys if BAD.of(k) is None][:2])


def _outputs(plan: Plan, late: Collection[str] = ()) -> tuple[Records, str]:
    """Every output record of a correct worker and misbehaving runners, and the runners'
    execution log: the plan's expected records, then what the result latch makes of them."""
    pairing = Pairing(ResultSettings(True, DEADLINE_MS / 1000), dlq_record)
    out: Records = []
    log: list[str] = []
    offsets = itertools.count()

    def emit(emits: list[Emit]) -> None:
        for e in emits:
            out.append(OutRecord(e.topic.value, 0, len(out), str(e.value.get("run_id")).encode(),
                                 orjson.dumps(e.value)))

    def answer(call: dict[str, object], now_ms: int) -> None:
        source = (0, next(offsets))
        runner = {"v": 1, "run_id": call["run_id"], "tool_call_id": call["call_id"],
                  "name": call["name"], "idempotency_key": call["idempotency_key"],
                  "is_error": False, "content": f"done {call['idempotency_key']}"}
        out.append(OutRecord("results", 0, source[1], None, orjson.dumps(runner)))
        forwarded = orjson.dumps({**runner, "type": "tool.result", "size": 9,
                                  "source": list(source)})
        result = ToolResult(str(call["run_id"]), None, str(call["call_id"]), str(call["name"]),
                            str(call["idempotency_key"]), False, 9, str(runner["content"]),
                            None, source)
        emit(pairing.result(result, now_ms, (None, forwarded, None)))

    for run in plan.runs:
        emit([e for e in pairing.observe(list(run.expected), 0) if e.topic is Topic.TURNS])
    emit(_records(plan))
    calls = _committed(plan)
    for call in calls:
        key = str(call["idempotency_key"])
        if BAD.of(key) != HANG and key not in late:
            answer(call, 1000)
            if BAD.of(key) == TWICE:
                answer(call, 2000)
                log.append(f"D {key} 1")
    emit(pairing.expire(DEADLINE_MS + 1))
    for call in calls:
        if str(call["idempotency_key"]) in late:
            answer(call, DEADLINE_MS + 2000)
    return out, "\n".join(log)


def _records(plan: Plan) -> list[Emit]:
    """The plan's expected records, and each bad input's DLQ record (as the other verifier
    tests make them)."""
    from worker.core import DlqReason
    from worker.core.envelope import Rejected

    emits = [e for r in plan.runs for e in r.expected]
    return emits + [dlq_record(Rejected(DlqReason(b.reason), "detail"), b.key, b.value,
                               {"topic": "x", "partition": 0, "offset": n})
                    for n, b in enumerate(plan.bad)]


def _verify(plan: Plan, records: Records, log: str, exactly_once: bool = False) -> Verdict:
    return verify(plan, records, exactly_once=exactly_once, latch=Latch(BAD, log))


def _turns(records: Records) -> list[int]:
    return [i for i, r in enumerate(records) if r.role == "turns"]


def test_misbehaviour_is_a_pure_function_of_seed_and_key_at_its_rates() -> None:
    """The runners and the verifier agree without talking: the same key and seed give the
    same answer; over many keys the shares are near the rates; no rates, no misbehaviour."""
    keys = [f"run-{n}:call_{n}" for n in range(4000)]
    drawn = Counter(BAD.of(k) for k in keys)
    assert [BAD.of(k) for k in keys] == [BAD.of(k) for k in keys]
    assert 0.17 < drawn[HANG] / len(keys) < 0.23
    assert 0.17 < drawn[TWICE] / len(keys) < 0.23
    assert [Misbehaviour(6, 0.2, 0.2).of(k) for k in keys] != [BAD.of(k) for k in keys]
    assert {Misbehaviour().of(k) for k in keys} == {None}


def test_correct_outputs_of_misbehaving_runners_pass_and_are_counted(plan: Plan) -> None:
    """Hung calls answered tool_timeout, second answers in the DLQ as result_duplicate,
    late answers result_late with their call tool_timeout: PASS, and the summary counts
    them, one turn per run."""
    late = _late(plan)
    records, log = _outputs(plan, late)
    verdict = _verify(plan, records, log, exactly_once=True)
    assert verdict.ok, verdict.failures[:5]
    hung = sum(BAD.of(str(c["idempotency_key"])) == HANG for c in _committed(plan))
    twice = sum(BAD.of(str(c["idempotency_key"])) == TWICE for c in _committed(plan))
    assert hung and twice
    assert verdict.turns == len(plan.runs)
    assert (verdict.tool_timeouts, verdict.hung, verdict.late) == (hung + 2, hung, 2)
    assert verdict.result_dlq == {"result_duplicate": twice, "result_late": 2}
    assert "turns=80 " in verdict.summary(0, 0)


def test_a_lost_turn_record_fails(plan: Plan) -> None:
    """A run with a final message and no turn record is missing."""
    records, log = _outputs(plan)
    lost = records[_turns(records)[3]]
    verdict = _verify(plan, [r for r in records if r is not lost], log)
    assert not verdict.ok
    assert verdict.missing == 1, verdict.failures
    assert "no turn record" in verdict.failures[0]


def test_a_repeated_turn_record_is_a_duplicate_and_another_one_a_contradiction(
        plan: Plan) -> None:
    """The same turn record twice: a duplicate (fails at read_committed only); a second turn
    record with other bytes: a contradiction, on either engine."""
    records, log = _outputs(plan)
    again = records[_turns(records)[0]]
    repeated = _verify(plan, [*records, again], log)
    assert repeated.ok and repeated.duplicates == 1
    assert not _verify(plan, [*records, again], log, exactly_once=True).ok
    other = OutRecord("turns", 0, 0, again.key, again.value.replace(b'"v":1', b'"v":2'))
    verdict = _verify(plan, [*records, other], log)
    assert not verdict.ok and verdict.contradictions == 1, verdict.failures


def _edit_turn(records: Records, change: str) -> Records:
    """The records with one turn record that has a committed call changed."""
    for i in _turns(records):
        turn = orjson.loads(records[i].value)
        entries = turn["outcomes"]
        answered = [e for e in entries if e["outcome"] == "answered"]
        failed = [e for e in entries if e["outcome"] == "failed"]
        if change == "answered_twice" and answered:
            entries.append(dict(answered[0]))
        elif change == "timeout_in_time" and answered:
            answered[0].update(outcome="tool_timeout", reason="tool_timeout")
        elif change == "other_reason" and failed:
            failed[0]["reason"] = "stream_error" if failed[0]["reason"] != "stream_error" \
                else "invalid_json"
        else:
            continue
        return [*records[:i], OutRecord("turns", 0, i, records[i].key, orjson.dumps(turn)),
                *records[i + 1:]]
    raise AssertionError(f"no turn record to change for {change}")


def test_a_call_answered_twice_in_its_turn_fails(plan: Plan) -> None:
    """One call id with two answers in a turn record: a contradiction (and its list of calls
    no longer is the final message's)."""
    records, log = _outputs(plan)
    verdict = _verify(plan, _edit_turn(records, "answered_twice"), log)
    assert not verdict.ok
    assert verdict.contradictions == 1, verdict.failures
    assert "answered 2 times" in verdict.failures[0]


def test_a_tool_timeout_for_a_call_answered_in_time_fails(plan: Plan) -> None:
    """A call the plan did not make hang, with no late answer, answered tool_timeout: it
    was answered in time, so mismatched (and the latch's own timeout result is missing)."""
    records, log = _outputs(plan)
    verdict = _verify(plan, _edit_turn(records, "timeout_in_time"), log)
    assert not verdict.ok
    assert verdict.mismatched == 1 and verdict.missing >= 1, verdict.failures
    assert any("did not make it hang" in f for f in verdict.failures)


def test_a_failed_call_with_another_reason_fails(plan: Plan) -> None:
    """A call that never committed is ``failed`` with its final message's reason."""
    records, log = _outputs(plan)
    verdict = _verify(plan, _edit_turn(records, "other_reason"), log)
    assert not verdict.ok and verdict.mismatched == 1, verdict.failures


def test_a_hung_call_that_a_runner_answered_fails(plan: Plan) -> None:
    """The plan made the runners hang on a call: an answer of it on the results topic is a
    runner that did not do what the plan says, mismatched."""
    records, log = _outputs(plan)
    call = next(c for c in _committed(plan) if BAD.of(str(c["idempotency_key"])) == HANG)
    stray = orjson.dumps({"v": 1, "run_id": call["run_id"], "tool_call_id": call["call_id"],
                          "name": call["name"], "idempotency_key": call["idempotency_key"],
                          "is_error": False, "content": "x"})
    verdict = _verify(plan, [*records, OutRecord("results", 0, 0, None, stray)], log)
    assert not verdict.ok
    assert any("a runner answered it" in f for f in verdict.failures), verdict.failures


def test_the_dlq_of_second_answers_is_checked(plan: Plan) -> None:
    """A second answer that is not in the DLQ is missing; a result DLQ record for a call
    that was answered once (as if the latch refused a good answer) is mismatched."""
    records, log = _outputs(plan)
    dlq = [i for i, r in enumerate(records)
           if r.role == "dlq" and b"result_duplicate" in r.value]
    lost = _verify(plan, [r for i, r in enumerate(records) if i != dlq[0]], log)
    assert not lost.ok and lost.missing == 1, lost.failures
    once = next(str(c["idempotency_key"]) for c in _committed(plan)
                if BAD.of(str(c["idempotency_key"])) is None)
    extra = orjson.loads(records[dlq[0]].value)
    forwarded = orjson.loads(base64.b64decode(extra["original_b64"]))
    forwarded["idempotency_key"] = once
    extra["original_b64"] = base64.b64encode(orjson.dumps(forwarded)).decode()
    verdict = _verify(plan, [*records, OutRecord("dlq", 0, 0, None, orjson.dumps(extra))], log)
    assert not verdict.ok and verdict.mismatched == 1, verdict.failures


def test_a_second_answer_the_runner_logged_but_never_wrote_is_missing(plan: Plan) -> None:
    """The execution log says a call's second answer committed (``D KEY``): two runner
    answers must be on the results topic."""
    records, log = _outputs(plan)
    key = next(str(c["idempotency_key"]) for c in _committed(plan)
               if BAD.of(str(c["idempotency_key"])) is None)
    twice = Latch(BAD, log + f"\nD {key} 1")
    verdict = verify(plan, records, latch=twice)
    assert not verdict.ok and verdict.missing == 1, verdict.failures


def test_without_the_latch_its_records_are_left_alone(plan: Plan) -> None:
    """Without ``latch`` (no runners) the result latch's records are not checked: the
    plan's checks alone, as before issue 36."""
    records, _ = _outputs(plan)
    plain = [r for r in records if not (r.role == "dlq" and b"result_" in r.value)]
    verdict = verify(plan, plain)
    assert verdict.ok, verdict.failures[:3]
    assert not verdict.latch and "turns=" not in verdict.summary(0, 0)


def test_the_runner_verdict_knows_hung_and_twice_calls_and_the_latch_results(plan: Plan) -> None:
    """verify_runners: a hung call needs no runner result, a call answered twice may have
    two, the latch's tool_timeout results are not the runners'; a hung call's runner answer
    is a duplicate."""
    records, _ = _outputs(plan)
    runs = "\n".join(f"S {c['idempotency_key']} 1\nE {c['idempotency_key']} 1\n"
                     f"C {c['idempotency_key']} 1" for c in _committed(plan)
                     if BAD.of(str(c["idempotency_key"])) != HANG)
    both = [r for r in records if r.role in ("committed", "results")]
    verdict = verify_runners(both, runs, BAD)
    assert verdict.ok, verdict.failures[:3]
    assert verdict.hung and verdict.twice
    assert not verify_runners(both, runs).ok  # (without the plan's misbehaviour: failures)
    hung = next(r for r in records if r.role == "results" and b'"by":"latch"' in r.value)
    stray = orjson.loads(hung.value)
    del stray["by"]
    assert verify_runners([*both, OutRecord("results", 0, 0, None, orjson.dumps(stray))],
                          runs, BAD).duplicates == 1


def _event(offset: int, ts: int, key: bytes = b"run-1", value: bytes = b"{}") -> OutRecord:
    return OutRecord("events", 0, offset, key, value, ts)


def _tick(offset: int, ts: int) -> OutRecord:
    return _event(offset, ts, b"__latch_tick__", b'{"v":1,"type":"tick"}')


def _result(offset: int, ts: int, key: str = "run-1:c1") -> OutRecord:
    return _event(offset, ts, value=orjson.dumps({"type": "tool.result",
                                                  "idempotency_key": key}))


@pytest.mark.parametrize(("log", "decided"), [
    # committed at 1000 (offset 1); answered before any tick past 31000
    ([_event(1, 1000), _tick(2, 30999), _result(3, 31500), _tick(4, 40000)], "answered"),
    # a tick at 31000 comes first: timed out, the answer after it is late
    ([_event(1, 1000), _tick(2, 31000), _result(3, 31001)], "tool_timeout"),
    # the clock stood at 2000 before the commit (an earlier record's time): its commit time
    # is 1000 to 2000, the tick at 31500 falls between the two deadlines: either
    ([_event(0, 2000), _event(1, 1000), _tick(2, 31500), _result(3, 31600)], "either"),
    # the same, but the next tick is past both deadlines before the answer: timed out
    ([_event(0, 2000), _event(1, 1000), _tick(2, 32000), _result(3, 32100)], "tool_timeout"),
    # neither an answer nor a tick past the deadline: no decision
    ([_event(1, 1000), _tick(2, 20000)], None),
])
def test_deadlines_are_replayed_from_the_events_log(log: Records, decided: str | None) -> None:
    """The latch's decision for a call committed at events[0]@1, deadline 30 s of record
    time: ticks (by their record time) against the first forwarded answer, in log order."""
    from worker.tools.chaos.verify import deadlines

    got = deadlines(log, {"run-1:c1": (0, 1)}, 30_000)
    assert got.get("run-1:c1") == decided
    assert deadlines(log, {"run-1:c1": (1, 1)}, 30_000) == {}  # (another partition's call)


def test_an_answer_against_its_replayed_deadline_fails(plan: Plan) -> None:
    """With the events log, a call answered in its turn record whose deadline passed before
    its answer (by the log) is mismatched, and so is a timed-out call answered in time."""
    records, log = _outputs(plan)
    keys = {str(c["idempotency_key"]): BAD.of(str(c["idempotency_key"])) for c in _committed(plan)}
    answered = next(k for k, v in keys.items() if v is None)
    hung = next(k for k, v in keys.items() if v == HANG)
    audits = [OutRecord("audit", 0, 0, None, orjson.dumps(
        {"idempotency_key": k, "source": {"partition": 5, "offset": n}, "run_id": "x"}))
        for n, k in enumerate((answered, hung))]
    events = [_event(0, 1000, value=b"a"), _event(1, 1000, value=b"b"),
              _result(2, 1500, hung), _tick(3, 40_000), _result(4, 40_001, answered)]
    events = [dataclasses.replace(e, partition=5) for e in events]
    mine = [r for r in records if not (r.role == "audit" and b'"result"' not in r.value
                                      and any(k.encode() in r.value for k in (answered, hung)))]
    verdict = verify(plan, mine + audits, latch=Latch(BAD, log, events, DEADLINE_MS))
    wrong = [f for f in verdict.failures if "by the events log" in f]
    assert len(wrong) == 2, verdict.failures[:6]
    assert verdict.deadline_checked == 2


def test_the_counted_answer_forwarded_again_after_its_turn_closed_is_a_repeat(
        plan: Plan) -> None:
    """Every runner answer of a call in the DLQ, the one that counted too (its results record
    forwarded again once its turn had closed, the faust engine's at-least-once forwarding):
    ``reforwarded``, a duplicate (allowed at least once, a failure at read_committed)."""
    records, log = _outputs(plan)
    dlq = next(r for r in records if r.role == "dlq" and b"result_duplicate" in r.value)
    value = orjson.loads(dlq.value)
    forwarded = orjson.loads(base64.b64decode(value["original_b64"]))
    key = forwarded["idempotency_key"]
    first = next(r.offset for r in records if r.role == "results" and b'"by"' not in r.value
                 and orjson.loads(r.value)["idempotency_key"] == key
                 and r.offset != forwarded["source"][1])
    forwarded["source"] = [0, first]
    value["original_b64"] = base64.b64encode(orjson.dumps(forwarded)).decode()
    again = [*records, OutRecord("dlq", 0, 0, None, orjson.dumps(value))]
    verdict = _verify(plan, again, log)
    assert verdict.ok, verdict.failures[:3]
    assert (verdict.reforwarded, verdict.duplicates) == (1, 1)
    assert "reforwarded=1" in verdict.summary(0, 0)
    assert not _verify(plan, again, log, exactly_once=True).ok


def test_the_misbehaviour_flags_parse_and_need_runners() -> None:
    """``--hang-rate``, ``--twice-rate``, ``--runner-deaths``, ``--results-deadline`` parse;
    without ``--runners``, or with shares over 1, the command refuses before doing anything."""
    from worker.tools.chaos import run as chaos

    args = chaos.build_parser().parse_args(
        ["--runners", "2", "--hang-rate", "0.1", "--twice-rate", "0.2", "--runner-deaths", "1",
         "--results-deadline", "20"])
    assert (args.hang_rate, args.twice_rate, args.runner_deaths, args.results_deadline) == (
        0.1, 0.2, 1, 20.0)
    for argv in (["--hang-rate", "0.1"], ["--runners", "1", "--hang-rate", "0.7",
                                          "--twice-rate", "0.5"]):
        with pytest.raises(SystemExit) as exited:
            chaos.main(argv)
        assert exited.value.code == 2
    stack = chaos.Stack("b:1", "app", 6, 45.0, 1.0, results_deadline_s=20.0)
    assert stack.env()["LATCH_RESULTS__DEADLINE_S"] == "20.0"
    assert stack.env()["LATCH_TOPICS__TURNS"] == "app.turns"
