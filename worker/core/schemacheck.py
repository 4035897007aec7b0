"""What a tool's JSON Schema may cost: no I/O, bounded time, and the same verdict at any depth.

A run's ``tools`` are input like any other, and a JSON Schema is a small program: jsonschema
left alone fetches any ``$ref`` URL it is given, runs ``pattern`` on a backtracking regex
engine, expands ``allOf``/``$ref`` fan-out without limit, compares ``uniqueItems`` pairwise,
and recurses as deep as the schema says, so that a deep enough chain of ``$ref`` gave a caught
``RecursionError`` whose verdict depended on the caller's stack. Each of those is closed here,
before and while a value is validated:

**Before** (:func:`prepare`, once per distinct schema, when a tool is first called):

* every ``$ref``, ``$dynamicRef`` and ``$recursiveRef`` must be a fragment (``#...``) that
  resolves within the tool's own schema; it is resolved by ``referencing`` against a
  registry whose ``retrieve`` refuses everything, so no URL is fetched and no file is read.
  ``$id`` and ``$schema`` are allowed at the root only (elsewhere they would change the base
  of a ``#...`` reference, or the rules, under the checks made here);
* the schema has at most ``max_nodes`` JSON values, and the subschemas that apply to one
  value through ``allOf``/``anyOf``/``oneOf``/``not``/``if``/``then``/``else``/
  ``dependentSchemas``/references (its *same-value expansion*) number at most
  ``max_nodes`` and chain at most :data:`MAX_SAME_VALUE_CHAIN` deep; a cycle of them that
  never descends into the value (``{"$ref": "#"}``) is refused;
* every ``pattern`` and ``patternProperties`` key compiles with RE2 (google-re2): linear-time
  matching, no backtracking. RE2 has no look-around and no back-references, and its ``\\d``,
  ``\\w`` and ``\\s`` are ASCII; a pattern it refuses, or longer than
  :data:`MAX_PATTERN_LENGTH`, makes the tool unusable (ECMA-262 look-arounds and
  back-references are exactly the constructs whose matching time is not linear);
* ``unevaluatedProperties`` together with ``patternProperties`` is refused: jsonschema
  evaluates those patterns with Python's ``re`` inside a helper this module cannot reach.

A schema refused here makes its tool unusable: every call fails ``schema_invalid`` with the
reason, and the run goes on.

**While** (:class:`Budget`): the validator classes are jsonschema's own, extended
(``jsonschema.validators.extend``) so that every keyword application counts one step and
one level of nesting; a value that takes more than ``max_steps`` applications, or nests them
deeper than :data:`MAX_VALIDATION_DEPTH`, fails ``schema_invalid``. ``pattern``,
``patternProperties`` and ``additionalProperties`` match with the RE2 patterns compiled
before, and ``uniqueItems`` hashes a canonical form of each item (JSON Schema equality: ``1``
and ``1.0`` are equal, ``true`` and ``1`` are not, key order does not matter) instead of
comparing every pair. Validation runs with :data:`RECURSION_HEADROOM` more frames allowed than
the caller had, which the depth bounds above never reach: no verdict is ever a caught
``RecursionError``, so it is the same at any stack depth, live or replayed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import re2
from jsonschema import validators as js_validators
from jsonschema.exceptions import ValidationError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import specification_with

#: Defaults of :class:`SchemaLimits` (and of the settings that set it).
DEFAULT_MAX_NODES = 2_000
DEFAULT_MAX_STEPS = 20_000
#: The longest chain of subschemas that apply to one value (``allOf`` in ``$ref`` in ...).
MAX_SAME_VALUE_CHAIN = 64
#: The deepest nesting of keyword applications while one value is validated.
MAX_VALIDATION_DEPTH = 512
#: The longest ``pattern`` (characters) RE2 is asked to compile.
MAX_PATTERN_LENGTH = 1000
#: Frames allowed beyond the caller's while a schema is checked or applied: measured, about
#: 3.5 per level of :data:`MAX_VALIDATION_DEPTH` (1,800 at the bound), and 450 for
#: ``check_schema`` of a schema 60 levels deep, the deepest a ``run.start`` can hold;
#: ``tests/core/unit/test_schemacheck.py`` runs the cases with 150 frames left to the caller.
RECURSION_HEADROOM = 6 * MAX_VALIDATION_DEPTH + 2000

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is an outcome, not a line on stderr
_RE2_OPTIONS.max_mem = 8 << 20

#: Keywords whose values are data, never schemas.
_DATA = frozenset({"const", "enum", "default", "examples"})
#: Keywords whose values map names to schemas.
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                        "dependentSchemas", "dependencies"})
#: Keywords whose values are lists of schemas.
_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
#: Keywords whose subschemas apply to the same value (the others descend into it).
_SAME_VALUE = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else",
                         "dependentSchemas", "dependencies"})
_REFS = ("$ref", "$dynamicRef", "$recursiveRef")


class SchemaRefused(Exception):
    """The schema breaks a bound of the module docstring; the message says which."""


class OverBudget(Exception):
    """Validating one value took more steps, or nested deeper, than allowed."""


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """The configurable bounds (``agent_stream_assemble``: ``max_schema_nodes``,
    ``max_schema_validation_steps``)."""

    max_nodes: int = DEFAULT_MAX_NODES
    max_steps: int = DEFAULT_MAX_STEPS


# -- before: the walk ------------------------------------------------------------------------


def prepare(schema: Any, cls: type[Any], limits: SchemaLimits) -> dict[str, Any]:
    """Check ``schema`` (a dict, its root ``$schema`` already removed) against the bounds of
    the module docstring; return its patterns compiled by RE2. Raises :class:`SchemaRefused`."""
    _count_nodes(schema, limits.max_nodes)
    spec = specification_with(cls.META_SCHEMA.get("$schema", ""))
    resolver = refusing_registry().resolver_with_root(spec.create_resource(schema))
    id_keys = ("$id", "id") if cls.__name__ in ("Draft3Validator", "Draft4Validator") else ("$id",)
    patterns: dict[str, Any] = {}
    same: dict[int, list[Any]] = {}
    unevaluated = named_patterns = False
    stack: list[tuple[Any, bool]] = [(schema, True)]
    while stack:
        node, root = stack.pop()
        if not isinstance(node, dict) or id(node) in same:
            continue
        children: list[Any] = []
        same[id(node)] = children
        for key, value in node.items():
            if key in _DATA:
                continue
            if not root and (key == "$schema" or key in id_keys) and isinstance(value, str):
                raise SchemaRefused(f"'{key}' below the root of the schema")
            if key in _REFS:
                target = _resolve(resolver, key, value)
                children.append(target)
                stack.append((target, False))
            elif key == "pattern" and isinstance(value, str):
                patterns[value] = _regex(value)
            elif key in _NAME_MAPS and isinstance(value, dict):
                if key == "patternProperties":
                    patterns.update((p, _regex(p)) for p in value)
                subs = [v for v in value.values() if isinstance(v, dict | bool)]
                stack += [(v, False) for v in subs]
                if key in _SAME_VALUE:
                    children += subs
            elif key in _LISTS and isinstance(value, list):
                subs = [v for v in value if isinstance(v, dict | bool)]
                stack += [(v, False) for v in subs]
                if key in _SAME_VALUE:
                    children += subs
            elif isinstance(value, dict | bool):
                stack.append((value, False))
                if key in _SAME_VALUE:
                    children.append(value)
            unevaluated = unevaluated or key == "unevaluatedProperties"
            named_patterns = named_patterns or (key == "patternProperties" and bool(value))
    if unevaluated and named_patterns:
        raise SchemaRefused("'unevaluatedProperties' together with 'patternProperties'")
    _check_expansion(same, limits.max_nodes)
    return patterns


def _count_nodes(schema: Any, limit: int) -> None:
    count, stack = 0, [schema]
    while stack:
        value = stack.pop()
        count += 1
        if count > limit:
            raise SchemaRefused(f"more than {limit} JSON values")
        if isinstance(value, dict):
            stack += value.values()
        elif isinstance(value, list):
            stack += value


def refusing_registry() -> Any:
    """A ``referencing`` registry that resolves only what it holds and retrieves nothing."""
    # ``retrieve`` is the attrs alias of ``Registry._retrieve``: referencing's documented API.
    return Registry(retrieve=refuse)  # type: ignore[call-arg]


def refuse(uri: str) -> Any:
    """``retrieve`` for the registry: nothing outside the schema is ever fetched or read."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs exception


def _resolve(resolver: Any, key: str, ref: Any) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaRefused(f"a '{key}' to something outside the tool's own schema")
    try:
        return resolver.lookup(ref).contents
    except Unresolvable:
        raise SchemaRefused(f"a '{key}' that does not resolve within the schema") from None


def _regex(pattern: str) -> Any:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise SchemaRefused(f"a pattern longer than {MAX_PATTERN_LENGTH} characters")
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error:
        raise SchemaRefused("a pattern RE2 cannot run (look-around, back-references and "
                            "the like are not supported)") from None


def _check_expansion(same: dict[int, list[Any]], limit: int) -> None:
    """Refuse a same-value cycle, an expansion over ``limit`` subschemas, or a chain over
    :data:`MAX_SAME_VALUE_CHAIN`: an iterative depth-first walk over the same-value edges,
    each subschema's expansion computed once its own are known."""
    size: dict[int, int] = {}
    chain: dict[int, int] = {}
    for start in same:
        if start in size:
            continue
        path: list[tuple[int, Iterator[int]]] = [(start, _kids(same, start))]
        on_path = {start}
        while path:
            node, kids = path[-1]
            kid = next(kids, None)
            if kid is not None:
                if kid in on_path:
                    raise SchemaRefused("a reference cycle that never descends into the value")
                if kid not in size:
                    on_path.add(kid)
                    path.append((kid, _kids(same, kid)))
                continue
            path.pop()
            on_path.discard(node)
            subs = same[node]
            size[node] = 1 + sum(size[id(c)] if isinstance(c, dict) else 1 for c in subs)
            chain[node] = 1 + max((chain[id(c)] for c in subs if isinstance(c, dict)), default=0)
            if size[node] > limit:
                raise SchemaRefused(f"one value would be checked against more than {limit} "
                                    "subschemas ($ref and allOf/anyOf/oneOf fan-out)")
            if chain[node] > MAX_SAME_VALUE_CHAIN:
                raise SchemaRefused(f"a chain of more than {MAX_SAME_VALUE_CHAIN} subschemas "
                                    "applying to one value")


def _kids(same: dict[int, list[Any]], node: int) -> Iterator[int]:
    return iter([id(c) for c in same[node] if isinstance(c, dict)])


# -- while: the budget and the keywords --------------------------------------------------------


class Budget:
    """The steps and depth left to the one validation under way, and its RE2 patterns."""

    __slots__ = ("depth", "max_steps", "patterns", "steps")

    def __init__(self, max_steps: int, patterns: dict[str, Any]) -> None:
        self.steps = 0
        self.depth = 0
        self.max_steps = max_steps
        self.patterns = patterns


#: The budget of the validation under way (the core is single-threaded); None outside one.
_CURRENT: list[Budget] = []


def run(budget: Budget, validate: Any, value: Any) -> Any:
    """``validate(value)`` under ``budget``, with :data:`RECURSION_HEADROOM` more frames."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + RECURSION_HEADROOM)
    _CURRENT.append(budget)
    try:
        return validate(value)
    finally:
        _CURRENT.pop()
        sys.setrecursionlimit(limit)


def _counted(keyword: Any) -> Any:
    """``keyword`` counting one step and one level of nesting in the current budget."""
    def counted(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not _CURRENT:  # a validator used outside ``run`` (the tests' stock comparisons)
            yield from keyword(validator, value, instance, schema) or ()
            return
        budget = _CURRENT[-1]
        budget.steps += 1
        if budget.steps > budget.max_steps:
            raise OverBudget(f"more than {budget.max_steps} validation steps")
        budget.depth += 1
        try:
            if budget.depth > MAX_VALIDATION_DEPTH:
                raise OverBudget(f"nesting deeper than {MAX_VALIDATION_DEPTH} levels")
            yield from keyword(validator, value, instance, schema) or ()
        finally:
            budget.depth -= 1
    return counted


def _search(pattern: str, text: str) -> bool:
    regex = _CURRENT[-1].patterns.get(pattern) if _CURRENT else None
    if regex is None:  # prepared schemas compile every pattern; this is never reached
        raise OverBudget("a pattern that was not prepared")
    return regex.search(text) is not None


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError("does not match the pattern")


def _pattern_properties(validator: Any, patterns: Any, instance: Any,
                        schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(stock: Any) -> Any:
    def additional(validator: Any, extra: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if "patternProperties" not in schema:
            yield from stock(validator, extra, instance, schema)
            return
        if not validator.is_type(instance, "object"):
            return
        named, patterns = schema.get("properties", {}), schema["patternProperties"]
        extras = [k for k in instance
                  if k not in named and not any(_search(p, k) for p in patterns)]
        if validator.is_type(extra, "object"):
            for key in extras:
                yield from validator.descend(instance[key], extra, path=key)
        elif not extra and extras:
            yield ValidationError("properties that match no pattern")
    return additional


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        form = canonical(item)
        if form in seen:
            yield ValidationError("has non-unique elements")
            return
        seen.add(form)


def canonical(value: Any) -> Any:
    """A hashable form of a JSON value, equal for values JSON Schema calls equal: numbers by
    value (``1 == 1.0``), booleans apart from numbers, objects whatever their key order."""
    if value is True or value is False:
        return ("b", value)
    if isinstance(value, dict):
        return ("o", frozenset((k, canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("a", tuple(canonical(v) for v in value))
    return ("s", value) if isinstance(value, str) else ("n", value)


def bounded_class(cls: type[Any]) -> type[Any]:
    """``cls`` with every keyword counted and the regex and ``uniqueItems`` keywords above."""
    keywords = dict(cls.VALIDATORS)
    replaced = {"pattern": _pattern, "patternProperties": _pattern_properties,
                "uniqueItems": _unique_items}
    for name, keyword in replaced.items():
        if name in keywords:
            keywords[name] = keyword
    if "additionalProperties" in keywords:
        keywords["additionalProperties"] = _additional_properties(keywords["additionalProperties"])
    extended: type[Any] = js_validators.extend(cls, {k: _counted(v) for k, v in keywords.items()})
    return extended
