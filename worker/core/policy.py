"""Who may call what: the core's side of the policy step of the completion latch.

The core decides *whether a call is allowed* through a :class:`Policy` it is given (the Cedar
policies of a tenant, issue 25, evaluated by :mod:`worker.policy`); the core itself imports no
policy engine and does no I/O. A policy is pure: the same request gives the same decision, so
that take-over and replay decide as the live worker did.

The request for one call is made after the schema check and before the budget
(:mod:`worker.core.latch`): the run's tenant, the tool's name and attributes, the committed
arguments (the parsed value), the provider and the run id. The answer is a
:class:`PolicyDecision`; the latch records it on the call (``Call.decision``) so that the
outputs and the audit record carry it, and in ``enforce`` mode a denied call fails
``policy_denied``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

__all__ = ["ENFORCE", "LOG_ONLY", "MODES", "OFF", "Policy", "PolicyDecision", "PolicyRequest"]

#: Policy modes (``policy.mode`` in latch.yaml): no decision at all (today's behaviour);
#: decide and record, commit anyway; decide, and a call without a permit is denied.
OFF = "off"
LOG_ONLY = "log_only"
ENFORCE = "enforce"
MODES = (OFF, LOG_ONLY, ENFORCE)


class PolicyRequest(NamedTuple):
    """One call as a policy sees it (never logged: ``arguments`` may hold a secret)."""

    #: The run's tenant (None: the run named none).
    tenant: str | None
    #: The tool's name: the one its committed record carries, whatever type the run declared
    #: it as (``worker/core/identity.py``).
    tool: str
    #: The tool's attributes: its ``kind``; its toolset and MCP annotations, when given; an MCP
    #: server's ``server_label``.
    attributes: dict[str, Any]
    #: The committed arguments (the parsed value).
    arguments: Any
    provider: str
    run_id: str


class PolicyDecision(NamedTuple):
    """What a policy said of one call."""

    #: The mode it was made in (:data:`LOG_ONLY` or :data:`ENFORCE`).
    mode: str
    #: Whether a policy permits the call and none forbids it.
    allow: bool
    #: The ids of the determining policies (those that permitted, or forbade).
    policies: tuple[str, ...] = ()
    #: Evaluation errors, by policy id and kind (never argument text); an error denies.
    errors: tuple[str, ...] = ()
    #: The version of the policy set that decided (None: a policy file, not the registry).
    version: int | None = None
    #: Whether a determining permit asks for a person's approval first (a Cedar
    #: ``@approval("required")`` annotation; docs/policies.md, "Approvals").
    approval: bool = False
    #: Whether the determining policies are satisfied ``forbid`` policies (else, when there are
    #: any, they are the permits that allowed the call, perhaps beside an error).
    forbidden: bool = False


class Policy(Protocol):
    """A policy set in force: its mode, its version, and its decision for one call."""

    @property
    def mode(self) -> str: ...

    @property
    def version(self) -> int | None: ...

    def decide(self, request: PolicyRequest) -> PolicyDecision: ...
