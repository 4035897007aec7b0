"""A held call stays held on every provider (issue 32 item 2; docs/policies.md, "Approvals").

A call waiting for a person's decision is not ended by the stream's end, whoever ends the
stream: the provider's own end event (Anthropic ``message_stop``, Responses
``response.completed``), or the gateway's ``stream.end`` (Chat's end, and the end at which
Bedrock's ``messageStop`` and Gemini's ``finishReason`` are read). Who sends what here:

* the model's stream (``provider.event``, through the gateway) decides the calls and the stop
  reason; it is trusted for nothing about approvals;
* the gateway sends ``stream.end`` (once, or again: a re-delivery or a later copy); it ends the
  stream, never a held call;
* an approver sends ``approve`` / ``deny`` (forwarded from the control topic): only that
  gives a held call its outcome (or ``approval_timeout`` at a tick, or a cancel, or a budget).

Each test runs all five providers, in each policy mode (no policy, ``log_only``,
``enforce``): before this fix a Bedrock or Gemini run failed its held call ``stream_error``
at ``stream.end``, ended ``failed``, and the decision went to the DLQ
(``call_already_decided``).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from builders import (
    ALL_PROVIDERS,
    BEDROCK,
    GEMINI,
    PATH_SCHEMA,
    bedrock_calls,
    check_outputs,
    check_schemas,
    committed,
    decision,
    dlq,
    errors,
    feed,
    finals,
    gemini_calls,
    provider_run,
    run_envelopes,
    stream_end,
    tick,
    tools_for,
)

from worker.core import Assembler, AssembleSettings, Emit, Topic
from worker.core.policy import ENFORCE, LOG_ONLY, PolicyDecision, PolicyRequest
from worker.core.settings import ApprovalSettings

TOOLS = {"read_file": PATH_SCHEMA, "delete_file": PATH_SCHEMA}
SECRET = "/srv/SECRET-hunter2"
GATED = ApprovalSettings(require_approval=("delete_file",), approval_timeout_s=10.0)


class Permits:
    """A policy set that permits every call, in a given mode."""

    version = None

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def decide(self, request: PolicyRequest) -> PolicyDecision:
        return PolicyDecision(self.mode, True, ("permit-all",))


#: The policy modes a held call must survive the stream's end in (None: ``policy.mode: off``).
MODES = {"off": None, "log_only": LOG_ONLY, "enforce": ENFORCE}


def asm(mode: str | None, **overrides: Any) -> Assembler:
    assembler = Assembler(AssembleSettings(**{"approvals": GATED, **overrides}))
    assembler.policy = None if mode is None else Permits(mode)
    return assembler


def args(path: str) -> str:
    return orjson.dumps({"path": path}).decode()


def held_run(provider: str, run_id: str = "r1", **kw: Any) -> list[dict[str, Any]]:
    """A whole run (the provider's own end, then ``stream.end``) that reads one file and
    deletes another: the delete waits for approval."""
    return provider_run(provider, run_id, TOOLS, [("c1", "read_file", args("/srv/a")),
                                                  ("c2", "delete_file", args(SECRET))], **kw)


def checked(emits: list[Emit]) -> list[Emit]:
    check_schemas(emits)
    check_outputs(emits)
    return emits


def kinds(emits: list[Emit]) -> list[Topic]:
    return [e.topic for e in emits if e.topic is not Topic.AUDIT]


both = pytest.mark.parametrize("provider", ALL_PROVIDERS)
modes = pytest.mark.parametrize("mode", list(MODES.values()), ids=list(MODES))


@both
@modes
def test_the_stream_end_leaves_a_held_call_waiting(provider: str, mode: str | None) -> None:
    """After the whole stream, ``stream.end`` included: the ungated call is committed, the
    gated one is on the pending topic, and nothing else: no error result (``stream_error``),
    no final message, no DLQ record; the run waits."""
    a = asm(mode)
    emits = checked(feed(a, held_run(provider)))
    assert kinds(emits) == [Topic.COMMITTED, Topic.PENDING], provider
    assert a.is_open("r1") and a.waiting_runs == 1
    assert a.stats["runs_failed"] == 0


@both
@modes
def test_approve_after_the_stream_end_commits(provider: str, mode: str | None) -> None:
    """``approve`` after ``stream.end``: the held call commits, then the run's one final
    message, status ``completed``, both calls committed; no error, no DLQ."""
    a = asm(mode)
    emits = checked(feed(a, [*held_run(provider), decision("r1", "approve", "c2")]))
    assert kinds(emits) == [Topic.COMMITTED, Topic.PENDING, Topic.COMMITTED, Topic.FINAL]
    assert [c["call_id"] for c in committed(emits)] == ["c1", "c2"]
    assert committed(emits)[1]["arguments"] == {"path": SECRET}
    (final,) = finals(emits)
    assert final["status"] == "completed"
    assert [o["state"] for o in final["outcomes"]] == ["committed", "committed"]
    assert not dlq(emits) and not errors(emits) and not a.is_open("r1")


@both
@modes
def test_deny_after_the_stream_end_gives_one_error(provider: str, mode: str | None) -> None:
    """``deny`` after ``stream.end``: exactly one error result, ``approval_denied`` (never
    ``stream_error``), without the argument text; the final message ``completed``."""
    a = asm(mode)
    emits = checked(feed(a, [*held_run(provider), decision("r1", "deny", "c2",
                                                           reason="no deletes")]))
    assert kinds(emits) == [Topic.COMMITTED, Topic.PENDING, Topic.ERRORS, Topic.FINAL]
    (error,) = errors(emits)
    assert error["reason"] == "approval_denied" and error["tool_call_id"] == "c2"
    assert SECRET not in orjson.dumps(error).decode()
    (final,) = finals(emits)
    assert final["status"] == "completed"
    assert [o.get("reason") for o in final["outcomes"]] == [None, "approval_denied"]
    assert not dlq(emits)


@both
def test_a_second_stream_end_changes_nothing(provider: str) -> None:
    """The gateway sending ``stream.end`` again (re-delivered, or a later copy with a higher
    ``seq``) after the run parked: nothing emitted, the call still waits and is decided once."""
    a = asm(None)
    run = held_run(provider)
    last = run[-1]["seq"]
    feed(a, run)
    assert feed(a, [stream_end("r1", last), stream_end("r1", last + 1)]) == []
    emits = feed(a, [decision("r1", "approve", "c2")])
    assert kinds(emits) == [Topic.COMMITTED, Topic.FINAL]


@both
def test_the_approval_timeout_still_applies(provider: str) -> None:
    """Nothing decides: the first tick ``approval_timeout_s`` of record time after the call
    was held fails it ``approval_timeout`` (the stream's end did not)."""
    a = asm(None)
    feed(a, held_run(provider, ts=1_000))
    emits = checked(feed(a, [tick(11_000)]))
    assert kinds(emits) == [Topic.ERRORS, Topic.FINAL]
    assert [e["reason"] for e in errors(emits)] == ["approval_timeout"]


@pytest.mark.parametrize("provider, events", [
    (BEDROCK, bedrock_calls([("c1", "delete_file", args(SECRET))], stop_reason="max_tokens")),
    (GEMINI, gemini_calls([("c1", "delete_file", args(SECRET))], finish_reason="MAX_TOKENS")),
], ids=[BEDROCK, GEMINI])
def test_a_truncating_stop_read_at_the_stream_end(provider: str, events: list[Any]) -> None:
    """A stop reason read at ``stream.end`` that truncates (Bedrock ``max_tokens``, Gemini
    ``MAX_TOKENS``): the call is not held (a truncated call is never committed) and the run
    ends ``truncated`` at once, as without approvals; nothing waits."""
    a = asm(None)
    emits = checked(feed(a, run_envelopes("r1", provider, tools_for(provider, TOOLS), events)))
    assert Topic.PENDING not in kinds(emits)
    assert finals(emits)[0]["status"] == "truncated" and not a.is_open("r1")


@pytest.mark.parametrize("provider", (BEDROCK, GEMINI))
def test_a_call_held_early_stays_held_at_the_stream_end(provider: str) -> None:
    """Block-level early commit: a pipelined gated call is held at its own end, while the
    run streams; the stop reason read at ``stream.end`` then completes the run and the call
    still waits; approve commits it, with the final message ``completed``."""
    a = asm(None, execute_before_stream_end=True, allow_pipelined_execute=("delete_file",))
    run = provider_run(provider, "r1", TOOLS, [("c1", "delete_file", args(SECRET))])
    emits = checked(feed(a, run))
    assert kinds(emits) == [Topic.PENDING] and a.waiting_runs == 1
    emits = checked(feed(a, [decision("r1", "approve", "c1")]))
    assert kinds(emits) == [Topic.COMMITTED, Topic.FINAL]
    assert finals(emits)[0]["status"] == "completed"
