"""``mypyc_attr`` for the modules that setup.py compiles with mypyc, without making
``mypy_extensions`` a dependency: where it is not installed (a pure-Python install) the
decorator does nothing, which is all it does at run time anyway. mypyc recognises it by its
name in ``mypy_extensions``, which is what mypy resolves this import to.

This module is never compiled (setup.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # no mypy_extensions: a pure-Python install

    def mypyc_attr(*attrs: str, **kwattrs: Any) -> Callable[[_T], _T]:  # type: ignore[misc]
        return lambda cls: cls


__all__ = ["mypyc_attr"]
