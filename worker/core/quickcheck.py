"""A quick "surely valid" for the JSON Schemas tools declare most, in front of jsonschema.

Every call the latch decides is validated against its tool's schema. jsonschema takes about
15 µs for a two-property object (``SchemaCheck.errors`` with its budget, ``best_match`` and
``descend``): about 0.07x of ``bench/bench_core.py``'s floor for its 384 calls, a sixth of
what the core's 1.5x target needs cut (``docs/decisions/0007-quick-schema-check.md``). Most
tool schemas are a small subset of JSON Schema (an object of typed properties, some
required, no others allowed), and checking a value against that subset takes well under
a microsecond.

:func:`plan` reads a schema once, when it is compiled, into a :class:`Node` tree, or returns
None when the schema uses anything outside the subset. :meth:`Node.sure` answers only
"surely valid" (True) or "not sure" (False); on False, jsonschema decides as it always did,
and every error message, every refusal and every verdict outside the subset stays its own.
So the one property that matters is soundness: ``sure`` is True only for a value that
jsonschema, bounded as ``worker.core.schemacheck`` bounds it, finds valid
(``tests/core/property/test_quickcheck.py`` checks it on generated schemas and values).

The subset, per (sub)schema: ``type`` (a name or a list of names), ``properties`` (object
subschemas), ``required``, ``additionalProperties`` (``true`` or ``false``), ``items`` (one
subschema), ``enum`` (only its strings are used), ``const`` (a string), ``anyOf``,
``allOf``, ``pattern`` (searched with the RE2 regex jsonschema's bounded validator uses), the
number
bounds (``minimum``, ``maximum``, and ``exclusiveMinimum``/``exclusiveMaximum`` as numbers,
not draft 4's booleans), ``minLength``/``maxLength`` (code points, as jsonschema counts them),
``minItems``/``maxItems``, the annotations that never change a verdict (``title``,
``description``, ``default``, ``examples``, ``$comment``, ``deprecated``, ``readOnly``,
``writeOnly``, and ``format``: the validators are built without a format checker, so
jsonschema asserts no format either), the schema ``true``, and a ``$ref`` beside nothing but
annotations to a definition of the root (``#/$defs/Name``, ``#/definitions/Name``; a root
with an ``$id`` of its own and reference cycles are not in the subset). That covers what tool
definitions are mostly made of, pydantic's nested models (``$defs``) and its ``anyOf`` of a
type and ``null`` for an optional field among them. Each check is the conservative reading
of its keyword, right in every draft jsonschema supports here:

* ``integer`` is an ``int`` only (a float such as ``1.0`` is an integer from draft 6 on, but
  not in draft 4: not sure, jsonschema decides); ``number`` an ``int`` or a ``float``; neither
  is a ``bool``;
* ``enum``: a string among the enum's strings (JSON equality puts a string equal only to a
  string); any other value is not sure;
* ``properties``, ``required`` and ``additionalProperties`` apply to objects only, ``items``
  to arrays only, the bounds to numbers, strings and arrays only, as in JSON Schema;
* ``anyOf`` is sure when one of its branches is, ``allOf`` when all of them are.

Bounds: a schema nested deeper than :data:`MAX_PLAN_DEPTH` is not planned. ``sure`` counts
each (sub)schema it applies as many steps as the schema has members, never fewer than the
keyword applications jsonschema's bounded validator counts for it, and is not sure beyond
the validation's ``max_steps``: a value that jsonschema would refuse for its budget is never
passed here. jsonschema checks the ``anyOf`` branches before the first valid one in full, so
each branch ``sure`` is not sure of is charged its full cost (:meth:`Node._cost`). Values
are at most ``strictjson.MAX_DEPTH`` levels deep, so the recursion is bounded by both.
"""

from __future__ import annotations

from typing import Any

#: Deepest (sub)schema nesting planned; deeper schemas are left to jsonschema.
MAX_PLAN_DEPTH = 32

#: Members that never change a verdict (``format``: no format checker, see the docstring).
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                         "deprecated", "readOnly", "writeOnly", "format"})

#: Bounds on a number, a string's length (code points, as jsonschema counts them) or an
#: array's length: name -> what a value that passes it is (below).
BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
                    "maxLength", "minItems", "maxItems"})

#: Where a root keeps the definitions its ``$ref`` members point to (``#/$defs/Name``).
DEFINITIONS = ("$defs", "definitions")

#: The members :func:`plan` reads; a schema with any other member is outside the subset.
KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items",
                      "enum", "const", "anyOf", "allOf", "pattern"}) | BOUNDS | ANNOTATIONS

# One bit per JSON type name, tested against the bits of a value's Python type.
STRING, INTEGER, NUMBER, BOOLEAN, NULL, OBJECT, ARRAY = 1, 2, 4, 8, 16, 32, 64
TYPE_BITS: dict[str, int] = {"string": STRING, "integer": INTEGER, "number": NUMBER,
                             "boolean": BOOLEAN, "null": NULL, "object": OBJECT,
                             "array": ARRAY}
#: No ``type`` keyword: any value.
ANY_TYPE = STRING | INTEGER | NUMBER | BOOLEAN | NULL | OBJECT | ARRAY


def _bits(value: Any) -> int:
    """The type bits a value surely has (``bool`` is neither integer nor number; a float is a
    number, not surely an integer)."""
    kind = type(value)
    if kind is str:
        return STRING
    if kind is dict:
        return OBJECT
    if kind is int:
        return INTEGER | NUMBER
    if kind is list:
        return ARRAY
    if kind is float:
        return NUMBER
    if kind is bool:
        return BOOLEAN
    if value is None:
        return NULL
    return 0


class Node:
    """One planned (sub)schema."""

    __slots__ = ("all_of", "any_of", "closed", "enum", "items", "lengths", "numbers",
                 "patterns", "properties", "required", "steps", "types")

    def __init__(self, steps: int) -> None:
        #: Type bits any of which the value must have.
        self.types = ANY_TYPE
        self.properties: dict[str, Node] = {}
        self.required: list[str] = []
        #: ``additionalProperties: false``.
        self.closed = False
        self.items: Node | None = None
        #: The enum's strings (or the one string of ``const``), when there is one.
        self.enum: frozenset[str] | None = None
        #: Number bounds: (minimum, maximum, exclusive minimum, exclusive maximum), each None
        #: when absent; None when there is none at all.
        self.numbers: tuple[Any, Any, Any, Any] | None = None
        #: Length bounds of a string or an array: (minLength, maxLength, minItems, maxItems).
        self.lengths: tuple[int, int, int, int] | None = None
        #: ``anyOf``'s branches.
        self.any_of: list[Node] | None = None
        #: ``allOf``'s branches.
        self.all_of: list[Node] = []
        #: ``pattern``: its RE2 regex (``schemacheck.prepare`` compiled it), searched in a
        #: string as jsonschema's bounded validator does.
        self.patterns: list[Any] = []
        #: What applying this schema costs in validation steps, at most (its member count).
        self.steps = steps

    def sure(self, value: Any, max_steps: int) -> bool:
        """Whether ``value`` is surely valid, within ``max_steps`` steps."""
        return self._left(value, max_steps) >= 0

    def _left(self, value: Any, left: int) -> int:
        """The steps left after applying this schema to ``value``; negative: not sure."""
        left -= self.steps
        bits = _bits(value)
        if left < 0 or not bits & self.types:
            return -1
        if self.enum is not None and (type(value) is not str or value not in self.enum):
            return -1
        if self.numbers is not None and bits & NUMBER and not _within(value, self.numbers):
            return -1
        if self.lengths is not None and not _long_enough(value, self.lengths):
            return -1
        if self.patterns and type(value) is str:
            for regex in self.patterns:
                if regex.search(value) is None:
                    return -1
        if self.any_of is not None:
            left = self._any_of(self.any_of, value, left)
            if left < 0:
                return -1
        for branch in self.all_of:
            left = branch._left(value, left)
            if left < 0:
                return -1
        if type(value) is dict:
            obj: dict[str, Any] = value
            for name in self.required:
                if name not in obj:
                    return -1
            properties = self.properties
            for key, member in obj.items():
                node = properties.get(key)
                if node is None:
                    if self.closed:
                        return -1
                    continue
                left = node._left(member, left)
                if left < 0:
                    return -1
        elif type(value) is list and self.items is not None:
            items = self.items
            for member in value:
                left = items._left(member, left)
                if left < 0:
                    return -1
        return left

    @staticmethod
    def _any_of(branches: list[Node], value: Any, left: int) -> int:
        """The steps left once a branch is surely valid, or -1. jsonschema tries the branches
        in order and stops at the first valid one, having checked each branch before it in
        full: each branch this is not sure of is charged its full :meth:`_cost`."""
        for branch in branches:
            after = branch._left(value, left)
            if after >= 0:
                return after
            left = branch._cost(value, left)
            if left < 0:
                return -1
        return -1

    def _cost(self, value: Any, left: int) -> int:
        """The steps left after jsonschema applied this schema to ``value`` in full, at most
        (every subschema that may apply, valid or not); -1 once they run out."""
        left -= self.steps
        if left < 0:
            return -1
        for branch in [*(self.any_of or ()), *self.all_of]:
            left = branch._cost(value, left)
            if left < 0:
                return -1
        if type(value) is dict:
            obj: dict[str, Any] = value
            for key, node in self.properties.items():
                if key in obj:
                    left = node._cost(obj[key], left)
                    if left < 0:
                        return -1
        elif type(value) is list and self.items is not None:
            for member in value:
                left = self.items._cost(member, left)
                if left < 0:
                    return -1
        return left


def _within(number: Any, bounds: tuple[Any, Any, Any, Any]) -> bool:
    """Whether an ``int`` or ``float`` passes ``minimum``, ``maximum`` and the exclusive
    bounds (as jsonschema compares them: Python's own comparison of the two numbers)."""
    low, high, above, below = bounds
    return ((low is None or number >= low) and (high is None or number <= high)
            and (above is None or number > above) and (below is None or number < below))


def _long_enough(value: Any, lengths: tuple[int, int, int, int]) -> bool:
    """Whether a string's or an array's length is within its bounds (other values pass)."""
    if type(value) is str:
        size, low, high = len(value), lengths[0], lengths[1]
    elif type(value) is list:
        size, low, high = len(value), lengths[2], lengths[3]
    else:
        return True
    return low <= size and (high < 0 or size <= high)


def plan(schema: Any, draft4: bool = False, patterns: dict[str, Any] | None = None
         ) -> Node | None:
    """``schema`` as a :class:`Node`, or None when it is outside the subset.

    ``draft4``: the schema is read by draft 4's rules. A definition under a container the
    draft does not know (``$defs`` before 2019-09) escaped the metaschema check, so it may
    hold what the draft reads otherwise: draft 4 has no boolean subschemas (jsonschema fails
    on one) and reads a truthy ``exclusiveMinimum``/``exclusiveMaximum`` as a flag on
    ``minimum``/``maximum``. With it, neither is in the subset.

    ``patterns``: each ``pattern`` of the schema compiled by RE2 (``schemacheck.prepare``);
    a ``pattern`` not in it is not in the subset."""
    definitions: dict[str, Any] = {}
    if type(schema) is dict:
        root: dict[str, Any] = schema
        for container in DEFINITIONS:
            found = root.get(container)
            if found is not None:
                if type(found) is not dict:
                    return None
                definitions.update({f"#/{container}/{name}": sub for name, sub in found.items()})
        # (a root with an ``$id``, a base URI its references would resolve against, is not
        # planned: ``$id`` is not in KEYWORDS, nor a sibling a ``$ref`` may have)
        schema = {k: v for k, v in root.items() if k not in DEFINITIONS}
    return _Planner(definitions, draft4, patterns or {}).plan(schema, 0)


class _Planner:
    """Reads one schema; a ``$ref`` target is read once, and shared by every reference."""

    def __init__(self, definitions: dict[str, Any], draft4: bool,
                 patterns: dict[str, Any]) -> None:
        self.definitions = definitions
        self.draft4 = draft4
        self.patterns = patterns
        self.planned: dict[str, Node] = {}
        #: The references being read: one met again is a cycle (not in the subset).
        self.open: set[str] = set()

    def plan(self, schema: Any, depth: int) -> Node | None:
        if schema is True:
            return None if self.draft4 else Node(0)
        if type(schema) is not dict or depth > MAX_PLAN_DEPTH:
            return None
        doc: dict[str, Any] = schema
        if "$ref" in doc:
            return self._reference(doc, depth)
        for key in doc:
            if key not in KEYWORDS:
                return None
        node = Node(len(doc))
        if "type" in doc:
            types = _types(doc["type"])
            if types is None:
                return None
            node.types = types
        properties = doc.get("properties", {})
        if type(properties) is not dict:
            return None
        for name, sub in properties.items():
            child = self.plan(sub, depth + 1)
            if child is None:
                return None
            node.properties[name] = child
        required = doc.get("required", [])
        if type(required) is not list or any(type(r) is not str for r in required):
            return None
        node.required = list(required)
        extra = doc.get("additionalProperties", True)
        if extra is not True and extra is not False:
            return None
        node.closed = extra is False
        if "items" in doc:
            items = self.plan(doc["items"], depth + 1)
            if items is None:
                return None
            node.items = items
        if "enum" in doc:
            enum = doc["enum"]
            if type(enum) is not list:
                return None
            node.enum = frozenset(e for e in enum if type(e) is str)
        if "const" in doc:  # a string only: other constants equal values of other types
            const = doc["const"]
            if type(const) is not str:
                return None
            node.enum = frozenset({const}) if node.enum is None else node.enum & {const}
        if not _bounds(doc, node) or (self.draft4 and (
                "exclusiveMinimum" in doc or "exclusiveMaximum" in doc)):
            return None
        if "anyOf" in doc:
            node.any_of = self._branches(doc["anyOf"], depth)
            if node.any_of is None:
                return None
        if "allOf" in doc:
            every = self._branches(doc["allOf"], depth)
            if every is None:
                return None
            node.all_of = every
        if "pattern" in doc:
            regex = self.patterns.get(doc["pattern"]) if type(doc["pattern"]) is str else None
            if regex is None:
                return None
            node.patterns.append(regex)
        return node

    def _branches(self, branches: Any, depth: int) -> list[Node] | None:
        """An ``anyOf``'s or ``allOf``'s branches (a non-empty list), or None."""
        if type(branches) is not list or not branches:
            return None
        nodes: list[Node] = []
        for branch in branches:
            child = self.plan(branch, depth + 1)
            if child is None:
                return None
            nodes.append(child)
        return nodes

    def _reference(self, doc: dict[str, Any], depth: int) -> Node | None:
        """A ``$ref`` beside annotations only (drafts 4 to 7 ignore its siblings, later ones
        apply them: with none, both read it alike) to a definition of the root, as a node
        whose one branch is the definition's."""
        ref = doc["$ref"]
        if any(k != "$ref" and k not in ANNOTATIONS for k in doc) or type(ref) is not str:
            return None
        target = self.planned.get(ref)
        if target is None:
            if ref not in self.definitions or ref in self.open or not _plain(ref):
                return None
            self.open.add(ref)
            target = self.plan(self.definitions[ref], depth + 1)
            self.open.discard(ref)
            if target is None:
                return None
            self.planned[ref] = target
        node = Node(len(doc))
        node.any_of = [target]
        return node


def _plain(ref: str) -> bool:
    """Whether a reference's name needs no unescaping (JSON Pointer's ``~``, URI ``%``)."""
    return "~" not in ref and "%" not in ref and ref.count("/") == 2


def _bounds(doc: dict[str, Any], node: Node) -> bool:
    """Read the number and length bounds into ``node``; False when one is not a number (or a
    count), e.g. draft 4's boolean ``exclusiveMinimum``."""
    numbers: list[Any] = []
    for name in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        bound = doc.get(name)
        if name in doc and type(bound) is not int and type(bound) is not float:
            return False
        numbers.append(bound)
    if any(b is not None for b in numbers):
        node.numbers = (numbers[0], numbers[1], numbers[2], numbers[3])
    lengths: list[int] = []
    for name, absent in (("minLength", 0), ("maxLength", -1), ("minItems", 0),
                         ("maxItems", -1)):
        bound = doc.get(name, absent)
        if name in doc and (type(bound) is not int or bound < 0):
            return False
        lengths.append(bound)
    if lengths != [0, -1, 0, -1]:
        node.lengths = (lengths[0], lengths[1], lengths[2], lengths[3])
    return True


def _types(value: Any) -> int | None:
    """The bits of a ``type`` keyword's value, or None when it is not one this reads."""
    names = [value] if type(value) is str else value
    if type(names) is not list or not names:
        return None
    bits = 0
    for name in names:
        if type(name) is not str or name not in TYPE_BITS:
            return None
        bits |= TYPE_BITS[name]
    return bits
