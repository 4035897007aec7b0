"""The ``latch`` command line.

Subcommands::

    latch assemble [--config FILE] [--registry] [FILE|-] offline: envelopes in, records out
    latch assemble --from-sse PROVIDER --tools FILE CAPTURE
    latch worker [--config FILE]                         run the Kafka worker
    latch topics create [--config FILE]                  provision every topic
    latch registry put|list|show [--config FILE]         toolsets and policy sets by version
    latch runner --mcp URL [--config FILE]               run committed calls on an MCP server
    latch broker start|stop|status                       a local Kafka for development
    latch publish [--config FILE] FILE                   send JSON-Lines envelopes
    latch tail [--config FILE]                           print the output topics
    latch results [--config FILE] RUN                    one run's turn record, or its calls
    latch replay [--config FILE] --from-... --to-...     re-run a range of the events topic
    latch policy check|test|schema ...                   write and try Cedar policies
    latch demo                                           everything above, end to end

Each subcommand's module is imported only when it runs, so ``latch assemble`` needs no
Kafka client at all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from worker.core import Assembler
from worker.core.envelope import PROVIDERS
from worker.core.settings import offline


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    lazy = {name: target for name, target, _ in _LAZY}
    if argv and argv[0] in lazy:
        # Straight to the subcommand: argparse's REMAINDER refuses a leading option
        # (`latch tail --from-beginning` would be "unrecognized arguments").
        args = argparse.Namespace(handler=_lazy(lazy[argv[0]]), rest=argv[1:])
    else:
        args = _parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except CliError as exc:
        print(f"latch: {exc}", file=sys.stderr)
        return 2


class CliError(Exception):
    """A problem with the command line or its inputs, reported as one line."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latch", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    asm = sub.add_parser("assemble", help="run envelopes through the latch offline")
    asm.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    asm.add_argument("--from-sse", metavar="PROVIDER",
                     choices=sorted(PROVIDERS),
                     help="read a raw capture (SSE, JSON Lines, a JSON array, a binary AWS "
                          "event stream or a VCR cassette)")
    asm.add_argument("--tools", metavar="FILE", help="with --from-sse: the tools JSON array")
    asm.add_argument("--run-id", default="capture", help=(
        "with --from-sse: the run id to use (a cassette of several interactions: one run each, "
        "ID-1, ID-2, ...)"))
    asm.add_argument("--registry", action="store_true", help=(
        "read the registry topic (topics.registry) whole first, for runs that name a toolset "
        "by reference (every version read counts: offline there is no wait rule); without it "
        "such runs fail unknown_toolset"))
    asm.add_argument("input", nargs="?", default="-", help="input file, - for stdin")
    asm.set_defaults(handler=_assemble)

    for name, target, text in _LAZY:
        lazy = sub.add_parser(name, help=text, add_help=False)
        lazy.add_argument("rest", nargs=argparse.REMAINDER)
        lazy.set_defaults(handler=_lazy(target))
    return parser


_LAZY = [
    ("worker", "worker.runtime.engine:main", "run the Kafka worker"),
    ("topics", "worker.runtime.admin:main", "provision the topics (topics create)"),
    ("registry", "worker.client.mcp:registry_main",
     "toolsets and policy sets by version: put (--from-mcp URL too), list, show"),
    ("runner", "worker.client.mcp:runner_main",
     "run committed calls on an MCP server (--mcp URL)"),
    ("broker", "worker.tools.broker:main", "a local Kafka broker: start, stop, status"),
    ("publish", "worker.client.publisher:main", "publish JSON-Lines envelopes"),
    ("tail", "worker.tools.tail:main", "print the output topics"),
    ("results", "worker.tools.results:main",
     "one run's turn record, or its calls joined with their answers"),
    ("demo", "worker.tools.demo:main", "run the end-to-end demo"),
    ("replay", "worker.tools.replay:main", "replay a range of the events topic"),
    ("approve", "worker.tools.approvals:approve", "approve a call waiting for approval"),
    ("deny", "worker.tools.approvals:deny", "deny a call waiting for approval"),
    ("edit", "worker.tools.approvals:edit",
     "give a call waiting for approval new arguments (checked again)"),
    ("policy", "worker.tools.policy:main",
     "Cedar policies: check a file, test a call, print the generated schema"),
    ("chaos", "worker.tools.chaos.run:main",
     "kill workers, restart the broker, verify the promises"),
]


def _lazy(target: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        module_name, func = target.split(":")
        module = importlib.import_module(module_name)
        result: int = getattr(module, func)(list(args.rest))
        return result

    return run


def _assemble(args: argparse.Namespace) -> int:
    from worker.runtime.config import ConfigError, load_config
    from worker.runtime.governance.approvers import approvers as approvers_for
    from worker.runtime.governance.policy_source import assembler_policy
    from worker.runtime.governance.signing import with_audit_key

    try:
        config = with_audit_key(load_config(args.config))  # the worker's audit digests
        policy = assembler_policy(config)
    except (ConfigError, ValueError) as exc:  # (a PolicyFileError is a ValueError)
        raise CliError(str(exc)) from exc
    # (offline, no runner answers: the result latch is off, as with results.enabled false)
    assembler = Assembler(offline(config.assemble))
    assembler.policy = policy
    assembler.approvals.approvers = approvers_for(config)
    if args.registry:
        assembler.toolsets = _registry_toolsets(config)
    out = sys.stdout.buffer
    if args.from_sse:
        lines: Iterable[bytes] = _capture_lines(args)
    else:
        lines = _input_lines(args.input)
    for line in lines:
        if line.strip():
            _write(out, (e.as_line() for e in assembler.feed_record(None, line.strip())))
    _write(out, (e.as_line() for e in assembler.summarise_late()))  # (decision 0015)
    if assembler.open_runs:
        ids = ", ".join(assembler.open_run_ids()[:5])
        print(f"latch: {assembler.open_runs} run(s) still open at end of input: {ids}",
              file=sys.stderr)
    return 0


def _registry_toolsets(config: Any) -> Callable[[str, int, int], Any]:
    """``latch assemble --registry``: the registry topic read whole now; a run naming a
    toolset gets any version read (offline there is no record time to wait from)."""
    from worker.runtime.governance.registry import TOOLSET
    from worker.runtime.governance.registry_io import RegistryError, read_whole

    try:
        state = read_whole(config)
    except RegistryError as exc:
        raise CliError(f"--registry: {exc}") from exc

    def lookup(name: str, version: int, at_ms: int) -> Any:
        entry = state.get(TOOLSET, name, version)
        return None if entry is None else entry.content

    return lookup


def _write(out: IO[bytes], lines: Iterable[dict[str, Any]]) -> None:
    for line in lines:
        out.write(orjson.dumps(line) + b"\n")
    out.flush()


def _input_lines(name: str) -> Iterable[bytes]:
    if name == "-":
        return sys.stdin.buffer
    try:
        return Path(name).read_bytes().splitlines()
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror}") from exc


def _capture_lines(args: argparse.Namespace) -> Iterable[bytes]:
    from worker.tools import capture

    if not args.tools:
        raise CliError("--from-sse needs --tools FILE (the JSON array of the run's tools)")
    try:
        tools = orjson.loads(Path(args.tools).read_bytes())
        name = args.input
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        runs = capture.responses(data, name)
    except OSError as exc:
        raise CliError(f"cannot read {exc.filename}: {exc.strerror}") from exc
    except (orjson.JSONDecodeError, ValueError, KeyError) as exc:
        raise CliError(f"{args.input} is not a capture this tool reads: {exc}") from exc
    if not isinstance(tools, list):
        raise CliError(f"{args.tools} must hold a JSON array of tool definitions")
    ids = [args.run_id] if len(runs) == 1 else [f"{args.run_id}-{n}" for n in
                                                  range(1, len(runs) + 1)]
    envelopes = [e for run_id, events in zip(ids, runs, strict=True)
                 for e in capture.envelopes(args.from_sse, events, tools, run_id=run_id)]
    return [e if isinstance(e, bytes) else orjson.dumps(e) for e in envelopes]
