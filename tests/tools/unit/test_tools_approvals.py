"""``latch approve|deny|edit`` with no approver key (issue 32 item 3): a worker never counts an
unsigned decision, so the tool sends none; it exits 2 and says why, before any Kafka client
exists. With ``approvers.key_id`` it signs and sends.

Who sends what: the operator runs the tool with its configuration; the tool is the
approver's, and only its key makes the decision count."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from builders import APPROVER, approver_env, approver_key_id

from worker.tools import approvals


class Recorder:
    """Stands in for the Publisher: records what the tool would send."""

    made: ClassVar[list[Recorder]] = []

    def __init__(self, config: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        Recorder.made.append(self)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, args))


def _config(tmp_path: Path) -> str:
    path = tmp_path / "latch.yaml"
    path.write_text("topics:\n  control: ctl\n", encoding="utf-8")
    return str(path)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> type[Recorder]:
    Recorder.made = []
    monkeypatch.setattr(approvals, "Publisher", Recorder)
    return Recorder


@pytest.mark.parametrize("kind", ["approve", "deny", "edit"])
def test_without_a_key_id_nothing_is_sent_and_the_tool_says_why(
        kind: str, tmp_path: Path, recorder: type[Recorder],
        capsys: pytest.CaptureFixture[str]) -> None:
    """No ``approvers.key_id``: exit 2, a message naming ``approvers.key_id`` and saying the
    decision would not count, and no Publisher made (before: sent unsigned, exit 0)."""
    config = _config(tmp_path)
    (tmp_path / "args.json").write_text('{"path": "/a"}', encoding="utf-8")
    extra = ["--arguments", str(tmp_path / "args.json")] if kind == "edit" else []
    status = getattr(approvals, kind)(["r1", "c1", "--by", "ann", "--config", config,
                                       *extra])
    err = capsys.readouterr().err
    assert status == 2
    assert "approvers.key_id" in err and "never counts" in err
    assert recorder.made == []


def test_with_a_key_id_the_decision_is_sent(
        tmp_path: Path, recorder: type[Recorder], monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``approvers.key_id`` (its key readable), the decision is handed to the
    Publisher, which signs it."""
    for name, value in approver_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LATCH_APPROVERS__KEY_ID", approver_key_id(APPROVER))
    status = approvals.approve(["r1", "c1", "--by", APPROVER, "--config", _config(tmp_path)])
    assert status == 0
    assert [c[0] for c in recorder.made[0].calls] == ["approve", "flush"]


def test_a_key_id_whose_key_cannot_be_read_is_refused_before_sending(
        tmp_path: Path, recorder: type[Recorder], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``approvers.key_id`` set but its ``env:`` variable missing: exit 2 naming the key id,
    nothing sent, no key bytes shown."""
    for name, value in approver_env().items():
        if name.startswith("LATCH_APPROVERS__"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("LATCH_APPROVERS__KEY_ID", approver_key_id(APPROVER))
    status = approvals.deny(["r1", "c1", "--by", APPROVER, "--config", _config(tmp_path)])
    assert status == 2 and recorder.made == []
    assert approver_key_id(APPROVER) in capsys.readouterr().err
