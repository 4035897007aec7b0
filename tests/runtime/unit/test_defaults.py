"""The commented default configuration (worker/runtime/defaults.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from worker.runtime.config import _SECTIONS, Config, load_config
from worker.runtime.defaults import dump_defaults

REPO = Path(__file__).resolve().parents[3]


def test_example_file_is_dump_defaults_and_loads_to_defaults() -> None:
    """latch.example.yaml is exactly dump_defaults(), and loading it gives the defaults."""
    example = REPO / "latch.example.yaml"
    assert example.read_text(encoding="utf-8") == dump_defaults()
    config = load_config(example, env={})
    assert dataclasses.replace(config, source=None) == Config()


def test_every_section_is_written_with_its_keys() -> None:
    """Every section of the configuration is in the file, and the YAML reads back to a
    mapping of the same sections (commented-out keys are unset)."""
    loaded = yaml.safe_load(dump_defaults())
    assert set(loaded) == set(_SECTIONS)
    assert loaded["results"]["enabled"] is True and loaded["results"]["tools"] == {}
