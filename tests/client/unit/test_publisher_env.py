"""The Publisher as an approval tool reads its approver key's ``env:`` reference from the
environment it is given (issue 32 item 3): ``latch demo`` hands its worker and its own
approver one environment holding a key made for the run, without writing the key into its
own process's environment."""

from __future__ import annotations

import orjson
from builders import APPROVER, approver_env, approver_key_id
from test_publisher import FakeProducer, sent

from worker.client.publisher import Publisher
from worker.core.envelope import decode
from worker.runtime.config import load_config
from worker.runtime.governance.approvers import approvers


def test_the_publisher_reads_the_key_from_the_environment_it_is_given() -> None:
    """``Publisher(config, env=...)`` signs with a key whose ``env:`` variable is only in
    ``env`` (a demo or a test hands its worker and its approver one environment without
    writing the key into its own)."""
    env = approver_env() | {"LATCH_APPROVERS__KEY_ID": approver_key_id(APPROVER),
                            "LATCH_TOPICS__CONTROL": "ctl"}
    config = load_config(None, env=env)
    fake = FakeProducer()
    pub = Publisher(config, producer=fake, env=env)  # type: ignore[arg-type]
    pub.approve("r1", "c1", by=APPROVER, reason="ok")
    ((_, _, doc),) = sent(fake)
    keys = approvers(config, env)
    assert keys.refusal(decode(b"r1", orjson.dumps(doc))) is None  # type: ignore[arg-type]
