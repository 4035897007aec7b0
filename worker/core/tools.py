"""The tools a run may call, read from ``run.start`` in each provider's own format.

A gateway sends the model a tool list; the same list arrives on ``run.start``. Only a
*client* tool (one the runner executes) can become a committed call:

* ``openai.chat``: ``{"type": "function", "function": {"name", "parameters"}}``; a custom
  (free-form) tool ``{"type": "custom", "custom": {"name", "format"?}}`` registers as
  Responses' custom tools do, under ``custom:<name>``, its format not enforced.
* ``openai.responses``: ``{"type": "function", "name", "parameters"}``; built-in tools such
  as ``web_search`` run at OpenAI and are not registered. The tools whose items a client
  answers register under a key of their kind (see :func:`responses_tool_key`), never a bare
  name: ``{"type": "custom", "name", "format"?}`` as ``custom:<name>`` (the format, text or
  grammar, is not enforced), ``computer_use_preview`` / ``computer`` as ``computer_call:``,
  ``local_shell`` as ``local_shell_call:``, ``shell`` as ``shell_call:`` (not a ``shell``
  whose ``environment`` is a container: OpenAI runs that one, :func:`hosted_shell`),
  ``apply_patch`` as ``apply_patch_call:``, and ``{"type": "mcp", "server_label"}`` as
  ``mcp_approval_request:<server_label>``, all with the empty schema
  (``docs/decisions/0004-responses-client-items.md``).
* ``anthropic.messages``: ``{"name", "input_schema"}`` with no ``type`` or
  ``"type": "custom"``, and Anthropic-defined client tools with a dated ``type``
  (``bash_20250124``, ``text_editor_...``, ``computer_...``, ``memory_...``: the client
  runs them, with Anthropic's own input schema, so they register with the empty schema).
  Server tools (``web_search_...``, ``web_fetch_...``, ``code_execution_...``,
  ``tool_search_tool_...``) run at Anthropic and are not registered (contract rule 6);
  their blocks are ``server_tool_use``, never ``tool_use``, in any case.

* ``bedrock.converse``: the request's ``toolConfig.tools`` array: ``{"toolSpec": {"name",
  "inputSchema": {"json": schema}}}``; ``systemTool`` entries (and ``cachePoint`` markers)
  are not client tools.
* ``google.gemini``: the request's ``tools`` array of ``Tool`` objects; each
  ``functionDeclarations[]`` entry is a client tool, its schema ``parametersJsonSchema`` (plain
  JSON Schema) or ``parameters`` (Google's OpenAPI subset, converted by :func:`openapi_schema`);
  the built-in tools (``googleSearch``, ``codeExecution``, ``urlContext``...) run at Google.
  Both JSON spellings are read: camelCase, and the snake_case that the proto JSON mapping also
  accepts (``function_declarations``, ``parameters_json_schema``).

* Any provider: MCP ``tools/list`` entries (issue 25), ``{"name", "inputSchema",
  "outputSchema"?, "annotations"?}``, told apart by their ``inputSchema`` member (no provider
  format has one at the top of an entry). ``inputSchema`` is the tool's parameter schema, under
  the same bounds as any other; ``outputSchema`` (the tool's structured result's) is kept as
  the entry holds it, read by :func:`output_schemas`, and decides nothing here. The four hints
  of the annotations (``readOnlyHint``, ``destructiveHint``, ``idempotentHint``,
  ``openWorldHint``), when they are booleans, are attributes a policy sees
  (:func:`tool_attributes`); any other annotation (``title``) is not.

A missing ``parameters`` / ``input_schema`` registers the tool with the empty schema.
A run keeps each tool's schema as its canonical JSON text (:class:`ToolSchema`, counted in the
partition's memory budget); it is compiled only when a call of the tool is decided, once per
distinct schema text, shared by every run through a :class:`ValidatorCache`. A schema that is
not itself a valid JSON Schema, or that breaks a bound of ``worker.core.schemacheck`` (no
reference outside itself, bounded size and fan-out, RE2 patterns), registers the tool with a
*broken* validator, so its calls fail ``schema_invalid`` instead of running unchecked.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from jsonschema import exceptions as js_exceptions
from jsonschema import validators as js_validators

from worker.core import quickcheck, schemacheck
from worker.core.schemacheck import SchemaLimits


@dataclass(frozen=True, slots=True)
class SchemaCheck:
    """A compiled JSON Schema, or the reason it could not be compiled."""

    validator: Any | None
    broken: str | None = None
    #: Its RE2 patterns (``schemacheck.prepare``) and the steps one validation may take.
    patterns: dict[str, Any] = field(default_factory=dict)
    max_steps: int = schemacheck.DEFAULT_MAX_STEPS
    #: The schema read by ``worker.core.quickcheck`` (None: outside its subset): a value it
    #: finds surely valid skips jsonschema, which decides every other value.
    quick: quickcheck.Node | None = None

    def errors(self, value: Any) -> str | None:
        """Describe the first violation by keyword and schema path only, or return None.

        jsonschema's own ``message`` quotes the offending value, and argument values may be
        secrets, so it is never used.
        """
        if self.validator is None:
            return f"the tool's parameter schema is not usable ({self.broken})"
        if self.quick is not None and self.quick.sure(value, self.max_steps):
            return None
        budget = schemacheck.Budget(self.max_steps, self.patterns)
        try:
            error = schemacheck.run(budget, self._best_match, value)
        except schemacheck.OverBudget as exc:
            return f"the tool's parameter schema could not be applied to this value ({exc})"
        except RecursionError:  # never caught: a verdict must not depend on the stack
            raise
        except Exception as exc:  # a schema jsonschema cannot apply: a bad schema, not a crash
            return f"the tool's parameter schema could not be applied ({type(exc).__name__})"
        if error is None:
            return None
        path = "/" + "/".join(str(p) for p in error.schema_path)
        return f"keyword '{error.validator}' failed at schema path {path}"

    def _best_match(self, value: Any) -> Any:
        assert self.validator is not None  # errors() returned first otherwise
        return js_exceptions.best_match(self.validator.iter_errors(value))


class ToolSchema:
    """A run's tool schema, kept as its canonical JSON text and compiled only when a call of
    the tool is decided (most tools of most runs never are)."""

    __slots__ = ("_cache", "_check", "text")

    def __init__(self, cache: ValidatorCache, text: bytes | None, check: SchemaCheck | None
                 ) -> None:
        self._cache = cache
        #: The schema's JSON text, keys sorted; what the run's memory budget counts.
        self.text = text
        self._check = check

    def check(self) -> SchemaCheck:
        if self._check is None:
            self._check = self._cache.compiled(self.text or b"{}")
        return self._check


class ValidatorCache:
    """Compile each distinct schema once; keep the ``size`` most recently used, holding at
    most ``max_bytes`` of schema text in all."""

    def __init__(self, size: int = 1024, limits: SchemaLimits | None = None,
                 max_bytes: int = 16 * 1024 * 1024) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        self.limits = limits or SchemaLimits()
        self._checks: OrderedDict[bytes, SchemaCheck] = OrderedDict()
        #: One :class:`ToolSchema` per distinct schema text, shared by every run that
        #: registers it (most runs of a deployment register the same few tools), most
        #: recently used last; bounded like ``_checks``.
        self._texts: OrderedDict[bytes, ToolSchema] = OrderedDict()
        self._text_bytes = 0

    def get(self, schema: Any) -> SchemaCheck:
        """The compiled check for ``schema`` (any JSON value)."""
        return self.prepare(schema).check()

    def prepare(self, schema: Any, max_bytes: int | None = None) -> ToolSchema:
        """``schema`` as a :class:`ToolSchema`, not compiled yet; over ``max_bytes`` of JSON
        text it is unusable at once."""
        try:
            text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return ToolSchema(self, None, SchemaCheck(None, "not JSON"))
        if max_bytes is not None and len(text) > max_bytes:
            return ToolSchema(self, None, SchemaCheck(None, f"more than {max_bytes} bytes"))
        shared = self._texts.get(text)
        if shared is not None:
            self._texts.move_to_end(text)
            return shared
        # orjson's result keeps the whole buffer it was written into (4 KiB at least) for
        # as long as it lives, and an open run holds its tools' texts: keep an exact copy.
        exact = bytes(memoryview(text))
        tool = self._texts[exact] = ToolSchema(self, exact, None)
        self._text_bytes += len(exact)
        while len(self._texts) > self._size or (self._text_bytes > self._max_bytes
                                                and len(self._texts) > 1):
            self._text_bytes -= len(self._texts.popitem(last=False)[0])
        return tool

    def compiled(self, text: bytes) -> SchemaCheck:
        """The compiled check for the schema whose canonical JSON text is ``text``."""
        check = self._checks.get(text)
        if check is not None:
            self._checks.move_to_end(text)
            return check
        check = _compile(orjson.loads(text), self.limits)
        self._checks[text] = check
        self._bytes += len(text)
        while len(self._checks) > self._size or (self._bytes > self._max_bytes
                                                 and len(self._checks) > 1):
            self._bytes -= len(self._checks.popitem(last=False)[0])
        return check


#: The process's validators, shared by every assembler that is not given its own: a compiled
#: validator never changes, and the worker makes an assembler for each partition it is
#: assigned, again at every rebalance, all with the same tools.
SHARED_VALIDATORS = ValidatorCache()
_SHARED: dict[SchemaLimits, ValidatorCache] = {SHARED_VALIDATORS.limits: SHARED_VALIDATORS}


def shared_validators(limits: SchemaLimits) -> ValidatorCache:
    """The process's cache for schemas compiled within ``limits``."""
    cache = _SHARED.get(limits)
    if cache is None:
        cache = _SHARED[limits] = ValidatorCache(limits=limits)
    return cache


def _compile(schema: Any, limits: SchemaLimits | None = None) -> SchemaCheck:
    """Compile ``schema`` within ``limits`` (``worker.core.schemacheck``): its calls are then
    validated without I/O, in bounded time, the same at any stack depth."""
    limits = limits or SchemaLimits()
    if isinstance(schema, bool):
        return SchemaCheck(_bounded(js_validators.Draft202012Validator)(schema),
                           quick=quickcheck.plan(schema))
    if not isinstance(schema, dict):
        return SchemaCheck(None, "not an object")
    try:  # validator_for hashes "$schema": a list there raises TypeError
        cls = js_validators.validator_for(schema, default=js_validators.Draft202012Validator)
    except TypeError:
        return SchemaCheck(None, "keyword '$schema'")
    if cls is js_validators.Draft3Validator:
        return SchemaCheck(None, "draft 3 schemas are not supported")
    # Without its "$schema", a reference back to the root keeps the bounded class (jsonschema
    # would switch to its stock class for the declared draft).
    schema = {k: v for k, v in schema.items() if k != "$schema"}
    budget = schemacheck.Budget(limits.max_steps, {})
    try:
        # The bounds first: they are cheap, and they bound what jsonschema's own check of the
        # schema against its metaschema costs (about 20 keyword applications per JSON value).
        patterns = schemacheck.run(budget, lambda s: schemacheck.prepare(s, cls, limits), schema)
        schemacheck.run(budget, _check_schema(cls), schema)
        validator = _bounded(cls)(schema, registry=schemacheck.refusing_registry())
    except js_exceptions.SchemaError as exc:
        return SchemaCheck(None, f"keyword '{exc.validator}'")
    except schemacheck.SchemaRefused as exc:
        return SchemaCheck(None, str(exc))
    try:
        quick = quickcheck.plan(schema, cls is js_validators.Draft4Validator, patterns)
    except Exception:  # not expected (tests/core/property/test_quickcheck.py); a schema is
        quick = None  # input, so jsonschema alone decides rather than the worker stopping
    return SchemaCheck(validator, None, patterns, limits.max_steps, quick)


def _check_schema(cls: type[Any]) -> Any:
    """``cls.check_schema`` without format checks: the ``regex`` format would compile each
    pattern with Python's ``re``; the patterns are RE2's (``schemacheck.prepare``)."""
    return lambda schema: cls.check_schema(schema, format_checker=None)


def _bounded(cls: type[Any]) -> type[Any]:
    """``cls`` with the quicker ``properties`` (below), then every keyword bounded."""
    bounded = _BOUNDED.get(cls)
    if bounded is None:
        bounded = _BOUNDED[cls] = schemacheck.bounded_class(_quick(cls))
    return bounded


_BOUNDED: dict[type[Any], type[Any]] = {}


# -- a quicker ``properties`` ------------------------------------------------------------------
#
# jsonschema checks each property against its subschema through ``descend``, which builds a
# new validator object for it: most of the time a call's arguments take to validate, for the
# commonest subschema of all, ``{"type": "string"}`` and the like. The validator classes used
# here are jsonschema's own, extended (``jsonschema.validators.extend``, its API for this) with
# a ``properties`` that first asks the class's own ``type`` keyword about a property whose
# subschema is nothing but a ``type``, and skips ``descend`` when that passes. Anything else,
# and every property that fails, goes through jsonschema's ``properties`` itself, so the
# verdicts and the errors are jsonschema's (``tests/core/unit/test_tools.py`` compares them).

_QUICK: dict[type[Any], type[Any]] = {}


def _quick(cls: type[Any]) -> type[Any]:
    """``cls`` with the quicker ``properties``, when it has the keywords it needs."""
    quick = _QUICK.get(cls)
    if quick is None:
        stock, type_keyword = cls.VALIDATORS.get("properties"), cls.VALIDATORS.get("type")
        quick = cls
        if stock is not None and type_keyword is not None:
            quick = js_validators.extend(cls, {"properties": _properties(stock, type_keyword)})
        _QUICK[cls] = quick
    return quick


def _properties(stock: Any, type_keyword: Any) -> Any:
    def properties(validator: Any, properties: Any, instance: Any, schema: Any) -> Any:
        if not validator.is_type(instance, "object"):
            return
        for name, subschema in properties.items():
            if name not in instance:
                continue
            if (type(subschema) is dict and len(subschema) == 1 and "type" in subschema
                    and next(type_keyword(validator, subschema["type"], instance[name],
                                          subschema), None) is None):
                continue  # the subschema is only a type, and the value has it
            yield from stock(validator, {name: subschema}, instance, schema)
    return properties


#: Type prefixes of the tools Anthropic runs itself.
ANTHROPIC_SERVER_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_",
                          "mcp_")


def client_tools(provider: str, tools: Any) -> dict[str, Any]:
    """Map each client tool's name to its parameter schema; ignore anything else. Of two
    entries with one key the first is here; the latch refuses the calls of both
    (``worker/core/identity.py``, ``ambiguous_tool``)."""
    found: dict[str, Any] = {}
    for key, schema, _ in client_entries(provider, tools):
        if key not in found:
            # interned: a call of the tool keeps its name as this one string (Assembler._open)
            found[sys.intern(key)] = schema
    return found


def client_entries(provider: str, tools: Any) -> Iterator[tuple[str, Any, Mapping[str, Any]]]:
    """Each client tool of ``tools`` in order, repeats included: the key it registers under,
    its parameter schema, and the entry that declared it."""
    if not isinstance(tools, list):
        return
    if provider == "google.gemini":
        tools = _gemini_declarations(tools)
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        entry = _mcp_tool(tool) if MCP_INPUT_SCHEMA in tool else _client_tool(provider, tool)
        if entry is not None:
            yield entry[0], entry[1], tool


def _client_tool(provider: str, tool: Mapping[str, Any]) -> tuple[str, Any] | None:
    if provider == "bedrock.converse":
        spec = tool.get("toolSpec")
        if not isinstance(spec, Mapping):
            return None
        holder = spec.get("inputSchema")
        name = spec.get("name")
        schema = holder.get("json", {}) if isinstance(holder, Mapping) else {}
    elif provider == "openai.chat":
        if tool.get("type") == "custom":  # free-form input, as Responses' custom tools
            custom = tool.get("custom")
            name = custom.get("name") if isinstance(custom, Mapping) else None
            if not isinstance(name, str) or not name:
                return None
            return responses_tool_key("custom", name), {}
        fn = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(fn, Mapping):
            return None
        name, schema = fn.get("name"), fn.get("parameters", {})
    elif provider == "openai.responses":
        kind = tool.get("type")
        if kind != "function":
            key = _responses_other_tool(kind, tool)
            return None if key is None else (key, {})
        name, schema = tool.get("name"), tool.get("parameters", {})
    elif provider == "google.gemini":
        name = tool.get("name")
        schema = _first(tool, "parametersJsonSchema", "parameters_json_schema")
        if schema is None:
            parameters = tool.get("parameters")
            schema = {} if parameters is None else openapi_schema(parameters)
    else:
        kind = tool.get("type", "custom")
        if not isinstance(kind, str) or kind.startswith(ANTHROPIC_SERVER_TOOLS):
            return None
        name, schema = tool.get("name"), tool.get("input_schema", {})
    if not isinstance(name, str) or not name:
        return None
    return name, ({} if schema is None else schema)


# -- MCP ---------------------------------------------------------------------------------------

#: The member that makes a ``tools`` entry an MCP ``tools/list`` entry.
MCP_INPUT_SCHEMA = "inputSchema"
#: The member of an MCP ``tools/list`` entry that describes the tool's structured result.
MCP_OUTPUT_SCHEMA = "outputSchema"
#: The member of an MCP ``tools/list`` entry that holds its annotations (``ToolAnnotations``).
MCP_ANNOTATIONS = "annotations"
#: The MCP tool annotations a policy sees, as attributes of the tool (``ToolAnnotations``).
MCP_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def _mcp_tool(tool: Mapping[str, Any]) -> tuple[str, Any] | None:
    name, schema = tool.get("name"), tool.get(MCP_INPUT_SCHEMA)
    if not isinstance(name, str) or not name:
        return None
    return name, ({} if schema is None else schema)


def output_schemas(provider: str, tools: Any) -> dict[str, Any]:
    """The ``outputSchema`` of each MCP entry of ``tools`` that states one, as it holds it, by
    the key the tool registers under (:func:`client_tools`: the first entry of a key)."""
    found: dict[str, Any] = {}
    for key, _, entry in client_entries(provider, tools):
        schema = entry.get(MCP_OUTPUT_SCHEMA) if MCP_INPUT_SCHEMA in entry else None
        if key not in found and schema is not None:
            found[key] = schema
    return found


def tool_attributes(tools: Any, registered: Mapping[str, Any] | None = None,
                    toolset: tuple[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """The attributes a policy sees of each MCP tool of ``tools`` (``run.start``'s, in any
    provider's format): ``{"annotations": {hint: bool}}`` with the hints of :data:`MCP_HINTS`
    that the entry states as booleans. Tools in a provider's own format have none (a policy sees
    an empty ``annotations``). For a run that named a registry ``toolset`` (name, version),
    each of its ``registered`` tools also has ``toolset``, the toolset's name."""
    found = _mcp_attributes(tools)
    if toolset is None or registered is None:
        return found
    name = toolset[0]
    return {key: {**found.get(key, {"annotations": {}}), "toolset": name} for key in registered}


def _mcp_attributes(tools: Any) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    if not isinstance(tools, list):
        return found
    for tool in tools:
        if not isinstance(tool, Mapping) or MCP_INPUT_SCHEMA not in tool:
            continue
        name, annotations = tool.get("name"), tool.get("annotations")
        if not isinstance(name, str) or not name or name in found:
            continue
        hints = ({hint: annotations[hint] for hint in MCP_HINTS
                  if type(annotations.get(hint)) is bool}
                 if isinstance(annotations, Mapping) else {})
        found[sys.intern(name)] = {"annotations": hints}
    return found


# -- Gemini ------------------------------------------------------------------------------------


def _first(mapping: Mapping[str, Any], *names: str) -> Any:
    """The value of the first of ``names`` that ``mapping`` holds (not None), else None."""
    for name in names:
        if mapping.get(name) is not None:
            return mapping[name]
    return None


def _gemini_declarations(tools: list[Any]) -> list[Any]:
    """The function declarations of a Gemini ``tools`` array, in order."""
    found: list[Any] = []
    for tool in tools:
        if isinstance(tool, Mapping) and MCP_INPUT_SCHEMA in tool:  # an MCP entry, as it is
            found.append(tool)
        elif isinstance(tool, Mapping):
            declarations = _first(tool, "functionDeclarations", "function_declarations")
            if isinstance(declarations, list):
                found += declarations
    return found


#: Google's ``Schema`` (an OpenAPI 3.0 subset) keywords that JSON Schema spells the same way
#: or in snake_case, and what they are in JSON Schema.
_SCHEMA_KEYWORDS = {
    "format": "format", "title": "title", "description": "description", "pattern": "pattern",
    "default": "default", "minimum": "minimum", "maximum": "maximum",
    "minItems": "minItems", "min_items": "minItems", "maxItems": "maxItems",
    "max_items": "maxItems", "minLength": "minLength", "min_length": "minLength",
    "maxLength": "maxLength", "max_length": "maxLength", "minProperties": "minProperties",
    "min_properties": "minProperties", "maxProperties": "maxProperties",
    "max_properties": "maxProperties",
}
_COUNTS = frozenset({"minItems", "maxItems", "minLength", "maxLength", "minProperties",
                     "maxProperties"})


def openapi_schema(schema: Any) -> Any:
    """Google's OpenAPI-subset ``Schema`` as the JSON Schema it means.

    ``type`` names are upper case (``STRING``, ``OBJECT``...; ``TYPE_UNSPECIFIED`` is no type);
    ``nullable: true`` adds ``"null"`` to the type (and ``None`` to an ``enum``); ``properties``,
    ``items`` and ``anyOf`` are converted in turn; ``required``, ``enum`` and the keywords of
    :data:`_SCHEMA_KEYWORDS` carry over (counts that the proto JSON mapping writes as strings,
    ``"5"``, become integers). Keywords JSON Schema does not have (``example``,
    ``propertyOrdering``) are left out. ``run.start`` is at most ``strictjson.MAX_DEPTH`` levels
    deep, which bounds the recursion. A value that is not a schema object is passed through, for
    the validator to refuse (the tool's calls then fail ``schema_invalid``)."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    kind = schema.get("type")
    if isinstance(kind, str) and kind.upper() != "TYPE_UNSPECIFIED":
        out["type"] = kind.lower()
    elif kind is not None and not isinstance(kind, str):
        out["type"] = kind  # not a type name: the validator refuses the schema
    for key, value in schema.items():
        target = _SCHEMA_KEYWORDS.get(key)
        if target is None:
            continue
        if target in _COUNTS and isinstance(value, str) and value.isascii() and value.isdigit():
            value = int(value)
        out[target] = value
    if isinstance(schema.get("enum"), list):
        out["enum"] = list(schema["enum"])
    if isinstance(schema.get("required"), list):
        out["required"] = list(schema["required"])
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        out["properties"] = {k: openapi_schema(v) for k, v in properties.items()}
    if "items" in schema:
        out["items"] = openapi_schema(schema["items"])
    any_of = _first(schema, "anyOf", "any_of")
    if isinstance(any_of, list):
        out["anyOf"] = [openapi_schema(s) for s in any_of]
    if schema.get("nullable") is True:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"].append(None)
    return out
#: Responses tool types whose items a client answers, and the item type each one answers.
RESPONSES_CLIENT_TOOLS = {"computer_use_preview": "computer_call", "computer": "computer_call",
                          "local_shell": "local_shell_call", "shell": "shell_call",
                          "apply_patch": "apply_patch_call"}


def hosted_shell(environment: Any) -> bool:
    """Whether a Responses ``shell`` tool's (or ``shell_call`` item's) ``environment`` is a
    container OpenAI runs (``container_auto``, ``container_reference``, or any type but
    ``local``): such a shell is OpenAI's, its items never a client's call. Absent, null or
    ``{"type": "local"}``: the client's."""
    if environment is None:
        return False
    return not (isinstance(environment, Mapping) and environment.get("type") == "local")


def responses_tool_key(kind: str, detail: str = "") -> str:
    """The key a Responses tool of item kind ``kind`` registers under: ``custom:<name>``,
    ``mcp_approval_request:<server_label>``, ``computer_call:``, ``local_shell_call:``. The
    ``:`` keeps these apart from function names, which OpenAI allows only letters, digits,
    ``_`` and ``-`` (a function named ``computer_call`` registers no computer use)."""
    return f"{kind}:{detail}"


def _responses_other_tool(kind: Any, tool: Mapping[str, Any]) -> str | None:
    if kind == "custom":
        name = tool.get("name")
        return responses_tool_key("custom", name) if isinstance(name, str) and name else None
    if kind == "mcp":
        label = tool.get("server_label")
        if isinstance(label, str) and label:
            return responses_tool_key("mcp_approval_request", label)
        return None
    if kind == "shell" and hosted_shell(tool.get("environment")):
        return None  # a container OpenAI runs: a hosted tool, as web_search
    item = RESPONSES_CLIENT_TOOLS.get(kind) if isinstance(kind, str) else None
    return None if item is None else responses_tool_key(item)


#: How many distinct tool maps an assembler keeps for its runs to share (:class:`ToolMaps`),
#: and how much schema text they may hold at most.
SHARED_TOOL_MAPS = 1024
SHARED_TOOL_MAP_BYTES = 16 * 1024 * 1024
#: The tool map of a run that registers no client tool (never changed).
_NO_TOOLS: dict[str, ToolSchema] = {}


class ToolMaps:
    """One tool map for the runs of a partition that register the same tools (names and
    shared schemas: ``ValidatorCache.prepare``), as most runs of one agent do: the map is only
    read, and each run would otherwise hold a copy (bench/bench_memory.py).

    The maps kept are the most recently used, at most :data:`SHARED_TOOL_MAPS` of them
    holding at most :data:`SHARED_TOOL_MAP_BYTES` of schema text: a map keeps its schemas
    alive after its runs ended, and run starts with ever new tools must not make that memory
    grow past a bound (it is counted in no run's ``max_buffered_bytes``)."""

    def __init__(self) -> None:
        #: The maps kept, least recently used first: key -> (map, its schema text bytes).
        self.maps: OrderedDict[tuple[tuple[str, ToolSchema], ...],
                               tuple[dict[str, ToolSchema], int]] = OrderedDict()
        #: The schema text bytes of the maps kept.
        self.bytes = 0

    def shared(self, tools: dict[str, ToolSchema], cost: int) -> dict[str, ToolSchema]:
        """The map kept equal to ``tools`` (``tools`` itself, kept, when there is none);
        ``cost``: the map's schema text bytes."""
        if not tools:
            return _NO_TOOLS
        maps = self.maps
        key = tuple(tools.items())  # (a ToolSchema hashes and compares by identity)
        found = maps.get(key)
        if found is not None:
            maps.move_to_end(key)
            return found[0]
        if cost > SHARED_TOOL_MAP_BYTES:
            return tools  # its own, never kept
        maps[key] = (tools, cost)
        self.bytes += cost
        while len(maps) > SHARED_TOOL_MAPS or self.bytes > SHARED_TOOL_MAP_BYTES:
            _, (_, dropped) = maps.popitem(last=False)
            self.bytes -= dropped
        return tools
