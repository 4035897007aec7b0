"""The configuration is plain data; the governance package builds the policy (issue 32: no
import circle between config and policy). Each command that decides calls (``latch worker``,
``latch assemble``, ``latch replay``) builds the ``policy.file`` first and stops with its
``FILE:LINE:COLUMN`` (exit 2) before it touches Kafka; commands that do not decide calls
(``latch registry``, ``latch tail``...) read the configuration without reading Cedar."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker import cli
from worker.runtime import engine
from worker.runtime.config import load_config
from worker.tools import replay

BAD = "permit(principal, action, resource);\nforbid(principal,\n action resource);"


def _config(tmp_path: Path) -> tuple[Path, Path]:
    cedar = tmp_path / "p.cedar"
    cedar.write_text(BAD, encoding="utf-8")
    path = tmp_path / "latch.yaml"
    path.write_text(f"policy:\n  mode: enforce\n  file: {cedar}\nkafka:\n"
                    "  bootstrap_servers: 127.0.0.1:1\n", encoding="utf-8")
    return path, cedar


@pytest.mark.parametrize("command", ["worker", "assemble", "replay"])
def test_a_command_that_decides_calls_stops_at_a_bad_policy_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """``latch worker``, ``latch assemble`` and ``latch replay`` with a ``policy.file`` Cedar
    cannot parse exit 2 naming the file, line and column (no broker answers at 127.0.0.1:1:
    they stop before any Kafka call)."""
    pytest.importorskip("cedarpy")
    path, cedar = _config(tmp_path)
    if command == "worker":
        code = engine.main(["--config", str(path)])
    elif command == "assemble":
        (tmp_path / "in.jsonl").write_text("", encoding="utf-8")
        code = cli.main(["assemble", "--config", str(path), str(tmp_path / "in.jsonl")])
    else:
        code = replay.main(["--config", str(path), "--from-beginning", "--no-progress",
                            "--to-file", str(tmp_path / "out.jsonl")])
    assert code == 2
    assert f"{cedar}:3:9: unexpected token" in capsys.readouterr().err


def test_reading_the_configuration_reads_no_cedar(tmp_path: Path) -> None:
    """``load_config`` returns the ``policy`` section as data, whatever the file holds: the
    commands that do not decide calls are not stopped by it."""
    path, cedar = _config(tmp_path)
    config = load_config(path, env={})
    assert (config.policy.mode, config.policy.file) == ("enforce", str(cedar))
