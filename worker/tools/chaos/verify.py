"""The chaos verifier (``latch chaos``): checks Latch's promises on every output record.

Pure: :func:`verify` takes the plan and the records read from the output topics (committed,
errors, final, DLQ), from the beginning, and counts

* ``missing``: an expected committed call, error result or final message, or a bad input's
  DLQ record, that is not there (promise 1, no lost outcome; promise 5);
* ``contradictions``: a call with two different outcomes, two records with one
  ``idempotency_key`` that are not byte-identical, a final message whose outcomes disagree
  with the run's records (promises 2 and 3);
* ``mismatched``: a record that is not the one the offline core emits for the run (committed
  arguments included), a record nobody expected, a DLQ record of no bad input or with
  another reason.

* one kind of outcome per call id: a call id with two different outcomes (a committed call
  and an error result, whatever their index) is a contradiction, and a run's final message
  must agree with its records (it may add ``failed``/``duplicate_call_id`` for an id that
  has records: a later call that reused the id once its outcome was out, which gets no
  record of its own);
* every cancel the broker acknowledged ends its run ``cancelled`` and each of its calls
  ``cancelled`` unless already committed (``missing`` otherwise: the cancel was lost).
  A *flexible* run (its cancel raced against its ``run.start``) is held to this promise
  rather than to exact records: where the cancel lands decides which calls it opened.

The pending records of calls waiting for approval (``--approvals``) and the ``run.ended``
records are compared too, but for what only the live worker knows (the record time a call was
held at, the offsets of a run's events). Each held call's outcome (committed as it was or as
edited, ``approval_denied``, ``approval_timeout``, or the edit's ``schema_invalid`` /
``invalid_json``) is then the offline core's, like any other: a lost decision or timeout is
``missing``; :attr:`Verdict.approvals` counts the held calls' outcomes.

Byte-identical repeats are counted as ``duplicates``: harmless at least once (the faust
engine), a failure for the kafka engine read at ``read_committed`` (``exactly_once``).

With policy rollouts (``--policy-rollouts``, a :class:`Rollout`) the workers take their policy
sets from the registry, and every version decides each planned call alike, so the records are
the offline core's but for the audit record's ``policy.version``, which is checked on its own
against the policy markers of the events log (:func:`_check_rollout`): the version a call's
audit names is the one the markers put in force at the call's position (its ``source``), one
put in force there or before for a call held for approval (decided when it completed, emitted
at its decision or timeout); every events partition has markers, their versions registered
and never going back, the last version last. Who writes what: the markers are the workers'
(anyone who can write the events topic could add one: a marker the verifier does not
understand is a failure, never skipped), the versions are chaos's own.

With runners (``--runners``, a :class:`Latch`) the result latch is checked too
(:func:`_check_turns`): every run with a final message has exactly one turn record (a
byte-identical repeat is a duplicate, another one a contradiction); its outcomes are the final
message's calls, in order, each id answered at most once; a call that never committed is
``failed`` with its final's reason; a committed call is ``answered``, or ``tool_timeout`` if
the plan made its runners hang on it, or if its runner's answer came after the deadline (in
log order: the answer is then in the DLQ as ``result_late``, the only evidence that counts);
the latch's own ``tool_timeout`` result stands on the results topic for exactly the calls so
answered; every runner answer past the first is in the DLQ (``result_duplicate``, or
``result_late`` after a timeout) and the DLQ holds no other result record; each answer has its
audit record, with the turn's outcome.
"""

from __future__ import annotations

import base64
import itertools
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from worker.core.envelope import RESULT, TICK_KEY
from worker.core.outputs import idempotency_key
from worker.runtime.governance.registry import POLICY_MARKER, marker_version
from worker.tools.chaos.plan import HANG, TWICE, UNRECORDED, BadInput, Misbehaviour, Plan

#: run_id -> tool call id -> the (state, reason) pairs its records carry.
States = dict[str, dict[str, set[tuple[Any, Any]]]]


@dataclass(frozen=True, slots=True)
class OutRecord:
    role: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    #: The record time (ms; 0: not read).
    timestamp: int = 0


@dataclass(slots=True)
class Verdict:
    runs: int = 0
    calls: int = 0
    committed: int = 0
    errors: int = 0
    duplicates: int = 0
    dlq: int = 0
    missing: int = 0
    contradictions: int = 0
    mismatched: int = 0
    failures: list[str] = field(default_factory=list)
    #: Duplicates break the promise too (the kafka engine, read at read_committed).
    exactly_once: bool = False
    #: Outcomes of the calls that waited for approval (a pending record), by outcome.
    approvals: dict[str, int] = field(default_factory=dict)
    #: Policy set versions registered (``--policy-rollouts``; 0: the policy, if any, a file).
    policy_versions: int = 0
    #: ``--policy-rollouts``: audit records by the policy version they name, and the policy
    #: markers read from the events log.
    policy_audits: dict[Any, int] = field(default_factory=dict)
    policy_markers: int = 0
    #: ``--runners``: the result latch was checked; turn records checked; committed calls
    #: answered ``tool_timeout`` (of them: hung by plan, answered late by their runner);
    #: the result latch's DLQ records by reason.
    latch: bool = False
    turns: int = 0
    tool_timeouts: int = 0
    hung: int = 0
    late: int = 0
    result_dlq: dict[str, int] = field(default_factory=dict)
    #: Committed calls whose answer-or-timeout was replayed from the events log
    #: (:func:`deadlines`), and of them the ones whose deadline fell too close to a tick to
    #: tell (either outcome accepted).
    deadline_checked: int = 0
    deadline_either: int = 0
    #: Result DLQ records (``result_duplicate``) that are the answer which counted, forwarded
    #: again after its turn closed (the faust engine's at-least-once forwarding): counted as
    #: duplicates too.
    reforwarded: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.contradictions or self.mismatched
                    or (self.exactly_once and self.duplicates))

    def fail(self, counter: str, message: str) -> None:
        setattr(self, counter, getattr(self, counter) + 1)
        self.failures.append(f"{counter}: {message}")

    def summary(self, kills: int, broker_restarts: int) -> str:
        return (f"chaos: runs={self.runs} calls={self.calls} committed={self.committed} "
                f"errors={self.errors} duplicates={self.duplicates} kills={kills} "
                f"broker_restarts={broker_restarts} dlq={self.dlq} missing={self.missing} "
                f"contradictions={self.contradictions} mismatched={self.mismatched}"
                + (" approvals=" + ",".join(f"{k}:{v}" for k, v in sorted(self.approvals.items()))
                   if self.approvals else "")
                + (f" policy_versions={self.policy_versions}" if self.policy_versions else "")
                + (f" turns={self.turns} tool_timeouts={self.tool_timeouts}(hung:{self.hung},"
                   f"late:{self.late}) result_dlq="
                   + (",".join(f"{k}:{v}" for k, v in sorted(self.result_dlq.items())) or "0")
                   + (f" reforwarded={self.reforwarded}" if self.reforwarded else "")
                   + (f" deadlines_replayed={self.deadline_checked}(either:"
                      f"{self.deadline_either})" if self.deadline_checked else "")
                   if self.latch else "")
                + f" -> {'PASS' if self.ok else 'FAIL'}")


@dataclass(frozen=True, slots=True)
class Rollout:
    """Policy rollouts (``--policy-rollouts``): the versions chaos registered, in order, and
    the policy markers of the events log (:func:`markers`)."""

    versions: tuple[int, ...]
    #: events partition -> the (offset, version) of its policy markers, in log order; a
    #: marker whose version cannot be read has version 0.
    markers: dict[int, list[tuple[int, int]]]
    partitions: int


def markers(records: Iterable[OutRecord]) -> dict[int, list[tuple[int, int]]]:
    """The policy markers among events records (role ``events``), per partition in log
    order (a marker Latch would not understand: version 0)."""
    found: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        if record.key == POLICY_MARKER:
            found[record.partition].append((record.offset, marker_version(record.value) or 0))
    return dict(found)


#: An audit record's call position and policy version: (key, events partition, offset,
#: version, held for approval).
_Audit = tuple[tuple[str, str], int, int, Any, bool]


#: DLQ reasons of the result latch (docs/contract.md, "The result latch").
RESULT_DLQ = frozenset({"result_duplicate", "result_late", "unknown_call"})
#: Turn outcomes that answer a committed call.
_ANSWERS = frozenset({"answered", "tool_timeout", "result_too_large", "result_schema_invalid"})


@dataclass(frozen=True, slots=True)
class Latch:
    """``--runners``: check the result latch (module doc). ``misbehaviour`` says which calls
    the runners hang on or answer twice; ``execution_log`` is theirs (``D KEY PID``: a call's
    second answer committed)."""

    misbehaviour: Misbehaviour = field(default_factory=Misbehaviour)
    execution_log: str = ""
    #: The events log (role ``events``, with record times) and ``results.deadline_s`` in ms:
    #: each call's deadline is then replayed (:func:`deadlines`); none: not replayed.
    events: Sequence[OutRecord] = ()
    deadline_ms: int | None = None


@dataclass(slots=True)
class _LatchRecords:
    #: run_id -> its turn records' bytes; idempotency_key -> results' bytes (the runners',
    #: the latch's own), answer audits' outcomes and (normalized) bytes.
    turns: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    runner: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    latch: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    audits: dict[str, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    #: A committed call's key -> where its call was decided in the events log (its audit
    #: record's ``source``), for calls not held for approval.
    commits: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: A committed call's key -> where its runners' answers are on the results topic.
    sources: dict[str, set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))
    #: ... and where the answers in the DLQ were read (the forwarded record's ``source``).
    dlq_sources: dict[str, set[tuple[int, int]]] = field(
        default_factory=lambda: defaultdict(set))
    #: (idempotency_key of the call, forwarded bytes) -> the DLQ records.
    dlq: dict[tuple[str, bytes], list[dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(list))

    def take(self, record: OutRecord, value: dict[str, Any]) -> bool:
        """Keep ``record`` if it is the result latch's; whether it was."""
        if record.role == "turns":
            self.turns[str(value.get("run_id"))].append(record.value)
        elif record.role == "results":
            key = str(value.get("idempotency_key"))
            if value.get("by") == "latch":
                self.latch[key].append(record.value)
            else:
                self.runner[key].append(record.value)
                self.sources[key].add((record.partition, record.offset))
        elif record.role == "audit" and "result" in value:
            value["source"] = value["trace_id"] = None  # (the live worker's only)
            key = str(value.get("idempotency_key")).removesuffix(":result")
            self.audits[key].append(orjson.dumps(value))
        elif record.role == "audit":
            source = value.get("source")
            if (isinstance(source, dict) and "approval" not in value
                    and isinstance(source.get("partition"), int)):
                self.commits[str(value.get("idempotency_key"))] = (source["partition"],
                                                                  source.get("offset", -1))
            return False  # (checked as the plan's too)
        elif record.role == "dlq" and value.get("reason") in RESULT_DLQ:
            original = base64.b64decode(value.get("original_b64") or "")
            try:
                forwarded = orjson.loads(original)
            except orjson.JSONDecodeError:
                forwarded = None
            named = forwarded.get("idempotency_key") if isinstance(forwarded, dict) else None
            self.dlq[(str(named), original)].append(value)
            where = forwarded.get("source") if isinstance(forwarded, dict) else None
            if isinstance(where, list) and len(where) == 2:
                self.dlq_sources[str(named)].add((where[0], where[1]))
        else:
            return False
        return True


def _policy_version(value: dict[str, Any], audits: list[_Audit]) -> None:
    """Set aside (to None) in place an audit record's ``policy.version``, noting it with the
    call's position in ``audits``."""
    policy, source = value.get("policy"), value.get("source")
    if not isinstance(policy, dict) or "version" not in policy:
        return
    where = source if isinstance(source, dict) else {}
    held = "approval" in value or value.get("reason") == "approval_timeout"
    audits.append(((str(value.get("idempotency_key")), str(value.get("run_id"))),
                   where.get("partition", -1), where.get("offset", -1), policy["version"],
                   held))
    policy["version"] = None


def _live_only(role: str, value: dict[str, Any]) -> bool:
    """Set aside (to None) in place what only the live worker knows of a record; whether
    there was any."""
    if role == "pending" and isinstance(value.get("approval"), dict):
        value["approval"]["held_ms"] = None
        return True
    if role == "run_ended" and "events" in value:
        value["events"] = None
        return True
    return False


def _expected_bytes(role: str, value: dict[str, Any], rollout: bool = False) -> bytes:
    value = orjson.loads(orjson.dumps(value))
    _live_only(role, value)
    if rollout and role == "audit":  # (the plan's version: checked by _check_rollout)
        _policy_version(value, [])
    return orjson.dumps(value)


def _outcome(value: dict[str, Any]) -> tuple[Any, ...]:
    """What a committed call or error result decides, for the contradiction check."""
    if "call_id" in value and not value.get("is_error"):
        return ("committed", orjson.dumps(value.get("arguments"), option=orjson.OPT_SORT_KEYS))
    return (value.get("state"), value.get("reason"))


def verify(plan: Plan, records: Iterable[OutRecord],
           acked_cancels: Collection[str] | None = None, exactly_once: bool = False,
           rollout: Rollout | None = None, latch: Latch | None = None) -> Verdict:
    """Check the promises on ``records`` (every output record) against the plan;
    ``acked_cancels`` are the runs whose cancel the broker acknowledged (default: every run
    with a cancel); with ``exactly_once`` a duplicate fails the verdict too; ``rollout``:
    the policy versions came from the registry; ``latch``: check the result latch's records
    (roles ``results`` and ``turns``, answer audits, result DLQ records; module doc)."""
    verdict = Verdict(runs=len(plan.runs), calls=plan.calls, exactly_once=exactly_once)
    flexible = {run.run_id for run in plan.runs if run.flexible}
    rolled = rollout is not None
    expected = {(e.topic.value, e.value["idempotency_key"]): _expected_bytes(e.topic.value,
                                                                              e.value, rolled)
                for run in plan.runs if run.run_id not in flexible for e in run.expected}
    audits: list[_Audit] = []
    by_key: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    by_call: dict[tuple[str, str], set[tuple[Any, ...]]] = defaultdict(set)
    dlq: dict[tuple[bytes | None, bytes], list[dict[str, Any]]] = defaultdict(list)
    decoded: dict[tuple[str, str], dict[str, Any]] = {}
    states: States = defaultdict(lambda: defaultdict(set))
    kept = _LatchRecords()
    for record in records:
        try:
            value = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            verdict.fail("mismatched", f"{record.role}[{record.partition}]@{record.offset} is "
                         "not JSON")
            continue
        if latch is not None and isinstance(value, dict) and kept.take(record, value):
            continue
        if record.role in ("results", "turns"):
            continue  # (the result latch's: checked with ``latch`` only)
        if record.role == "dlq":
            raw_key = value.get("source", {}).get("key_b64")
            key = None if raw_key is None else base64.b64decode(raw_key)
            dlq[(key, base64.b64decode(value.get("original_b64") or ""))].append(value)
            continue
        raw = record.value
        if record.role == "audit" and "result" in value:
            continue  # (a committed call's answer, the result latch's: not in the plan)
        if record.role == "audit":  # where it was read and the trace: the live worker's only
            if rolled:
                _policy_version(value, audits)
            value["source"] = value["trace_id"] = None
            raw = orjson.dumps(value)
        elif _live_only(record.role, value):
            raw = orjson.dumps(value)
        ikey = (record.role, str(value.get("idempotency_key")))
        if value.get("run_id") in flexible:
            expected.setdefault(ikey, raw)  # any record, but one set of bytes
        by_key[ikey].append(raw)
        decoded.setdefault(ikey, value)
        if record.role in ("committed", "errors"):
            call = value.get("call_id") if record.role == "committed" else value.get(
                "tool_call_id")
            # One kind of outcome per call id, whatever its place: a runner pairs results
            # by id (docs/contract.md, "Choices the contract leaves open").
            by_call[(str(value.get("run_id")), str(call))].add(_outcome(value))
            state = ("committed", None) if record.role == "committed" else (
                value.get("state"), value.get("reason"))
            states[str(value.get("run_id"))][str(call)].add(state)
    _check_records(verdict, expected, by_key)
    _check_calls(verdict, by_call)
    _check_finals(verdict, plan, decoded, states)
    _check_cancels(verdict, plan, decoded, states, acked_cancels)
    _check_dlq(verdict, plan, dlq)
    verdict.committed = sum(1 for role, _ in by_key if role == "committed")
    verdict.errors = sum(1 for role, _ in by_key if role == "errors")
    verdict.duplicates += sum(len(v) - 1 for v in by_key.values())
    verdict.approvals = _approvals(decoded)
    if rollout is not None:
        _check_rollout(verdict, rollout, audits)
    if latch is not None:
        _check_turns(verdict, plan, decoded, kept, latch)
    return verdict


#: What the events log says of a committed call's deadline: answered in time, timed out
#: before its first answer, or too close to tell (a tick within the span its commit time may
#: take).
IN_TIME, TIMED_OUT, EITHER = "answered", "tool_timeout", "either"


def deadlines(events: Iterable[OutRecord], commits: dict[str, tuple[int, int]],
              deadline_ms: int) -> dict[str, str]:
    """Replay each committed call's deadline from the events log, as the latch decides it
    (worker/core/pairing.py): the call waits from its commit, at record time ``commit_ms``,
    the latest record time of its partition up to the record that committed it (the
    assembler's clock: at least that record's own time, at most the largest before it); a
    tick (key ``__latch_tick__``) whose record time is ``commit_ms + deadline_ms`` or later
    times it out, unless a forwarded ``tool.result`` for it comes first. A call decided one
    way with the lower and the other with the upper bound of ``commit_ms`` is :data:`EITHER`;
    a call with neither a tick past its deadline nor a result has no entry."""
    at: dict[tuple[int, int], list[str]] = defaultdict(list)
    for key, where in commits.items():
        at[where].append(key)
    decided: dict[str, set[str]] = defaultdict(set)
    by_partition: dict[int, list[OutRecord]] = defaultdict(list)
    for record in events:
        by_partition[record.partition].append(record)
    tick = TICK_KEY.encode()
    for partition, records in by_partition.items():
        clock = 0
        waiting: dict[str, tuple[int, int]] = {}  # key -> (earliest, latest) deadline
        for record in sorted(records, key=lambda r: r.offset):
            for key in at.get((partition, record.offset), []):
                waiting[key] = (record.timestamp + deadline_ms,
                                max(clock, record.timestamp) + deadline_ms)
            clock = max(clock, record.timestamp)
            if record.key == tick:
                for key, (early, late) in list(waiting.items()):
                    if early <= record.timestamp:
                        decided[key].add(TIMED_OUT)
                        if late <= record.timestamp:
                            del waiting[key]
            elif b'"' + RESULT.encode() + b'"' in record.value:
                try:
                    key = str(orjson.loads(record.value).get("idempotency_key"))
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if key in waiting:
                    del waiting[key]
                    decided[key].add(IN_TIME)
    return {key: EITHER if len(ways) > 1 else next(iter(ways)) for key, ways in decided.items()}


def _check_turns(verdict: Verdict, plan: Plan, decoded: dict[tuple[str, str], dict[str, Any]],
                 kept: _LatchRecords, latch: Latch) -> None:
    """The result latch's promises on every run with a final message (module doc)."""
    verdict.latch = True
    replayed = (deadlines(latch.events, kept.commits, latch.deadline_ms)
                if latch.events and latch.deadline_ms is not None else None)
    twice = {line.split(" ")[1] for line in latch.execution_log.splitlines()
             if line.startswith("D ") and len(line.split(" ")) == 3}
    dlq: dict[str, Counter[str]] = defaultdict(Counter)
    reasons: Counter[str] = Counter()
    for (key, _), found in kept.dlq.items():
        verdict.duplicates += len(found) - 1
        named = {str(g.get("reason")) for g in found}
        if len(named) > 1:
            verdict.fail("contradictions", f"one result of {key} is in the DLQ as "
                         f"{sorted(named)}")
        dlq[key][min(named)] += 1
        reasons[min(named)] += 1
    verdict.result_dlq = dict(reasons)
    keys = {(str(v.get("run_id")), str(v.get("call_id"))): str(v.get("idempotency_key"))
            for (role, _), v in decoded.items() if role == "committed"}
    checked: set[str] = set()
    for run in plan.runs:
        final = decoded.get(("final", idempotency_key(run.run_id, "final")))
        if final is None:
            continue  # (missing: counted by _check_records or _check_cancels)
        got = kept.turns.get(run.run_id)
        if not got:
            verdict.fail("missing", f"no turn record for {run.run_id}")
            continue
        verdict.turns += 1
        verdict.duplicates += len(got) - 1
        if len(set(got)) > 1:
            verdict.fail("contradictions", f"{len(set(got))} different turn records for "
                         f"{run.run_id}")
        _check_turn(verdict, run.run_id, final, orjson.loads(got[0]), keys, kept, dlq,
                    latch.misbehaviour, twice, checked, replayed)
    for key, got in kept.latch.items():
        verdict.duplicates += len(got) - 1
        if len(set(got)) > 1:
            verdict.fail("contradictions", f"{len(set(got))} different tool_timeout results "
                         f"of the latch for {key}")
        if key not in checked:
            verdict.fail("mismatched", f"a tool_timeout result of the latch for {key}, a call "
                         "of no turn record")
    for key, counts in dlq.items():
        if key not in checked:
            verdict.fail("mismatched", f"result DLQ records {dict(counts)} for {key}, a call "
                         "of no turn record")
    for key, got in kept.audits.items():
        verdict.duplicates += len(got) - 1
        if len(set(got)) > 1:
            verdict.fail("contradictions", f"{len(set(got))} different answer audits for {key}")


def _check_turn(verdict: Verdict, run_id: str, final: dict[str, Any], turn: dict[str, Any],
                keys: dict[tuple[str, str], str], kept: _LatchRecords,
                dlq: dict[str, Counter[str]], misbehaviour: Misbehaviour, twice: set[str],
                checked: set[str], replayed: dict[str, str] | None) -> None:
    """One run's turn record against its final message and the results (module doc)."""
    said = sorted(final.get("outcomes") or [],
                  key=lambda o: (o.get("choice", 0), o.get("index", 0)))
    entries = turn.get("outcomes") or []
    answers = Counter(e.get("tool_call_id") for e in entries if e.get("outcome") in _ANSWERS)
    for call_id, n in answers.items():
        if n > 1:
            verdict.fail("contradictions", f"{run_id} {call_id} is answered {n} times in its "
                         "turn record")
    if ([o.get("tool_call_id") for o in said] != [e.get("tool_call_id") for e in entries]
            or turn.get("final_idempotency_key") != final.get("idempotency_key")):
        verdict.fail("mismatched", f"the turn record of {run_id} lists calls "
                     f"{[e.get('tool_call_id') for e in entries]}, its final message "
                     f"{[o.get('tool_call_id') for o in said]}")
        return
    for said_one, entry in zip(said, entries, strict=True):
        call_id, outcome = said_one.get("tool_call_id"), entry.get("outcome")
        if said_one.get("dropped"):
            if outcome != "dropped":
                verdict.fail("mismatched", f"{run_id} {call_id}: dropped from the final "
                             f"message, but {outcome} in the turn record")
        elif said_one.get("state") != "committed":
            if (outcome, entry.get("reason")) != ("failed", said_one.get("reason")):
                verdict.fail("mismatched", f"{run_id} {call_id}: {said_one.get('state')}/"
                             f"{said_one.get('reason')} in the final message, "
                             f"{outcome}/{entry.get('reason')} in the turn record")
        elif (key := keys.get((run_id, str(call_id)))) is None:
            verdict.fail("missing", f"{run_id} {call_id}: committed in the final message, no "
                         "committed record")
        else:
            checked.add(key)
            _check_answer(verdict, key, outcome, kept, dlq.get(key, Counter()),
                          misbehaviour.of(key), key in twice)
            if replayed is not None and key in kept.commits:
                _check_deadline(verdict, key, outcome, replayed.get(key))


def _check_deadline(verdict: Verdict, key: str, outcome: Any, replayed: str | None) -> None:
    """A committed call's answer against its deadline replayed from the events log."""
    verdict.deadline_checked += 1
    if replayed == EITHER:
        verdict.deadline_either += 1
    elif replayed is None:
        verdict.fail("mismatched", f"{key}: {outcome} in the turn record, but the events log "
                     "has neither its answer nor a tick past its deadline")
    elif outcome in (IN_TIME, TIMED_OUT) and outcome != replayed:
        said = ("answered in time" if replayed == IN_TIME
                else "not answered before a tick past its deadline")
        verdict.fail("mismatched", f"{key}: {outcome} in the turn record, but by the events "
                     f"log it was {said}")


def _check_answer(verdict: Verdict, key: str, outcome: Any, kept: _LatchRecords,
                  dlq: Counter[str], intent: str | None, twice: bool) -> None:
    """One committed call's answer in its turn record, against the plan's intent, the
    results topic and the result DLQ (module doc)."""
    runner, timed_out = kept.runner.get(key, []), bool(kept.latch.get(key))
    if outcome == "tool_timeout":
        verdict.tool_timeouts += 1
        if intent == HANG:
            verdict.hung += 1
        elif dlq["result_late"]:
            verdict.late += 1
        else:
            verdict.fail("mismatched", f"{key}: tool_timeout in the turn record, but the plan "
                         "did not make it hang and no answer of it came late (result_late)")
        if not timed_out:
            verdict.fail("missing", f"{key}: tool_timeout in the turn record, no tool_timeout "
                         "result of the latch")
    elif outcome == "answered":
        if intent == HANG:
            verdict.fail("mismatched", f"{key}: answered, but the plan made its runners hang")
        if timed_out:
            verdict.fail("contradictions", f"{key}: answered in the turn record, and the latch "
                         "answered it tool_timeout")
    else:
        verdict.fail("mismatched", f"{key}: {outcome} in the turn record, expected answered "
                     "or tool_timeout")
        return
    if intent == HANG and runner:
        verdict.fail("mismatched", f"{key}: the plan made it hang, and a runner answered it")
    extra = len(runner) - (outcome == "answered")
    if outcome == "answered" and runner and kept.dlq_sources.get(key) == kept.sources.get(key):
        # every runner answer is in the DLQ, the one that counted too: forwarded again after
        # its turn closed (at least once), a repeat the latch no longer knew by its source
        verdict.reforwarded += 1
        verdict.duplicates += 1
        extra += 1
    wanted = "result_duplicate" if outcome == "answered" else "result_late"
    if sum(dlq.values()) < extra:
        verdict.fail("missing", f"{key}: {len(runner)} runner answers, "
                     f"{sum(dlq.values())} in the DLQ")
    elif sum(dlq.values()) > extra or set(dlq) - {wanted}:
        verdict.fail("mismatched", f"{key}: result DLQ records {dict(dlq)} for {len(runner)} "
                     f"runner answers and a call {outcome}")
    if twice and len(runner) < 2:
        verdict.fail("missing", f"{key}: answered twice (the runner's log), "
                     f"{len(runner)} runner answers on the results topic")
    audits = {orjson.loads(a).get("outcome") for a in kept.audits.get(key, [])}
    if not audits:
        verdict.fail("missing", f"{key}: no audit record of its answer")
    elif audits != {outcome}:
        verdict.fail("contradictions", f"{key}: answer audits say {sorted(map(str, audits))}, "
                     f"the turn record {outcome}")


def _check_rollout(verdict: Verdict, rollout: Rollout, audits: list[_Audit]) -> None:
    """The markers of each events partition, then each audit record's version (module doc)."""
    registered, last = set(rollout.versions), max(rollout.versions)
    for partition in range(rollout.partitions):
        found = rollout.markers.get(partition, [])
        versions = [v for _, v in found]
        if not found:
            verdict.fail("missing", f"events[{partition}] has no policy marker")
        elif any(v not in registered for v in versions):
            verdict.fail("mismatched", f"events[{partition}] has markers of versions never "
                         f"registered: {sorted(set(versions) - registered)}")
        elif any(b < a for a, b in itertools.pairwise(versions)):
            verdict.fail("mismatched", f"events[{partition}]'s markers go back: {versions}")
        elif versions[-1] != last:
            verdict.fail("missing", f"events[{partition}] ends with policy version "
                         f"{versions[-1]} in force, not the last registered, {last}")
    seen: dict[tuple[str, str], set[Any]] = defaultdict(set)
    for key, partition, offset, version, held in audits:
        seen[key].add(version)
        before = [v for o, v in rollout.markers.get(partition, []) if o < offset]
        in_force = before[-1] if before else None
        if version not in registered:
            verdict.fail("mismatched", f"the audit of {key[0]} names policy version "
                         f"{version!r}, never registered")
        elif held and version not in before:
            verdict.fail("mismatched", f"the audit of {key[0]} (held) names policy version "
                         f"{version}, not in force at events[{partition}]@{offset} or before")
        elif not held and version != in_force:
            verdict.fail("mismatched", f"the audit of {key[0]} names policy version "
                         f"{version}, but version {in_force} was in force at "
                         f"events[{partition}]@{offset}")
    for key, named in seen.items():
        if len(named) > 1:
            verdict.fail("contradictions", f"the audits of {key[0]} name policy versions "
                         f"{sorted(map(str, named))}")
    verdict.policy_versions = len(rollout.versions)
    verdict.policy_audits = dict(sorted(Counter(v for _, _, _, v, _ in audits).items(),
                                        key=lambda item: str(item[0])))
    verdict.policy_markers = sum(map(len, rollout.markers.values()))


def _approvals(decoded: dict[tuple[str, str], dict[str, Any]]) -> dict[str, int]:
    """The outcomes of the calls that have a pending record, by outcome."""
    held = {(v.get("run_id"), v.get("call_id")) for (role, _), v in decoded.items()
            if role == "pending"}
    counts: dict[str, int] = defaultdict(int)
    for (role, _), value in decoded.items():
        if role == "committed" and (value.get("run_id"), value.get("call_id")) in held:
            counts["committed"] += 1
        elif role == "errors" and (value.get("run_id"), value.get("tool_call_id")) in held:
            counts[str(value.get("reason"))] += 1
    return dict(counts)


def _check_records(verdict: Verdict, expected: dict[tuple[str, str], bytes],
                   by_key: dict[tuple[str, str], list[bytes]]) -> None:
    for key, want in expected.items():
        got = by_key.get(key)
        if got is None:
            verdict.fail("missing", f"no {key[0]} record for {key[1]}")
        elif got[0] != want:
            verdict.fail("mismatched", f"{key[0]} {key[1]}: got {_short(got[0])}, expected "
                         f"{_short(want)}")
    for key, got in by_key.items():
        if key not in expected:
            verdict.fail("mismatched", f"unexpected {key[0]} record {key[1]}: {_short(got[0])}")
        if len(set(got)) > 1:
            verdict.fail("contradictions", f"{len(set(got))} different {key[0]} records for "
                         f"{key[1]}")


def _check_calls(verdict: Verdict, by_call: dict[tuple[str, str], set[tuple[Any, ...]]]) -> None:
    for (run_id, call_id), outcomes in by_call.items():
        if len(outcomes) > 1:
            shown = ", ".join(sorted(str(o[0]) + ("/" + str(o[1]) if o[0] != "committed" else "")
                                     for o in outcomes))
            verdict.fail("contradictions", f"{run_id} {call_id} has {len(outcomes)} outcomes: "
                         f"{shown}")


def _check_finals(verdict: Verdict, plan: Plan,
                  decoded: dict[tuple[str, str], dict[str, Any]], states: States) -> None:
    """Each run's final message lists the outcomes that its records carry, call by call."""
    for run in plan.runs:
        final = decoded.get(("final", idempotency_key(run.run_id, "final")))
        if final is None:
            continue  # counted as missing by _check_records
        said: dict[str, set[tuple[Any, Any]]] = defaultdict(set)
        for outcome in final.get("outcomes", []):
            said[outcome.get("tool_call_id")].add((outcome.get("state"), outcome.get("reason")))
        records = states.get(run.run_id, {})
        if not _final_agrees(said, records):
            verdict.fail("contradictions", f"the final message of {run.run_id} says "
                         f"{dict(said)}, its records say {dict(records)}")


def _final_agrees(said: dict[str, set[tuple[Any, Any]]],
                  records: dict[str, set[tuple[Any, Any]]]) -> bool:
    """Whether a final message's outcomes (per call id, the (state, reason) pairs it lists)
    are those of its run's records: the same ids and pairs, but that the final may add
    ``failed``/``duplicate_call_id`` for an id with records (a later call that reused the id
    once its outcome was out gets no record of its own)."""
    if said.keys() != records.keys():
        return False
    return all(records[cid] <= said[cid] and said[cid] - records[cid] <= {UNRECORDED}
               for cid in said)


def _check_cancels(verdict: Verdict, plan: Plan, decoded: dict[tuple[str, str], dict[str, Any]],
                   states: States, acked: Collection[str] | None) -> None:
    """Every acknowledged cancel ended its run ``cancelled`` and each call the run opened
    ``cancelled``, unless committed before it (early commit)."""
    for run in plan.runs:
        final = decoded.get(("final", f"{run.run_id}:final"))
        if final is None and run.flexible:  # the exact check does not know this run's records
            verdict.fail("missing", f"no final message for {run.run_id}")
        if final is None or run.cancel is None or (acked is not None
                                                   and run.run_id not in acked):
            continue
        if final.get("status") != "cancelled":
            verdict.fail("missing", f"the cancel of {run.run_id} was acknowledged, but the "
                         f"run ended {final.get('status')}")
        for call_id, outcome in states.get(run.run_id, {}).items():
            # (a call that shares its id with another is never run either)
            if not outcome <= {("committed", None), ("cancelled", "cancelled"), UNRECORDED}:
                verdict.fail("missing", f"the cancel of {run.run_id} was acknowledged, but "
                             f"{call_id} ended {sorted(map(str, outcome))}")


def _check_dlq(verdict: Verdict, plan: Plan,
               dlq: dict[tuple[bytes | None, bytes], list[dict[str, Any]]]) -> None:
    wanted: dict[tuple[bytes | None, bytes], BadInput] = {(b.key, b.value): b for b in plan.bad}
    for key, bad in wanted.items():
        got = dlq.get(key)
        if not got:
            verdict.fail("missing", f"bad input {bad.key!r} ({bad.reason}) is not in the DLQ")
        elif {g.get("reason") for g in got} != {bad.reason}:
            verdict.fail("mismatched", f"bad input {bad.key!r}: DLQ reason "
                         f"{sorted({str(g.get('reason')) for g in got})}, expected {bad.reason}")
    for key, got in dlq.items():
        if key not in wanted:
            verdict.fail("mismatched", f"unexpected DLQ record ({got[0].get('reason')}: "
                         f"{got[0].get('detail')}) for key {key[0]!r}")
        verdict.duplicates += len(got) - 1
    verdict.dlq = len(dlq)


def _short(value: bytes, limit: int = 160) -> str:
    text = value.decode("utf-8", "replace")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(value)} bytes)"




@dataclass(slots=True)
class RunnerVerdict:
    """``--runners``: the committed calls' results and executions (decision 0012).

    Each committed call (distinct ``idempotency_key``) has exactly one result on the results
    topic read at read_committed (``missing`` none, ``duplicates`` more). Executions come from
    the runners' log: a call is ``once`` when it ran once; a call that ran more often is
    ``repeated_in_tool`` / ``repeated_after_tool`` when every run of it but the last was cut
    short by a SIGKILL inside the tool / after the tool returned and before its transaction
    committed (the runner journal's documented exception), and ``unexplained`` otherwise.

    With misbehaving runners (``--hang-rate``, ``--twice-rate``): the results the latch wrote
    (``"by": "latch"``) are not the runners'; a call the plan made hang has no runner result
    and no execution (``hung``; a runner answer of it is a duplicate), a call answered twice
    may have two (``twice``)."""

    calls: int = 0
    results: int = 0
    missing: int = 0
    duplicates: int = 0
    once: int = 0
    repeated_in_tool: int = 0
    repeated_after_tool: int = 0
    unexplained: int = 0
    executions: int = 0
    hung: int = 0
    twice: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicates or self.unexplained)

    def summary(self, kills: int) -> str:
        return (f"runners: calls={self.calls} results={self.results} missing={self.missing} "
                f"duplicates={self.duplicates} runner_kills={kills} "
                f"executions={self.executions} executed_once={self.once} "
                f"repeated_after_kill_in_tool={self.repeated_in_tool} "
                f"repeated_after_kill_after_tool={self.repeated_after_tool} "
                f"unexplained_repeats={self.unexplained}"
                + (f" hung={self.hung} answered_twice={self.twice}"
                   if self.hung or self.twice else "")
                + f" -> {'PASS' if self.ok else 'FAIL'}")


def verify_runners(records: Iterable[OutRecord], execution_log: str,
                   misbehaviour: Misbehaviour | None = None) -> RunnerVerdict:
    """Check the committed calls (role ``committed``) against their results (role
    ``results``) and the runners' execution log (lines ``S|E|C|H|D KEY PID``)."""
    verdict = RunnerVerdict()
    bad = misbehaviour or Misbehaviour()
    committed: set[str] = set()
    results: dict[str, set[bytes]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    for record in records:
        value = orjson.loads(record.value)
        key = str(value.get("idempotency_key"))
        if record.role == "committed":
            committed.add(key)
        elif record.role == "results":
            if value.get("by") == "latch":
                continue  # (the result latch's tool_timeout: not a runner's)
            results[key].add(record.value)
            counts[key] += 1
    marks: dict[str, list[tuple[str, str]]] = defaultdict(list)  # key -> (mark, pid), in order
    for line in execution_log.splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            marks[parts[1]].append((parts[0], parts[2]))
    verdict.calls, verdict.results = len(committed), sum(1 for k in committed if k in results)
    for key in sorted(committed):
        intent = bad.of(key)
        if intent == HANG:
            verdict.hung += 1
            if key in results:
                verdict.duplicates += 1
                verdict.failures.append(f"duplicates: {counts[key]} results for {key}, a "
                                        "call the runners hang on")
            continue
        if intent == TWICE and counts[key] == 2:  # (its second answer: the DLQ's)
            verdict.twice += 1
            counts[key] = 1
        if key not in results:
            verdict.missing += 1
            verdict.failures.append(f"missing: no result for {key}")
        elif counts[key] > 1:
            verdict.duplicates += 1
            verdict.failures.append(f"duplicates: {counts[key]} results for {key}")
        runs = [pid for mark, pid in marks.get(key, []) if mark == "S"]
        verdict.executions += len(runs)
        if len(runs) == 1:
            verdict.once += 1
            continue
        done = {(mark, pid) for mark, pid in marks.get(key, [])}
        cut = runs[:-1]
        if not runs:
            verdict.unexplained += 1
            verdict.failures.append(f"unexplained: {key} has a result but never ran")
        elif any(("C", pid) in done for pid in cut):
            verdict.unexplained += 1
            verdict.failures.append(f"unexplained: {key} ran {len(runs)} times, once after "
                                    "its transaction committed")
        elif all(("E", pid) not in done for pid in cut):
            verdict.repeated_in_tool += 1
        else:
            verdict.repeated_after_tool += 1
    return verdict
