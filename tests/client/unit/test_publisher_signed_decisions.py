"""The Publisher as an approval tool (issue 32 item 3): with ``approvers.key_id`` it signs
each ``approve``, ``deny`` and ``edit`` with that key (read from ``file:`` or ``env:``), the
worker's approvers accept exactly what it signs, and it refuses to sign for an approver who
does not own the key."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from test_publisher import FakeProducer, sent

from worker.client.publisher import Publisher
from worker.core.envelope import decode
from worker.runtime.config import ApproverSettings, Config, TopicNames
from worker.runtime.governance.approvers import approvers


def test_an_approval_tool_signs_what_the_worker_verifies(tmp_path: Path) -> None:
    """Signed approve, deny and edit reach the control topic with a ``signature``; each
    verifies against the worker's keys; an edit's arguments are bound (changing them breaks
    the signature); ``by`` other than the key's owner is refused before anything is sent."""
    (tmp_path / "k").write_text("k" * 64)
    settings = ApproverSettings(key_id="ann-1", keys={"ann-1": f"file:{tmp_path}/k"},
                                owners={"ann-1": "ann"})
    config = Config(topics=TopicNames(events="ev", control="ctl"), approvers=settings)
    fake = FakeProducer()
    pub = Publisher(config, producer=fake, clock=lambda: 5)  # type: ignore[arg-type]
    pub.approve("r1", "c1", by="ann", reason="ok")
    pub.deny("r1", "c2", by="ann")
    pub.edit("r1", "c3", {"path": "/a"}, by="ann", reason="narrowed")
    worker = approvers(config)
    assert worker is not None
    docs = [doc for _, _, doc in sent(fake)]
    assert [d["signature"]["key"] for d in docs] == ["ann-1"] * 3
    for doc in docs:
        assert worker.refusal(decode(b"r1", orjson.dumps(doc))) is None  # type: ignore[arg-type]
    moved = {**docs[2], "arguments": '{"path": "/etc"}'}
    assert worker.refusal(decode(b"r1", orjson.dumps(moved))) is not None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="belongs to ann"):
        pub.approve("r1", "c1", by="bob")
    assert len(fake.produced) == 3
