"""``latch approve|deny|edit RUN CALL --by WHO --reason TEXT``: an operator's decision on a call
waiting for approval (docs/policies.md, "Approvals"), sent to the control topic by the
:class:`~worker.client.publisher.Publisher`; the worker forwards it into the run's events
partition, where it decides the call (or goes to the DLQ when the call is unknown, not waiting,
or already decided: ``latch tail`` shows it).

``latch edit RUN CALL --arguments FILE`` gives the call new arguments (the file's JSON text,
``-`` for stdin), which the worker's latch checks again before it commits or fails them.

The decision is signed with the configuration's ``approvers.key_id`` (its owner must be
``--by``): a worker counts only signed decisions by an approver the policy in force allows,
and never an unsigned one (docs/policies.md, "Approvals"; decision 0019). Without
``approvers.key_id``, or with a key that cannot be read, the tool sends nothing and exits 2, saying
why.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from worker.client.publisher import Publisher, PublishError
from worker.runtime.config import ConfigError, load_config
from worker.runtime.governance.approvers import decision_signer

__all__ = ["approve", "deny", "edit"]

#: Why nothing is sent without an approver key.
UNSIGNED = ("approvers.key_id is not set, so this decision would go unsigned, and a worker "
            "never counts an unsigned decision (it goes to the DLQ, approval_unsigned, and "
            "the call stays held until approval_timeout). Set approvers.key_id to your key "
            "(with approvers.keys and approvers.owners; docs/policies.md, Approvals). "
            "Nothing was sent.")


def _parser(kind: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"latch {kind}", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_id", metavar="RUN")
    parser.add_argument("tool_call_id", metavar="CALL", help="the call's id (its pending "
                        "record's call_id)")
    parser.add_argument("--by", required=True, help="who decides: the approver id that owns "
                        "approvers.key_id (the key the decision is signed with)")
    parser.add_argument("--reason", default="", help="why")
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    if kind == "edit":
        parser.add_argument("--arguments", required=True, metavar="FILE",
                            help="the new arguments' JSON text, - for stdin")
    return parser


def _main(kind: str, argv: Sequence[str] | None) -> int:
    args = _parser(kind).parse_args(argv)
    try:
        arguments = None
        if kind == "edit":
            arguments = (sys.stdin.read() if args.arguments == "-"
                         else Path(args.arguments).read_text(encoding="utf-8"))
        config = load_config(args.config)
        if config.approvers.key_id is None:
            print(f"latch {kind}: {UNSIGNED}", file=sys.stderr)
            return 2
        decision_signer(config)  # (a key that cannot be read stops here, before any client)
        with Publisher(config) as publisher:
            if kind == "edit":
                assert arguments is not None
                publisher.edit(args.run_id, args.tool_call_id, arguments, by=args.by,
                               reason=args.reason)
            elif kind == "approve":
                publisher.approve(args.run_id, args.tool_call_id, by=args.by, reason=args.reason)
            else:
                publisher.deny(args.run_id, args.tool_call_id, by=args.by, reason=args.reason)
            publisher.flush()
    except (ConfigError, OSError, PublishError, ValueError) as exc:
        print(f"latch {kind}: {exc}", file=sys.stderr)
        return 2
    print(f"latch {kind}: sent for run {args.run_id}, call {args.tool_call_id}")
    return 0


def approve(argv: Sequence[str] | None = None) -> int:
    """``latch approve``."""
    return _main("approve", argv)


def deny(argv: Sequence[str] | None = None) -> int:
    """``latch deny``."""
    return _main("deny", argv)


def edit(argv: Sequence[str] | None = None) -> int:
    """``latch edit``."""
    return _main("edit", argv)
