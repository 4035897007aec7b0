"""The optional compiled build of ``worker.core`` (``setup.py``, mypyc).

A checkout compiled in place must never run stale code: ``worker`` refuses to import when an
extension is older than its source. Whether the core is compiled is reported, since the
benchmark's figures depend on it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import worker


def _checkout(tmp_path: Path, git: bool = True) -> Path:
    package = tmp_path / "worker"
    (package / "core").mkdir(parents=True)
    if git:
        (tmp_path / ".git").mkdir()
    return package


def _write(path: Path, mtime: float) -> None:
    path.write_text("")
    os.utime(path, (mtime, mtime))


def test_an_extension_older_than_its_source_is_refused(tmp_path: Path) -> None:
    """An edited ``assembler.py`` beside an older ``assembler.*.so`` stops the import, and
    the message says how to rebuild or remove the build."""
    package = _checkout(tmp_path)
    _write(package / "core" / "assembler.cpython-311-x86_64-linux-gnu.so", 1_000)
    _write(package / "core" / "assembler.py", 2_000)
    with pytest.raises(ImportError, match=r"older than assembler\.py.*LATCH_COMPILE=1"):
        worker._refuse_a_stale_build(package)


def test_a_peek_extension_older_than_its_c_source_is_refused(tmp_path: Path) -> None:
    """``_peek`` has no ``.py`` beside it: its source is ``csrc/peek.c``."""
    package = _checkout(tmp_path)
    (package / "core" / "csrc").mkdir()
    _write(package / "core" / "_peek.cpython-311-x86_64-linux-gnu.so", 1_000)
    _write(package / "core" / "csrc" / "peek.c", 2_000)
    with pytest.raises(ImportError, match=r"older than peek\.c"):
        worker._refuse_a_stale_build(package)


def test_a_fresh_build_and_an_installed_package_are_accepted(tmp_path: Path) -> None:
    """An extension newer than its source is fine; so is any file of a package that is not
    a checkout (an installer gives its files no meaningful times)."""
    package = _checkout(tmp_path)
    _write(package / "core" / "run.py", 1_000)
    _write(package / "core" / "run.cpython-311-x86_64-linux-gnu.so", 2_000)
    worker._refuse_a_stale_build(package)
    installed = _checkout(tmp_path / "site", git=False)
    _write(installed / "core" / "run.cpython-311-x86_64-linux-gnu.so", 1_000)
    _write(installed / "core" / "run.py", 2_000)
    worker._refuse_a_stale_build(installed)


def test_the_core_is_compiled_all_or_none() -> None:
    """Every compiled module of ``worker.core`` is an extension, or none is (the modules
    share one library). CI's compiled step sets ``LATCH_EXPECT_COMPILED=1`` and its main
    step ``0``, and then the build must be the one expected."""
    import importlib

    names = ["assembler", "envelope", "model", "ops", "outputs", "run", "strictjson",
             "providers.openai_chat", "providers.openai_responses",
             "providers.anthropic_messages", "providers.bedrock_converse", "providers.gemini",
             "providers.gemini_args"]
    kinds = {not importlib.import_module(f"worker.core.{n}").__file__.endswith(".py")
             for n in names}
    assert len(kinds) == 1, "a partly compiled core"
    assert worker.compiled_core() in kinds
    # worker/core/csrc/peek.c is built with the compiled core, never alone (setup.py).
    from worker.core import assembler
    assert (assembler._PEEK is not None) == worker.compiled_core()
    expected = os.environ.get("LATCH_EXPECT_COMPILED")
    if expected is not None:
        assert worker.compiled_core() == (expected == "1")
