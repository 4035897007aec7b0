"""Cedar policies at the latch: the :class:`~worker.core.policy.Policy` the worker gives its
assemblers (issue 25; docs/decisions/0013-cedar-policies.md; docs/policies.md, *Policies*).

A policy set is a ``.cedar`` file, read once by Cedar (:mod:`.policy_file`: ids and
annotations from Cedar's own parser) into a :class:`CedarPolicy`; each call the latch decides
is one Cedar request, evaluated by the Cedar engine through ``cedarpy``:

* principal ``Latch::Tenant::"<tenant>"``, or ``Latch::Anonymous::"anonymous"`` for a run that
  names no tenant (never a tenant, not even ``""``: ``principal is Latch::Tenant`` excludes it);
* action ``Latch::Action::"call"``;
* resource ``Latch::Tool::"<name>"``, the tool's name as its committed record carries it
  (``worker/core/identity.py``: one name, whatever type the run declared the tool as), an
  entity whose attributes are ``kind`` (``function``, ``custom``, ``computer``,
  ``local_shell``, ``shell``, ``apply_patch``, ``mcp``, an Anthropic tool type such as
  ``bash``), ``annotations`` (the MCP
  hints the run gave, :func:`worker.core.tools.tool_attributes`; empty otherwise),
  ``toolset`` when the tool came from one, and ``server_label`` for an MCP server's approval
  request;
* context ``{arguments, provider, run_id}``: the committed arguments mapped by
  :func:`cedar_value`.

Cedar decides: ``Allow`` when a ``permit`` is satisfied and no ``forbid`` is; anything else
denies (deny by default). An evaluation error (a missing attribute, a type error, an overflow)
makes Cedar skip that policy; here it denies the call whatever the others say, and the
decision names the policy and the kind of error, never Cedar's message (it may quote a value).

The JSON -> Cedar mapping (:func:`cedar_value`): a string is a String; ``true``/``false`` a Bool;
an integer within Cedar's 64-bit range a Long; a number with a fraction or exponent (a float)
``decimal("...")`` when Cedar's decimal holds it exactly (at most 4 digits after the point,
within +-922337203685477.5807; ``1.5`` is ``decimal("1.5")``, ``2.0`` is ``decimal("2.0")``); an
object a Record; an array a Set (order and duplicates lost). What Cedar cannot hold is left
out: ``null``, an integer beyond 64 bits, a float with more than 4 decimals or out of range, a
string with a lone surrogate, and an object member named ``__entity``, ``__extn`` or ``__expr``
(Cedar's JSON escapes: left in, they would let arguments forge an entity or an extension value).
A member left out is absent from its record (``context.arguments has x`` is false; reading it
is an error, which denies); an element left out is absent from its set. Arguments Cedar cannot
hold at all (``null``) are an empty record.
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cedarpy
import orjson

from worker.core.approvers import ApproverRequest
from worker.core.policy import ENFORCE, LOG_ONLY, MODES, OFF, PolicyDecision, PolicyRequest
from worker.core.tools import MCP_HINTS, client_tools
from worker.runtime.governance.policy_file import (
    PolicyFileError,
    PolicySetText,
    accept,
    check,
    read_policies,
    validate,
)
from worker.runtime.governance.policy_scope import ScopedSets

if TYPE_CHECKING:
    from worker.runtime.config import PolicySettings

__all__ = ["DECISIONS", "CedarPolicy", "PolicyFileError", "cedar_schema", "cedar_value",
           "check", "load_policy", "read_tools", "registry_policy"]

NAMESPACE = "Latch"
TENANT, ANONYMOUS, TOOL = f"{NAMESPACE}::Tenant", f"{NAMESPACE}::Anonymous", f"{NAMESPACE}::Tool"
ACTION = {"type": f"{NAMESPACE}::Action", "id": "call"}
#: An approver deciding a held call (core/approvers.py), and the groups it belongs to.
APPROVER, APPROVER_GROUP = f"{NAMESPACE}::Approver", f"{NAMESPACE}::ApproverGroup"
#: The principal of a run that names no tenant.
ANONYMOUS_PRINCIPAL = {"type": ANONYMOUS, "id": "anonymous"}

#: Decisions made in this process, by (mode, result): result ``allow``, ``deny`` or ``error``
#: (an evaluation error, which denies). Closed label values, all present from the start
#: (``latch_policy_decisions_total``, worker/runtime/observability/metrics.py).
RESULTS = ("allow", "deny", "error")
DECISIONS: Counter[tuple[str, str]] = Counter(
    {(mode, result): 0 for mode in (LOG_ONLY, ENFORCE) for result in RESULTS})

_OMIT: Any = object()
_RESERVED = frozenset({"__entity", "__extn", "__expr"})
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DECIMAL_MAX = Decimal("922337203685477.5807")
_DECIMAL_MIN = Decimal("-922337203685477.5808")


# -- JSON -> Cedar ------------------------------------------------------------------------------


def cedar_value(value: Any) -> Any:
    """``value`` (parsed JSON) as Cedar's JSON value form, or :data:`_OMIT` when Cedar cannot
    hold it (see the module docstring)."""
    kind = type(value)
    if kind is str:
        return value if _encodable(value) else _OMIT
    if kind is bool:
        return value
    if kind is int:
        return value if _LONG_MIN <= value <= _LONG_MAX else _OMIT
    if kind is float:
        text = _decimal(value)
        return _OMIT if text is None else {"__extn": {"fn": "decimal", "arg": text}}
    if kind is dict:
        record = {}
        for key, item in value.items():
            if key in _RESERVED or not _encodable(key):
                continue
            mapped = cedar_value(item)
            if mapped is not _OMIT:
                record[key] = mapped
        return record
    if kind is list:
        return [m for m in map(cedar_value, value) if m is not _OMIT]
    return _OMIT  # None, and anything not JSON


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _decimal(value: float) -> str | None:
    """Cedar's decimal literal for ``value`` (its shortest repr), or None when it has more
    than 4 decimals, is out of range or is not finite."""
    try:
        exact = Decimal(repr(value))
    except InvalidOperation:
        return None
    if not exact.is_finite() or not _DECIMAL_MIN <= exact <= _DECIMAL_MAX:
        return None
    exponent = exact.as_tuple().exponent
    if not isinstance(exponent, int) or exponent < -4:
        return None
    text = f"{exact:f}"
    return text if "." in text else text + ".0"


# -- the policy --------------------------------------------------------------------------------


class CedarPolicy:
    """A Cedar policy set in force (the :class:`~worker.core.policy.Policy` protocol): parsed
    once; :meth:`decide` is one Cedar request per call, never raising."""

    def __init__(self, source: str | PolicySetText, mode: str = ENFORCE, path: str = "<policy>",
                 schema: Mapping[str, Any] | None = None, version: int | None = None) -> None:
        if mode not in (LOG_ONLY, ENFORCE):
            raise ValueError(f"a policy decides in log_only or enforce mode, not {mode!r}")
        self._mode, self._version, self.path = mode, version, path
        text = source if isinstance(source, PolicySetText) else read_policies(source, path)
        self.statements = list(text.statements)
        self._names = {s.cedar_id: s.name for s in self.statements}
        #: Each policy's place in the file: decisions list policies and errors in file order
        #: (Cedar's own order is a hash set's, which differs between processes).
        self._order = {s.cedar_id: n for n, s in enumerate(self.statements)}
        self._approval = frozenset(s.cedar_id for s in self.statements if s.approval)
        #: The policies that can apply to each request, by scope (policy_scope.py).
        self.scoped = ScopedSets(text.est, text.whole, ACTION)
        if schema is not None:
            problems = validate(text, schema)
            if problems:
                raise problems[0]
        #: Tool entities by (tool, attributes' JSON), parsed once (most runs share tools).
        self._entities: OrderedDict[tuple[str, bytes], cedarpy.Entities] = OrderedDict()

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def version(self) -> int | None:
        return self._version

    def name(self, cedar_id: str) -> str:
        """A policy's id as decisions give it: its ``@id`` annotation, else Cedar's own
        positional id (``policy0``, ``policy1``... in file order)."""
        return self._names.get(cedar_id, cedar_id)

    def decide(self, request: PolicyRequest) -> PolicyDecision:
        decision = self._decide(request)
        DECISIONS[(self._mode, "error" if decision.errors else
                   "allow" if decision.allow else "deny")] += 1
        return decision

    def _decide(self, request: PolicyRequest) -> PolicyDecision:
        try:
            context: dict[str, Any] = {"provider": request.provider, "run_id": request.run_id}
            arguments = cedar_value(request.arguments)
            context["arguments"] = {} if arguments is _OMIT else arguments
            principal = (ANONYMOUS_PRINCIPAL if request.tenant is None
                         else {"type": TENANT, "id": request.tenant})
            policies = self.scoped.policies((principal["type"], principal["id"]),
                                             (TOOL, request.tool))
            result = cedarpy.is_authorized(
                {"principal": principal, "action": ACTION,
                 "resource": {"type": TOOL, "id": request.tool},
                 "context": orjson.dumps(context).decode()},
                policies, self._tool(request.tool, request.attributes))
        except Exception as exc:  # never raised into the core: a request Cedar refuses denies
            return PolicyDecision(self._mode, False, (), (f"request: {type(exc).__name__}",),
                                  self._version)
        order = self._order
        reasons = sorted(result.diagnostics.reasons, key=lambda p: order.get(p, len(order)))
        ids = tuple(self.name(p) for p in reasons)
        errors = tuple(e for _, e in sorted(self._error(e) for e in result.diagnostics.errors))
        allow = result.allowed and not errors
        # (when allowed, the determining policies are the permits: one marked asks a person)
        approval = allow and any(p in self._approval for p in reasons)
        # (when Cedar denies, the determining policies are the satisfied forbids)
        forbidden = not result.allowed and bool(reasons)
        return PolicyDecision(self._mode, allow, ids, errors, self._version, approval=approval,
                              forbidden=forbidden)

    def decide_approver(self, request: ApproverRequest) -> PolicyDecision:
        """Whether the approver may make this decision (:func:`approver_request`): one Cedar
        request against the whole set, never raising; an evaluation error denies."""
        try:
            query, entities = approver_request(request)
            result = cedarpy.is_authorized(query, self.scoped.whole, entities)
        except Exception as exc:  # (a request Cedar refuses denies)
            return PolicyDecision(self._mode, False, (), (f"request: {type(exc).__name__}",),
                                  self._version)
        order = self._order
        reasons = sorted(result.diagnostics.reasons, key=lambda p: order.get(p, len(order)))
        errors = tuple(e for _, e in sorted(self._error(e) for e in result.diagnostics.errors))
        return PolicyDecision(self._mode, result.allowed and not errors,
                              tuple(self.name(p) for p in reasons), errors, self._version)

    def _tool(self, tool: str, attributes: Mapping[str, Any]) -> cedarpy.Entities:
        try:  # (the attributes are JSON values: a run's tool definition)
            key = (tool, orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS))
        except TypeError:
            key = (tool, repr(sorted(attributes.items())).encode())
        entities = self._entities.get(key)
        if entities is None:
            mapped = cedar_value(dict(attributes))
            mapped.setdefault("annotations", {})
            entity = {"uid": {"type": TOOL, "id": tool}, "attrs": mapped, "parents": []}
            entities = self._entities[key] = cedarpy.Entities.from_json_str(
                orjson.dumps([entity]).decode())
            if len(self._entities) > 4096:
                self._entities.popitem(last=False)
        return entities

    def _error(self, message: str) -> tuple[int, str]:
        """An evaluation error as ``<policy id>: <kind>``, after its policy's place in the
        file: never Cedar's message, which may quote a value of the arguments."""
        found = re.search(r"policy `([^`]+)`", message)
        where = self.name(found.group(1)) if found else "request"
        place = self._order.get(found.group(1), -1) if found else -1
        return place, f"{where}: {_error_kind(message)}"


def approver_request(request: ApproverRequest) -> tuple[dict[str, Any], str]:
    """The Cedar request and entities of an approver's decision (docs/policies.md, *Approvals*):
    principal ``Latch::Approver::"<id>"``, a member of each ``Latch::ApproverGroup`` of
    ``approvers.groups``; action ``Latch::Action::"approve"``, ``"deny"`` or ``"edit"``;
    resource the call's tool, as the call's own request has it; context ``{tenant,
    arguments, provider, run_id}`` (``tenant`` absent for a run that names none: test it with
    ``context has tenant``; ``arguments`` the held call's, mapped by :func:`cedar_value`)."""
    principal = {"type": APPROVER, "id": request.approver}
    groups = [{"type": APPROVER_GROUP, "id": g} for g in request.groups]
    tool = cedar_value(dict(request.attributes))
    tool.setdefault("annotations", {})
    entities = [{"uid": principal, "attrs": {}, "parents": groups},
                *({"uid": g, "attrs": {}, "parents": []} for g in groups),
                {"uid": {"type": TOOL, "id": request.tool}, "attrs": tool, "parents": []}]
    context: dict[str, Any] = {"provider": request.provider, "run_id": request.run_id}
    if request.tenant is not None:
        context["tenant"] = request.tenant
    arguments = cedar_value(request.arguments)
    context["arguments"] = {} if arguments is _OMIT else arguments
    query = {"principal": principal, "action": {"type": ACTION["type"], "id": request.action},
             "resource": {"type": TOOL, "id": request.tool},
             "context": orjson.dumps(context).decode()}
    return query, orjson.dumps(entities).decode()


def _error_kind(message: str) -> str:
    text = message.lower()
    if "failed to build request" in text:
        return "invalid_request"
    for needle, kind in (("does not have the attribute", "missing_attribute"),
                         ("attribute", "missing_attribute"), ("overflow", "overflow"),
                         ("type error", "type_error"), ("expected", "type_error"),
                         ("does not exist", "missing_entity"), ("extension", "extension_error")):
        if needle in text:
            return kind
    return "evaluation_error"


# -- the schema generated from a toolset -------------------------------------------------------

_SCALARS = {"string": "String", "integer": "Long", "boolean": "Boolean"}
_MAX_DEPTH = 16


def cedar_schema(tools: Any, provider: str = "openai.chat") -> dict[str, Any]:
    """The Cedar schema (JSON form) of a run whose ``tools`` (``run.start``'s, in
    ``provider``'s format or MCP ``tools/list`` entries) are those given: the three entity
    types and the one action, whose context's ``arguments`` is the union of the tools'
    parameters (every one optional: a call passes one tool's arguments). Best effort, from
    each parameter schema: ``string``/``integer``/``boolean`` are String/Long/Bool (a string
    ``enum`` a String), ``object`` with ``properties`` a Record, ``array`` with typed
    ``items`` a Set; a parameter of any other kind (``number``, which may be a Long or a
    decimal; ``anyOf``, ``$ref``, a list of types...) or typed differently by two tools is left
    out, so a policy that reads it does not validate."""
    merged: dict[str, Any] = {}
    conflicts: set[str] = set()
    for schema in client_tools(provider, tools).values():
        record = _cedar_type(schema, 0)
        if record is None or record.get("type") != "Record":
            continue
        for name, attribute in record["attributes"].items():
            attribute = {**attribute, "required": False}
            if name in merged and merged[name] != attribute:
                conflicts.add(name)
            merged.setdefault(name, attribute)
    arguments = {k: v for k, v in merged.items() if k not in conflicts}
    hints = {hint: {"type": "Boolean", "required": False} for hint in MCP_HINTS}
    return {NAMESPACE: {
        "entityTypes": {
            "Tenant": {}, "Anonymous": {},
            "Tool": {"shape": {"type": "Record", "attributes": {
                "kind": {"type": "String"},
                "annotations": {"type": "Record", "attributes": hints},
                "toolset": {"type": "String", "required": False},
                "server_label": {"type": "String", "required": False}}}},
        },
        "actions": {"call": {"appliesTo": {
            "principalTypes": ["Tenant", "Anonymous"], "resourceTypes": ["Tool"],
            "context": {"type": "Record", "attributes": {
                "arguments": {"type": "Record", "attributes": arguments},
                "provider": {"type": "String"}, "run_id": {"type": "String"}}}}}},
    }}


def _cedar_type(schema: Any, depth: int) -> dict[str, Any] | None:
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return None
    kind = schema.get("type")
    if kind is None and isinstance(schema.get("enum"), list) and schema["enum"] and all(
            isinstance(v, str) for v in schema["enum"]):
        kind = "string"
    if kind is None and isinstance(schema.get("properties"), Mapping):
        kind = "object"
    if not isinstance(kind, str):
        return None
    if kind in _SCALARS:
        return {"type": _SCALARS[kind]}
    if kind == "array":
        element = _cedar_type(schema.get("items"), depth + 1)
        return None if element is None else {"type": "Set", "element": element}
    if kind != "object":
        return None
    properties = schema.get("properties")
    required: list[Any] = (schema["required"] if isinstance(schema.get("required"), list)
                           else [])
    attributes = {}
    if isinstance(properties, Mapping):
        for name, sub in properties.items():
            if not isinstance(name, str) or name in _RESERVED:
                continue
            mapped = _cedar_type(sub, depth + 1)
            if mapped is not None:
                attributes[name] = {**mapped, "required": name in required}
    return {"type": "Record", "attributes": attributes}


def read_tools(path: str) -> Any:
    """A tools file: a JSON array of tool definitions, or an MCP ``tools/list`` result
    (``{"tools": [...]}``). Raises ValueError saying what is wrong."""
    try:
        tools = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if isinstance(tools, dict) and isinstance(tools.get("tools"), list):
        tools = tools["tools"]
    if not isinstance(tools, list):
        raise ValueError(f"{path} must hold a JSON array of tool definitions (or an MCP "
                         "tools/list result)")
    return tools


def load_policy(mode: str, file: str | None, tools_file: str | None = None,
                provider: str = "openai.chat") -> CedarPolicy | None:
    """The policy in force for ``policy:`` settings (None for mode ``off``, and without a
    file: then the registry's policy sets decide, :mod:`.policy_source`); raises
    :class:`PolicyFileError` (file, line, column) for a file that does not parse or does not
    validate against the schema generated from ``tools_file``, ValueError for the rest."""
    if mode not in MODES:
        raise ValueError(f"policy.mode must be one of {', '.join(MODES)}")
    if mode == OFF:
        return None
    if not file:
        return None
    try:  # (the bytes as they are, as `latch registry put` reads them: no newline translation)
        source = Path(file).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read policy.file {file}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise PolicyFileError(file, 1, 1, "not UTF-8 text") from exc
    schema = None if not tools_file else cedar_schema(read_tools(tools_file), provider)
    return CedarPolicy(source, mode, file, schema)


def registry_policy(source: str, mode: str, version: int) -> CedarPolicy:
    """The worker's build of registry policy set ``version`` (:mod:`.policy_source`), which
    ``latch registry put`` runs too before it registers a version: the acceptance rule
    (:func:`~.policy_file.accept`), then the policy. Raises :class:`PolicyFileError`
    (``registry policy N:LINE:COLUMN: what``)."""
    path = f"registry policy {version}"
    return CedarPolicy(accept(source, path), mode, path, version=version)


@cache
def policy_for(settings: PolicySettings) -> CedarPolicy | None:
    """The policy of a ``policy:`` section, loaded once per process (the worker, ``latch
    assemble`` and ``latch replay`` load it first, through ``policy_source.assembler_policy``,
    so that a bad policy file stops them with the file, line and column; then they give it to
    each assembler: ``Assembler.policy``)."""
    return load_policy(settings.mode, settings.file, settings.schema)
