"""The pure core of Latch: provider events in, outcomes out, no I/O and no clock.

Public API::

    Assembler(settings).feed_record(key, value, now_ms) -> list[Emit]
    Assembler(settings).feed(envelope, now_ms) -> list[Emit]
    Assembler(settings).expire(now_ms) -> list[Emit]

Nothing under ``worker.core`` imports faust, aiokafka, confluent_kafka, opentelemetry,
asyncio or socket, or reads the time; ``tests/core/unit/test_core_purity.py`` holds it to that.
"""

from worker.core.assembler import Assembler
from worker.core.envelope import decode
from worker.core.model import CallState, DlqReason, Emit, Reason, RunStatus, Topic
from worker.core.settings import AssembleSettings

__all__ = [
    "AssembleSettings",
    "Assembler",
    "CallState",
    "DlqReason",
    "Emit",
    "Reason",
    "RunStatus",
    "Topic",
    "decode",
]
