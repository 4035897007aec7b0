"""``latch policy``: write and try the Cedar policies of ``policy.file`` (README, *Policies*).

::

    latch policy check FILE [--tools FILE] [--provider P]
    latch policy test --policy FILE --tenant T --tool NAME --arguments FILE
                      [--tools FILE] [--provider P] [--mode log_only|enforce]
    latch policy schema --tools FILE [--provider P]

``check`` parses the policy file and, with ``--tools``, validates it against the Cedar schema
Latch generates from those tools (``schema`` prints it); each problem is one line
``FILE:LINE:COLUMN: what``. ``test`` decides one call as the worker would (the tool's MCP
annotations come from ``--tools``) and prints the decision and the determining policies.
``--tools`` is a JSON array of tool definitions in ``--provider``'s format (default
openai.chat) or MCP ``tools/list`` entries, or a ``tools/list`` result. (A toolset named in the
registry, ``--toolset NAME@VERSION``, comes with the registry: :func:`_tools` is the one place
that reads the tools.)

Exit 0: the file is fine, the call allowed, the schema printed; 1: problems found, the call
denied; 2: a usage error or a file that cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from worker.core.envelope import PROVIDERS
from worker.core.policy import ENFORCE, LOG_ONLY, PolicyRequest
from worker.core.tools import client_tools, tool_attributes
from worker.runtime import policy as cedar


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latch policy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def tools_options(command: argparse.ArgumentParser, required: bool = False) -> None:
        command.add_argument("--tools", metavar="FILE", required=required,
                             help="the tools (JSON array, MCP tools/list entries or result)")
        command.add_argument("--provider", default="openai.chat", choices=sorted(PROVIDERS),
                             help="the tools' format (default openai.chat; MCP entries: any)")

    check = sub.add_parser("check", help="parse a policy file; validate it against the tools")
    check.add_argument("file", help="the .cedar file")
    tools_options(check)
    test = sub.add_parser("test", help="decide one call and print the decision")
    test.add_argument("--policy", required=True, metavar="FILE", help="the .cedar file")
    test.add_argument("--tenant", help="the run's tenant (absent: a run without one)")
    test.add_argument("--tool", required=True, help="the tool's name")
    test.add_argument("--arguments", required=True, metavar="FILE",
                      help="the call's arguments (a JSON file, - for stdin)")
    test.add_argument("--run-id", default="policy-test")
    test.add_argument("--mode", default=ENFORCE, choices=[LOG_ONLY, ENFORCE])
    tools_options(test)
    schema = sub.add_parser("schema", help="print the Cedar schema generated from tools")
    tools_options(schema, required=True)
    return parser


class _Usage(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    """``latch policy``; see the module docstring."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "schema":
            schema = cedar.cedar_schema(_tools(args.tools), args.provider)
            print(orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode())
            return 0
        if args.command == "check":
            return _check(args)
        return _test(args)
    except (_Usage, ValueError) as exc:
        print(f"latch policy: {exc}", file=sys.stderr)
        return 2


def _tools(path: str | None) -> Any:
    """The tools to generate the schema from and to take annotations from (None: none)."""
    return [] if path is None else cedar.read_tools(path)


def _source(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise _Usage(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise _Usage(f"{path} is not UTF-8 text") from exc


def _check(args: argparse.Namespace) -> int:
    schema = None if args.tools is None else cedar.cedar_schema(_tools(args.tools),
                                                                args.provider)
    problems = cedar.check(_source(args.file), args.file, schema)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    against = f" against the schema of {args.tools}" if args.tools else ""
    print(f"{args.file}: ok{against}")
    return 0


def _test(args: argparse.Namespace) -> int:
    tools = _tools(args.tools)
    try:
        data = sys.stdin.buffer.read() if args.arguments == "-" else Path(
            args.arguments).read_bytes()
        arguments = orjson.loads(data)
    except OSError as exc:
        raise _Usage(f"cannot read {args.arguments}: {exc.strerror}") from exc
    except orjson.JSONDecodeError as exc:
        raise _Usage(f"{args.arguments} is not JSON: {exc}") from exc
    if tools and args.tool not in client_tools(args.provider, tools):
        print(f"note: {args.tool} is not among the tools of {args.tools} (the call would fail "
              "unknown_tool before any policy)", file=sys.stderr)
    policy = cedar.CedarPolicy(_source(args.policy), args.mode, args.policy)
    decision = policy.decide(PolicyRequest(
        args.tenant, args.tool, tool_attributes(tools).get(args.tool, {}), arguments,
        args.provider, args.run_id))
    verdict = "allow" if decision.allow else "deny"
    print(f"decision: {verdict} ({decision.mode})")
    print("determining policies: " + (", ".join(decision.policies) or "none"))
    for error in decision.errors:
        print(f"error: {error} (an evaluation error denies)")
    if not decision.allow and not decision.policies and not decision.errors:
        print("no policy permits this call (deny by default)")
    return 0 if decision.allow else 1
