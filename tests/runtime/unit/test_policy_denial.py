"""The error names what decided (issue 32, item 12): a ``policy_denied`` error's content names
the determining policies and the evaluation errors, each in the file's order, as the audit
record lists them; never argument text.

Who sends what: the policy set is the operator's (a file or a registry version); the arguments
are the model's, and a policy that reads an argument the model left out errors. The content
must say both what forbade the call and what could not be evaluated, whichever the model's
arguments made happen.
"""

from __future__ import annotations

from typing import Any

from builders import CHAT, PATH_SCHEMA, chat_calls, chat_run, errors, feed, tools_for, values

from worker.core import Assembler, AssembleSettings
from worker.core.latch import denial
from worker.core.model import Topic
from worker.core.policy import ENFORCE, PolicyDecision
from worker.runtime.governance.policy import CedarPolicy

#: In file order: an erroring forbid, a satisfied forbid, a permit, a second erroring policy,
#: a second satisfied forbid.
FORBID_BESIDE_ERRORS = """\
@id("needs-size") forbid(principal, action, resource) when { context.arguments.size > 1 };
@id("no-secret") forbid(principal, action, resource)
when { context.arguments.path like "*SECRET*" };
@id("all") permit(principal, action, resource);
@id("needs-mode") permit(principal, action, resource) when { context.arguments.mode == 1 };
@id("no-etc") forbid(principal, action, resource) when { context.arguments.path like "/etc/*" };
"""


def decide(source: str, arguments: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The error result and audit record of one chat call decided by ``source`` (enforce)."""
    asm = Assembler(AssembleSettings())
    asm.policy = CedarPolicy(source, ENFORCE)
    emits = feed(asm, chat_run("r1", tools_for(CHAT, {"read_file": PATH_SCHEMA}),
                               chat_calls([("c1", "read_file", arguments)])))
    [error] = errors(emits)
    [audit] = values(emits, Topic.AUDIT)
    return error, audit


def test_a_satisfied_forbid_beside_errors_names_both_in_file_order() -> None:
    """Two satisfied forbids and two erroring policies: the content names the forbids, then
    the errors, each list in the file's order, as the audit record has them; the argument
    text is not in it."""
    error, audit = decide(FORBID_BESIDE_ERRORS, '{"path": "/etc/SECRET"}')
    assert error["reason"] == "policy_denied"
    assert audit["policy"]["policies"] == ["no-secret", "no-etc"]
    assert audit["policy"]["errors"] == ["needs-size: missing_attribute",
                                         "needs-mode: missing_attribute"]
    assert error["content"] == (
        "policy_denied: forbidden by policy no-secret, no-etc; a policy could not be "
        "evaluated, which denies the call: needs-size: missing_attribute, "
        "needs-mode: missing_attribute")
    assert "/etc" not in error["content"]


def test_a_permit_beside_an_error_is_not_called_a_forbid() -> None:
    """A satisfied permit beside an erroring policy: the error denies; the content names the
    error, and the permit as what would otherwise have allowed the call, not as a forbid."""
    source = ('@id("all") permit(principal, action, resource);\n'
              '@id("needs-size") forbid(principal, action, resource) '
              "when { context.arguments.size > 1 };\n")
    error, audit = decide(source, '{"path": "/srv/a"}')
    assert audit["policy"]["policies"] == ["all"]
    assert error["content"] == (
        "policy_denied: a policy could not be evaluated, which denies the call: "
        "needs-size: missing_attribute (permitted by policy all otherwise)")


def test_the_wording_of_each_decision() -> None:
    """Forbids alone, errors alone, and nothing that permits keep their wording."""
    assert denial(PolicyDecision(ENFORCE, False, ("a", "b"), forbidden=True)) == (
        "forbidden by policy a, b")
    assert denial(PolicyDecision(ENFORCE, False, (), ("e: overflow",))) == (
        "a policy could not be evaluated, which denies the call: e: overflow")
    assert denial(PolicyDecision(ENFORCE, False)) == "no policy permits this call"
