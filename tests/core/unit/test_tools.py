"""``worker.core.tools``: which tools a run may call, and their compiled schemas.

Only *client* tools, read in each provider's own format, become committed calls; server
tools and built-ins never register (rule 6). A broken schema makes its calls fail
``schema_invalid`` rather than run unchecked or crash the worker, and each distinct schema is
compiled once.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from builders import (
    ANTHROPIC,
    CHAT,
    PATH_SCHEMA,
    PROVIDERS,
    RESPONSES,
    anthropic_tool,
    chat_tool,
    committed,
    errors,
    feed,
    provider_calls,
    provider_run,
    reasons,
    responses_tool,
    run_envelopes,
    tools_for,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import validators as js_validators

from worker.core import Assembler, AssembleSettings
from worker.core import tools as tools_module
from worker.core.tools import SchemaCheck, ValidatorCache, client_tools

SECRET = "hunter2-SECRET"

# -- registration per provider format ---------------------------------------------------------

ANTHROPIC_SERVER_TOOLS = [
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    {"type": "web_fetch_20250910", "name": "web_fetch"},
    {"type": "code_execution_20250522", "name": "code_execution"},
]
RESPONSES_BUILTINS = [
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "image_generation"},
    {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.example"},
    {"type": "computer_use_preview", "display_width": 1024, "display_height": 768},
]


def test_chat_function_tools_register() -> None:
    """Chat ``{"type": "function", "function": {...}}`` tools register by name with their
    ``parameters``; a tool without ``type`` is read as a function too."""
    tools = [chat_tool("read_file", PATH_SCHEMA),
             {"function": {"name": "untyped", "parameters": {"type": "object"}}}]
    assert client_tools(CHAT, tools) == {"read_file": PATH_SCHEMA,
                                         "untyped": {"type": "object"}}


def test_chat_ignores_other_shapes() -> None:
    """Chat entries that are not function tools (another type, no ``function``, the
    Responses or Anthropic shape, not an object) register nothing; a custom tool registers
    under ``custom:<name>`` (issue 33), one without a name nothing."""
    tools = [{"type": "custom", "custom": {"name": "grammar_tool"}},
             {"type": "custom", "custom": {"name": ""}}, {"type": "custom", "name": "flat"},
             {"type": "function", "name": "flat_responses_shape", "parameters": {}},
             anthropic_tool("anthropic_shape", PATH_SCHEMA), "read_file", None, 3]
    assert client_tools(CHAT, tools) == {"custom:grammar_tool": {}}


def test_anthropic_client_tools_register_server_tools_do_not() -> None:
    """Anthropic tools with no ``type`` or ``"type": "custom"`` register with their
    ``input_schema``; server tools such as ``web_search_20250305`` do not."""
    tools = [anthropic_tool("read_file", PATH_SCHEMA),
             {**anthropic_tool("custom_tool", {"type": "object"}), "type": "custom"},
             *ANTHROPIC_SERVER_TOOLS]
    assert client_tools(ANTHROPIC, tools) == {"read_file": PATH_SCHEMA,
                                              "custom_tool": {"type": "object"}}


def test_anthropic_defined_client_tools_register_with_the_empty_schema() -> None:
    """Anthropic-defined tools that the client runs (``bash_20250124``, the text editor,
    computer use, memory) carry a dated ``type`` but no ``input_schema``: they register with
    the empty schema, so their ``tool_use`` calls can commit; server tools still do not."""
    tools = [{"type": "bash_20250124", "name": "bash"},
             {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
             {"type": "computer_20250124", "name": "computer", "display_width_px": 1024},
             {"type": "memory_20250818", "name": "memory"}, *ANTHROPIC_SERVER_TOOLS,
             {"type": "mcp_toolset", "name": "mcp"}]
    assert client_tools(ANTHROPIC, tools) == {
        "bash": {}, "str_replace_based_edit_tool": {}, "computer": {}, "memory": {}}


def test_responses_function_tools_register_builtins_do_not() -> None:
    """Responses ``{"type": "function", "name": ...}`` tools register under their name;
    built-ins such as ``{"type": "web_search"}``, file search and code interpreter do not. The
    tools whose items a client answers (computer use, an MCP server's approval requests)
    register under a key of their kind, never a bare name (decision 0004)."""
    tools = [responses_tool("read_file", PATH_SCHEMA), *RESPONSES_BUILTINS]
    assert client_tools(RESPONSES, tools) == {
        "read_file": PATH_SCHEMA, "computer_call:": {}, "mcp_approval_request:deepwiki": {}}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_missing_or_null_schema_is_the_empty_schema(provider: str) -> None:
    """A tool without a parameter schema (or with ``null``) registers with ``{}``."""
    make = {CHAT: chat_tool, ANTHROPIC: anthropic_tool, RESPONSES: responses_tool}[provider]
    tool = make("free")
    found = client_tools(provider, [tool])
    assert found == {"free": {}}
    key = {CHAT: "parameters", ANTHROPIC: "input_schema", RESPONSES: "parameters"}[provider]
    holder = tool["function"] if provider == CHAT else tool
    holder[key] = None
    assert client_tools(provider, [tool]) == {"free": {}}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_nameless_tools_and_first_name_wins(provider: str) -> None:
    """A tool without a non-empty string name is ignored; of two tools with one name the
    first registers."""
    make = {CHAT: chat_tool, ANTHROPIC: anthropic_tool, RESPONSES: responses_tool}[provider]
    tools = [make("", PATH_SCHEMA), make("dup", PATH_SCHEMA), make("dup", {"type": "array"})]
    assert client_tools(provider, tools) == {"dup": PATH_SCHEMA}


@pytest.mark.parametrize("tools", [None, {}, "tools", 5])
def test_tools_that_are_not_a_list(tools: Any) -> None:
    """A ``tools`` value that is not a list registers nothing and does not raise."""
    assert client_tools(CHAT, tools) == {}


# -- registration seen through the assembler ---------------------------------------------------


def test_anthropic_call_to_a_server_tool_name_is_unknown() -> None:
    """A ``tool_use`` block (a client call) naming a server tool from the run's list fails
    ``unknown_tool``: server tools are not the runner's to execute."""
    tools = [*ANTHROPIC_SERVER_TOOLS, anthropic_tool("read_file", PATH_SCHEMA)]
    envs = run_envelopes("r1", ANTHROPIC, tools, provider_calls(
        ANTHROPIC, [("toolu_1", "web_search", '{"query": "x"}'),
                    ("toolu_2", "read_file", '{"path": "/a"}')]))
    emits = feed(Assembler(), envs)
    assert [(e["tool_call_id"], e["reason"]) for e in errors(emits)] == [
        ("toolu_1", "unknown_tool")]
    assert [c["call_id"] for c in committed(emits)] == ["toolu_2"]


def test_responses_call_to_a_builtin_name_is_unknown() -> None:
    """A ``function_call`` named like a built-in tool (``web_search``) fails
    ``unknown_tool``."""
    tools = [*RESPONSES_BUILTINS, responses_tool("read_file", PATH_SCHEMA)]
    envs = run_envelopes("r1", RESPONSES, tools, provider_calls(
        RESPONSES, [("call_1", "web_search", '{"query": "x"}')]))
    assert reasons(feed(Assembler(), envs)) == ["unknown_tool"]


def test_tools_are_read_in_the_runs_own_provider_format() -> None:
    """A chat-format tool list on an Anthropic run registers nothing: the format is the
    provider's, never guessed."""
    envs = run_envelopes("r1", ANTHROPIC, [chat_tool("read_file", PATH_SCHEMA)],
                         provider_calls(ANTHROPIC, [("toolu_1", "read_file", '{"path": "/a"}')]))
    assert reasons(feed(Assembler(), envs)) == ["unknown_tool"]


# -- broken schemas ---------------------------------------------------------------------------

BROKEN_SCHEMAS = {
    "unknown_type": {"type": "objectt"},
    "bad_regex": {"type": "object", "properties": {"p": {"type": "string", "pattern": "("}}},
    "required_not_array": {"type": "object", "required": "path"},
    "not_an_object": "object",
    "number": 5,
    "dangling_ref": {"$ref": "#/$defs/missing"},
    "remote_ref": {"$ref": "https://example.invalid/schema.json"},
    "self_ref": {"$ref": "#"},
    "nested_dangling_ref": {"type": "object", "properties": {"p": {"$ref": "#/$defs/nope"}}},
}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("schema", list(BROKEN_SCHEMAS.values()), ids=list(BROKEN_SCHEMAS))
def test_broken_schema_fails_its_calls(provider: str, schema: Any) -> None:
    """A tool whose schema is not a usable JSON Schema is registered with a broken check:
    its calls fail ``schema_invalid`` (never committed unchecked, never a crash, even when
    the schema only breaks at validation time, like an unresolvable ``$ref``)."""
    text = '{"p": "@"}'.replace("@", SECRET)
    envs = provider_run(provider, "r1", {"t": schema}, [("call_1", "t", text)])
    emits = feed(Assembler(), envs)
    assert committed(emits) == []
    [error] = errors(emits)
    assert error["reason"] == "schema_invalid"
    assert SECRET not in error["content"]


def test_boolean_schemas() -> None:
    """``true`` accepts any object, ``false`` refuses every value."""
    cache = ValidatorCache()
    assert cache.get(True).errors({"a": 1}) is None
    assert cache.get(False).errors({}) is not None


def test_declared_draft_is_honoured() -> None:
    """A schema that declares draft-07 is validated by draft-07 rules (its
    ``dependencies`` keyword applies)."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "dependencies": {"a": ["b"]}}
    check = ValidatorCache().get(schema)
    assert check.errors({"a": 1, "b": 2}) is None
    assert check.errors({"a": 1}) is not None


# -- error descriptions -----------------------------------------------------------------------


@pytest.mark.parametrize("value, keyword, path", [
    ({"path": 5}, "type", "/properties/path/type"),
    ({}, "required", "/required"),
    ({"path": "/a", SECRET: SECRET}, "additionalProperties", "/additionalProperties"),
])
def test_errors_name_keyword_and_schema_path_only(value: Any, keyword: str,
                                                  path: str) -> None:
    """``SchemaCheck.errors`` names the failing keyword and its schema path, and never the
    value (jsonschema's own message quotes it)."""
    problem = ValidatorCache().get(PATH_SCHEMA).errors(value)
    assert problem == f"keyword '{keyword}' failed at schema path {path}"


def test_errors_never_quote_values_for_value_keywords() -> None:
    """Keywords whose jsonschema messages quote the instance (``const``, ``enum``,
    ``pattern``, ``maxLength``, ``not``) still give no value."""
    schema = {"type": "object", "properties": {
        "c": {"const": "x"}, "e": {"enum": ["x"]}, "p": {"pattern": "^x$"},
        "m": {"maxLength": 1}, "n": {"not": {"type": "string"}}}}
    check = ValidatorCache().get(schema)
    for key in ("c", "e", "p", "m", "n"):
        problem = check.errors({key: SECRET})
        assert problem is not None and SECRET not in problem, key


def test_valid_value_has_no_errors() -> None:
    """A conforming value gives None."""
    assert ValidatorCache().get(PATH_SCHEMA).errors({"path": "/a"}) is None


# -- the validator cache ----------------------------------------------------------------------


def test_cache_returns_the_same_check_for_equal_schemas() -> None:
    """Equal schemas (different objects, different key order) share one compiled check;
    a different schema gets another."""
    cache = ValidatorCache()
    first = cache.get(PATH_SCHEMA)
    reordered = dict(reversed(list(copy.deepcopy(PATH_SCHEMA).items())))
    assert cache.get(copy.deepcopy(PATH_SCHEMA)) is first
    assert cache.get(reordered) is first
    assert cache.get({"type": "object"}) is not first


def test_cache_compiles_once_per_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """However many runs use a schema, it is compiled once per cache; assemblers not given
    a cache share the process's, so a second one compiles nothing."""
    compiled: list[Any] = []
    real = tools_module._compile

    def spy(schema: Any, *limits: Any) -> SchemaCheck:
        compiled.append(schema)
        return real(schema, *limits)

    monkeypatch.setattr(tools_module, "_compile", spy)
    asm = Assembler(AssembleSettings(), ValidatorCache())
    for n in range(5):
        feed(asm, provider_run(PROVIDERS[n % 3], f"r{n}", {"read_file": PATH_SCHEMA},
                               [("c1", "read_file", '{"path": "/a"}')]))
    assert compiled == [PATH_SCHEMA]
    compiled.clear()
    schema = {**PATH_SCHEMA, "description": "only in this test"}
    for _ in range(2):  # two assemblers, as two partitions of one worker
        feed(Assembler(AssembleSettings()), provider_run(
            CHAT, "r1", {"read_file": schema}, [("c1", "read_file", '{"path": "/a"}')]))
    assert compiled == [schema]


def test_cache_is_bounded_and_recompiles_after_eviction() -> None:
    """With ``size=1`` the older schema is evicted, so getting it again compiles anew
    (a new object), while the most recent stays shared."""
    cache = ValidatorCache(size=1)
    a = cache.get({"type": "object"})
    b = cache.get({"type": "array"})
    assert cache.get({"type": "array"}) is b
    assert cache.get({"type": "object"}) is not a


def test_tools_for_builder_matches_registration() -> None:
    """The test builders' tool definitions register under every provider (a guard for the
    other tests in this folder)."""
    for provider in PROVIDERS:
        assert client_tools(provider, tools_for(provider, {"x": PATH_SCHEMA})) == {
            "x": PATH_SCHEMA}


# -- the quicker ``properties`` (tools._quick) --------------------------------------------------

_SIMPLE_TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]
_subschemas = st.one_of(
    st.sampled_from(_SIMPLE_TYPES).map(lambda t: {"type": t}),
    st.lists(st.sampled_from(_SIMPLE_TYPES), min_size=1, max_size=3, unique=True).map(
        lambda ts: {"type": ts}),
    st.sampled_from(_SIMPLE_TYPES).map(lambda t: {"type": t, "minLength": 2}),
    st.just({"enum": ["a", 1, None]}), st.just(True), st.just(False), st.just({}),
    st.just({"type": "array", "items": {"type": "integer"}}),
    st.just({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}),
)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False,
                                                               allow_infinity=False)
    | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["x", "a", "b", "c"]), inner, max_size=3),
    max_leaves=6)
_NAMES = ["a", "b", "c"]


@settings(max_examples=400, deadline=None)
@given(props=st.dictionaries(st.sampled_from(_NAMES), _subschemas, max_size=3),
       required=st.lists(st.sampled_from(_NAMES), max_size=3, unique=True),
       extra=st.sampled_from([None, False, {"type": "integer"}]),
       draft=st.sampled_from([None, "http://json-schema.org/draft-07/schema#",
                              "https://json-schema.org/draft/2019-09/schema"]),
       instance=st.one_of(_values, st.dictionaries(st.sampled_from([*_NAMES, "z"]), _values,
                                                   max_size=4)))
def test_quick_properties_decide_as_jsonschema(props: dict[str, Any], required: list[str],
                                               extra: Any, draft: str | None,
                                               instance: Any) -> None:
    """A call's arguments get the same verdict, and an invalid one the same description
    (keyword and schema path), from the extended validator as from jsonschema's own class,
    over schemas mixing type-only subschemas with others, in three drafts."""
    schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if extra is not None:
        schema["additionalProperties"] = extra
    if draft is not None:
        schema["$schema"] = draft
    quick = ValidatorCache().get(schema)
    # The cache compiles the schema's canonical text (keys sorted), which orders the keywords
    # and so the errors jsonschema finds first: the stock class gets the same text.
    canonical = orjson.loads(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    stock = SchemaCheck(js_validators.validator_for(schema)(canonical))
    assert quick.validator is not None and type(quick.validator) is not type(stock.validator)
    assert quick.errors(instance) == stock.errors(instance)


def test_output_schemas_are_read_from_mcp_entries_by_their_key() -> None:
    """``output_schemas``: the ``outputSchema`` of each MCP tools/list entry that has one, by
    the key the tool registers under, the first of two entries with one key, in any
    provider's format; entries in a provider's own format, and MCP entries without one, have
    none."""
    weather = {"name": "weather", "inputSchema": {}, "outputSchema": {"type": "object"}}
    tools = [weather, {"name": "weather", "inputSchema": {}, "outputSchema": {"type": "null"}},
             {"name": "plain", "inputSchema": {}},
             {"type": "function", "function": {"name": "chat", "parameters": {}},
              "outputSchema": {"type": "string"}}]
    for provider in ("openai.chat", "anthropic.messages", "google.gemini"):
        assert tools_module.output_schemas(provider, tools) == {"weather": {"type": "object"}}
    assert tools_module.output_schemas("openai.chat", None) == {}
