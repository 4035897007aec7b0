"""``worker.core.quickcheck`` against jsonschema: "surely valid" only where jsonschema agrees.

* Soundness: over generated schemas (the quick subset, mixed with keywords outside it, in
  every draft the cache accepts) and values (random ones, and ones built to conform),
  whenever the quick check is sure, the bounded jsonschema validator finds no error, and
  with a small step budget it is never sure of a value jsonschema refuses for its budget.
* It is used: a value built to conform to a schema of the subset is surely valid, so the
  check is not one that always defers (which would be sound, and useless).
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from worker.core import quickcheck
from worker.core.schemacheck import SchemaLimits
from worker.core.tools import SchemaCheck, ValidatorCache

TYPES = ["string", "integer", "number", "boolean", "null", "object", "array"]
DRAFTS = [None, "http://json-schema.org/draft-04/schema#",
          "http://json-schema.org/draft-06/schema#", "http://json-schema.org/draft-07/schema#",
          "https://json-schema.org/draft/2019-09/schema",
          "https://json-schema.org/draft/2020-12/schema"]
NAMES = ["a", "b", "c", "path"]
ANNOTATION = st.sampled_from([{}, {"description": "d"}, {"title": "t", "default": 1},
                              {"format": "email"}, {"format": "date-time"},
                              {"examples": [1, "x"]}, {"deprecated": True}])
#: Bounds and constants of the subset (a draft 4 boolean exclusive bound is outside it).
BOUNDED = st.sampled_from([{}, {}, {"minimum": 1}, {"maximum": 2.5}, {"exclusiveMinimum": 0},
                           {"exclusiveMaximum": 2}, {"minimum": -1, "maximum": 1},
                           {"minLength": 1}, {"maxLength": 1}, {"minLength": 2, "maxLength": 3},
                           {"minItems": 1}, {"maxItems": 2}, {"const": "a"},
                           {"maximum": 2, "exclusiveMaximum": True}, {"pattern": "^a"},
                           {"pattern": "b$", "maxLength": 2}])
#: Keywords outside the subset (the quick check must defer on them, jsonschema decides).
OUTSIDE = st.sampled_from([{}, {}, {}, {}, {"multipleOf": 2}, {"minProperties": 1},
                           {"oneOf": [{}]}, {"not": {"type": "string"}}, {"const": 1},
                           {"additionalProperties": {"type": "integer"}}])

_type = st.one_of(st.sampled_from(TYPES),
                  st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        out.update(part)
    return out


def _extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    obj = st.builds(
        lambda props, required, closed, note, odd: _merge(
            {"type": "object", "properties": props, "required": required},
            {"additionalProperties": False} if closed else {}, note, odd),
        st.dictionaries(st.sampled_from(NAMES), inner, max_size=3),
        st.lists(st.sampled_from(NAMES), max_size=2, unique=True), st.booleans(), ANNOTATION,
        OUTSIDE)
    arr = st.builds(lambda items, note, odd, bound: _merge(
        {"type": "array", "items": items}, note, odd, bound), inner, ANNOTATION, OUTSIDE,
        BOUNDED)
    any_of = st.builds(lambda branches, note: _merge({"anyOf": branches}, note),
                       st.lists(inner, min_size=1, max_size=3), ANNOTATION)
    all_of = st.builds(lambda branches, note: _merge({"allOf": branches}, note),
                       st.lists(inner, min_size=1, max_size=2), ANNOTATION)
    return st.one_of(obj, arr, any_of, all_of)


LEAF = st.one_of(
    st.builds(lambda t, note, odd, bound: _merge({"type": t}, note, odd, bound), _type,
              ANNOTATION, OUTSIDE, BOUNDED),
    st.builds(lambda e, note: _merge({"enum": e}, note),
              st.lists(st.sampled_from(["a", "b", 1, 1.0, None, True, "1"]), min_size=1,
                       max_size=4, unique_by=lambda v: (type(v), v)), ANNOTATION),
    st.builds(lambda t, e: {"type": t, "enum": e}, st.sampled_from(["string", "integer"]),
              st.lists(st.sampled_from(["a", "b", 1, 2]), min_size=1, max_size=3, unique=True)),
    st.just({}), st.just(True))
NESTED_SCHEMAS = st.recursive(LEAF, _extend, max_leaves=8)


@st.composite
def _with_definitions(draw: Any) -> Any:
    """A schema whose subschemas are moved, some of them, into the root's definitions and
    referenced from where they were (``$ref``, with an annotation, or with another keyword
    beside it that puts it outside the quick subset); a definition may be referenced twice."""
    schema = draw(NESTED_SCHEMAS)
    container = draw(st.sampled_from(["$defs", "definitions"]))
    defs: dict[str, Any] = {}

    def move(sub: Any) -> Any:
        if not isinstance(sub, dict) or not draw(st.booleans()):
            return sub
        name = draw(st.sampled_from(["A", "B", "C"]))
        defs.setdefault(name, sub)
        ref: dict[str, Any] = {"$ref": f"#/{container}/{name}"}
        ref.update(draw(st.sampled_from([{}, {}, {"description": "r"}, {"type": "string"}])))
        return ref

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        if isinstance(out.get("properties"), dict):
            out["properties"] = {k: move(walk(v)) for k, v in out["properties"].items()}
        if "items" in out:
            out["items"] = move(walk(out["items"]))
        for combinator in ("anyOf", "allOf"):
            if isinstance(out.get(combinator), list):
                out[combinator] = [move(walk(b)) for b in out[combinator]]
        return out

    root = walk(schema)
    if isinstance(root, dict):
        if draw(st.booleans()):  # the whole schema behind a reference, as pydantic writes it
            defs.setdefault("Root", root)
            root = {"$ref": f"#/{container}/Root"}
        if defs:
            root = {**root, container: defs}
    return root


SCHEMAS = st.one_of(NESTED_SCHEMAS, _with_definitions())

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.0, 2.5, -0.0, 2**63])
    | st.sampled_from(["", "a", "b", "1", "x@y.z", "not a date"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from([*NAMES, "z"]), inner, max_size=4),
    max_leaves=10)


def _conforming(draw: Any, schema: Any, depth: int = 0, root: Any = None) -> Any:
    """A value built to satisfy ``schema`` when it is in the quick subset (else anything)."""
    root = schema if root is None else root
    schema = _resolved(schema, root)
    if schema is True or not isinstance(schema, dict) or depth > 6:
        return draw(VALUES)
    if "anyOf" in schema:
        return _conforming(draw, draw(st.sampled_from(schema["anyOf"])), depth + 1, root)
    if "allOf" in schema:  # the first branch's (the others may refuse it: jsonschema says)
        return _conforming(draw, schema["allOf"][0], depth + 1, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        strings = [e for e in schema["enum"] if isinstance(e, str)]
        wanted = schema.get("type", "string")
        return draw(st.sampled_from(strings)) if strings and "string" in wanted else None
    kind = schema.get("type", "null")
    kind = draw(st.sampled_from(kind)) if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties", {})
        names = set(schema.get("required", [])) | set(draw(st.sets(st.sampled_from(
            sorted(props) or ["z"]))))
        value = {n: _conforming(draw, props.get(n, True), depth + 1, root) for n in names}
        if not schema.get("additionalProperties", True):
            value = {k: v for k, v in value.items() if k in props}
        return value
    if kind == "array":
        low = schema.get("minItems", 0)
        high = max(low, schema.get("maxItems", 3))
        return [_conforming(draw, schema.get("items", True), depth + 1, root)
                for _ in range(draw(st.integers(low, high)))]
    if kind == "string":
        low = max(schema.get("minLength", 0), 1 if "pattern" in schema else 0)
        text = "a" * draw(st.integers(low, max(low, schema.get("maxLength", 3))))
        return text[:-1] + "b" if schema.get("pattern") == "b$" else text
    if kind in ("integer", "number"):
        return draw(st.sampled_from([-1, 0, 1, 2, 3]) if kind == "integer"
                    else st.sampled_from([-1, 0, 0.5, 1, 2, 2.5, 3]))
    return {"boolean": False, "null": None}[kind]


def _resolved(schema: Any, root: Any) -> Any:
    """``schema``, or what its ``$ref`` names in ``root``'s definitions."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and isinstance(
            root, dict):
        _, container, name = schema["$ref"].split("/")
        schema = root.get(container, {}).get(name, True)
    return schema


def _non_string_enum(schema: Any, root: Any = None) -> bool:
    """Whether some (sub)schema has an enum with a member that is not a string (the quick
    check reads only an enum's strings)."""
    root = schema if root is None else root
    schema = _resolved(schema, root)
    if not isinstance(schema, dict):
        return False
    if "enum" in schema and not ("string" in schema.get("type", "string") and all(
            isinstance(e, str) for e in schema["enum"])):
        return True  # (a value equal to a member of another type is valid, and not sure)
    subs = [*schema.get("properties", {}).values(), schema.get("items", True),
            *schema.get("anyOf", []), *schema.get("allOf", [])]
    return any(_non_string_enum(sub, root) for sub in subs)


def _conform(schema: Any) -> st.SearchStrategy[Any]:
    return st.composite(lambda draw: _conforming(draw, schema))()


def _compiled(schema: Any, draft: str | None, limits: SchemaLimits | None = None
              ) -> tuple[SchemaCheck, SchemaCheck]:
    """The cache's check (with its quick plan) and the same validator without one."""
    if draft is not None and isinstance(schema, dict):
        schema = {**schema, "$schema": draft}
    check = ValidatorCache(limits=limits).get(schema)
    assume(check.validator is not None)  # a schema the draft refuses: no verdict to compare
    slow = SchemaCheck(check.validator, None, check.patterns, check.max_steps, None)
    return check, slow


@settings(max_examples=600, deadline=None)
@given(schema=SCHEMAS, draft=st.sampled_from(DRAFTS), data=st.data())
def test_sure_only_where_jsonschema_finds_the_value_valid(schema: Any, draft: str | None,
                                                          data: Any) -> None:
    """Soundness: over generated schemas and values, the quick check says "surely valid" only for
    values jsonschema finds valid, and the combined check's errors are always jsonschema's."""
    check, slow = _compiled(schema, draft)
    for value in (data.draw(VALUES), data.draw(_conform(schema))):
        # the arguments the latch validates are what strict JSON parsing gives
        value = orjson.loads(orjson.dumps(value))
        if check.quick is not None and check.quick.sure(value, check.max_steps):
            assert slow.errors(value) is None
        assert check.errors(value) == slow.errors(value)


@settings(max_examples=300, deadline=None)
@given(schema=SCHEMAS, draft=st.sampled_from(DRAFTS), max_steps=st.integers(1, 12),
       data=st.data())
def test_never_sure_beyond_the_step_budget(schema: Any, draft: str | None, max_steps: int,
                                           data: Any) -> None:
    """With a budget small enough to run out, the verdicts (an over-budget one included)
    are jsonschema's."""
    check, slow = _compiled(schema, draft, SchemaLimits(max_steps=max_steps))
    value = orjson.loads(orjson.dumps(data.draw(_conform(schema))))
    assert check.errors(value) == slow.errors(value)


@settings(max_examples=300, deadline=None)
@given(schema=SCHEMAS, draft=st.sampled_from(DRAFTS), data=st.data())
def test_a_conforming_value_of_a_subset_schema_is_surely_valid(
        schema: Any, draft: str | None, data: Any) -> None:
    """Completeness on the subset: a value built to conform to a schema the quick check plans
    (no non-string enum) is found surely valid, within the step budget."""
    check, slow = _compiled(schema, draft)
    plain = {k: v for k, v in schema.items() if k != "$schema"} \
        if isinstance(schema, dict) else schema
    assume(check.quick is not None and not _non_string_enum(plain))
    value = orjson.loads(orjson.dumps(data.draw(_conform(schema))))
    assume(slow.errors(value) is None)  # e.g. an enum of no strings: nothing conforms
    assert check.quick is not None and check.quick.sure(value, check.max_steps)


def test_the_subset_and_outside_it() -> None:
    """Which schemas ``quickcheck.plan`` covers: closed objects, required, enum and shared local
    ``$ref`` are planned; patterns, cycles, remote or odd refs and over-deep nesting are not."""
    tags = {"type": "array", "items": {"type": "string"}}
    tool = {"type": "object", "properties": {"path": {"type": "string"},
                                             "mode": {"enum": ["w", "a"]}, "tags": tags},
            "required": ["path"], "additionalProperties": False, "description": "Write."}
    node = quickcheck.plan(tool)
    assert node is not None
    assert node.sure({"path": "/tmp/a", "mode": "w", "tags": ["x"]}, 100)
    assert not node.sure({"path": "/tmp/a", "extra": 1}, 100)  # closed
    assert not node.sure({"mode": "w"}, 100)  # required
    assert not node.sure({"path": "/tmp/a", "mode": "x"}, 100)  # enum
    assert not node.sure({"path": "/tmp/a"}, 3)  # over the steps (the root alone takes 5)
    assert not quickcheck.plan({"type": "integer"}).sure(1.0, 10)  # type: ignore[union-attr]
    assert not quickcheck.plan({"type": "integer"}).sure(True, 10)  # type: ignore[union-attr]
    for outside in ({"pattern": "a"}, {"$ref": "#"}, {"additionalProperties": {}},
                    {"items": [{}]}, {"type": "float"}, {"properties": {"a": False}}, False,
                    {"required": "a"}, {"const": 1}, {"exclusiveMinimum": True},
                    {"minLength": 1.0}, {"maxItems": -1}, {"anyOf": []},
                    {"anyOf": [{"not": {}}]}):
        assert quickcheck.plan(outside) is None, outside
    shared = {"properties": {"a": {"$ref": "#/$defs/S"}, "b": {"$ref": "#/$defs/S"}},
              "$defs": {"S": {"type": "string"}}}
    assert quickcheck.plan(shared) is not None
    assert quickcheck.plan(shared).sure({"a": "x", "b": "y"}, 100)  # type: ignore[union-attr]
    for outside in ({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}},  # a cycle
                    {"$ref": "#/$defs/A", "$defs": {"A": {}}, "$id": "urn:x"},
                    {"$ref": "#/$defs/a~1b", "$defs": {"a/b": {}}},
                    {"$ref": "#/$defs/A/properties/x", "$defs": {"A": {}}},
                    {"$ref": "#/$defs/missing", "$defs": {}},
                    {"properties": {"a": {"$defs": {"X": {}}}}}):
        assert quickcheck.plan(outside) is None, outside
    deep: Any = {"type": "string"}
    for _ in range(quickcheck.MAX_PLAN_DEPTH + 1):
        deep = {"type": "array", "items": deep}
    assert quickcheck.plan(deep) is None


_REF_SIBLING = {"properties": {"a": {"$ref": "#/$defs/A", "type": "string"}},
                "$defs": {"A": {"type": "integer"}}}
EDGES = [({"pattern": "^a"}, "ba"), ({"pattern": "^a"}, 1), ({"pattern": "é"}, "xé"),
         ({"allOf": [{"type": "string"}, {"maxLength": 1}]}, "ab"),
         ({"allOf": [{"minimum": 1}, {"maximum": 3}]}, 4),
         ({"$ref": "#/$defs/A", "$defs": {"A": {"type": "array", "items": True}}}, []),
         ({"$ref": "#/$defs/A", "$defs": {"A": {"minimum": 1, "exclusiveMinimum": 0.5}}}, 1),
         (_REF_SIBLING, {"a": 1}), (_REF_SIBLING, {"a": "x"}),
         ({"$ref": "#/definitions/B", "definitions": {"B": {"maxItems": 1}}}, [1, 2]),
         ({"items": {"$ref": "#/$defs/C"}, "$defs": {"C": {"type": "string"}}}, ["x", 1]),
         ({"maxLength": 1}, "ab"), ({"maxItems": 1}, [1, 2]), ({"minItems": 1}, []),
         ({"minLength": 1}, ""), ({"exclusiveMinimum": 1}, 1), ({"maximum": 1}, 2),
         ({"minimum": 1}, True), ({"maximum": 1}, 1.0), ({"exclusiveMaximum": 1}, 1.0),
         ({"minimum": 2**63}, 2**63 - 1), ({"maxLength": 1}, "é"), ({"minLength": 2}, "😀"),
         ({"maxItems": 0}, {}), ({"const": "a"}, "a"), ({"anyOf": [{"type": "null"}]}, None),
         ({"type": "integer"}, 1.0), ({"type": "integer"}, True), ({"type": "number"}, False),
         ({"type": "integer"}, 2**63), ({"type": "number"}, -0.0), ({"type": "null"}, False),
         ({"enum": ["1"]}, 1), ({"enum": [1]}, 1.0), ({"enum": [True]}, 1),
         ({"type": "string", "format": "email"}, "not an email"),
         ({"type": "object", "additionalProperties": False}, {"a": 1}),
         ({"type": "object", "required": ["a"]}, {}), ({"items": {"type": "string"}}, [1])]


@given(draft=st.sampled_from(DRAFTS))
@settings(max_examples=30, deadline=None)
def test_edges_of_each_type_in_every_draft(draft: str | None) -> None:
    """The readings that differ between drafts or that JSON equality decides (an integral
    float, a boolean beside a number, an enum of another type, a format) get jsonschema's
    verdict in every draft."""
    for schema, value in EDGES:
        check, slow = _compiled(schema, draft)
        assert check.errors(value) == slow.errors(value), (schema, value)


NESTED = [{"anyOf": [{"anyOf": [{"type": "string"}, {"type": "string", "minLength": 1}]},
                     {"type": "integer"}]},
          {"anyOf": [{"type": "object", "properties": {"a": {"anyOf": [{"type": "string"},
                                                                       {"maxItems": 0}]}}},
                     {"type": "array", "items": {"anyOf": [{"type": "null"}, {}]}}]},
          {"type": "array", "items": {"anyOf": [{"type": "string", "maxLength": 1},
                                                {"type": "integer", "minimum": 0}]}}]
NESTED.append({"anyOf": [{"type": "object", "required": ["b"], "properties": {
    "a": {"type": "string", "minLength": 5, "description": "d"}}}, {"type": "object"}]})
NESTED.append({"anyOf": [{"type": "array", "minItems": 5, "items": {
    "type": "string", "minLength": 2}}, {"type": "array"}]})
NESTED_VALUES = [5, "", "ab", ["a", "b", "c"], {"a": [1]}, {"a": "x"}, {"a": "xy"},
                 [None, 1], [1, "a", -1], ["abc", 2]]


def test_every_step_budget_at_the_edge_of_nested_branches() -> None:
    """Each step budget from 1 to 40, on nested ``anyOf`` (where jsonschema checks each
    failing branch in full before the next): the verdict, over budget or not, is
    jsonschema's."""
    for schema in NESTED:
        for max_steps in range(1, 41):
            check = ValidatorCache(limits=SchemaLimits(max_steps=max_steps)).get(schema)
            assert check.quick is not None and check.validator is not None
            slow = SchemaCheck(check.validator, None, check.patterns, check.max_steps, None)
            for value in NESTED_VALUES:
                assert check.errors(value) == slow.errors(value), (schema, max_steps, value)


def test_a_schema_the_quick_check_cannot_read_is_left_to_jsonschema(monkeypatch: Any) -> None:
    """Should reading a schema ever raise, the tool still works: jsonschema decides alone."""
    def broken(*args: Any, **kwargs: Any) -> None:
        raise TypeError("a schema quickcheck cannot read")
    monkeypatch.setattr(quickcheck, "plan", broken)
    check = ValidatorCache().get({"type": "object", "required": ["a"]})
    assert check.validator is not None and check.quick is None
    assert check.errors({"a": 1}) is None
    assert check.errors({}) == "keyword 'required' failed at schema path /required"
