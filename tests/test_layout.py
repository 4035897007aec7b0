"""The tests' own layout (issue 24, item 6; issue 35, item 5): findable by the unit they pin,
and each saying what it proves.

Inside each layer and kind (``tests/<layer>/<kind>/``) a test file is named for the module it
pins (``test_assembler.py``, ``test_openai_chat.py``, ``test_faust_engine.py``, ...); an issue
number belongs in a docstring, never in a file name. Every module of ``worker/core``,
``worker/runtime``, ``worker/client`` and ``worker/tools`` has one, under its layer's tests
(:func:`unpinned`; the runtime's since issue 35, item 5). Every test function has a
docstring. The basenames stay unique across the tree: the test folders are not packages, so
pytest imports each file under its basename alone; a module whose name another layer's
module has too is pinned by a name with its package in front (``test_core_settings.py``,
``test_chaos_verify.py``, ``test_faust_engine_heads.py``).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
WORKER = TESTS.parent / "worker"
ISSUE = re.compile(r"issue_?\d+", re.IGNORECASE)
#: The layers of ``worker/`` whose every module has a test file named after it.
PINNED_LAYERS = ("core", "runtime", "client", "tools")


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def undocumented(source: str) -> list[str]:
    """The test functions (methods of test classes too) in ``source`` without a docstring."""
    return [node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test") and not ast.get_docstring(node)]


def named_by_issue(path: Path) -> bool:
    """Whether a test file's name carries an issue number (``test_issue9.py``)."""
    return ISSUE.search(path.stem) is not None


def pinning_names(module: str) -> set[str]:
    """The names of a test file that pins ``module`` (a path under ``worker/``, such as
    ``tools/chaos/verify.py``): ``test_`` and its name, or its name with its packages in front,
    innermost first (``test_verify.py``, ``test_chaos_verify.py``,
    ``test_tools_chaos_verify.py``)."""
    parts = Path(module).with_suffix("").parts
    return {"test_" + "_".join(parts[n:]) + ".py" for n in range(len(parts))}


def unpinned(worker: Path, tests: Path, layer: str) -> list[str]:
    """The modules of ``worker/<layer>`` (private ones, ``_*.py``, apart) without a test file
    named after them (:func:`pinning_names`) under ``tests/<layer>``."""
    names = {path.name for path in (tests / layer).rglob("test_*.py")}
    return [str(module.relative_to(worker)) for module in sorted((worker / layer).rglob("*.py"))
            if not module.name.startswith("_")
            and not pinning_names(str(module.relative_to(worker))) & names]


def test_every_module_has_a_test_file_named_after_it() -> None:
    """Each module of worker/core, worker/runtime, worker/client and worker/tools has a test
    file named after it in its layer's tests."""
    missing = [m for layer in PINNED_LAYERS for m in unpinned(WORKER, TESTS, layer)]
    assert not missing, f"modules without a test file named after them: {missing}"


def test_the_module_check_catches_a_module_without_tests(tmp_path: Path) -> None:
    """The check breaks on what it forbids: a module without a test file named after it is
    found, one whose test file is in another layer's tests too; a test file named after the
    module, or after it with its packages in front, pins it; a private module needs none."""
    worker, tests = tmp_path / "worker", tmp_path / "tests"
    for module in ("core/fresh.py", "core/kept.py", "core/_private.py", "tools/chaos/plan.py",
                   "tools/chaos/verify.py", "tools/policy.py"):
        (worker / module).parent.mkdir(parents=True, exist_ok=True)
        (worker / module).write_text("")
    for test in ("core/unit/test_kept.py", "tools/unit/test_chaos_plan.py",
                 "tools/unit/test_tools_chaos_verify.py", "runtime/unit/test_policy.py",
                 "core/unit/test_fresh_and_more.py"):
        (tests / test).parent.mkdir(parents=True, exist_ok=True)
        (tests / test).write_text("")
    assert unpinned(worker, tests, "core") == ["core/fresh.py"]
    assert unpinned(worker, tests, "tools") == ["tools/policy.py"]
    assert pinning_names("core/settings.py") == {"test_settings.py", "test_core_settings.py"}


def test_every_test_function_has_a_docstring() -> None:
    """Every ``test*`` function in every test file states what it proves in a docstring."""
    missing = [f"{path.relative_to(TESTS)}::{name}" for path in _test_files()
               for name in undocumented(path.read_text())]
    assert not missing, f"tests without a docstring: {missing}"


def test_no_test_file_is_named_by_an_issue_number() -> None:
    """No test file name holds an issue number; the module it pins names it."""
    offenders = [str(path.relative_to(TESTS)) for path in _test_files() if named_by_issue(path)]
    assert not offenders, f"named by an issue number: {offenders}"


def test_test_file_basenames_are_unique() -> None:
    """No two test files share a basename (pytest imports each under its basename alone, so a
    second ``test_kafka_engine.py`` in another folder would fail the collection)."""
    counts = Counter(path.name for path in _test_files())
    assert not [name for name, n in counts.items() if n > 1]


def imports_the_tests_package(source: str) -> bool:
    """Whether ``source`` imports ``tests.`` as a package: it is not one where CI's compiled
    step runs the core's tests (``python -P`` from the checkout: only ``tests/`` itself is on
    the path, as ``builders``, ``test_assembler``...)."""
    return any((isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests")
               or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tests"
                                                       for a in node.names))
               for node in ast.walk(ast.parse(source)))


def test_no_test_imports_the_tests_package() -> None:
    """Test helpers are imported by module name (``from builders import ...``), never as
    ``tests.builders``: two files that did broke the compiled step's collection."""
    offenders = [str(path.relative_to(TESTS)) for path in _test_files()
                 if imports_the_tests_package(path.read_text())]
    assert not offenders, f"import the tests package: {offenders}"
    assert imports_the_tests_package("from tests.builders import chat\n")
    assert not imports_the_tests_package("from builders import chat\n")


def test_the_checks_catch_what_they_exist_for() -> None:
    """The checks above break on what they forbid: a test without a docstring (module level or
    in a class, async too) is found, a documented one and a helper are not; ``issue9``,
    ``issue_24`` and ``Issue12`` in a file name are found, a module name is not."""
    source = '''
def helper():
    pass

def test_documented():
    """It proves something."""

def test_bare():
    assert True

class TestGroup:
    async def test_bare_method(self):
        pass
'''
    assert undocumented(source) == ["test_bare", "test_bare_method"]
    for name in ("test_issue9.py", "test_hostile_issue_24.py", "test_Issue12_abuse.py"):
        assert named_by_issue(Path(name)), name
    for name in ("test_assembler.py", "test_kafka_engine_on_kafka.py", "test_run.py"):
        assert not named_by_issue(Path(name)), name
