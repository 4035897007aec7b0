"""schemas/audit.schema.json holds the audit record to the truth (issue 32, item 10): a
``refused`` outcome says ``output_refused`` and what was refused, no other outcome carries
``refused``; the digest is a keyed HMAC with its key id, or the size alone, never SHA-256."""

from __future__ import annotations

from typing import Any

import pytest

from worker.runtime.schemas import validator

BASE: dict[str, Any] = {
    "v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat", "tool_call_id": "c1",
    "name": "read_file", "outcome": "committed", "reason": None, "policy": {"mode": "off"},
    "arguments": {"bytes": 16}, "trace_id": None, "source": None, "idempotency_key": "r1:c1"}
HMAC = {"bytes": 16, "hmac": "ab" * 32, "key_id": "audit-1"}
REFUSED = {"outcome": "refused", "reason": "output_refused",
           "refused": {"outcome": "committed", "reason": None, "error": "MSG_SIZE_TOO_LARGE"}}


@pytest.mark.parametrize("record", [
    BASE, {**BASE, "arguments": HMAC}, {**BASE, "arguments": None}, {**BASE, **REFUSED},
    {**BASE, "outcome": "error", "reason": "invalid_json"},
    {**BASE, **REFUSED, "refused": {"outcome": "error", "reason": "invalid_json",
                                    "error": "INVALID_RECORD"}},
], ids=["size", "hmac", "none", "refused", "error", "refused-error"])
def test_records_the_worker_writes_are_valid(record: dict[str, Any]) -> None:
    """The size alone, a keyed digest, no digest; a refused committed call or error."""
    assert list(validator("audit").iter_errors(record)) == []


@pytest.mark.parametrize("record", [
    {**BASE, "arguments": {"bytes": 16, "sha256": "ab" * 32}},  # the unkeyed hash, gone
    {**BASE, "arguments": {"bytes": 16, "hmac": "ab" * 32}},  # an HMAC naming no key
    {**BASE, "arguments": {"bytes": 16, "key_id": "audit-1"}},  # a key id without HMAC
    {**BASE, "outcome": "refused", "reason": "output_refused"},  # refused, not saying what
    {**BASE, **REFUSED, "reason": None},  # refused with another reason
    {**BASE, "refused": REFUSED["refused"]},  # committed, yet carrying refused
], ids=["sha256", "hmac-no-key", "key-no-hmac", "refused-bare", "refused-reason",
        "committed-refused"])
def test_untruths_and_unkeyed_digests_are_invalid(record: dict[str, Any]) -> None:
    """What the audit record must never say fails the schema."""
    assert list(validator("audit").iter_errors(record)) != []
