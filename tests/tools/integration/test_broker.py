"""The local Kafka broker that ``latch broker`` runs: it answers, round-trips a message, and
its ``start``/``status``/``stop`` behave as documented."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from worker.tools import broker

MakeTopic = Callable[..., str]


def _managed_pid(bootstrap: str) -> int:
    pid, address = broker.status()
    if pid is None or address != bootstrap:
        pytest.skip(f"the broker at {bootstrap} is not the one worker.tools.broker manages")
    return pid


def _kafka_processes(properties: Path) -> list[int]:
    """Pids of running Kafka JVMs that were started with ``properties``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" in args and str(properties).encode() in args:
            pids.append(int(cmdline.parent.name))
    return pids


def test_broker_answers(kafka_bootstrap: str) -> None:
    """The managed broker answers at the test bootstrap address as a single node."""
    assert broker.answers(kafka_bootstrap)
    meta = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10)
    assert len(meta.brokers) == 1


def test_message_round_trip(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    """A message produced with idempotence to a fresh topic is consumed back with its key and
    value, and its offset commits."""
    topic = make_topic("roundtrip")
    value = f"hello {uuid.uuid4()}".encode()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    producer.produce(topic, key=b"run-1", value=value)
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"latch-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        message = None
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None:
                break
        assert message is not None, "nothing consumed within 60s"
        assert message.error() is None, message.error()
        assert (message.key(), message.value()) == (b"run-1", value)
        consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()


def test_status_reports_running(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``latch broker status`` prints the running broker's pid and bootstrap address, exit 0."""
    pid = _managed_pid(kafka_bootstrap)
    assert broker.main(["status"]) == broker.EXIT_OK
    assert capsys.readouterr().out == f"running pid={pid} bootstrap={kafka_bootstrap}\n"


def test_start_is_idempotent(kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``latch broker start`` on a running broker prints its address and starts no second Kafka
    process."""
    pid = _managed_pid(kafka_bootstrap)
    port = kafka_bootstrap.rpartition(":")[2]
    assert broker.main(["start", "--port", port]) == broker.EXIT_OK
    assert capsys.readouterr().out == f"{kafka_bootstrap}\n"
    assert broker.status()[0] == pid
    assert _kafka_processes(broker.Paths.from_env().properties) == [pid]


@pytest.fixture
def second_broker_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A separate data dir for a second broker; it is stopped whatever the test does."""
    data = tmp_path / "broker"
    monkeypatch.setenv("LATCH_BROKER_DIR", str(data))
    yield data
    broker.stop(timeout=10)


def test_stop_then_restart_keeps_data(
    second_broker_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second broker, started fresh, has its group coordinator ready; stopped and started
    again it still holds the topic created before."""
    port = broker.free_ports(2)
    controller = port + 1
    start = ["start", "--port", str(port), "--controller-port", str(controller)]
    assert broker.main(start) == broker.EXIT_OK
    bootstrap = capsys.readouterr().out.strip()
    assert bootstrap == f"127.0.0.1:{port}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # a fresh broker is started with its group coordinator loaded: a group request answers at
    # once (a worker's first join gets no GroupCoordinatorNotAvailable)
    admin.describe_consumer_groups(["latch-first-group"], request_timeout=5)[
        "latch-first-group"].result(timeout=10)
    admin.create_topics([NewTopic("survives-restart", 1, 1)])["survives-restart"].result(60)

    assert broker.main(["stop"]) == broker.EXIT_OK
    assert broker.main(["status"]) == broker.EXIT_NOT_RUNNING
    assert not (second_broker_dir / "broker.pid").exists()
    assert not broker.answers(bootstrap, timeout=2)

    assert broker.main(start) == broker.EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1] == bootstrap
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    assert "survives-restart" in topics
