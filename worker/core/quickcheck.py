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
subschema), ``enum`` (only its strings are used), the annotations that never change a verdict
(``title``, ``description``, ``default``, ``examples``, ``$comment``, ``deprecated``,
``readOnly``, ``writeOnly``, and ``format``: the validators are built without a format
checker, so jsonschema asserts no format either), and the schema ``true``. Each check is the
conservative reading of its keyword, right in every draft jsonschema supports here:

* ``integer`` is an ``int`` only (a float such as ``1.0`` is an integer from draft 6 on, but
  not in draft 4: not sure, jsonschema decides); ``number`` an ``int`` or a ``float``; neither
  is a ``bool``;
* ``enum``: a string among the enum's strings (JSON equality puts a string equal only to a
  string); any other value is not sure;
* ``properties``, ``required`` and ``additionalProperties`` apply to objects only, ``items``
  to arrays only, as in JSON Schema.

Bounds: a schema nested deeper than :data:`MAX_PLAN_DEPTH` is not planned. ``sure`` counts
each (sub)schema it applies as many steps as the schema has members, never fewer than the
keyword applications jsonschema's bounded validator counts for it, and is not sure beyond
the validation's ``max_steps``: a value that jsonschema would refuse for its budget is never
passed here. Values are at most ``strictjson.MAX_DEPTH`` levels deep, so the recursion is
bounded by both.
"""

from __future__ import annotations

from typing import Any

#: Deepest (sub)schema nesting planned; deeper schemas are left to jsonschema.
MAX_PLAN_DEPTH = 32

#: Members that never change a verdict (``format``: no format checker, see the docstring).
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                         "deprecated", "readOnly", "writeOnly", "format"})

#: The members :func:`plan` reads; a schema with any other member is outside the subset.
KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items",
                      "enum"}) | ANNOTATIONS

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

    __slots__ = ("closed", "enum", "items", "properties", "required", "steps", "types")

    def __init__(self, steps: int) -> None:
        #: Type bits any of which the value must have.
        self.types = ANY_TYPE
        self.properties: dict[str, Node] = {}
        self.required: list[str] = []
        #: ``additionalProperties: false``.
        self.closed = False
        self.items: Node | None = None
        #: The enum's strings, when there is an enum.
        self.enum: frozenset[str] | None = None
        #: What applying this schema costs in validation steps, at most (its member count).
        self.steps = steps

    def sure(self, value: Any, max_steps: int) -> bool:
        """Whether ``value`` is surely valid, within ``max_steps`` steps."""
        return self._left(value, max_steps) >= 0

    def _left(self, value: Any, left: int) -> int:
        """The steps left after applying this schema to ``value``; negative: not sure."""
        left -= self.steps
        if left < 0 or not _bits(value) & self.types:
            return -1
        if self.enum is not None and (type(value) is not str or value not in self.enum):
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


def plan(schema: Any, depth: int = 0) -> Node | None:
    """``schema`` as a :class:`Node`, or None when it is outside the subset."""
    if schema is True:
        return Node(0)
    if type(schema) is not dict or depth > MAX_PLAN_DEPTH:
        return None
    doc: dict[str, Any] = schema
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
        child = plan(sub, depth + 1)
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
        items = plan(doc["items"], depth + 1)
        if items is None:
            return None
        node.items = items
    if "enum" in doc:
        enum = doc["enum"]
        if type(enum) is not list:
            return None
        node.enum = frozenset(e for e in enum if type(e) is str)
    return node


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
