"""``latch chaos --policy --policy-rollouts N`` without Kafka (issue 32): the versions chaos
rolls out decide every planned call as the policy file does, the workers' settings take the
policy from the stack's own registry, and the verifier holds each audit record's
``policy.version`` to the markers of the events log (and the markers to the registered
versions) without loosening any other check."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from worker.core import DlqReason, Topic
from worker.core.envelope import Rejected
from worker.core.outputs import dlq_record
from worker.runtime.governance import registry
from worker.runtime.governance.approvers import approvers as approvers_for
from worker.runtime.governance.policy import registry_policy
from worker.tools.chaos import plan as plan_module
from worker.tools.chaos import rollout
from worker.tools.chaos import run as chaos
from worker.tools.chaos.plan import Plan, build_plan, expected_emits
from worker.tools.chaos.verify import OutRecord, Rollout, markers, verify

PARTITIONS = 3
STACK = chaos.Stack("127.0.0.1:1", "chaos-unit", PARTITIONS, 5.0, 1.0,
                    policy=str(chaos.DEFAULT_POLICY), approval_timeout_s=7.0)
Markers = dict[int, list[tuple[int, int]]]


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(seed=7, runs=160, config=STACK.config(), env=STACK.env())


def _in_force(found: list[tuple[int, int]], offset: int) -> int | None:
    before = [v for o, v in found if o < offset]
    return before[-1] if before else None


def _records(plan: Plan, found: Markers) -> list[OutRecord]:
    """What correct workers write under the rollout ``found``: run ``i`` in events partition
    ``i % 3``, each record at an offset of its own, each audit record read there and naming
    the version in force there."""
    out: list[OutRecord] = []
    for index, run in enumerate(plan.runs):
        partition = index % PARTITIONS
        for emit in run.expected:
            value = orjson.loads(orjson.dumps(emit.value))
            offset = len(out) + 1
            if emit.topic is Topic.AUDIT:
                value["source"] = {"topic": "e", "partition": partition, "offset": offset}
                if "version" in value["policy"]:
                    value["policy"]["version"] = _in_force(found[partition], offset)
            out.append(OutRecord(emit.topic.value, partition, offset, run.run_id.encode(),
                                 orjson.dumps(value)))
    for bad in plan.bad:
        emit = dlq_record(Rejected(DlqReason(bad.reason), "detail"), bad.key, bad.value,
                          {"topic": "x", "partition": 0, "offset": len(out)})
        out.append(OutRecord("dlq", 0, len(out), bad.key, orjson.dumps(emit.value)))
    return out


def _markers(total: int) -> Markers:
    return {p: [(0, 1), (total // 2, 2), (total * 3 // 4, 3)] for p in range(PARTITIONS)}


def _setup(plan: Plan) -> tuple[list[OutRecord], Rollout]:
    total = sum(len(r.expected) for r in plan.runs)
    found = _markers(total)
    return _records(plan, found), Rollout((1, 2, 3), found, PARTITIONS)


def _audits(records: list[OutRecord], held: bool) -> list[tuple[int, dict[str, Any]]]:
    """The audit records decided by the policy, held for approval or not."""
    found = []
    for index, record in enumerate(records):
        if record.role != "audit":
            continue
        value = orjson.loads(record.value)
        is_held = "approval" in value or value.get("reason") == "approval_timeout"
        if "version" in value["policy"] and is_held == held:
            found.append((index, value))
    return found


def _replace(records: list[OutRecord], index: int, value: dict[str, Any]) -> list[OutRecord]:
    copy = list(records)
    old = copy[index]
    copy[index] = OutRecord(old.role, old.partition, old.offset, old.key, orjson.dumps(value))
    return copy


def test_audits_naming_the_version_in_force_at_their_call_pass(plan: Plan) -> None:
    """Versions 1, 2 and 3 put in force along every partition: audit records naming the
    version in force where their call was read pass, and the summary counts the versions;
    without the rollout the same records fail (the plan's version is the file's, None: the
    exact comparison is unchanged)."""
    records, rolled = _setup(plan)
    versions = {v["policy"]["version"] for _, v in _audits(records, held=False)}
    assert versions == {1, 2, 3}
    verdict = verify(plan, records, rollout=rolled)
    assert verdict.ok, verdict.failures[:3]
    assert verdict.policy_versions == 3 and "policy_versions=3 -> PASS" in verdict.summary(0, 0)
    assert not verify(plan, records).ok


@pytest.mark.parametrize("version", [2, None, 4, "3"])
def test_an_audit_naming_another_version_than_the_one_in_force_fails(
        plan: Plan, version: object) -> None:
    """A call decided where version 3 was in force whose audit names version 2 (an older
    set), None (a file), 4 (never registered) or ``"3"`` (not the number) fails
    ``mismatched``."""
    records, rolled = _setup(plan)
    index, value = next((i, v) for i, v in _audits(records, held=False)
                        if v["policy"]["version"] == 3)
    value["policy"]["version"] = version
    verdict = verify(plan, _replace(records, index, value), rollout=rolled)
    assert not verdict.ok and verdict.mismatched == 1, verdict.failures


def test_a_held_call_may_name_the_version_it_completed_under_but_not_a_later_one(
        plan: Plan) -> None:
    """A call held for approval is decided by the policy when it completes and audited at
    its decision or timeout: its audit may name a version put in force before that position
    (version 1 where 3 is in force), never one not yet in force there."""
    records, rolled = _setup(plan)
    held = _audits(records, held=True)
    index, value = next((i, v) for i, v in held if v["policy"]["version"] == 3)
    value["policy"]["version"] = 1
    assert verify(plan, _replace(records, index, value), rollout=rolled).ok
    index, value = next((i, v) for i, v in held if v["policy"]["version"] == 1)
    value["policy"]["version"] = 2
    verdict = verify(plan, _replace(records, index, value), rollout=rolled)
    assert not verdict.ok and verdict.mismatched == 1, verdict.failures


def test_two_audits_of_one_call_naming_two_versions_contradict(plan: Plan) -> None:
    """The same call audited twice (a rebuild after a kill), once where version 1 was in
    force and once, later in the log, where version 3 was: each consistent with its
    position, together a contradiction (a call is decided once)."""
    records, rolled = _setup(plan)
    index, value = next((i, v) for i, v in _audits(records, held=False)
                        if v["policy"]["version"] == 1)
    late = max(o for o, _ in rolled.markers[records[index].partition]) + 10**6
    value["source"]["offset"], value["policy"]["version"] = late, 3
    again = OutRecord("audit", records[index].partition, late, records[index].key,
                      orjson.dumps(value))
    verdict = verify(plan, [*records, again], rollout=rolled)
    assert not verdict.ok and verdict.contradictions == 1, verdict.failures


@pytest.mark.parametrize(("partition_markers", "counter"), [
    ([], "missing"),  # a partition never got a version in force
    ([(0, 1), (5, 3), (9, 2)], "mismatched"),  # versions went back
    ([(0, 1), (5, 2)], "missing"),  # the last version never reached it
    ([(0, 1), (5, 0), (9, 3)], "mismatched"),  # a marker Latch would not understand
    ([(0, 1), (5, 7), (9, 3)], "mismatched"),  # a version never registered
])
def test_every_partition_ends_with_the_last_version_and_its_markers_go_forward(
        plan: Plan, partition_markers: list[tuple[int, int]], counter: str) -> None:
    """The markers of events partition 2 (the audits unchanged: its markers checked on
    their own), each way they can be wrong, fail the verdict with ``counter``."""
    records, rolled = _setup(plan)
    found = {**rolled.markers, 2: partition_markers}
    verdict = verify(plan, records, rollout=Rollout(rolled.versions, found, PARTITIONS))
    assert not verdict.ok and getattr(verdict, counter) >= 1
    assert any(f.startswith(counter) and "events[2]" in f for f in verdict.failures)


def test_markers_are_read_from_events_records_by_key() -> None:
    """Only records keyed ``__latch_policy__`` are markers, in log order per partition; a
    value that names no version is version 0 (a failure for the verifier, not skipped)."""
    marker = registry.POLICY_MARKER
    records = [OutRecord("events", 1, 7, marker, registry.marker_value(2, 5)),
               OutRecord("events", 1, 3, marker, registry.marker_value(1, 5)),
               OutRecord("events", 0, 4, b"run-1", registry.marker_value(9, 5)),
               OutRecord("events", 0, 5, marker, b"{}")]
    assert markers(records) == {1: [(3, 1), (7, 2)], 0: [(5, 0)]}


def test_every_rolled_out_version_decides_the_plans_calls_as_the_file(
        plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each version's text is one ``latch registry put`` accepts, a text of its own, and the
    offline core under it (as the registry's version ``n``, built the workers' way) emits
    for every run exactly the plan's records but for the audit's ``policy.version``: ``n``."""
    policy = chaos.DEFAULT_POLICY.read_text()
    texts = rollout.texts(policy, 3)
    assert len(set(texts)) == 3
    config = STACK.config()
    keys = approvers_for(config, STACK.env())
    for version, text in enumerate(texts, start=1):
        registry.check_policy(text, version)
        built = registry_policy(text, "enforce", version)
        monkeypatch.setattr(plan_module, "assembler_policy", lambda _config, b=built: b)
        for run in plan.runs:
            got = [orjson.loads(orjson.dumps(e.value)) for e in expected_emits(run, config, keys)]
            want = [orjson.loads(orjson.dumps(e.value)) for e in run.expected]
            for value in want:
                if "version" in value.get("policy", {}):
                    value["policy"]["version"] = version
            assert got == want, run.run_id


def test_the_workers_take_the_policy_from_the_stacks_own_registry() -> None:
    """With ``policy_registry`` the workers' settings say ``enforce`` with no file (the
    registry decides), and every stack names its own registry topic; ``--policy-rollouts``
    parses, and is refused without ``--policy``."""
    env = chaos.Stack("b", "app", 1, 5.0, 1.0, policy="p.cedar", policy_registry=True).env()
    assert env["LATCH_POLICY__MODE"] == "enforce" and "LATCH_POLICY__FILE" not in env
    assert env["LATCH_TOPICS__REGISTRY"] == "app.registry"
    assert chaos.Stack("b", "app", 1, 5.0, 1.0, policy="p.cedar").env()[
        "LATCH_POLICY__FILE"] == "p.cedar"
    args = chaos.build_parser().parse_args(["--policy", "--policy-rollouts", "30"])
    assert args.policy_rollouts == 30 and args.policy == str(chaos.DEFAULT_POLICY)
    with pytest.raises(SystemExit):
        chaos.main(["--policy-rollouts", "3"])


def test_a_version_is_registered_through_broker_errors_and_once_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``rollout.register`` retries a put that Kafka refused (a broker restart), counts a
    version already registered with the same text (a put whose delivery report was lost) and
    refuses one registered with another text."""
    from worker.runtime.governance import registry_io

    tries: list[int] = []

    def put(_config: object, kind: str, name: str, version: int, text: str) -> str:
        tries.append(version)
        if len(tries) < 3:
            raise registry_io.RegistryError("broker away")
        raise registry.Invalid("policy set version 1 exists already")

    state = registry.RegistryState()
    key, value = registry.encode(registry.POLICY, "", 1, "permit-all")
    state.apply(key, value, 0, 0)
    monkeypatch.setattr(registry_io, "put", put)
    monkeypatch.setattr(registry_io, "read_whole", lambda _config: state)
    monkeypatch.setattr(rollout.time, "sleep", lambda _s: None)
    rollout.register(STACK.config(), 1, "permit-all")
    assert tries == [1, 1, 1]
    with pytest.raises(registry.Invalid):
        rollout.register(STACK.config(), 1, "another text")


def test_the_rollout_thread_registers_each_version_once_its_records_are_published(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Version ``n`` goes in once ``(n - 1) * every`` records are published, in order, and
    no version before its records (the driver's count read as it grows)."""
    sent = [0]
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(rollout, "register",
                        lambda _config, version, _text: seen.append((version, sent[0])))
    rollouts = rollout.Rollouts(STACK.config(), rollout.texts("t", 4), 100, lambda: sent[0])
    rollouts.start()
    for count in range(0, 401, 10):
        sent[0] = count
        rollouts.join(0.01)
    rollouts.join(5)
    assert [v for v, _ in seen] == [2, 3, 4] and rollouts.registered == [1, 2, 3, 4]
    assert all(at >= (v - 1) * 100 for v, at in seen) and rollouts.error is None
    assert [due for due, _ in rollouts.lags] == [100, 200, 300]
    assert all(at >= due for due, at in rollouts.lags)
