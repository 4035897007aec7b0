"""Reading a Cedar policy set, and the one rule that accepts it (issue 32 item 4).

One reader for every place a policy set's text enters Latch: ``policy.file``
(:func:`~worker.runtime.governance.policy.load_policy`), ``latch registry put policy``
(:func:`worker.runtime.governance.registry.check_policy`), ``latch policy check|test`` and the
worker's build of a registry version (:mod:`.policy_source`). :func:`read_policies` is that
reader; :func:`accept` the acceptance rule ``put`` and the worker share (the reader, bounded in
size), so that ``put`` accepts exactly the sets the worker can build.

**Who writes the text.** An operator: a file on the worker's disk, or a registry record
written by ``latch registry put`` -- or by anything else with write access to the registry
topic (an older Latch, a hand-made record), so the worker reads a registry version as
untrusted text: whatever it holds, the build ends in a :class:`CedarPolicy` or a
:class:`PolicyFileError`, never another exception, in bounded time (the text is at most
:data:`MAX_CEDAR_BYTES` bytes; a parse error is located by a bisection of at most about
2 log2(n) parses).

**One grammar, one parser.** Every policy's id (Cedar's positional ``policyN``) and its
annotations (``@id``, ``@approval``) are Cedar's own, from ``cedarpy.policies_to_json_str``:
no tokenizer of ours decides which text is a policy or an annotation. (Before issue 32 a
tokenizer of ours split the text on ``;`` and took statement n for ``policyN``; it ended a
``//`` comment only at ``\\n`` while Cedar ends it at ``\\r`` too, so a set whose lines end in
a bare carriage return lost its ``@approval("required")`` and ``@id`` in the worker.) The
tokenizer below is kept only to tell a human *where*: the line and column of each policy and
of a parse error (Cedar's messages say what, not where). It lexes comments as Cedar does
(``//`` to the next ``\\r`` or ``\\n``) and counts ``\\r\\n``, ``\\r`` and ``\\n`` as line ends; if
it ever disagrees with Cedar on how many policies there are, positions fall back to 1:1,
never ids or annotations.

What a set may not hold (refused by :func:`read_policies`, so by ``put``, ``check`` and every
worker alike): text Cedar cannot parse; templates (``?principal``, ``?resource``): nothing
links them; two policies named alike (decisions name policies by ``@id``, else ``policyN``).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cedarpy
import orjson

from worker.runtime.governance.registry import MAX_CEDAR_BYTES

__all__ = ["MAX_CEDAR_BYTES", "PolicyFileError", "PolicySetText", "Statement", "accept",
           "check", "read_policies", "validate"]



class PolicyFileError(ValueError):
    """A policy file that cannot be used: where (file, line, column) and what."""

    def __init__(self, path: str, line: int, column: int, message: str) -> None:
        super().__init__(f"{path}:{line}:{column}: {message}")
        self.path, self.line, self.column, self.message = path, line, column, message


@dataclass(frozen=True, slots=True)
class Statement:
    """One policy of a set: Cedar's positional id, its name in decisions, where it starts."""

    cedar_id: str
    #: Its ``@id`` annotation, else ``cedar_id``.
    name: str
    line: int
    column: int
    #: Its ``@approval("required")`` annotation: a call it permits waits for a person's
    #: approval (docs/policies.md, "Approvals").
    approval: bool = False


@dataclass(frozen=True, slots=True)
class PolicySetText:
    """A policy set read once: its text, its policies in file order, Cedar's JSON form of it
    (``est``) and Cedar's parsed handle (``whole``)."""

    source: str
    path: str
    statements: tuple[Statement, ...]
    est: Mapping[str, Any]
    whole: cedarpy.PolicySet


def read_policies(source: str, path: str) -> PolicySetText:
    """``source`` read by Cedar (module doc); raises :class:`PolicyFileError` (``path``,
    line, column, what) for a set Cedar cannot parse or that Latch does not accept."""
    lines = _Lines(source)
    try:
        whole = cedarpy.PolicySet.from_str(source)
        est = orjson.loads(cedarpy.policies_to_json_str(source))
    except ValueError as exc:  # (orjson's JSONDecodeError is a ValueError too)
        raise _locate(source, path, lines, str(exc) or "cannot be parsed") from exc
    starts = _starts(source)
    policies: Mapping[str, Any] = est.get("staticPolicies") or {}
    templates: Mapping[str, Any] = est.get("templates") or {}
    count = len(policies) + len(templates)

    def where(cedar_id: str) -> tuple[int, int]:
        n = _number(cedar_id)
        if len(starts) != count or n is None or n >= len(starts):
            return 1, 1  # (our tokenizer and Cedar disagree: no place rather than a wrong one)
        return lines.position(starts[n])

    if templates:
        first = min(templates, key=_order)
        raise PolicyFileError(path, *where(first), "templates (?principal, ?resource) are not "
                              "supported: nothing links them")
    statements: list[Statement] = []
    seen: dict[str, int] = {}
    for cedar_id in sorted(policies, key=_order):
        annotations = policies[cedar_id].get("annotations") or {}
        name = annotations.get("id") or cedar_id
        line, column = where(cedar_id)
        if name in seen:
            raise PolicyFileError(path, line, column, f"a second policy with the id {name!r} "
                                  f"(the first is at line {seen[name]}): decisions name "
                                  "policies by id, so each must be unique")
        seen[name] = line
        statements.append(Statement(cedar_id, name, line, column,
                                    annotations.get("approval") == "required"))
    return PolicySetText(source, path, tuple(statements), est, whole)


def accept(source: str, path: str) -> PolicySetText:
    """The acceptance rule of a registry version, the same for ``latch registry put`` and
    for every worker that builds it: at most :data:`MAX_CEDAR_BYTES` bytes, and
    :func:`read_policies`. Raises :class:`PolicyFileError`."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_CEDAR_BYTES:
        raise PolicyFileError(path, 1, 1, f"the policy set is {size} bytes, more than "
                              f"{MAX_CEDAR_BYTES}")
    return read_policies(source, path)


def _number(cedar_id: str) -> int | None:
    return int(cedar_id[6:]) if cedar_id.startswith("policy") and cedar_id[6:].isdigit() \
        else None


def _order(cedar_id: str) -> tuple[int, str]:
    """File order: Cedar numbers the policies of a text ``policy0``, ``policy1``... as they
    come (its own maps are hash maps, whose order differs between processes)."""
    n = _number(cedar_id)
    return (-1 if n is None else n), cedar_id


# -- where: lines and columns for people ------------------------------------------------------

#: Cedar's lexer: whitespace, and a ``//`` comment ends at ``\r`` or ``\n``.
_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\r\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<open_string>"(?:[^"\\]|\\.)*)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*|\d+)
  | (?P<op>==|!=|<=|>=|&&|\|\||::|.)
""", re.VERBOSE | re.DOTALL)
_LINE_END = re.compile(r"\r\n|\r|\n")


class _Lines:
    """1-based line and column of an offset; a line ends at ``\\r\\n``, ``\\r`` or ``\\n``."""

    __slots__ = ("_starts",)

    def __init__(self, source: str) -> None:
        self._starts = [0, *(m.end() for m in _LINE_END.finditer(source))]

    def position(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self._starts, offset)
        return line, offset - self._starts[line - 1] + 1


def _tokens(source: str) -> list[tuple[int, int, str]]:
    """The tokens of ``source`` as (start, end, kind), comments and spaces left out."""
    found = []
    for match in _TOKEN.finditer(source):
        kind = match.lastgroup or "op"
        if kind != "space":
            found.append((match.start(), match.end(), kind))
    return found


def _ends(source: str, tokens: list[tuple[int, int, str]]) -> list[int]:
    """The indexes of the tokens that end a policy (``;``)."""
    return [i for i, (start, _end, kind) in enumerate(tokens)
            if kind == "op" and source[start] == ";"]


def _starts(source: str) -> list[int]:
    """The offset where each policy starts, in order (its first token, annotations
    included)."""
    tokens = _tokens(source)
    starts, begin = [], 0
    for end in _ends(source, tokens):
        starts.append(tokens[begin][0])
        begin = end + 1
    return starts


def _parses(text: str) -> str | None:
    """None when ``text`` is a policy set, else Cedar's message."""
    try:
        cedarpy.PolicySet.from_str(text)
    except ValueError as exc:
        return str(exc) or "cannot be parsed"
    return None


def _viable(text: str) -> bool:
    """Whether ``text`` is a policy set or the beginning of one."""
    problem = _parses(text)
    return problem is None or problem == "unexpected end of input"


def _locate(source: str, path: str, lines: _Lines, problem: str) -> PolicyFileError:
    """Cedar's ``problem`` with ``source`` at the token where the text stops being a policy
    set: the first policy (ended by ``;``) that does not parse with those before it, found by
    bisection, then the first token within it after which the text is not the start of a set."""
    tokens = _tokens(source)
    ends = _ends(source, tokens)
    for start, _end, kind in tokens:
        if kind == "open_string":
            return PolicyFileError(path, *lines.position(start), "an unterminated string")
    low, high = 0, len(ends)  # the first `low` policies parse; find the first that does not
    while low < high:
        middle = (low + high + 1) // 2
        if _parses(source[:tokens[ends[middle - 1]][1]]) is None:
            low = middle
        else:
            high = middle - 1
    first = ends[low - 1] + 1 if low else 0
    last = ends[low] if low < len(ends) else len(tokens) - 1
    if first > last:
        return PolicyFileError(path, *lines.position(len(source)), problem)
    low, high = first, last + 1
    while low < high:
        middle = (low + high) // 2
        if _viable(source[:tokens[middle][1]]):
            low = middle + 1
        else:
            high = middle
    named = re.search(r"`([^`]+)`", problem)
    found = source.find(named.group(1), tokens[first][0], tokens[last][1]) if named else -1
    if low < last or (low == last and found < 0):
        offset = tokens[low][0]
    elif found >= 0:  # wrong as a whole (a name, a function): where the message's name is
        offset = found
    elif problem == "unexpected end of input":
        offset = tokens[last][1]
    else:
        offset = tokens[first][0]
    return PolicyFileError(path, *lines.position(offset), problem)


# -- validation against a schema ---------------------------------------------------------------


def validate(text: PolicySetText, schema: Mapping[str, Any]) -> list[PolicyFileError]:
    """What is wrong with the policies of ``text`` against ``schema`` (a Cedar JSON schema),
    each at the line and column of the policy it is in."""
    path = text.path
    try:
        result = cedarpy.validate_policies(text.source, dict(schema))
    except ValueError as exc:
        return [PolicyFileError(path, 1, 1, f"the schema is not usable: {exc}")]
    where = {s.cedar_id: s for s in text.statements}
    problems = []
    for error in result.errors:
        at = where.get(error.policy_id)
        message = error.error
        if at is None:
            problems.append(PolicyFileError(path, 1, 1, message))
            continue
        message = message.replace(f"for policy `{at.cedar_id}`, ", "")
        problems.append(PolicyFileError(path, at.line, at.column,
                                        f"policy {at.name!r}: {message}"))
    return problems


def check(source: str, path: str, schema: Mapping[str, Any] | None = None
          ) -> list[PolicyFileError]:
    """Every problem of a policy set: the first :func:`read_policies` refuses it for, else
    each validation error against ``schema``."""
    try:
        text = read_policies(source, path)
    except PolicyFileError as exc:
        return [exc]
    return [] if schema is None else validate(text, schema)
