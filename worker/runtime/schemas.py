"""Find and load Latch's JSON Schemas (the files of ``schemas/``, one per record kind).

A source checkout reads them from ``<repo>/schemas``; an installed distribution reads the copy
shipped as package data in ``worker/_schemas`` (the first of the two that exists wins).

    >>> validator("committed-call").is_valid({"v": 1})
    False
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

__all__ = ["load_schema", "schema_dir", "schema_names", "schema_path", "validator"]

_SUFFIX = ".schema.json"
_CANDIDATES = (
    Path(__file__).resolve().parents[2] / "schemas",  # source checkout
    Path(__file__).resolve().parents[1] / "_schemas",  # installed package data
)


def schema_dir() -> Path:
    """The directory holding the ``*.schema.json`` files; FileNotFoundError if there is none."""
    for candidate in _CANDIDATES:
        if (candidate / f"config{_SUFFIX}").is_file():
            return candidate
    raise FileNotFoundError(f"no Latch schema directory in {[str(c) for c in _CANDIDATES]}")


def schema_names() -> tuple[str, ...]:
    """Short names of every schema (``"committed-call"``, ``"config"``, ...), sorted."""
    return tuple(sorted(p.name.removesuffix(_SUFFIX) for p in schema_dir().glob(f"*{_SUFFIX}")))


def schema_path(name: str) -> Path:
    """The file of schema ``name``, given short (``"config"``) or as a file name."""
    file_name = name if name.endswith(_SUFFIX) else f"{name}{_SUFFIX}"
    path = schema_dir() / file_name
    if not path.is_file():
        raise FileNotFoundError(f"no schema {name!r} (looked for {path})")
    return path


def load_schema(name: str) -> dict[str, Any]:
    """A fresh parsed copy of schema ``name`` (callers may mutate it)."""
    loaded: dict[str, Any] = json.loads(schema_path(name).read_text(encoding="utf-8"))
    return loaded


@cache
def validator(name: str) -> Any:
    """A ``Draft202012Validator`` for schema ``name``, compiled once, that resolves ``$ref``
    to any other Latch schema by its ``$id`` (``output-line`` needs that). Returned as ``Any``
    because jsonschema ships no type information."""
    resources = [
        (schema["$id"], Resource.from_contents(schema))
        for schema in map(load_schema, schema_names())
    ]
    registry: Registry[Any] = Registry().with_resources(resources)
    return Draft202012Validator(load_schema(name), registry=registry)
