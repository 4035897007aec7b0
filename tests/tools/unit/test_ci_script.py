"""CI (``.ci/run``) runs the README's two commands as the README gives them and in its order:
``latch demo`` on the broker the tests use, then the tests, so that a test that depends on what
the demo left on the broker (its topics under the default names, 12 partitions each) fails
in CI as it fails for a user."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The two commands"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block
    return [line.split("#")[0].strip() for line in block.group(1).splitlines()
            if line.startswith(".venv/bin/")]


def test_ci_runs_the_readme_commands_in_the_readme_order() -> None:
    """The README's commands are the demo (then the demo on the faust engine) and the tests;
    ``.ci/run`` defines them verbatim, starts the broker, runs the demo (first on the default
    kafka engine, then with ``--engine faust``: one deployment that switches engines, issue 23
    item 11; issue 34 made kafka the default) and only then the tests."""
    demo, faust_demo, tests = _readme_commands()
    assert demo == ".venv/bin/latch demo"
    assert faust_demo == f"{demo} --engine faust"
    script = (ROOT / ".ci" / "run").read_text()
    assert f"DEMO_CMD='{demo}'" in script
    assert f"TEST_CMD='{tests}'" in script
    steps = [m.group(1) for m in re.finditer(r'^step "([^"]+)"', script, re.M)]
    order = [s.split(":")[0] for s in steps]
    start = order.index("broker start")
    assert order[start + 1:start + 4] == ["demo", "demo, faust engine", "tests"], steps
    assert 'demo --engine faust || status' in script
