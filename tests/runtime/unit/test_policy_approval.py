"""A Cedar permit annotated ``@approval("required")`` (issue 26): a call it permits waits for
a person's approval (the pending topic), naming the policy; a call another permit allows
commits; a forbid still denies."""

from __future__ import annotations

from builders import CHAT, PATH_SCHEMA, feed, provider_run, values

from worker.core import Assembler, Topic
from worker.core.policy import LOG_ONLY, PolicyRequest
from worker.runtime.governance.policy import CedarPolicy

POLICIES = """\
@id("reads")
permit(principal, action, resource == Latch::Tool::"read_file");

@id("deletes-reviewed") @approval("required")
permit(principal, action, resource == Latch::Tool::"delete_file");
"""


def test_the_annotation_marks_the_decision() -> None:
    """Only a decision whose determining permit carries the annotation asks for approval."""
    policy = CedarPolicy(POLICIES)

    def ask(tool: str) -> bool:
        return policy.decide(PolicyRequest("t1", tool, {}, {"path": "/a"}, CHAT, "r1")).approval

    assert ask("delete_file") and not ask("read_file") and not ask("other")


def test_a_call_the_annotated_permit_allows_is_held() -> None:
    """Through the assembler: the read commits, the delete goes to the pending topic with
    ``required_by: ["policy"]`` and the policy's id; no final message yet."""
    asm = Assembler()
    asm.policy = CedarPolicy(POLICIES)
    emits = feed(asm, provider_run(CHAT, "r1", {"read_file": PATH_SCHEMA,
                                                "delete_file": PATH_SCHEMA},
                                   [("c1", "read_file", '{"path": "/a"}'),
                                    ("c2", "delete_file", '{"path": "/b"}')]))
    assert [e.topic for e in emits] == [Topic.COMMITTED, Topic.AUDIT, Topic.PENDING]
    (pending,) = values(emits, Topic.PENDING)
    assert pending["approval"]["required_by"] == ["policy"]
    assert pending["approval"]["policies"] == ["deletes-reviewed"]


def test_log_only_never_holds_a_call_for_the_policy() -> None:
    """In ``log_only`` the policy never changes what is committed: the call the annotated
    permit allows commits at once (nothing pending), its audit record carrying the decision;
    only ``enforce`` holds it for approval."""
    asm = Assembler()
    asm.policy = CedarPolicy(POLICIES, LOG_ONLY)
    emits = feed(asm, provider_run(CHAT, "r1", {"delete_file": PATH_SCHEMA},
                                   [("c2", "delete_file", '{"path": "/b"}')]))
    assert Topic.PENDING not in [e.topic for e in emits]
    (committed,) = values(emits, Topic.COMMITTED)
    assert committed["call_id"] == "c2"
    (audit,) = values(emits, Topic.AUDIT)
    assert audit["outcome"] == "committed"
    assert audit["policy"]["mode"] == LOG_ONLY and audit["policy"]["allow"] is True
