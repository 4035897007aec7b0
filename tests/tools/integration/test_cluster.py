"""A three-node cluster (``latch broker start --nodes 3``) keeps taking writes with
``acks=all`` while the leader of a partition is killed, and elects a new controller when the
active one is killed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from worker.tools import broker


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[broker.Cluster]:
    monkeypatch.setenv("LATCH_BROKER_DIR", str(tmp_path_factory.mktemp("cluster")))
    broker.start_cluster(3, broker.free_ports(6), timeout=180)
    found = broker.Cluster.load(broker.Paths.from_env())
    assert found is not None
    try:
        yield found
    finally:
        broker.stop()


def _leader(admin: AdminClient, topic: str) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        leader = meta.partitions[0].leader if meta.partitions else -1
        if leader > 0:
            return int(leader)
        time.sleep(0.5)
    raise TimeoutError(f"{topic} has no leader")


def _write(bootstrap: str, topic: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "message.timeout.ms": 60000})
    producer.produce(topic, key=b"run", value=value)
    assert producer.flush(90) == 0


def test_writes_go_on_while_a_leader_and_the_controller_die(cluster: broker.Cluster) -> None:
    """Kill the partition's leader: a write with acks=all still succeeds (2 of 3 in sync) and
    another node leads. Once it is back, kill the active controller: another node takes the
    quorum over and writes go on. Each node comes back with its data."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = f"latch-test-cluster-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(timeout=60)
    _write(cluster.bootstrap, topic, b"before")

    leader = _leader(admin, topic)
    assert broker.kill_node(leader)
    _write(cluster.bootstrap, topic, b"without the leader")
    assert _leader(admin, topic) != leader

    broker.start_node(leader, timeout=180)  # two of three again: the quorum can vote

    controller = cluster.active_controller()
    assert controller is not None
    assert broker.kill_node(controller)
    deadline = time.monotonic() + 60
    while cluster.active_controller() in (controller, None) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster.active_controller() not in (controller, None)
    _write(cluster.bootstrap, topic, b"without the controller")
    broker.start_node(controller, timeout=180)
    _write(cluster.bootstrap, topic, b"after")
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(meta.partitions[0].replicas) == 3
