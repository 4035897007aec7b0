"""The control topic: a cancel, and a person's decision on a call waiting for approval
(``approve``, ``deny``, ``edit``), is forwarded into its run's events partition, so that it
takes its place in the run's one ordered history (take-over and replay decide the same); any
other control record goes to the DLQ.

Engine-independent: :func:`route` decides, the engine sends.
"""

from __future__ import annotations

import orjson

from worker.core import DlqReason, Emit, decode
from worker.core.envelope import Cancel, Decision, Rejected
from worker.core.outputs import dlq_record
from worker.runtime.step import Record

__all__ = ["Forward", "route"]

#: A cancel marker to append to the events topic: (key, value).
Forward = tuple[bytes, bytes]


def route(record: Record) -> Forward | Emit:
    """Where one control record goes: a cancel marker for the events topic, or a DLQ record."""
    key, value, _, source = record
    envelope = decode(key, value)
    if isinstance(envelope, Cancel):
        marker = {"v": 1, "run_id": envelope.run_id, "type": "cancel", "reason": envelope.reason}
        return envelope.run_id.encode(), orjson.dumps(marker)
    if isinstance(envelope, Decision):  # the checked fields only, bounded (envelope.py)
        decision = {"v": 1, "run_id": envelope.run_id, "type": envelope.decision,
                    "tool_call_id": envelope.tool_call_id, "by": envelope.by,
                    "reason": envelope.reason}
        if envelope.arguments is not None:
            decision["arguments"] = envelope.arguments
        if envelope.signature is not None:  # (checked where it is applied: core/approvers.py)
            decision["signature"] = envelope.signature._asdict()
        if source is not None:  # (a repeat of this forward is known by it: envelope.py)
            decision["control"] = [source.partition, source.offset]
        return envelope.run_id.encode(), orjson.dumps(decision)
    if not isinstance(envelope, Rejected):
        envelope = Rejected(DlqReason.INVALID_ENVELOPE, "the control topic takes only cancel, "
                            "approve, deny and edit envelopes",
                            getattr(envelope, "run_id", None))
    return dlq_record(envelope, key, value, source)
