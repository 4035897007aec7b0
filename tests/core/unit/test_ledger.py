"""``core/ledger.py``: what one partition's open runs share. The :class:`Ledger` counts each
DLQ record it makes and starts with nothing held, no policy and no place; the :class:`Rules`
copy the settings a run reads once, and give each run the builder of its records under them.
How a run uses both is pinned in test_run.py."""

from __future__ import annotations

import base64

from builders import CHAT, chat_tool, run_start

from worker.core.call import Call
from worker.core.envelope import Rejected, RunStart, Source, checked
from worker.core.ledger import Ledger, Rules
from worker.core.model import CallState, DlqReason, Emit, Reason, Topic
from worker.core.settings import AssembleSettings


def _start(tenant: str) -> RunStart:
    start = checked(run_start("r", CHAT, [chat_tool("f", {})], tenant=tenant), b"r", b"")
    assert isinstance(start, RunStart)
    return start


def test_a_new_ledger_holds_nothing_and_calls_no_hook() -> None:
    """A ledger starts at zero bytes held against its limit, with no counters, no sizes
    kept, no policy, no place read and nobody told of a parked run."""
    told: list[object] = []
    ledger = Ledger(100, lambda run, growth: told.append(run) or [], told.append)
    assert (ledger.held, ledger.limit, ledger.sizes, ledger.policy, ledger.at, ledger.park) \
        == (0, 100, None, None, None, None)
    assert not ledger.stats and not told


def test_a_rejected_record_is_counted_and_keeps_its_bytes() -> None:
    """``Ledger.reject`` counts ``dlq_<reason>`` and returns the DLQ record of the input
    record: its reason, detail, original bytes and where it was read."""
    ledger = Ledger(100, lambda run, growth: [], lambda run: None)
    emit = ledger.reject(Rejected(DlqReason.INVALID_ENVELOPE, "no", "r1"), b"r1", b"{",
                         Source("events", 3, 9))
    assert isinstance(emit, Emit) and emit.topic is Topic.DLQ and emit.key == "r1"
    assert emit.value["reason"] == "invalid_envelope" and emit.value["detail"] == "no"
    assert base64.b64decode(emit.value["original_b64"]) == b"{"
    assert emit.value["source"]["offset"] == 9
    assert ledger.stats == {"dlq_invalid_envelope": 1}


def test_rules_copy_the_settings_a_run_reads() -> None:
    """``Rules`` holds the settings a run reads per fragment as plain attributes, and
    ``on_invalid_json: drop_with_protocol_repair`` as a flag."""
    rules = Rules(AssembleSettings(max_tool_argument_bytes=10, max_run_text_bytes=20,
                                   allow_pipelined_execute=("f",),
                                   on_invalid_json="drop_with_protocol_repair"))
    assert (rules.argument_bytes, rules.text_bytes, rules.pipelined, rules.drop_invalid) \
        == (10, 20, frozenset({"f"}), True)
    assert Rules(AssembleSettings()).drop_invalid is False


def _invalid_json_error(rules: Rules, tenant: str) -> str:
    """The error content of a call failing ``invalid_json`` in a run of ``tenant``."""
    call = Call("0", 0, None, 0, call_id="c1", name="f")
    call.state, call.reason, call.detail = CallState.FAILED, Reason.INVALID_JSON, "bad"
    call.text = '{"a": '
    [error, _audit] = rules.outputs(_start(tenant)).outcomes([call])
    content: str = error.value["content"]
    return content


def test_a_runs_outputs_echo_only_for_a_listed_tenant() -> None:
    """``Rules.outputs`` gives a run's record builder the echo of invalid input only when the
    run's tenant is listed in ``echo_invalid_input_tenants``."""
    rules = Rules(AssembleSettings(echo_invalid_input_tenants=("t1",)))
    assert "INVALID_JSON" in _invalid_json_error(rules, "t1")
    assert "INVALID_JSON" not in _invalid_json_error(rules, "t2")
