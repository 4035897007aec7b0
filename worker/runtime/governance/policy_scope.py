"""The policies of a Cedar policy set that can apply to one request, by their scope.

Cedar evaluates every policy of a set for every request; a policy whose scope names another
principal or another resource is false before its conditions are read, so it can neither
permit, forbid nor fail. A set of policies written per tenant and per tool (the usual shape:
``permit(principal == Latch::Tenant::"acme", action == Latch::Action::"call",
resource == Latch::Tool::"read_file") when {...}``) therefore costs, per call, the policies of
the whole set where only a few can hold. :class:`ScopedSets` hands the engine the policies
whose scope *may* match the request's principal and tool, with their ids unchanged, so the
decision (allow or deny, the determining policies, the errors) is the one the whole set gives
(``tests/runtime/unit/test_policy_scope.py`` compares both on every policy file we ship).

A scope constraint prunes only when its answer is certain without the entity store:
``== <entity>`` (the principal or the tool is that entity, or not) and ``is <type>`` (of that
type, or not; with an ``in`` as well, only the type prunes). ``in``, the unconstrained scope
and a template's slot keep the policy. A set with templates is never pruned. The action is
always ``Latch::Action::"call"``, so a policy scoped to another action never applies.

The subsets are found per request by set intersection (a few microseconds) and parsed once
per distinct subset; their number is bounded by the policies' distinct scopes, not by what
runs send (a tenant that no policy names shares the subset of every such tenant), and capped
at :data:`MAX_SUBSETS` (beyond it, the whole set).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cedarpy
import orjson

__all__ = ["MAX_SUBSETS", "ScopedSets"]

#: The most subsets kept parsed; a request whose subset is not among them uses the whole set.
MAX_SUBSETS = 1024

_Entity = tuple[str, str]


class _Index:
    """For one scope element (the principal or the resource): the policies an exact entity,
    an entity type, or anything at all may satisfy."""

    __slots__ = ("always", "by_entity", "by_type")

    def __init__(self) -> None:
        self.by_entity: dict[_Entity, set[str]] = {}
        self.by_type: dict[str, set[str]] = {}
        self.always: set[str] = set()

    def add(self, policy_id: str, scope: Any) -> None:
        op = scope.get("op") if isinstance(scope, dict) else None
        entity = _entity(scope.get("entity")) if op == "==" else None
        if entity is not None:  # (a slot, ``?principal``, has no ``entity``)
            self.by_entity.setdefault(entity, set()).add(policy_id)
        elif op == "is" and isinstance(scope.get("entity_type"), str):
            self.by_type.setdefault(scope["entity_type"], set()).add(policy_id)
        else:  # unconstrained, ``in``, a slot, or a form this reader does not know: may apply
            self.always.add(policy_id)

    def matching(self, entity: _Entity) -> set[str]:
        found = self.always | self.by_type.get(entity[0], _NONE)
        exact = self.by_entity.get(entity)
        return found | exact if exact else found


_NONE: frozenset[str] = frozenset()


def _entity(value: Any) -> _Entity | None:
    if isinstance(value, dict) and isinstance(value.get("type"), str) \
            and isinstance(value.get("id"), str) and len(value) == 2:
        return value["type"], value["id"]
    return None


class ScopedSets:
    """The parsed subsets of one policy set (the module docstring): ``est`` is the set in
    Cedar's JSON form (``cedarpy.policies_to_json_str``), ``whole`` the parsed set, ``action``
    the one action every request names."""

    def __init__(self, est: Mapping[str, Any], whole: cedarpy.PolicySet,
                 action: Mapping[str, str]) -> None:
        self.whole = whole
        policies: Mapping[str, Any] = est.get("staticPolicies") or {}
        #: In the set's order (a subset keeps it, so Cedar's answers list ids alike).
        self._policies = dict(policies)
        #: Whether requests get subsets (a set with templates never does; False: always the
        #: whole set, as Cedar would evaluate it).
        self.pruned = not (est.get("templates") or est.get("templateLinks"))
        self._principals, self._resources = _Index(), _Index()
        self._actions: set[str] = set()
        call = (action["type"], action["id"])
        for policy_id, policy in self._policies.items():
            self._principals.add(policy_id, policy.get("principal"))
            self._resources.add(policy_id, policy.get("resource"))
            scope = policy.get("action")
            op = scope.get("op") if isinstance(scope, dict) else None
            if op != "==" or _entity(scope.get("entity")) in (None, call):
                self._actions.add(policy_id)
        self._subsets: dict[frozenset[str], cedarpy.PolicySet] = {}

    def ids(self, principal: _Entity, resource: _Entity) -> frozenset[str]:
        """The ids of the policies whose scope may match ``principal`` and ``resource``."""
        return frozenset(self._principals.matching(principal)
                         & self._resources.matching(resource) & self._actions)

    def policies(self, principal: _Entity, resource: _Entity) -> cedarpy.PolicySet:
        """The policy set to evaluate for a request of ``principal`` on ``resource``."""
        if not self.pruned:
            return self.whole
        ids = self.ids(principal, resource)
        found = self._subsets.get(ids)
        if found is None:
            if len(self._subsets) >= MAX_SUBSETS:
                return self.whole
            subset = {i: p for i, p in self._policies.items() if i in ids}
            found = self._subsets[ids] = cedarpy.PolicySet.from_json_str(orjson.dumps(
                {"staticPolicies": subset, "templates": {}, "templateLinks": []}).decode())
        return found
