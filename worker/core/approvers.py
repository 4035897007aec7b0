"""Who may decide a held call: the core's side of signed approvals (docs/policies.md, "Approvals";
docs/decisions/0019-approver-identity.md).

Who sends what, and what is trusted:

* A decision (``approve``, ``deny``, ``edit``) reaches a run as a marker in its events
  partition. Two principals can put one there: whoever may write the control topic (the
  gateway, which writes cancels, and the approval tools), whose record the worker forwards,
  and whoever may write the events topic itself (the gateway). Neither topic's ACL says
  *which person* decided, so neither is trusted for it.
* What is trusted is the decision's **signature** (:func:`signed_bytes`): HMAC-SHA256 with an
  approver's key, named by its key id; the worker holds each key id with the approver it
  belongs to (``approvers.keys`` / ``approvers.owners``). A valid signature proves that the
  holder of that approver's key decided *this* decision of *this* call of *this* run, with
  these edited arguments and this reason; ``by`` must name the key's owner. It is checked
  where the decision is applied (not where it is forwarded), so a marker written straight
  into the events topic, a replay and a take-over are judged alike.
* The approver must then be allowed by the policy in force (:class:`ApproverPolicy`): Cedar
  principal ``Latch::Approver::"<id>"``, action ``approve``/``deny``/``edit``, resource the
  call's tool, context the run's tenant and the call's arguments.
* An ``approve`` is decided against the policy in force when it is applied: a call that the
  policy now forbids fails ``policy_denied`` and is never committed (``Latch.approve``).

A decision refused here goes to the DLQ with its bytes (reason ``approval_unsigned``,
``approver_unknown_key``, ``approval_bad_signature``, ``approver_not_allowed``); the call stays
held, until a decision that counts or its ``approval_timeout``.

Pure: the keys are given (:class:`Approvers`, built by the runtime from the configuration);
HMAC and SHA-256 are computations, not I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson

from worker.core.model import DlqReason
from worker.core.policy import ENFORCE, PolicyDecision

if TYPE_CHECKING:
    from worker.core.envelope import Decision

__all__ = ["ApproverPolicy", "ApproverRequest", "Approvers", "Signature", "approver_refusal",
           "mac", "signed_bytes"]


class Signature(NamedTuple):
    """A decision's signature (the envelope's ``signature`` object)."""

    #: The id of the approver's key that signed (``approvers.keys``).
    key: str
    #: When the approver signed, milliseconds since the epoch (informational, signed).
    ts: int
    #: Lowercase hex of HMAC-SHA256(key, :func:`signed_bytes`), 64 characters.
    mac: str


def signed_bytes(run_id: str, tool_call_id: str, decision: str, by: str, reason: str,
                 arguments: str | None, key: str, ts: int) -> bytes:
    """What an approver signs: one canonical JSON object (sorted keys, no spaces) naming the
    run, the call, the decision, the approver, the reason, the SHA-256 of an edit's new
    argument text (null for approve and deny), the key id and the time. Every field is
    bound: a signature cannot be moved onto another call, run, decision or argument text."""
    digest = (None if arguments is None
              else hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest())
    return orjson.dumps({"v": 1, "run_id": run_id, "tool_call_id": tool_call_id,
                         "type": decision, "by": by, "reason": reason,
                         "arguments_sha256": digest, "key": key, "ts": ts},
                        option=orjson.OPT_SORT_KEYS)


def mac(key: bytes, message: bytes) -> str:
    """Lowercase hex HMAC-SHA256 of ``message``."""
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class Approvers:
    """The approvers' verification keys by key id, each with the approver it belongs to
    (the worker's ``approvers.keys`` and ``approvers.owners``), and each approver's groups
    (``approvers.groups``: the approver entity's Cedar parents). Never shows a key. With no
    key (the runtime's default, ``approvers.keys`` empty), no decision counts."""

    __slots__ = ("_keys", "groups")

    def __init__(self, keys: Mapping[str, tuple[str, bytes]],
                 groups: Mapping[str, tuple[str, ...]] | None = None) -> None:
        #: key id -> (approver id, key bytes)
        self._keys = dict(keys)
        self.groups: dict[str, tuple[str, ...]] = dict(groups or {})

    def refusal(self, decision: Decision) -> tuple[DlqReason, str] | None:
        """Why ``decision`` does not count (unsigned, unknown key, a key of another approver,
        bad signature), or None when its signature proves ``decision.by`` made it."""
        signature = decision.signature
        if signature is None:
            return DlqReason.APPROVAL_UNSIGNED, "the decision is not signed by an approver"
        owned = self._keys.get(signature.key)
        if owned is None:
            return (DlqReason.APPROVER_UNKNOWN_KEY,
                    "the decision is signed with a key the worker does not know")
        owner, key = owned
        if owner != decision.by:
            return (DlqReason.APPROVER_UNKNOWN_KEY,
                    "the decision is signed with a key of another approver")
        expected = mac(key, signed_bytes(
            decision.run_id, decision.tool_call_id, decision.decision, decision.by,
            decision.reason, decision.arguments, signature.key, signature.ts))
        if not hmac.compare_digest(expected, signature.mac):
            return DlqReason.APPROVAL_BAD_SIGNATURE, "the decision's signature does not verify"
        return None

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of the keys a decision may be signed with (none: no decision counts)."""
        return tuple(sorted(self._keys))

    def __repr__(self) -> str:
        return f"Approvers(key_ids={sorted(self._keys)!r})"


class ApproverRequest(NamedTuple):
    """One decision as a policy sees it (never logged: ``arguments`` may hold a secret)."""

    #: The approver (the verified ``by``), and its groups.
    approver: str
    groups: tuple[str, ...]
    #: ``approve``, ``deny`` or ``edit``.
    action: str
    #: The run's tenant (None: the run named none).
    tenant: str | None
    #: The tool's one name, and its attributes with its kind (as the call's own request
    #: has them: worker.core.identity).
    tool: str
    attributes: dict[str, Any]
    #: The held call's arguments (the parsed value; a custom call's input text).
    arguments: Any
    provider: str
    run_id: str


class ApproverPolicy(Protocol):
    """A policy that also decides who may decide a held call (``CedarPolicy``)."""

    def decide_approver(self, request: ApproverRequest) -> PolicyDecision: ...


def approver_refusal(policy: Any, request: ApproverRequest) -> tuple[DlqReason, str] | None:
    """Why the policy in force does not let ``request.approver`` make this decision (None:
    it does). No policy, or one that only logs, lets everyone; a policy in force that cannot
    judge approvers denies (fail closed)."""
    if policy is None or policy.mode != ENFORCE:
        return None
    decide = getattr(policy, "decide_approver", None)
    if decide is None:
        return DlqReason.APPROVER_NOT_ALLOWED, "the policy in force cannot judge approvers"
    decision: PolicyDecision = decide(request)
    if decision.allow:
        return None
    why = (", ".join(decision.errors) if decision.errors
           else "forbidden by policy " + ", ".join(decision.policies) if decision.policies
           else "no policy permits it")
    return DlqReason.APPROVER_NOT_ALLOWED, f"the approver may not {request.action} this call: {why}"
