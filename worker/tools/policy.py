"""``latch policy``: write and try Cedar policies before the worker uses them (docs/policies.md,
*Policies*).

::

    latch policy check (FILE | --policy-version N) [--tools FILE | --toolset NAME@VERSION]
    latch policy test (--policy FILE | --policy-version N) --tenant T --tool NAME
                      [--server-label LABEL] --arguments FILE
                      [--tools FILE | --toolset NAME@VERSION] [--mode M]
    latch policy schema (--tools FILE | --toolset NAME@VERSION)

``check`` parses a policy set and, given tools, validates it against the Cedar schema Latch
generates from them (``schema`` prints it); each problem is one line ``FILE:LINE:COLUMN: what``.
``test`` decides one call as the worker would and prints the decision and the determining
policies: the resource is the tool's name, with the attributes the worker gives it from the
tools (its ``kind``, its MCP annotations, the ``--toolset``'s name; ``--server-label`` for an
approval request of a Responses MCP server, whose tool names are not declared). A name two of
the tools share is denied as the worker refuses it (``ambiguous_tool``), before any policy.
The policy set is a ``.cedar`` file or a version in the registry (``--policy-version``); the
tools are a file (``--tools``: a JSON array of tool definitions in a provider's format or MCP
``tools/list`` entries, or a ``tools/list`` result) or a toolset version in the registry
(``--toolset NAME@VERSION``). The registry is the topic ``topics.registry`` of ``--config``,
read whole once (:func:`main` takes a :class:`~worker.runtime.governance.registry.RegistryState`
instead, for tests).

Exit 0: the policy set is fine, the call allowed, the schema printed; 1: problems found, the
call denied; 2: a usage error, or a file, registry or version that cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from worker.core.envelope import PROVIDERS
from worker.core.identity import MCP, identities
from worker.core.ops import FUNCTION
from worker.core.policy import ENFORCE, LOG_ONLY, PolicyRequest
from worker.core.tools import client_tools, responses_tool_key, tool_attributes
from worker.runtime.governance import policy as cedar
from worker.runtime.governance.registry import POLICY, TOOLSET, RegistryState

#: The tools' format when ``--provider`` is not given and it reads them.
DEFAULT_PROVIDER = "openai.chat"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latch policy", description=__doc__.split("\n\n")[0].replace("``", "'"),
        epilog="Exit status: 0 fine or allowed, 1 problems found or denied, 2 a usage error "
               "or something that cannot be read.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(command: argparse.ArgumentParser, tools_required: bool = False) -> None:
        tools = command.add_mutually_exclusive_group(required=tools_required)
        tools.add_argument("--tools", metavar="FILE",
                           help="the tools: a JSON array of tool definitions, MCP tools/list "
                                "entries or a tools/list result")
        tools.add_argument("--toolset", metavar="NAME@VERSION",
                           help="the tools of a toolset version in the registry (e.g. files@3)")
        command.add_argument("--provider", choices=sorted(PROVIDERS), metavar="P",
                             help=f"the tools' format, one of {', '.join(sorted(PROVIDERS))} "
                                  f"(default: {DEFAULT_PROVIDER}, or else the first of them "
                                  "that reads the tools; MCP entries: any)")
        command.add_argument("--config", metavar="FILE",
                             help="latch.yaml, for the registry's topic and brokers (default: "
                                  "./latch.yaml if present; read only with --toolset or "
                                  "--policy-version)")

    check = sub.add_parser(
        "check", help="parse a policy set; validate it against the tools' schema",
        usage="latch policy check [-h] (FILE | --policy-version N)\n"
              "                          [--tools FILE | --toolset NAME@VERSION] "
              "[--provider P] [--config FILE]",
        description="Parse a policy set and, given tools, validate it against the Cedar "
                    "schema generated from them. Exit 1 when there are problems.")
    policy = check.add_mutually_exclusive_group(required=True)
    policy.add_argument("file", nargs="?", metavar="FILE", help="the .cedar file")
    policy.add_argument("--policy-version", type=int, metavar="N",
                        help="the policy set version N in the registry, instead of a file")
    common(check)
    test = sub.add_parser(
        "test", help="decide one call as the worker would; print the decision",
        description="Decide one call as the worker would and print the decision and the "
                    "determining policies. Exit 0 allowed, 1 denied.")
    policy = test.add_mutually_exclusive_group(required=True)
    policy.add_argument("--policy", metavar="FILE", help="the .cedar file")
    policy.add_argument("--policy-version", type=int, metavar="N",
                        help="the policy set version N in the registry, instead of a file")
    test.add_argument("--tenant", metavar="T",
                      help="the run's tenant (default: none, the principal "
                           "Latch::Anonymous::\"anonymous\")")
    test.add_argument("--tool", required=True, metavar="NAME",
                      help="the tool's name, as its committed record carries it (a Responses "
                           "custom tool: its name; computer use: computer)")
    test.add_argument("--server-label", metavar="LABEL",
                      help="the call is an approval request of the Responses MCP server LABEL "
                           "(--tool: the MCP tool's name)")
    test.add_argument("--arguments", required=True, metavar="FILE",
                      help="the call's arguments (a JSON file, - for stdin)")
    test.add_argument("--run-id", default="policy-test", metavar="ID",
                      help="context.run_id (default: policy-test)")
    test.add_argument("--mode", default=ENFORCE, choices=[LOG_ONLY, ENFORCE],
                      help=f"the policy mode (default: {ENFORCE}; the decision is the same, "
                           "log_only only records it)")
    common(test)
    schema = sub.add_parser(
        "schema", help="print the Cedar schema generated from tools",
        description="Print the Cedar schema (JSON) Latch generates from tools: what "
                    "'latch policy check' validates against.")
    common(schema, tools_required=True)
    return parser


class _Usage(Exception):
    pass


class _Sources:
    """Where the policy set and the tools come from: files, or the registry, read whole at
    most once (or the state given, for tests)."""

    def __init__(self, args: argparse.Namespace, state: RegistryState | None) -> None:
        self.args, self._state = args, state
        self.topic: str | None = None

    def registry(self) -> RegistryState:
        if self._state is None:
            from confluent_kafka import KafkaException

            from worker.runtime.config import ConfigError, load_config
            from worker.runtime.governance.registry_io import RegistryError, read_whole
            try:
                config = load_config(self.args.config)
            except ConfigError as exc:
                raise _Usage(str(exc)) from exc
            self.topic = config.topics.registry
            try:
                self._state = read_whole(config)
            except (RegistryError, KafkaException) as exc:
                raise _Usage(f"cannot read the registry: {exc}") from exc
        return self._state

    def _where(self) -> str:
        return f"the registry (topic {self.topic})" if self.topic else "the registry"

    def tools(self) -> tuple[Any, str | None]:
        """The tools, and what to call them in messages (None: no tools given)."""
        if self.args.tools is not None:
            return cedar.read_tools(self.args.tools), self.args.tools
        if self.args.toolset is None:
            return [], None
        name, version = toolset_name(self.args.toolset)
        state = self.registry()
        entry = state.get(TOOLSET, name, version)
        if entry is None:
            known = sorted(v for (k, n, v) in state.entries if k == TOOLSET and n == name)
            if not known:
                raise _Usage(f"{self._where()} holds no toolset {name!r}")
            raise _Usage(f"{self._where()} holds no toolset {name!r} version {version} "
                         f"(its versions: {', '.join(map(str, known))})")
        return entry.content, f"toolset {name}@{version}"

    def policy(self, path: str | None) -> tuple[str, str, int | None]:
        """The policy set's Cedar text, the name its problems are reported under, its
        version (None: a file)."""
        version = self.args.policy_version
        if version is None:
            assert path is not None  # (argparse: one of the two is required)
            return _source(path), path, None
        state = self.registry()
        text = state.policy_text(version)
        if text is None:
            known = sorted(v for (k, _, v) in state.entries if k == POLICY)
            listed = ", ".join(map(str, known)) if known else "none"
            raise _Usage(f"{self._where()} holds no policy set version {version} "
                         f"(its versions: {listed})")
        return text, f"registry:policy/{version}", version

    def provider(self, tools: Any) -> str:
        if self.args.provider is not None:
            return str(self.args.provider)
        for provider in (DEFAULT_PROVIDER, *sorted(PROVIDERS)):
            if client_tools(provider, tools):
                return provider
        return DEFAULT_PROVIDER


def toolset_name(text: str) -> tuple[str, int]:
    """``NAME@VERSION`` as (name, version); raises :class:`_Usage` saying what is wrong."""
    name, at, version = text.rpartition("@")
    if not at or not name or not version.isdigit() or int(version) < 1:
        raise _Usage(f"--toolset wants NAME@VERSION, a toolset's name and a positive version "
                     f"(e.g. files@3), not {text!r}")
    return name, int(version)


def main(argv: Sequence[str] | None = None, registry: RegistryState | None = None) -> int:
    """``latch policy``; see the module docstring. ``registry``: the registry to read
    toolsets and policy sets from instead of the topic (tests)."""
    args = build_parser().parse_args(argv)
    sources = _Sources(args, registry)
    try:
        if args.command == "schema":
            tools, _ = sources.tools()
            schema = cedar.cedar_schema(tools, sources.provider(tools))
            print(orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode())
            return 0
        if args.command == "check":
            return _check(args, sources)
        return _test(args, sources)
    except (_Usage, ValueError) as exc:
        print(f"latch policy: {exc}", file=sys.stderr)
        return 2


def _source(path: str) -> str:
    try:  # (the bytes as they are, as `latch registry put` and policy.file read them)
        return Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise _Usage(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise _Usage(f"{path} is not UTF-8 text") from exc


def _check(args: argparse.Namespace, sources: _Sources) -> int:
    source, where, _ = sources.policy(args.file)
    tools, named = sources.tools()
    schema = None if named is None else cedar.cedar_schema(tools, sources.provider(tools))
    problems = cedar.check(source, where, schema)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{where}: ok" + (f" against the schema of {named}" if named else
                            " (parsed; give --tools or --toolset to validate it)"))
    return 0


def _test(args: argparse.Namespace, sources: _Sources) -> int:
    source, where, version = sources.policy(args.policy)
    tools, named = sources.tools()
    provider = sources.provider(tools)
    try:
        data = sys.stdin.buffer.read() if args.arguments == "-" else Path(
            args.arguments).read_bytes()
        arguments = orjson.loads(data)
    except OSError as exc:
        raise _Usage(f"cannot read {args.arguments}: {exc.strerror}") from exc
    except orjson.JSONDecodeError as exc:
        raise _Usage(f"{args.arguments} is not JSON: {exc}") from exc
    registered, ids = client_tools(provider, tools), identities(provider, tools)
    kind, key = FUNCTION, ids.key_of(args.tool, registered)
    if args.server_label is not None:
        kind, key = "mcp_approval_request", responses_tool_key(
            "mcp_approval_request", args.server_label)
    if named is not None and ids.refuses(key or args.tool, args.tool, kind, registered):
        print("decision: deny (ambiguous_tool: two of the tools have this name, and the "
              "worker refuses its calls before any policy)")
        return 1
    if named is not None and key not in registered:
        print(f"note: {args.tool} is not among the tools of {named} (the call would fail "
              "unknown_tool before any policy)", file=sys.stderr)
    toolset = None if args.toolset is None else toolset_name(args.toolset)
    given = tool_attributes(tools, registered, toolset).get(key or args.tool, {})
    attributes = ids.attributes(key or args.tool, given)
    if args.server_label is not None:  # (as the worker's, declared or not)
        attributes.update(kind=MCP, server_label=args.server_label)
    policy = cedar.CedarPolicy(source, args.mode, where, version=version)
    decision = policy.decide(PolicyRequest(
        args.tenant, args.tool, attributes, arguments, provider, args.run_id))
    verdict = "allow" if decision.allow else "deny"
    print(f"decision: {verdict} ({decision.mode})")
    print("determining policies: " + (", ".join(decision.policies) or "none"))
    if decision.approval:
        print("approval: required (a determining permit is annotated @approval(\"required\"); "
              "in enforce the call waits for a person)")
    for error in decision.errors:
        print(f"error: {error} (an evaluation error denies)")
    if not decision.allow and not decision.policies and not decision.errors:
        print("no policy permits this call (deny by default)")
    return 0 if decision.allow else 1
