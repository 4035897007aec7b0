"""``core/policy.py``, the core's side of the policy step: a :class:`Policy` the core is given
(it imports no policy engine) is asked once per call that passed its schema, with the
request the module documents (tenant, tool, attributes, the parsed arguments, provider, run
id); its decision is recorded on the call's audit record in ``log_only`` and ``enforce``
mode, and only ``enforce`` fails a denied call. The Cedar policies behind the worker's
``Policy`` are tests/runtime/unit/test_policy.py's; ``policy_denied`` is test_latch.py's.
Named ``test_core_policy.py``: the runtime and the tools have a ``policy.py`` too."""

from __future__ import annotations

from typing import Any

from builders import CHAT, committed, errors, feed, provider_run

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.policy import ENFORCE, LOG_ONLY, MODES, OFF, PolicyDecision, PolicyRequest


class Recording:
    """A policy in ``mode`` that denies every call, recording each request it is asked."""

    version = 7

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.asked: list[PolicyRequest] = []

    def decide(self, request: PolicyRequest) -> PolicyDecision:
        self.asked.append(request)
        return PolicyDecision(self.mode, False, ("deny-all",), version=self.version)


def audits(emits: list[Emit]) -> list[dict[str, Any]]:
    return [e.value for e in emits if e.topic is Topic.AUDIT]


def _run(policy: Recording | None, text: str = '{"path": "/a"}') -> list[Emit]:
    asm = Assembler(AssembleSettings())
    asm.policy = policy
    tools = {"read_file": {"type": "object"}}
    return feed(asm, provider_run(CHAT, "r1", tools, [("c1", "read_file", text)]))


def test_the_modes_are_off_log_only_and_enforce() -> None:
    """The three modes of ``policy.mode``, in the order of their strictness."""
    assert MODES == (OFF, LOG_ONLY, ENFORCE) == ("off", "log_only", "enforce")


def test_a_policy_is_asked_with_the_documented_request() -> None:
    """The policy gets the run's tenant, the tool's name and kind, the parsed arguments, the
    provider and the run id, once for the one call."""
    policy = Recording(LOG_ONLY)
    _run(policy)
    [request] = policy.asked
    assert (request.tenant, request.tool, request.arguments, request.provider,
            request.run_id) == ("t1", "read_file", {"path": "/a"}, CHAT, "r1")
    assert request.attributes["kind"] == "function"


def test_log_only_records_the_denial_and_commits() -> None:
    """In ``log_only`` a denied call commits; its audit record carries the decision (mode,
    allow, policies, version)."""
    emits = _run(Recording(LOG_ONLY))
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
    [audit] = audits(emits)
    assert audit["policy"] == {"mode": "log_only", "allow": False, "policies": ["deny-all"],
                               "errors": [], "version": 7}


def test_enforce_fails_a_denied_call() -> None:
    """In ``enforce`` a denied call fails ``policy_denied`` and nothing commits."""
    emits = _run(Recording(ENFORCE))
    assert committed(emits) == []
    assert [e["reason"] for e in errors(emits)] == ["policy_denied"]


def test_no_policy_asks_nobody_and_audits_mode_off() -> None:
    """Without a policy the call commits and its audit record says ``{"mode": "off"}``; a
    call that fails before the policy step (invalid JSON) is never put to the policy."""
    [audit] = audits(_run(None))
    assert audit["policy"] == {"mode": "off"}
    policy = Recording(ENFORCE)
    assert [e["reason"] for e in errors(_run(policy, "{bad"))] == ["invalid_json"]
    assert policy.asked == []
