"""The results topic: each runner's result is forwarded into its run's events partition as a
``tool.result`` record, so that the result latch (``worker.core.pairing``) pairs it in the
run's one ordered history (take-over and replay decide the same); a record that is not a
runner's result goes to the DLQ, with its bytes and why; the latch's own results
(``tool_timeout``, ``"by": "latch"``) are not forwarded.

Who writes the results topic: the runners (``worker.client.runner``, an MCP runner), and the
worker's own ``tool_timeout`` results. Whoever else writes there can do no more than a runner
could: a result pairs only with a committed call of its run by ``tool_call_id``, ``name`` and
``idempotency_key``, the first one counts, and its content is bounded (``results.max_bytes``:
over it, only its size is forwarded).

Engine-independent: :func:`route` decides, the engine sends.
"""

from __future__ import annotations

from typing import Any

import orjson

from worker.core import DlqReason, Emit
from worker.core.envelope import MAX_IDEMPOTENCY_KEY_LENGTH, RESULT, Rejected
from worker.core.outputs import dlq_record
from worker.core.pairing import LATCH, result_size
from worker.core.settings import MAX_ID_CHARACTERS, ResultSettings
from worker.runtime.step import Record

__all__ = ["FORWARD_RECORD_BYTES", "forward_limit", "route"]

#: The largest forwarded record (its JSON): the events topic's records are bounded at 1 MiB
#: by Kafka's default ``max.message.bytes``; a result whose record would be larger (JSON
#: escapes can make text up to six times longer) is forwarded without its content, and
#: answered ``result_too_large``.
FORWARD_RECORD_BYTES = 900_000


def forward_limit(settings: ResultSettings) -> int:
    """The most bytes of result a forwarded record carries: the largest ``max_bytes`` of the
    section and of any tool (the core decides each call's own)."""
    return max([settings.max_bytes, *(own.max_bytes for _, own in settings.tools
                                      if own.max_bytes is not None)])


def route(record: Record, limit: int) -> tuple[bytes, bytes] | Emit | None:
    """Where one results record goes: a ``tool.result`` record for the events topic, keyed
    by its run; a DLQ record; or nowhere (None: the latch's own result)."""
    key, value, _, source = record
    try:
        doc: Any = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return _dlq(DlqReason.UNDECODABLE, f"not JSON: {exc.msg} (char {exc.pos})", None,
                    record)
    problem = _problem(doc, key)
    if problem is not None:
        reason, detail = problem
        run_id = doc.get("run_id") if isinstance(doc, dict) else None
        return _dlq(reason, detail, run_id if isinstance(run_id, str) else None, record)
    if doc.get("by") == LATCH:
        return None
    content, structured = doc["content"], doc.get("structured")
    size = result_size(content, structured)
    marker: dict[str, Any] = {
        "v": 1, "run_id": doc["run_id"], "type": RESULT, "tool_call_id": doc["tool_call_id"],
        "name": doc["name"], "idempotency_key": doc["idempotency_key"],
        "is_error": doc["is_error"], "size": size}
    if size <= limit:
        marker["content"] = content
        if structured is not None:
            marker["structured"] = structured
    if source is not None:
        marker["source"] = [source.partition, source.offset]
    forwarded = orjson.dumps(marker)
    if len(forwarded) > FORWARD_RECORD_BYTES:
        marker.pop("content", None)
        marker.pop("structured", None)
        forwarded = orjson.dumps(marker)
    return doc["run_id"].encode(), forwarded


def _problem(doc: Any, key: bytes | None) -> tuple[DlqReason, str] | None:
    """Why ``doc`` is not a runner's result (schemas/tool-result.schema.json), or None."""
    if not isinstance(doc, dict):
        return DlqReason.INVALID_ENVELOPE, "a result is a JSON object"
    if doc.get("v") != 1 or type(doc.get("v")) is not int:
        return DlqReason.UNSUPPORTED_VERSION, "v is not 1"
    run_id = doc.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return DlqReason.INVALID_ENVELOPE, "run_id is missing or empty"
    if key is None or key != run_id.encode():
        return DlqReason.KEY_MISMATCH, "the record key differs from run_id"
    for field, most in (("tool_call_id", MAX_ID_CHARACTERS), ("name", MAX_ID_CHARACTERS),
                        ("idempotency_key", MAX_IDEMPOTENCY_KEY_LENGTH)):
        value = doc.get(field)
        if not isinstance(value, str) or not value or len(value) > most:
            return DlqReason.INVALID_ENVELOPE, (f"{field} is missing, empty or longer than "
                                                f"{most} characters")
    if type(doc.get("is_error")) is not bool:
        return DlqReason.INVALID_ENVELOPE, "is_error is not a boolean"
    if not isinstance(doc.get("content"), str):
        return DlqReason.INVALID_ENVELOPE, "content is not a string"
    return None


def _dlq(reason: DlqReason, detail: str, run_id: str | None, record: Record) -> Emit:
    return dlq_record(Rejected(reason, detail, run_id), record.key, record.value, record.source)
