"""Optional mypyc build of the pure core (``worker/core``); everything else is in pyproject.toml.

``pip install .`` (and a wheel build) compiles the modules in :data:`COMPILED` with mypyc into C
extensions that sit next to their ``.py`` files and are imported in their place, and builds
``worker.core._peek`` (``worker/core/csrc/peek.c`` with the vendored yyjson, decision 0008).
The install is plain Python, and works the same, when:

* ``LATCH_PURE_PYTHON=1`` is set;
* mypyc is not importable (a build without isolation and without mypy);
* mypyc refuses the code, or the C compiler is missing or fails.

An editable install (``pip install -e .``, a checkout being worked on) is pure Python unless
``LATCH_COMPILE=1`` is set: compiled in place, the extensions sit in the source tree
(``worker/core/*.so``) and are imported instead of the ``.py`` files, so an edit would take
effect only after a rebuild. ``worker/__init__.py`` refuses to import such a stale build.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: What mypyc compiles. Left interpreted, each for a reason:
#: settings.py (AssembleSettings is built by worker.runtime.config from YAML, deep-copied and
#: pickled, which a compiled frozen dataclass does not survive), tools.py and schemacheck.py
#: (jsonschema's keyword callables and the tests' spies replace their functions at run time,
#: which compiled callers would not see; they are not on the per-event path), identity.py
#: (asked once at a run's start and once per decided call, never per event), redaction.py
#: (RE2's bindings are untyped, and a result is redacted once, never per event), turns.py and
#: pairing.py (once per committed call or turn, never per event; they compile), _mypyc.py
#: (the decorator shim).
COMPILED = [
    "worker/core/__init__.py",
    "worker/core/assembler.py",
    "worker/core/call.py",
    "worker/core/ending.py",
    "worker/core/envelope.py",
    "worker/core/keys.py",
    "worker/core/latch.py",
    "worker/core/ledger.py",
    "worker/core/model.py",
    "worker/core/ops.py",
    "worker/core/outputs.py",
    "worker/core/quickcheck.py",
    "worker/core/remembered.py",
    "worker/core/run.py",
    "worker/core/strictjson.py",
    "worker/core/waiting.py",
    "worker/core/wrapper.py",
    "worker/core/providers/__init__.py",
    "worker/core/providers/anthropic_messages.py",
    "worker/core/providers/bedrock_converse.py",
    "worker/core/providers/gemini.py",
    "worker/core/providers/gemini_args.py",
    "worker/core/providers/openai_chat.py",
    "worker/core/providers/openai_responses.py",
]


PEEK_BUILD = "worker/core/csrc/build.json"


def _pure(why: str) -> None:
    print(f"latch: not compiling worker.core ({why}): installing it as pure Python",
          file=sys.stderr)


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def _ext_modules() -> list[Any]:
    if _flag("LATCH_PURE_PYTHON"):
        _pure("LATCH_PURE_PYTHON is set")
        return []
    # setuptools runs this file with the command it builds: an editable install (a checkout
    # being worked on) stays pure Python, so that an edit takes effect without a rebuild.
    if "editable_wheel" in sys.argv and not _flag("LATCH_COMPILE"):
        _pure("an editable install; set LATCH_COMPILE=1 to compile it in place")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _pure("mypyc is not installed")
        return []
    try:
        # One shared library, worker/core__mypyc*.so, inside the package (not top-level).
        compiled = list(mypycify(COMPILED, opt_level="3", group_name="worker.core"))
    except (Exception, SystemExit) as exc:  # mypyc reports its errors and exits
        _pure(f"mypyc failed: {exc!r}")
        return []
    return [*compiled, _peek()]


def _peek() -> Extension:
    """worker.core._peek (worker/core/csrc/peek.c with the vendored yyjson): the common
    provider event read without building its whole object. Built with the compiled core,
    never alone: a pure-Python install parses every record with orjson. How it is built is
    worker/core/csrc/build.json, which bench/fuzz_peek.py builds with sanitizers too."""
    spec = json.loads((Path(__file__).resolve().parent / PEEK_BUILD).read_text())
    return Extension(
        "worker.core._peek", sources=spec["sources"], depends=spec["depends"],
        include_dirs=spec["include_dirs"],
        define_macros=[(name, value) for name, value in spec["define_macros"]],
        extra_compile_args=["-O3"],
    )


class OptionalBuildExt(build_ext):
    """build_ext that falls back to pure Python when any extension fails to build: the shims
    import the shared library, so the extensions are kept all or none."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, a compile or link error
            _pure(f"the C build failed: {exc}")
            self._remove_outputs()
            self.extensions = []

    def _remove_outputs(self) -> None:
        for ext in self.extensions:
            built = Path(self.get_ext_fullpath(ext.name))
            in_place = Path(self.get_ext_filename(ext.name))  # relative to the source tree
            for path in {built, in_place}:
                if path.is_file():
                    path.unlink()


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
