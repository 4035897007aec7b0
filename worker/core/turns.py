"""PLACEHOLDER until the turns branch lands (replaced at merge)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple


class Answer(NamedTuple):
    call_id: str
    name: str
    kind: str
    is_error: bool
    content: str
    structured: object | None = None


class TurnEntry(NamedTuple):
    tool_call_id: str
    name: str
    outcome: str
    reason: str | None
    answer: Answer | None
    size: int | None


def tool_messages(provider: str, answers: Sequence[Answer]) -> list[dict[str, Any]]:
    return [{"role": "tool", "tool_call_id": a.call_id, "content": a.content} for a in answers]


def turn_record(run_id: str, tenant: str | None, provider: str, final_key: str,
                entries: Sequence[TurnEntry]) -> dict[str, Any]:
    answers = [e.answer for e in entries if e.answer is not None]
    return {"v": 1, "run_id": run_id, "tenant": tenant, "provider": provider,
            "final_idempotency_key": final_key, "messages": tool_messages(provider, answers),
            "outcomes": [{"tool_call_id": e.tool_call_id, "name": e.name, "outcome": e.outcome,
                          "reason": e.reason, "is_error": e.answer.is_error if e.answer else None,
                          "size": e.size} for e in entries]}
