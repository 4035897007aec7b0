"""Redaction of tool results (issue 36, item 4): the operator's rules, per tenant, rewrite a
result's text before it goes back to the model (``docs/policies.md``, "Redacting results";
``docs/decisions/0026-result-redaction.md``).

A rule is a name, an RE2 pattern (google-re2: linear time in the text, whatever the pattern,
so a result cannot make a rule run for long) and a replacement. :class:`Redactor` compiles a
list of rules once; :meth:`Redactor.apply` runs them in order over a text and says how many
rewrites each rule made. Nothing here logs: the counts are the only trace, by rule name.

The rules, and what is refused when they are compiled (:class:`RedactionError`, naming the
rule by index and name and the problem, never echoing a pattern or a replacement: either may
hold the very secret it redacts):

* at most :data:`MAX_RULES` rules in a list, each with a unique name of at most 64 letters,
  digits, ``_``, ``.``, ``:`` or ``-`` (a name is a metric label);
* a pattern of 1 to :data:`MAX_PATTERN_LENGTH` characters that RE2 compiles: look-around and
  back-references, which only a backtracking engine runs, are refused; so are ``\\C`` (one
  byte, which could split a character) and a pattern that matches the empty string;
* a replacement of at most :data:`MAX_REPLACE_LENGTH` characters (default
  :data:`DEFAULT_REPLACE`): literal text but for ``\\\\`` (a backslash), ``\\1`` to ``\\99``,
  ``\\g<N>`` and ``\\g<name>`` (a group of the pattern, empty when it took no part in the
  match; ``\\g<0>`` is the whole match); any other backslash, or a group the pattern does not
  have, is refused.

Applying, a rule rewrites each non-empty match, left to right, as RE2 finds them (an empty
match, which a pattern such as ``\\b`` can still make, is left alone). The output is bounded:
it may never be longer than ``max(2 * len(text), len(text) + 65,536)`` characters
(:func:`output_limit`). When a rule's rewrite would make it longer, the whole text becomes
:data:`TOO_LARGE` and no later rule runs; that rule's count includes the rewrite that went
over. A lone surrogate in the text (what Python's JSON decoder makes of ``"\\ud800"``), which
UTF-8 and so RE2 cannot carry, is first escaped as its six characters (``\\ud800``), as
``worker.client.results.escaped`` does to a runner's result: the rules see, and the output
holds, the escaped text.

Not compiled by mypyc (setup.py): RE2's bindings are untyped, and a result is redacted once,
not per event.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import re2

from worker.core.envelope import MAX_TENANT_LENGTH

__all__ = ["DEFAULT_REPLACE", "EVERY_TENANT", "MAX_PATTERN_LENGTH", "MAX_REPLACE_LENGTH",
           "MAX_RULES", "TOO_LARGE", "RedactionError", "Redactor", "Rule", "output_limit",
           "parse_tenant_rules", "redactor_for"]

#: The most rules one list (a tenant's, or ``"*"``'s) may hold.
MAX_RULES = 64
#: The longest pattern, in characters.
MAX_PATTERN_LENGTH = 1000
#: The longest replacement, in characters.
MAX_REPLACE_LENGTH = 1000
#: A rule's replacement when the operator gives none.
DEFAULT_REPLACE = "[redacted]"
#: What a text becomes when a rule would make it longer than :func:`output_limit`.
TOO_LARGE = "[redacted: result too large after redaction]"
#: The rules' key for every tenant (and runs without one), applied after the tenant's own.
EVERY_TENANT = "*"
#: Characters an output may grow by over its input's length, however short the input.
GROWTH_ALLOWANCE = 64 * 1024
#: Pieces of a rule's output joined into one string at a time, so that many small matches
#: do not hold a list entry each.
_JOIN_EVERY = 4096

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}")
#: The replacement's backslash sequences (:func:`_template`).
_ESCAPE = re.compile(r"\\(?:(\\)|([1-9][0-9]?)|g<([^<>]{0,64})>)")
_RULE_KEYS = frozenset({"name", "pattern", "replace"})

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is an error for the operator, not stderr


class RedactionError(ValueError):
    """A rule, or the ``results.redact`` configuration, is refused; the message names where
    (the config path, or the rule's index and name) and the problem, never a pattern's or a
    replacement's text. ``field`` is the rule's key at fault (``name``, ``pattern``,
    ``replace``), or None for the rule or list as a whole."""

    def __init__(self, message: str, index: int | None = None, field: str | None = None,
                 problem: str = "") -> None:
        super().__init__(message)
        self.index = index
        self.field = field
        self.problem = problem or message


class Rule(NamedTuple):
    """One redaction rule as the operator wrote it."""

    name: str
    pattern: str
    replace: str = DEFAULT_REPLACE


class _Compiled(NamedTuple):
    name: str
    regex: Any  # re2._Regexp
    #: The replacement: literal text (str) and group numbers (int), in order.
    template: tuple[str | int, ...]
    #: The replacement when it refers to no group, else None.
    constant: str | None


class _Problem(Exception):
    """A rule's field is refused (:func:`_compile`); the caller says which rule."""

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


def output_limit(length: int) -> int:
    """The longest output :meth:`Redactor.apply` gives for a text of ``length`` characters."""
    return max(2 * length, length + GROWTH_ALLOWANCE)


class Redactor:
    """Rules compiled once (:class:`RedactionError` when one is refused), applied in order
    by :meth:`apply`. Immutable; safe to share between threads."""

    __slots__ = ("_joined", "_rules")

    def __init__(self, rules: Sequence[Rule]) -> None:
        if isinstance(rules, str | bytes) or not isinstance(rules, Sequence):
            raise RedactionError("the rules must be a list", problem="must be a list")
        if len(rules) > MAX_RULES:
            problem = f"more than {MAX_RULES} rules"
            raise RedactionError(problem, problem=problem)
        compiled: list[_Compiled] = []
        seen: set[str] = set()
        for index, rule in enumerate(rules):
            named = _safe_name(rule)
            try:
                one = _compile(rule)
                if one.name in seen:
                    raise _Problem("name", "is the name of an earlier rule")
            except _Problem as exc:
                where = f"rule {index}" + (f" ('{named}')" if named else "")
                field = f" {exc.field}" if exc.field else ""
                raise RedactionError(f"redaction {where}:{field} {exc.problem}", index,
                                     exc.field, exc.problem) from None
            seen.add(one.name)
            compiled.append(one)
        self._rules: tuple[_Compiled, ...] = tuple(compiled)
        self._joined: tuple[Redactor, Redactor] | None = None

    @classmethod
    def _of(cls, rules: tuple[_Compiled, ...]) -> Redactor:
        redactor = cls.__new__(cls)
        redactor._rules = rules
        redactor._joined = None
        return redactor

    @property
    def names(self) -> tuple[str, ...]:
        """The rules' names, in the order they apply (a name twice when a tenant's rule and
        a ``"*"`` rule share it: their counts add up)."""
        return tuple(rule.name for rule in self._rules)

    def then(self, other: Redactor) -> Redactor:
        """This redactor's rules, then ``other``'s (remembered for the last ``other``)."""
        joined = self._joined
        if joined is not None and joined[0] is other:
            return joined[1]
        combined = Redactor._of(self._rules + other._rules)
        self._joined = (other, combined)
        return combined

    def apply(self, text: str) -> tuple[str, dict[str, int]]:
        """``text`` with every rule applied in order, and the number of rewrites each rule
        that rewrote something made, by name (the module docstring says what a rewrite is,
        and what happens to a text that would grow beyond :func:`output_limit`)."""
        if not text.isascii():
            text = _encodable(text)
        limit = output_limit(len(text))
        counts: dict[str, int] = {}
        for rule in self._rules:
            rewritten, count = _substitute(rule, text, limit)
            if count:
                counts[rule.name] = counts.get(rule.name, 0) + count
            if rewritten is None:
                return TOO_LARGE, counts
            text = rewritten
        return text, counts

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:  # the names only: a pattern may hold what it redacts
        return f"Redactor({list(self.names)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (tuple(self._rules),)


def _restore(rules: tuple[_Compiled, ...]) -> Redactor:
    """A pickled :class:`Redactor` (its compiled patterns pickle as their sources)."""
    return Redactor._of(rules)


def _safe_name(rule: object) -> str | None:
    name = getattr(rule, "name", None)
    return name if isinstance(name, str) and _NAME.fullmatch(name) else None


def _compile(rule: Rule) -> _Compiled:
    if not isinstance(rule, tuple) or len(rule) != 3:
        raise _Problem(None, "is not a Rule (name, pattern, replace)")
    name, pattern, replace = rule
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _Problem("name", "must be 1 to 64 letters, digits, '_', '.', ':' or '-', "
                               "starting with a letter, digit or '_'")
    regex = _regex(pattern)
    template = _template(replace, regex)
    literal = [piece for piece in template if isinstance(piece, str)]
    constant = "".join(literal) if len(literal) == len(template) else None
    return _Compiled(name, regex, template, constant)


def _regex(pattern: object) -> Any:
    if not isinstance(pattern, str):
        raise _Problem("pattern", "must be a string")
    if not 1 <= len(pattern) <= MAX_PATTERN_LENGTH:
        raise _Problem("pattern", f"must be 1 to {MAX_PATTERN_LENGTH} characters long")
    if not _utf8(pattern):
        raise _Problem("pattern", "holds a lone surrogate (not UTF-8)")
    if _has_any_byte(pattern):
        raise _Problem("pattern", "uses \\C (any one byte), which can split a character")
    try:
        regex = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise _Problem("pattern", _refusal(exc)) from None
    if regex.search("") is not None:
        raise _Problem("pattern", "matches the empty string")
    return regex


def _refusal(exc: Exception) -> str:
    """RE2's reason for refusing a pattern, without the part of the pattern it quotes
    (RE2's messages are ``<reason>: <the pattern's text at fault>``)."""
    message = exc.args[0] if exc.args else ""
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    reason, _, arg = str(message).partition(": ")
    if arg.startswith(("(?=", "(?!")):
        feature = "look-ahead"
    elif arg.startswith(("(?<=", "(?<!")):
        feature = "look-behind"
    elif re.fullmatch(r"\\[1-9][0-9]*", arg):
        feature = "a back-reference"
    else:
        return f"is refused by RE2: {reason}"
    return (f"uses {feature}, which RE2 does not run (RE2 matches in linear time: no "
            "look-around, no back-references)")


def _has_any_byte(pattern: str) -> bool:
    """Whether ``pattern`` holds ``\\C`` (not ``\\\\C``, a backslash then ``C``)."""
    index = pattern.find("\\")
    while index != -1:
        if pattern[index + 1:index + 2] == "C":
            return True
        index = pattern.find("\\", index + 2)
    return False


def _template(replace: object, regex: Any) -> tuple[str | int, ...]:
    """``replace`` as literal pieces and group numbers (the module docstring's syntax)."""
    if not isinstance(replace, str):
        raise _Problem("replace", "must be a string")
    if len(replace) > MAX_REPLACE_LENGTH:
        raise _Problem("replace", f"must be at most {MAX_REPLACE_LENGTH} characters long")
    if not _utf8(replace):
        raise _Problem("replace", "holds a lone surrogate (not UTF-8)")
    groups: int = regex.groups
    names: Mapping[str, int] = regex.groupindex
    pieces: list[str | int] = []
    literal: list[str] = []
    position = 0
    while (start := replace.find("\\", position)) != -1:
        literal.append(replace[position:start])
        match = _ESCAPE.match(replace, start)
        if match is None:
            raise _Problem("replace", "has a backslash that is neither '\\\\' nor a group "
                                      "(\\1, \\g<1>, \\g<name>)")
        backslash, number, name = match.groups()
        if backslash:
            literal.append("\\")
        else:
            group = _group(number if number is not None else name, groups, names)
            pieces.append("".join(literal))
            literal = []
            pieces.append(group)
        position = match.end()
    literal.append(replace[position:])
    pieces.append("".join(literal))
    return tuple(piece for piece in pieces if piece != "")


def _group(ref: str, groups: int, names: Mapping[str, int]) -> int:
    if ref.isascii() and ref.isdigit():
        number = int(ref)
        if number > groups:
            raise _Problem("replace", f"refers to group {number}; the pattern has {groups}")
        return number
    if ref not in names:
        raise _Problem("replace", "refers to a group name the pattern does not define")
    return names[ref]


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _encodable(text: str) -> str:
    """``text`` with each lone surrogate escaped (``\\ud800``), the rest as it is."""
    return text if _utf8(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _substitute(rule: _Compiled, text: str, limit: int) -> tuple[str | None, int]:
    """``text`` with ``rule``'s non-empty matches rewritten, and how many; None for the text
    when the output would be longer than ``limit`` (the count then includes that rewrite)."""
    chunks: list[str] = []
    pieces: list[str] = []
    size = len(text)
    end = count = 0
    for start, stop, replacement in _rewrites(rule, text):
        size += len(replacement) - (stop - start)
        count += 1
        if size > limit:
            return None, count
        pieces.append(text[end:start])
        pieces.append(replacement)
        end = stop
        if len(pieces) >= _JOIN_EVERY:
            chunks.append("".join(pieces))
            pieces.clear()
    if not count:
        return text, 0
    pieces.append(text[end:])
    chunks.append("".join(pieces))
    return "".join(chunks), count


def _rewrites(rule: _Compiled, text: str) -> Iterator[tuple[int, int, str]]:
    """Each non-empty match of ``rule`` in ``text``: its span and its replacement."""
    constant = rule.constant
    for match in rule.regex.finditer(text):
        start, stop = match.span()
        if start == stop:
            continue
        if constant is not None:
            yield start, stop, constant
        else:
            yield start, stop, "".join(piece if isinstance(piece, str)
                                       else match.group(piece) or "" for piece in rule.template)


def parse_tenant_rules(raw: object) -> dict[str, Redactor]:
    """The ``results.redact`` configuration: a mapping of tenant names (``"*"``: every
    tenant, and runs without one) to lists of rules, each a mapping with ``name``,
    ``pattern`` and optionally ``replace`` (:data:`DEFAULT_REPLACE`). None or an empty
    mapping: no rules. A tenant with an empty list has no rules of its own. Raises
    :class:`RedactionError` with the config path, ``results.redact.acme[2].pattern: ...``."""
    base = "results.redact"
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise RedactionError(f"{base}: must map tenant names to lists of rules")
    parsed: dict[str, Redactor] = {}
    for tenant, listed in raw.items():
        if not isinstance(tenant, str) or not 1 <= len(tenant) <= MAX_TENANT_LENGTH:
            raise RedactionError(f"{base}: a tenant name must be a string of 1 to "
                                 f"{MAX_TENANT_LENGTH} characters")
        path = f"{base}.{tenant}"
        if isinstance(listed, str | bytes) or not isinstance(listed, Sequence):
            raise RedactionError(f"{path}: must be a list of rules")
        if len(listed) > MAX_RULES:
            raise RedactionError(f"{path}: more than {MAX_RULES} rules")
        rules = [_rule(f"{path}[{index}]", item) for index, item in enumerate(listed)]
        try:
            redactor = Redactor(rules)
        except RedactionError as exc:
            where = f"{path}[{exc.index}]" + (f".{exc.field}" if exc.field else "")
            raise RedactionError(f"{where}: {exc.problem}", exc.index, exc.field,
                                 exc.problem) from None
        if len(redactor):
            parsed[tenant] = redactor
    return parsed


def _rule(path: str, item: object) -> Rule:
    if not isinstance(item, Mapping):
        raise RedactionError(f"{path}: must be a mapping with name, pattern and replace")
    if not set(item) <= _RULE_KEYS:
        raise RedactionError(f"{path}: has a key other than name, pattern and replace")
    for key in ("name", "pattern"):
        if key not in item:
            raise RedactionError(f"{path}: has no {key}")
    return Rule(item["name"], item["pattern"], item.get("replace", DEFAULT_REPLACE))


def redactor_for(rules: Mapping[str, Redactor], tenant: str | None) -> Redactor | None:
    """The rules a run of ``tenant`` (None: a run without one) gets from
    :func:`parse_tenant_rules`'s ``rules``: the tenant's own, then ``"*"``'s; None when
    neither has any. The combination is built once per pair and remembered."""
    own = rules.get(tenant) if tenant is not None and tenant != EVERY_TENANT else None
    every = rules.get(EVERY_TENANT)
    if own is None or every is None:
        return own if own is not None else every
    return own.then(every)
