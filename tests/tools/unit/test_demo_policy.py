"""``latch demo``'s policy: the shipped ``examples/demo.cedar`` in ``enforce`` by default,
denying exactly one call of ``examples/demo.jsonl`` (issue 25: "``latch demo`` shows one
denied call") and holding exactly one for approval (issue 26: "one call waiting for approval
and approved"), and left alone when asked or when the configuration has its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from worker.runtime.config import Config, PolicySettings
from worker.tools import demo

ROOT = Path(__file__).resolve().parents[3]


def test_the_demo_enforces_the_shipped_policy_unless_told_otherwise() -> None:
    """By default the demo picks the shipped ``demo.cedar``; ``--policy`` picks another file;
    ``--no-policy``, ``--file`` (other envelopes) and a configured ``policy.mode`` leave the
    configuration's policy as it is."""
    parse = demo.build_parser().parse_args
    off = Config()
    assert demo.demo_policy(parse([]), off) == demo.example_policy()
    assert demo.example_policy().name == "demo.cedar"
    assert demo.demo_policy(parse(["--policy", "p.cedar"]), off) == Path("p.cedar")
    assert demo.demo_policy(parse(["--no-policy"]), off) is None
    assert demo.demo_policy(parse(["--file", "x.jsonl"]), off) is None
    own = Config(policy=PolicySettings(mode="log_only", file=str(demo.example_policy())))
    assert demo.demo_policy(parse([]), own) is None


def test_the_shipped_policy_denies_one_demo_call_and_holds_one() -> None:
    """The demo's envelopes through the latch with ``demo.cedar`` in ``enforce``: the one
    ``glob_search`` (of ``**/*cursor*``, not under ``/srv/``) gets ``policy_denied`` naming
    ``glob-only-under-srv`` and is not committed; the one ``get_stock_price`` waits on the
    pending topic (offline no one decides, so its run stays open: the demo approves it live);
    every other call ends as without a policy."""
    env = {**os.environ, "LATCH_POLICY__MODE": "enforce",
           "LATCH_POLICY__FILE": str(demo.example_policy())}
    out = subprocess.run(
        [sys.executable, "-m", "worker", "assemble", str(demo.example_file())],
        cwd=ROOT, env=env, capture_output=True, check=True, timeout=120).stdout
    records = [orjson.loads(line) for line in out.splitlines() if line.strip()]
    committed = [r["value"]["name"] for r in records if r["topic"] == "committed"]
    errors = {r["value"]["name"]: r["value"] for r in records if r["topic"] == "errors"}
    denied = [v for v in errors.values() if v["reason"] == "policy_denied"]
    assert len(denied) == 1 and denied[0]["name"] == "glob_search", errors
    assert "glob-only-under-srv" in denied[0]["content"]
    assert "cursor" not in denied[0]["content"]  # never argument text
    assert "glob_search" not in committed
    assert sorted(committed) == ["GetWeatherArgs", "get_capital", "get_weather", "writeItems"]
    pending = [r["value"] for r in records if r["topic"] == "pending"]
    assert [(v["run_id"], v["name"]) for v in pending] == [("chat-parallel", "get_stock_price")]
    assert "chat-parallel" not in {r["key"] for r in records if r["topic"] == "final"}
    assert sorted(v["reason"] for v in errors.values()) == [
        "cancelled", "invalid_json", "policy_denied", "stream_error"]
