"""What one Cedar decision costs, whole set against the policies a request's scope may match.

Times ``CedarPolicy.decide`` in one process over the calls of ``bench/bench_worker.py``'s
backlog shape (tenant t1 calling ``write_file`` with ``{path, content}``), and over calls of
other tenants and tools, with a policy file (default ``bench/policies20.cedar``) in pairs of
passes, back to back: the **whole set** (``ScopedSets.pruned`` off: Cedar evaluates every
policy, as before issue 25's pruning) and the **scoped** subsets (governance/policy_scope.py).
The **floor** of each pair is Cedar on an empty policy set (the request's own cost: building
it, the context, the answer). Headline: the median over pairs of scoped / whole, and each in
µs per decision and as a multiple of the floor. Then what the arguments' size costs: the same
call with a ``content`` of 64 bytes and of 64 KiB (cedarpy builds Cedar's context from the
arguments, per byte), as µs per KB.

    python bench/bench_policy.py                       # 9 pairs of 5,000 decisions
    python bench/bench_policy.py --policy FILE --pairs 9 --calls 5000
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from worker.core.policy import PolicyRequest
from worker.runtime.governance.policy import CedarPolicy

HERE = Path(__file__).resolve().parent


def calls(count: int) -> list[PolicyRequest]:
    """The backlog's calls (every fourth one another tenant or tool)."""
    out = []
    for n in range(count):
        tenant, tool = ("t1", "write_file") if n % 4 else (("t2", "read_file"), ("t3", "pay"),
                                                           ("acme", "get_weather"))[n % 3]
        out.append(PolicyRequest(tenant, tool, {}, {"path": f"/tmp/out-{n}.md",
                                                    "content": "# notes\n" * 8, "amount": n},
                                 "openai.chat", f"bench-{n // 2}"))
    return out


def timed(policy: CedarPolicy, requests: list[PolicyRequest]) -> float:
    """Seconds per decision over ``requests``."""
    decide = policy.decide
    start = time.perf_counter()
    for request in requests:
        decide(request)
    return (time.perf_counter() - start) / len(requests)


def size_cost(policy: CedarPolicy, count: int) -> tuple[float, float]:
    """µs per decision with 64 bytes of ``content``, and µs per KB beyond that at 64 KiB."""
    def one(size: int) -> float:
        request = PolicyRequest("t1", "write_file", {}, {"path": "/tmp/out.md",
                                                          "content": "x" * size},
                                "openai.chat", "bench-size")
        return min(timed(policy, [request] * count) for _ in range(3)) * 1e6
    small, large = one(64), one(65536)
    return small, (large - small) / 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, default=HERE / "policies20.cedar")
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    policy = CedarPolicy(args.policy.read_text(), path=str(args.policy))
    floor = CedarPolicy("// no policies")
    requests = calls(args.calls)
    timed(policy, requests[:200])  # warm: entity and subset caches, as a worker has them
    rows = []
    for _ in range(args.pairs):
        policy.scoped.pruned = False
        whole = timed(policy, requests)
        policy.scoped.pruned = True
        scoped = timed(policy, requests)
        rows.append((timed(floor, requests), whole, scoped))
    med = [statistics.median(r[i] for r in rows) * 1e6 for i in range(3)]
    print(f"{len(policy.statements)} policies ({args.policy}), {args.pairs} pairs of "
          f"{args.calls:,} decisions")
    print(f"floor (no policies) {med[0]:7.1f} µs/decision")
    print(f"whole set           {med[1]:7.1f} µs/decision  {med[1] / med[0]:.2f}x the floor")
    print(f"scoped              {med[2]:7.1f} µs/decision  {med[2] / med[0]:.2f}x the floor")
    print(f"ratio scoped / whole: {statistics.median(r[2] / r[1] for r in rows):.2f} "
          f"(pairs: {', '.join(f'{r[2] / r[1]:.2f}' for r in rows)})")
    small, per_kb = size_cost(policy, max(1, args.calls // 50))
    print(f"arguments' size: {small:.1f} µs/decision with 64 bytes of content, "
          f"+{per_kb:.1f} µs per KB (at 64 KiB)")


if __name__ == "__main__":
    main()
