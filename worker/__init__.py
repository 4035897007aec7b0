"""Latch: emit a streamed LLM tool call only after it is complete and valid."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def compiled_core() -> bool:
    """Whether ``worker.core`` runs compiled by mypyc (``setup.py``) rather than interpreted."""
    from worker.core import assembler

    return not assembler.__file__.endswith(".py")


def _refuse_a_stale_build(package: Path) -> None:
    """In a checkout compiled in place (``LATCH_COMPILE=1 pip install -e .``), an extension
    older than its ``.py`` file would run code that is no longer there, silently: refuse to
    start, and say how to rebuild. Installed packages (no ``.git`` beside them) are left
    alone, since an installer gives its files no meaningful times."""
    if not (package.parent / ".git").exists():
        return
    for built in (package / "core").rglob("*.so"):
        stem = built.name.split(".", 1)[0]
        source = built.with_name(stem + ".py") if stem != "_peek" else (
            built.parent / "csrc" / "peek.c")  # (setup.py: the one C extension of our own)
        if source.exists() and source.stat().st_mtime > built.stat().st_mtime:
            raise ImportError(
                f"{built} is older than {source.name}: the compiled core would not run the "
                "code in this checkout. Rebuild it (LATCH_COMPILE=1 pip install -e .), or "
                "delete the build to run the source: find worker -name '*.so' -delete")


_refuse_a_stale_build(Path(__file__).resolve().parent)
