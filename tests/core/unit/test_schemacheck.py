"""Tool schemas are hostile input too (issue 9, items 1, 2, 10 and 11; ``worker.core.schemacheck``).

Each test is one line of this list (``tests/core/unit/test_assembler.py`` lists the rest):

* A ``$ref`` to ``http://`` or ``file://``: nothing is fetched or read (a server on 127.0.0.1
  records no hit), the tool's calls fail ``schema_invalid`` saying why, the run goes on.
* ``"pattern": "^(a+)+$"`` on 29 ``a`` and a ``!``: RE2, no backtracking, ``schema_invalid``
  (``pattern``) at once; a pattern RE2 cannot run (look-ahead, back-reference) makes the
  tool unusable with that reason.
* ``allOf``/``$ref`` fan-out 18 levels deep: refused when first called (more than
  ``max_schema_nodes`` subschemas for one value); a ``$ref`` cycle that never descends into
  the value: refused.
* A value that takes more than ``max_schema_validation_steps`` keyword applications fails
  ``schema_invalid``.
* ``uniqueItems`` over many objects: hashed, JSON Schema equality (``1 == 1.0``,
  ``true != 1``, key order irrelevant).
* A schema over ``max_tool_schema_bytes`` or ``max_schema_nodes``: the tool is unusable.
* A tool that is never called is never compiled; the schema text a run keeps counts in
  ``max_buffered_bytes``; a run whose schemas alone exceed it has every tool unusable.
* A ``$ref`` chain of 470 links, and a deep value under a recursive schema: the same outcome
  from a shallow and from a deep stack (no caught ``RecursionError`` decides anything).
"""

from __future__ import annotations

import http.server
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from builders import (
    CHAT,
    committed,
    errors,
    feed,
    finals,
    provider_run,
    run_start,
    tools_for,
)
from test_assembler import checked

from worker.core import Assembler, AssembleSettings
from worker.core import tools as tools_module
from worker.core.schemacheck import SchemaLimits, canonical
from worker.core.tools import ValidatorCache

OBJECT = {"type": "object"}


def make(**kw: Any) -> Assembler:
    """An assembler with ``kw`` settings and a cache of its own (nothing compiled yet)."""
    settings = AssembleSettings(**kw)
    limits = SchemaLimits(settings.max_schema_nodes, settings.max_schema_validation_steps)
    return Assembler(settings, ValidatorCache(limits=limits))


def outcome(schema: Any, args: str, **settings: Any) -> tuple[str, str]:
    """(state, content or call id) of one call of tool ``f`` with ``schema``, in a run that
    also calls a plain tool ``g``, which must commit whatever ``f`` does (the run goes on)."""
    emits = checked(feed(make(**settings), provider_run(
        CHAT, "r", {"f": schema, "g": OBJECT}, [("c1", "f", args), ("c2", "g", "{}")])))
    assert [c["call_id"] for c in committed(emits)][-1:] == ["c2"]
    for error in errors(emits):
        if error["tool_call_id"] == "c1":
            return error["reason"], error["content"]
    return "committed", "c1"


# -- no I/O from a schema ---------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that serves a schema and records every request."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/s.json", hits
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_http_ref_is_never_fetched(server: tuple[str, list[str]]) -> None:
    """A ``$ref`` to a URL on 127.0.0.1: the server gets no request, the call fails
    ``schema_invalid`` saying the reference is outside the tool's schema, the run goes on."""
    url, hits = server
    schema = {"type": "object", "properties": {"x": {"$ref": url}}}
    reason, content = outcome(schema, '{"x": 1}')
    assert hits == []
    assert reason == "schema_invalid"
    assert "'$ref' to something outside the tool's own schema" in content


def test_file_ref_is_never_read(tmp_path: Path) -> None:
    """A ``$ref`` to a ``file://`` URL whose file would refuse the value: the file is not read
    (its content decides nothing), the call fails ``schema_invalid`` for the reference."""
    target = tmp_path / "s.json"
    target.write_text('{"type": "string"}')
    schema = {"type": "object", "properties": {"x": {"$ref": target.as_uri()}}}
    assert outcome(schema, '{"x": "a string"}')[0] == "schema_invalid"
    assert "outside the tool's own schema" in outcome(schema, '{"x": 1}')[1]


def test_local_refs_resolve() -> None:
    """``#/$defs/...`` references within the schema, and to the root, work as before."""
    schema = {"type": "object", "$defs": {"s": {"type": "string"}},
              "properties": {"x": {"$ref": "#/$defs/s"}, "self": {"$ref": "#"}}}
    assert outcome(schema, '{"x": "a", "self": {"x": "b"}}') == ("committed", "c1")
    reason, content = outcome(schema, '{"self": {"x": 1}}')
    assert reason == "schema_invalid" and "keyword 'type'" in content


# -- bounded time ---------------------------------------------------------------------------


def test_catastrophic_pattern_is_linear() -> None:
    """``^(a+)+$`` against 29 ``a`` and ``!``: a plain mismatch (RE2 runs it in linear time;
    Python's ``re`` took 18 s)."""
    schema = {"type": "object", "properties": {"s": {"pattern": "^(a+)+$"}}}
    assert outcome(schema, orjson.dumps({"s": "a" * 29 + "!"}).decode()) == (
        "schema_invalid", "schema_invalid: keyword 'pattern' failed at schema path "
        "/properties/s/pattern")
    assert outcome(schema, '{"s": "aaaa"}') == ("committed", "c1")


@pytest.mark.parametrize("pattern", ["^(?=a)a$", r"^(a)\1$", "^a(?<=a)$"])
def test_pattern_re2_cannot_run_makes_the_tool_unusable(pattern: str) -> None:
    """Look-around and back-references (ECMA-262 has them, RE2 does not): the tool is
    unusable, whatever the value, with a reason that says so."""
    schema = {"type": "object", "properties": {"s": {"pattern": pattern}}}
    reason, content = outcome(schema, '{"s": "a"}')
    assert reason == "schema_invalid" and "a pattern RE2 cannot run" in content


def test_pattern_properties_use_re2() -> None:
    """``patternProperties`` and ``additionalProperties`` beside it match with RE2."""
    schema = {"type": "object", "patternProperties": {"^(x+)+$": {"type": "integer"}},
              "additionalProperties": False}
    assert outcome(schema, '{"xxx": 1}') == ("committed", "c1")
    assert outcome(schema, '{"xxx": "a"}')[0] == "schema_invalid"
    extra = '{"x": 1, "xxxxxxxxxxxxxxxxxxxxxxxxxx!": 1}'
    assert "additionalProperties" in outcome(schema, extra)[1]


def fan_out(levels: int) -> dict[str, Any]:
    """Each level is ``allOf`` of two references to the next: 2**levels subschemas for one
    value."""
    defs = {f"l{n}": {"allOf": [{"$ref": f"#/$defs/l{n + 1}"}, {"$ref": f"#/$defs/l{n + 1}"}]}
            for n in range(levels)}
    defs[f"l{levels}"] = {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


def test_ref_fan_out_is_refused() -> None:
    """18 levels of ``allOf``/``$ref`` fan-out (2**18 subschemas for one value, 7 s before):
    the tool is unusable; 8 levels (256) are fine."""
    reason, content = outcome(fan_out(18), "{}")
    assert reason == "schema_invalid" and "more than 2000 subschemas" in content
    assert outcome(fan_out(8), "{}") == ("committed", "c1")


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
     "$ref": "#/$defs/a"},
])
def test_same_value_reference_cycle_is_refused(schema: dict[str, Any]) -> None:
    """A reference cycle that never descends into the value would recurse forever: the tool
    is unusable."""
    reason, content = outcome(schema, "{}")
    assert reason == "schema_invalid" and "reference cycle" in content


def test_validation_steps_are_bounded() -> None:
    """A value that needs more keyword applications than ``max_schema_validation_steps``
    fails ``schema_invalid`` naming the bound; under it, the same schema commits."""
    schema = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
    args = orjson.dumps({f"k{n}": n for n in range(100)}).decode()
    reason, content = outcome(schema, args, max_schema_validation_steps=150)
    assert reason == "schema_invalid" and "more than 150 validation steps" in content
    assert outcome(schema, args, max_schema_validation_steps=400) == ("committed", "c1")


def test_unique_items_follows_json_schema_equality() -> None:
    """``uniqueItems`` hashes canonical forms: ``1`` and ``1.0`` are equal, ``true`` and ``1``
    are not, objects are equal whatever their key order, arrays are ordered; 8,000 distinct
    objects are unique."""
    schema = {"type": "object", "properties": {"a": {"uniqueItems": True}}}
    for dup in ("[1, 1.0]", '[{"x": 1, "y": [2]}, {"y": [2.0], "x": 1}]', '[[1, 2], [1, 2]]'):
        assert outcome(schema, f'{{"a": {dup}}}')[0] == "schema_invalid", dup
    for unique in ("[1, true]", "[0, false]", "[[1, 2], [2, 1]]", '[null, "null", {}]'):
        assert outcome(schema, f'{{"a": {unique}}}') == ("committed", "c1"), unique
    many = orjson.dumps({"a": [{"i": n, "s": "x"} for n in range(8000)]}).decode()
    assert outcome(schema, many) == ("committed", "c1")
    assert canonical({"a": 1, "b": True}) == canonical({"b": True, "a": 1.0})


def test_oversize_and_overlarge_schemas_are_unusable() -> None:
    """A schema over ``max_tool_schema_bytes``, or with more JSON values than
    ``max_schema_nodes``: the tool is unusable, the run goes on."""
    big = {"type": "object", "description": "x" * 2000}
    reason, content = outcome(big, "{}", max_tool_schema_bytes=1000)
    assert reason == "schema_invalid" and "more than 1000 bytes" in content
    many = {"type": "object", "enum": [[n] for n in range(200)]}
    reason, content = outcome(many, "{}", max_schema_nodes=100)
    assert reason == "schema_invalid" and "more than 100 JSON values" in content


def test_nested_schema_or_id_is_refused() -> None:
    """``$schema`` or ``$id`` below the root would change the rules or the base of ``#``
    references under the checks: the tool is unusable."""
    for key, value in (("$schema", "http://json-schema.org/draft-07/schema#"),
                       ("$id", "http://example.invalid/other")):
        schema = {"type": "object", "properties": {"x": {key: value, "type": "string"}}}
        reason, content = outcome(schema, '{"x": "a"}')
        assert reason == "schema_invalid" and f"'{key}' below the root" in content


# -- memory and laziness -------------------------------------------------------------------------


def test_uncalled_tools_are_never_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run registering 50 tools and calling one compiles one schema."""
    compiled: list[Any] = []
    real = tools_module._compile

    def spy(schema: Any, *limits: Any) -> Any:
        compiled.append(schema)
        return real(schema, *limits)

    monkeypatch.setattr(tools_module, "_compile", spy)
    schemas = {f"t{n}": {"type": "object", "description": f"tool {n}"} for n in range(50)}
    emits = feed(make(), provider_run(CHAT, "r", schemas, [("c1", "t7", "{}")]))
    assert [c["call_id"] for c in committed(emits)] == ["c1"]
    assert compiled == [schemas["t7"]]


def test_schema_text_counts_in_the_byte_budget() -> None:
    """The schema text a run keeps is in ``buffered_bytes`` from its ``run.start`` to its end;
    when another run's schemas need the room, the least recently active run is ended."""
    schema = {"type": "object", "description": "d" * 500}
    size = len(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    asm = make(max_buffered_bytes=size * 2 + 10)
    feed(asm, [run_start("a", CHAT, tools_for(CHAT, {"f": schema}))])
    assert asm.buffered_bytes == size
    feed(asm, [run_start("b", CHAT, tools_for(CHAT, {"f": schema}))])
    emits = feed(asm, [run_start("c", CHAT, tools_for(CHAT, {"f": schema}))])
    assert [(f["run_id"], f["status"]) for f in finals(emits)] == [("a", "failed")]
    assert asm.buffered_bytes == 2 * size


def test_run_whose_schemas_exceed_the_budget_has_no_usable_tool() -> None:
    """A ``run.start`` whose schemas alone exceed ``max_buffered_bytes``: nothing is kept,
    nobody is ended, and its calls fail ``schema_invalid`` saying why."""
    schema = {"type": "object", "description": "d" * 500}
    emits = checked(feed(make(max_buffered_bytes=300), provider_run(
        CHAT, "r", {"f": schema}, [("c1", "f", "{}")])))
    [error] = errors(emits)
    assert "tool schemas exceed the worker's byte budget (300 bytes)" in error["content"]


# -- the same outcome at any stack depth -------------------------------------------------------


def ref_chain(links: int) -> dict[str, Any]:
    defs = {f"d{n}": {"$ref": f"#/$defs/d{n + 1}"} for n in range(links)}
    defs[f"d{links}"] = {"type": "object"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


RECURSIVE = {"$defs": {"n": {"type": "object", "additionalProperties": {"$ref": "#/$defs/n"}}},
             "$ref": "#/$defs/n"}


def nested_args(depth: int) -> str:
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


def at_depth(frames_left: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` called with only about ``frames_left`` frames left below the recursion
    limit."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    def down(n: int) -> Any:
        return fn() if n <= 0 else down(n - 1)
    return down(sys.getrecursionlimit() - depth - frames_left)


@pytest.mark.parametrize("schema, args", [
    (ref_chain(470), "{}"),
    (ref_chain(60), "{}"),
    (RECURSIVE, nested_args(60)),
    (fan_out(8), nested_args(3)),
])
def test_outcome_is_the_same_at_any_stack_depth(schema: dict[str, Any], args: str) -> None:
    """A 470-link ``$ref`` chain (refused: longer than 64), a 60-link one and a value 60 levels
    deep under a recursive schema (both commit): the same outcome from a shallow stack and
    from one with 150 frames left (a caught ``RecursionError`` decided it before)."""
    shallow = outcome(schema, args)
    deep = at_depth(150, lambda: outcome(schema, args))
    assert shallow == deep
    assert shallow[0] == ("schema_invalid" if schema is not None and "d470" in str(schema)
                          else "committed")
