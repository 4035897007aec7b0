"""The completion latch: whether a call whose text is complete commits.

When a run ends (or, with block-level early commit, when a call's block does), its
:class:`~worker.core.run.Run` asks the latch to decide each complete call. A call commits
only when all of these hold, checked in this order, the first failure naming the reason:

1. the provider did not stop the call's message (or choice) with a stop that forbids running
   it (``ops.Stopped``: ``truncated``, rule 5; ``content_filtered``; ``turn_paused``...);
2. it has a non-empty id and name (``missing_id_or_name``);
3. no other call of the run claims the same id, its ``tool_call_id`` (``duplicate_call_id``);
4. the name is a client tool registered by ``run.start`` (``unknown_tool``), and only one of
   its tools has that name (``ambiguous_tool``: :mod:`worker.core.identity`);
5. its text is strict JSON (``invalid_json``, rule 1), empty text meaning ``{}`` (rule 3);
6. the value is an object (``arguments_not_object``) when ``arguments_must_be_object``;
7. the value is valid against the tool's JSON Schema (``schema_invalid``);
8. the run's policy allows it (``policy_denied``; only with a policy in force, ``enforce``
   mode: :mod:`worker.core.policy`, issue 25); in ``log_only`` the decision is recorded on the
   call (``Call.decision``) and the call goes on;
9. its committed call record fits the output topics' record size (``record_too_large``);
10. the run's call budget has room (``budget_exceeded``, rule 7, counted at enqueue).

A call that passes every step commits, unless it needs a person's approval first (docs/policies.md,
"Approvals"): its tool's name is in ``approvals.require_approval``, or its MCP annotations say
``destructiveHint: true`` with ``approvals.destructive``, or the policy's determining permit
asks for it (``PolicyDecision.approval``, in ``enforce`` mode only: in ``log_only`` the call
commits, its decision recorded). Such a call is held (``PENDING_APPROVAL``), keeps
its place in the budget, and waits for ``approve`` (it commits as it is), ``edit`` (the latch
decides the new arguments again, every step, and never holds them again: :meth:`Latch.edit`),
``deny`` or a timeout (it fails, and gives its place back: :meth:`Latch.release`).

A call's ``kind`` (``ops.CALL_KINDS``) says what its text is. ``function`` calls take every
step. A ``custom`` call (Responses ``custom_tool_call``, a chat custom call) takes 1 to 4
against the custom tools the run registered, then 8 (its ``arguments`` the input text), 9
and 10: its text is free-form input, committed as text, never parsed (a ``grammar`` format
is not enforced). The Responses items a client answers take every step against the tool of
their type (``tools.client_tools``), whose schema is empty. Whatever its kind, a call is
found among the run's tools by its key, and is known everywhere else (the policy's resource,
the approval lists, the records) by its name, the one its committed record carries; the
policy also sees the tool's kind (:mod:`worker.core.identity`).

Limits that can be known earlier fail the call earlier, while its text streams in:
``arguments_exceed_max_bytes`` (the buffer is dropped at once) and ``too_many_tool_calls``
(a placeholder that keeps the call's place so that it still gets its one outcome).

Whatever ended them, calls that share one ``tool_call_id`` end with one kind of outcome
(``ending.outcomes``): ``duplicate_call_id`` for each, or, when one of them already had
its record emitted (block-level early commit), that record alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from worker.core import strictjson
from worker.core.call import Call, utf8_len
from worker.core.identity import NO_IDENTITIES, Identities
from worker.core.model import CallEvent, Reason
from worker.core.ops import CUSTOM, FUNCTION, Stopped
from worker.core.policy import ENFORCE, OFF, Policy, PolicyDecision, PolicyRequest
from worker.core.settings import MAX_RECORD_BYTES, RECORD_OVERHEAD, AssembleSettings
from worker.core.tools import ToolSchema

#: The reasons :meth:`Latch.decide` gives only after the call's tool was found among the
#: run's tools: a call that failed with one of them (or committed) bears a name the run
#: registered. Any other outcome may bear a name the model made up (``unknown_tool``, a call
#: cut short before its check; ``budget_exceeded`` is also the worker's byte budget, which
#: fails calls unchecked). The worker's metrics take ``tool`` label values from such names
#: only (``worker/runtime/observability/metrics.py``).
NAME_CHECKED_REASONS: frozenset[str] = frozenset({
    Reason.INVALID_JSON.value, Reason.ARGUMENTS_NOT_OBJECT.value, Reason.SCHEMA_INVALID.value})


#: Why a call waits for approval, as its pending record says (``approval.required_by``).
REQUIRE_APPROVAL, DESTRUCTIVE, POLICY = "require_approval", "destructive", "policy"
APPROVAL_CAUSES = (REQUIRE_APPROVAL, DESTRUCTIVE, POLICY)


class Latch:
    """The checks of the completion latch for one run (see the module docstring)."""

    __slots__ = ("attributes", "budget", "committed", "identities", "parse", "provider",
                 "run_id", "settings", "tenant", "tools", "unknown")

    def __init__(self, settings: AssembleSettings, tools: dict[str, ToolSchema],
                 budget: int,
                 parse: Callable[[str], Any | strictjson.ParseError] = strictjson.parse,
                 run: tuple[str | None, str, str] = (None, "", ""),
                 attributes: dict[str, dict[str, Any]] | None = None,
                 identities: Identities = NO_IDENTITIES) -> None:
        self.settings = settings
        self.tools = tools
        self.budget = budget
        self.committed = 0
        #: Argument text to value: strict JSON, or the adapter's own (``Adapter.parse_arguments``).
        self.parse = parse
        #: What a policy is told of the run: its tenant (None: it named none), provider, id.
        self.tenant, self.provider, self.run_id = run
        #: Each tool's attributes a policy sees (its MCP annotations, its toolset), by the key
        #: it is registered under; a tool not here has none.
        self.attributes: dict[str, dict[str, Any]] = attributes or {}
        #: Why the run has no tools at all when that is not the model's fault (the registry
        #: toolset it names is unknown): every call fails with it instead of ``unknown_tool``.
        self.unknown: tuple[Reason, str] | None = None
        #: What each tool is called and what kind it is, and which names two tools share
        #: (``identity.identities`` of the run's tools).
        self.identities = identities

    def decide(self, call: Call, stop: Stopped | None, duplicate: bool,
               measure: Callable[[Call], int] | None = None,
               policy: Policy | None = None, hold: bool = True) -> None:
        """Move an ``ARGS_COMPLETE`` call to ``COMMITTED``, ``FAILED`` or (``hold``, when it
        needs approval) ``PENDING_APPROVAL``; ``measure`` gives the bytes of the call's
        committed record (``Outputs.committed_size``); ``policy`` is the partition's policy in
        force when the call is decided (``Assembler.policy``; None: none)."""
        text = "".join(call.parts)
        call.text, call.parts = text, []
        failure = self._check(call, text, stop, duplicate, measure, policy)
        if failure is not None:
            call.fail(*failure)
            return
        causes = self._approval(call) if hold else ()
        if causes:
            if call.step(CallEvent.HOLD):
                call.held = causes
                self.committed += 1  # its place in the budget, kept until it is decided
            return
        if call.step(CallEvent.COMMIT):
            self.committed += 1

    def _approval(self, call: Call) -> tuple[str, ...]:
        """Why a call that passed every step needs approval (module docstring); () if not."""
        rules = self.settings.approvals
        key = (call.name if call.tool is None else call.tool) or ""
        causes = []
        if call.name in rules.require_approval:  # (by name, whatever the tool's kind)
            causes.append(REQUIRE_APPROVAL)
        if rules.destructive and self.attributes.get(key, _NO_ATTRIBUTES).get(
                "annotations", _NO_ATTRIBUTES).get("destructiveHint") is True:
            causes.append(DESTRUCTIVE)
        # (only a policy that enforces holds: log_only never changes what is committed)
        if call.decision is not None and call.decision.approval and (
                call.decision.mode == ENFORCE):
            causes.append(POLICY)
        return tuple(causes)

    def approve(self, call: Call, policy: Policy | None) -> None:
        """A person approved the held ``call``: it commits, unless the policy in force now
        (which may differ from the one that held it) forbids it; then it fails
        ``policy_denied`` and gives its place in the budget back. Never committed unchecked."""
        if policy is not None and policy.mode != OFF:
            key = (call.name if call.tool is None else call.tool) or ""
            failure = self._check_policy(call, key, call.text or "", policy)
            if failure is not None:
                call.fail(*failure)
                self.release()
                return
        call.step(CallEvent.APPROVE)

    def release(self) -> None:
        """A held call failed (denied, timed out): it gives its place in the budget back."""
        self.committed -= 1

    def edit(self, call: Call, text: str, measure: Callable[[Call], int] | None,
             policy: Policy | None) -> None:
        """A held call's new argument text (an ``edit`` decision): the latch decides it again,
        every step, and commits or fails it; it is not held again (a person chose it)."""
        if not call.step(CallEvent.EDIT):
            return
        self.committed -= 1
        call.parts, call.text, call.arguments, call.parsed = [text], None, None, False
        call.refused, call.decision = None, None
        limit = self.settings.max_tool_argument_bytes
        if utf8_len(text) > limit:
            call.parts = []
            call.fail(Reason.ARGUMENTS_EXCEED_MAX_BYTES, f"the edited arguments have more than "
                      f"{limit} bytes")
            return
        self.decide(call, None, False, measure, policy, hold=False)

    def _check(
        self, call: Call, text: str, stop: Stopped | None, duplicate: bool,
        measure: Callable[[Call], int] | None = None, policy: Policy | None = None,
    ) -> tuple[Reason, str] | None:
        if stop is not None:
            return stop.reason, stop.detail
        if not call.call_id or not call.name:
            missing = "id" if not call.call_id else "name"
            return Reason.MISSING_ID_OR_NAME, f"the provider sent no {missing} for this call"
        if duplicate:
            return Reason.DUPLICATE_CALL_ID, "another call of this run has the same id"
        key = call.name if call.tool is None else call.tool
        if self.identities.refuses(key, call.name, call.kind, self.tools):
            return Reason.AMBIGUOUS_TOOL, ("two of the run's tools have this name: it is not "
                                           "guessed which one the call means")
        tool = self.tools.get(key)
        if tool is not None and not self.identities.declared_as(key, call.kind):
            tool = None  # (a tool of another kind under the same key: not this call's)
        if tool is None:
            if self.unknown is not None:
                return self.unknown
            if call.kind == FUNCTION:
                return Reason.UNKNOWN_TOOL, "the tool name is not among the run's tools"
            return Reason.UNKNOWN_TOOL, f"the run registered no tool for this {call.kind} call"
        if call.kind != CUSTOM:  # (free-form input: committed as text, never parsed)
            failure = self._check_value(call, text, tool)
            if failure is not None:
                return failure
        if policy is not None and policy.mode != OFF:
            failure = self._check_policy(call, key, text, policy)
            if failure is not None:
                return failure
        return self._check_record(call, text, measure) or self._check_budget()

    def _check_policy(self, call: Call, key: str, text: str, policy: Policy
                      ) -> tuple[Reason, str] | None:
        """Ask ``policy`` about the call and record its answer on it (``Call.decision``); in
        ``enforce`` mode a call it does not allow fails ``policy_denied``, naming the
        determining policies (never argument text)."""
        arguments = call.arguments if call.parsed else text  # a custom call: its input text
        attributes = self.identities.attributes(key, self.attributes.get(key, _NO_ATTRIBUTES))
        decision = policy.decide(PolicyRequest(
            self.tenant, call.name or key, attributes, arguments, self.provider, self.run_id))
        call.decision = decision
        if decision.allow or policy.mode != ENFORCE:
            return None
        return Reason.POLICY_DENIED, denial(decision)

    @staticmethod
    def _check_record(call: Call, text: str, measure: Callable[[Call], int] | None
                      ) -> tuple[Reason, str] | None:
        """Whether the committed call record fits ``MAX_RECORD_BYTES``: surely, when its text,
        id and name at 6 bytes a character (the longest JSON escape; a parsed value is never
        longer than 4.5 bytes a character of its text) and the rest of a record fit; else as
        measured."""
        chars = len(text) + len(call.call_id or "") + len(call.name or "")
        if 6 * chars + RECORD_OVERHEAD <= MAX_RECORD_BYTES or measure is None:
            return None
        size = measure(call)
        if size <= MAX_RECORD_BYTES:
            return None
        return Reason.RECORD_TOO_LARGE, (f"the committed call would take {size} bytes, more "
                                         f"than an output record may ({MAX_RECORD_BYTES})")

    def _check_budget(self) -> tuple[Reason, str] | None:
        if self.committed >= self.budget:
            return Reason.BUDGET_EXCEEDED, f"the run may commit at most {self.budget} calls"
        return None

    def _check_value(self, call: Call, text: str, tool: ToolSchema) -> tuple[Reason, str] | None:
        if call.refused is not None:  # arguments sent as a value without one meaning
            return Reason.INVALID_JSON, call.refused
        value = self.parse(text) if text.strip() else {}
        if isinstance(value, strictjson.ParseError):
            return Reason.INVALID_JSON, f"{value.message}; {utf8_len(text)} bytes received"
        call.arguments, call.parsed = value, True
        if self.settings.arguments_must_be_object and not isinstance(value, dict):
            return Reason.ARGUMENTS_NOT_OBJECT, f"arguments are a JSON {_json_type(value)}"
        problem = tool.check().errors(value)  # compiled now, for the first call of its tool
        if problem is not None:
            return Reason.SCHEMA_INVALID, problem
        return None


_NO_ATTRIBUTES: dict[str, Any] = {}


def denial(decision: PolicyDecision) -> str:
    """Why a call was denied, by policy id and error kind only (the detail of its
    ``policy_denied`` error): the determining policies and the errors, each in the file's
    order (as the decision lists them), the forbids first."""
    policies = ", ".join(decision.policies)
    errors = "a policy could not be evaluated, which denies the call: " + ", ".join(
        decision.errors)
    if decision.errors and decision.policies and not decision.forbidden:
        return f"{errors} (permitted by policy {policies} otherwise)"
    if decision.errors and decision.policies:
        return f"forbidden by policy {policies}; {errors}"
    if decision.errors:
        return errors
    if decision.policies:
        return "forbidden by policy " + policies
    return "no policy permits this call"


def _json_type(value: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


# -- why every call of a run fails: its toolset (the assembler sets ``Latch.unknown``) ----


def toolset_required(required: frozenset[str | None], tenant: str | None) -> bool:
    """Whether a run of ``tenant`` must name a registered toolset (``required``:
    ``require_toolsets_for``; ``*``: every run). ``tenant`` is the gateway's word (it writes
    the envelope); the tools a run.start carries inline are the tenant's, MCP annotations
    included, so such a run gets none (``toolset_required``)."""
    return bool(required) and ("*" in required or tenant in required)


#: The tool map of a run whose registry toolset is unknown (never changed).
UNKNOWN_TOOLSET: dict[str, ToolSchema] = {}
#: Why every call fails of a run that must name a registered toolset and did not.
TOOLSET_REQUIRED = (Reason.TOOLSET_REQUIRED, "the run's tenant must name a registered "
                     "toolset (registry.require_toolsets_for) and its run.start named none: "
                     "tools given inline are not used")


def unknown_toolset(toolset: tuple[str, int], unknown: bool, registry: bool = True
                     ) -> tuple[Reason, str]:
    """Why every call of a run that names ``toolset`` fails: the version is unknown (or no
    registry is read at all: ``registry`` False, e.g. ``latch assemble`` without
    ``--registry``), or it holds no client tool of the run's provider (``unknown_tool``, as
    an empty ``tools``)."""
    name, version = toolset
    if unknown and not registry:
        return Reason.UNKNOWN_TOOLSET, (f"the run names toolset {name!r} version {version} "
                                        "and no registry is read here (offline: latch "
                                        "assemble --registry reads the registry topic)")
    if unknown:
        return Reason.UNKNOWN_TOOLSET, (f"the registry holds no toolset {name!r} version "
                                        f"{version} for this run")
    return Reason.UNKNOWN_TOOL, (f"toolset {name!r} version {version} has no client tool of "
                                 "the run's provider")
