"""The tests' own layout (issue 24, item 6): findable by the unit they pin, and each saying what
it proves.

Inside each layer and kind (``tests/<layer>/<kind>/``) a test file is named for the module it
pins (``test_assembler.py``, ``test_openai_chat.py``, ``test_faust_engine.py``, ...); an issue
number belongs in a docstring, never in a file name. Every test function has a docstring. The
basenames stay unique across the tree: the test folders are not packages, so pytest imports
each file under its basename alone.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ISSUE = re.compile(r"issue_?\d+", re.IGNORECASE)


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
