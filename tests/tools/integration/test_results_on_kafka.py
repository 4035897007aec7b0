"""``latch results RUN`` on the real broker (issue 26, item 2): the run's committed calls,
error results and runners' results, joined, at read_committed, within a bounded time; and
(issue 36) the run's turn record in their place once the result latch has written it."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from conftest import MakeTopic

from worker.tools import results


def _config(tmp_path: Path, bootstrap: str, committed: str, errors: str, out: str,
            turns: str) -> str:
    path = tmp_path / f"latch-{turns}.yaml"
    path.write_text(f"kafka:\n  bootstrap_servers: '{bootstrap}'\n"
                    f"topics:\n  committed: {committed}\n  errors: {errors}\n"
                    f"  results: {out}\n  turns: {turns}\n")
    return str(path)


def test_latch_results_joins_one_runs_calls_and_answers(
        kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two committed calls (one answered by a runner, one not), an error result, a result in
    an aborted transaction (never shown) and another run's records (left out): JSON lines,
    one per call, in call order, ``result`` / ``pending`` / ``error``; ``--table`` shows the
    same calls; ``--timeout 0`` on the same topics prints nothing and exits 1 saying why. A
    turns topic that does not exist is no error (the join is printed)."""
    committed = make_topic("committed", partitions=2)
    errors, out = make_topic("errors", partitions=2), make_topic("results", partitions=2)
    missing = f"latch-test-missing-turns-{uuid.uuid4().hex[:8]}"
    config = _config(tmp_path, kafka_bootstrap, committed, errors, out, missing)

    def call(run: str, call_id: str, index: int) -> bytes:
        return orjson.dumps({"v": 1, "run_id": run, "tenant": None,
                             "provider": "anthropic.messages", "call_id": call_id,
                             "name": "add", "index": index, "arguments": {"a": 1},
                             "idempotency_key": f"{run}:{call_id}"})

    def result(run: str, call_id: str, content: str) -> bytes:
        return orjson.dumps({"v": 1, "run_id": run, "tenant": None,
                             "provider": "anthropic.messages", "tool_call_id": call_id,
                             "name": "add", "idempotency_key": f"{run}:{call_id}",
                             "is_error": False, "content": content})

    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for topic, key, value in [
        (committed, b"r1", call("r1", "t1", 0)), (committed, b"r1", call("r1", "t2", 1)),
        (committed, b"r2", call("r2", "t1", 0)),
        (errors, b"r1", orjson.dumps({"tool_call_id": "t3", "name": "add", "index": 2,
                                      "is_error": True, "state": "failed",
                                      "reason": "invalid_json", "content": "invalid_json"})),
        (out, b"r1", result("r1", "t1", "2")), (out, b"r2", result("r2", "t1", "other run")),
    ]:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    aborting = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"latch-test-{uuid.uuid4().hex[:8]}"})
    aborting.init_transactions(30)
    aborting.begin_transaction()
    aborting.produce(out, key=b"r1", value=result("r1", "t2", "aborted"))
    aborting.flush(30)
    aborting.abort_transaction(30)

    assert results.main(["--config", config, "r1", "--no-progress", "--timeout", "30"]) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(x["call_id"], x["status"], x.get("content")) for x in lines] == [
        ("t1", "result", "2"), ("t2", "pending", None), ("t3", "error", "invalid_json")]

    assert results.main(["--config", config, "r1", "--table", "--no-progress"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4

    assert results.main(["--config", config, "r1", "--timeout", "0", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "--timeout" in captured.err


def test_latch_results_prints_the_turn_record_once_there_is_one(
        kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run with a committed call and its answer but no turn record yet: the join; once the
    run's turn record is on the turns topic (another run's beside it, and one in an aborted
    transaction before it, never read): that record, one JSON line; ``--calls``: the join
    again; ``--table``: the outcomes."""
    committed = make_topic("committed", partitions=2)
    errors, out = make_topic("errors", partitions=2), make_topic("results", partitions=2)
    turns = make_topic("turns", partitions=2)
    config = _config(tmp_path, kafka_bootstrap, committed, errors, out, turns)
    call = {"v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat",
            "call_id": "c1", "name": "add", "index": 0, "arguments": {"a": 1},
            "idempotency_key": "r1:c1"}
    result = {"v": 1, "run_id": "r1", "tenant": None, "provider": "openai.chat",
              "tool_call_id": "c1", "name": "add", "idempotency_key": "r1:c1",
              "is_error": False, "content": "2"}

    def turn(run: str, content: str) -> dict[str, object]:
        return {"v": 1, "run_id": run, "tenant": None, "provider": "openai.chat",
                "final_idempotency_key": f"{run}:final",
                "messages": [{"role": "tool", "tool_call_id": "c1", "content": content}],
                "outcomes": [{"tool_call_id": "c1", "name": "add", "outcome": "answered",
                              "reason": None, "is_error": False, "size": len(content)}]}

    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(committed, key=b"r1", value=orjson.dumps(call))
    producer.produce(out, key=b"r1", value=orjson.dumps(result))
    assert producer.flush(30) == 0
    args = ["--config", config, "r1", "--no-progress", "--timeout", "30"]
    assert results.main(args) == 0
    assert [orjson.loads(x)["status"] for x in capsys.readouterr().out.splitlines()] == [
        "result"]

    aborting = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"latch-test-{uuid.uuid4().hex[:8]}"})
    aborting.init_transactions(30)
    aborting.begin_transaction()
    aborting.produce(turns, key=b"r1", value=orjson.dumps(turn("r1", "aborted")))
    aborting.flush(30)
    aborting.abort_transaction(30)
    producer.produce(turns, key=b"r2", value=orjson.dumps(turn("r2", "other run")))
    producer.produce(turns, key=b"r1", value=orjson.dumps(turn("r1", "2")))
    assert producer.flush(30) == 0

    assert results.main(args) == 0
    assert [orjson.loads(x) for x in capsys.readouterr().out.splitlines()] == [turn("r1", "2")]
    assert results.main([*args, "--calls"]) == 0
    assert [orjson.loads(x)["status"] for x in capsys.readouterr().out.splitlines()] == [
        "result"]
    assert results.main([*args, "--table"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("turn record of r1 (openai.chat)") and len(table) == 3
    assert table[2].split() == ["c1", "add", "answered", "-", "-", "1"]
