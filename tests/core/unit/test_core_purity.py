"""The core stays pure: no I/O, no framework, no clock, no randomness.

``worker.core`` decides outcomes from its input and the record times it is given, so that
the same history always gives the same decision (replay, recovery after a crash). This
test reads every module of the core with :mod:`ast` and fails on an import of a module that
does I/O or reads the time, and on a call that reads a clock.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[3] / "worker" / "core"

FORBIDDEN_MODULES = frozenset({
    "faust", "mode", "aiokafka", "confluent_kafka", "kafka", "opentelemetry", "asyncio",
    "socket", "time", "random", "datetime", "os", "secrets", "uuid", "threading",
    "subprocess", "selectors", "ssl", "http", "urllib", "requests", "httpx",
    # the policy engine: the core asks a Policy it is given (worker.core.policy), never Cedar
    "cedarpy",
})
#: Calls that read a clock, whatever the module was imported as.
CLOCK_CALLS = frozenset({"time", "monotonic", "monotonic_ns", "time_ns", "perf_counter",
                         "perf_counter_ns", "now", "utcnow", "today"})
CLOCK_OWNERS = frozenset({"time", "datetime", "date", "_time", "dt"})


def core_files() -> list[Path]:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 10, f"the core is not where this test looks: {CORE}"
    return files


def violations(source: str) -> list[str]:
    """What in ``source`` breaks purity, one line per finding."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        else:
            names = []
        for name in names:
            if name.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (node.func.attr in CLOCK_CALLS and isinstance(owner, ast.Name)
                    and owner.id in CLOCK_OWNERS):
                found.append(f"line {node.lineno}: calls {owner.id}.{node.func.attr}()")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in {"__import__", "open", "input", "print"}):
            found.append(f"line {node.lineno}: calls {node.func.id}()")
    return found


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_is_pure(path: Path) -> None:
    """This core module imports no I/O, framework, clock or randomness module, and calls no
    clock, ``open``, ``print`` or ``__import__``."""
    assert violations(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("source, expected", [
    ("import time", "imports time"),
    ("import os.path", "imports os.path"),
    ("from asyncio import sleep", "imports asyncio"),
    ("from confluent_kafka import Producer", "imports confluent_kafka"),
    ("import faust", "imports faust"),
    ("from opentelemetry.metrics import get_meter", "imports opentelemetry"),
    ("import aiokafka", "imports aiokafka"),
    ("from cedarpy import PolicySet", "imports cedarpy"),
    ("import socket", "imports socket"),
    ("import random", "imports random"),
    ("from datetime import datetime", "imports datetime"),
    ("x = time.time()", "calls time.time()"),
    ("x = time.monotonic()", "calls time.monotonic()"),
    ("x = datetime.now()", "calls datetime.now()"),
])
def test_the_checker_catches_impurity(source: str, expected: str) -> None:
    """The checker itself works: each impure line is reported (so a pass above means
    something)."""
    assert any(expected in v for v in violations(source))


def test_the_checker_allows_the_pure_standard_library() -> None:
    """Imports the core legitimately uses are not reported."""
    source = ("import json\nimport base64\nfrom dataclasses import dataclass\n"
              "from worker.core import ops\nfrom . import model\nimport orjson\n")
    assert violations(source) == []
