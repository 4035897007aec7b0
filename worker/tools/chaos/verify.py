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
"""

from __future__ import annotations

import base64
import itertools
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from worker.core.outputs import idempotency_key
from worker.runtime.governance.registry import POLICY_MARKER, marker_version
from worker.tools.chaos.plan import UNRECORDED, BadInput, Plan

#: run_id -> tool call id -> the (state, reason) pairs its records carry.
States = dict[str, dict[str, set[tuple[Any, Any]]]]


@dataclass(frozen=True, slots=True)
class OutRecord:
    role: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


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
           rollout: Rollout | None = None) -> Verdict:
    """Check the promises on ``records`` (every output record) against the plan;
    ``acked_cancels`` are the runs whose cancel the broker acknowledged (default: every run
    with a cancel); with ``exactly_once`` a duplicate fails the verdict too; ``rollout``:
    the policy versions came from the registry (module doc)."""
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
    for record in records:
        try:
            value = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            verdict.fail("mismatched", f"{record.role}[{record.partition}]@{record.offset} is "
                         "not JSON")
            continue
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
    return verdict


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
    committed (the runner journal's documented exception), and ``unexplained`` otherwise."""

    calls: int = 0
    results: int = 0
    missing: int = 0
    duplicates: int = 0
    once: int = 0
    repeated_in_tool: int = 0
    repeated_after_tool: int = 0
    unexplained: int = 0
    executions: int = 0
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
                f"unexplained_repeats={self.unexplained} -> {'PASS' if self.ok else 'FAIL'}")


def verify_runners(records: Iterable[OutRecord], execution_log: str) -> RunnerVerdict:
    """Check the committed calls (role ``committed``) against their results (role
    ``results``) and the runners' execution log (lines ``S|E|C KEY PID``)."""
    verdict = RunnerVerdict()
    committed: set[str] = set()
    results: dict[str, set[bytes]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    for record in records:
        value = orjson.loads(record.value)
        key = str(value.get("idempotency_key"))
        if record.role == "committed":
            committed.add(key)
        elif record.role == "results":
            results[key].add(record.value)
            counts[key] += 1
    marks: dict[str, list[tuple[str, str]]] = defaultdict(list)  # key -> (mark, pid), in order
    for line in execution_log.splitlines():
        parts = line.split(" ")
        if len(parts) == 3:
            marks[parts[1]].append((parts[0], parts[2]))
    verdict.calls, verdict.results = len(committed), sum(1 for k in committed if k in results)
    for key in sorted(committed):
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
