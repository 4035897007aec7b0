"""``latch broker start --nodes N`` without starting anything: each node's configuration, the
cluster's ports, and how the active controller is found on disk."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path

import pytest

from worker.tools import broker


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line
                and not line.startswith("#"))


def _cluster(tmp_path: Path, nodes: int = 3, port: int = 20000) -> broker.Cluster:
    return broker.Cluster(broker.Paths(tmp_path / "home", tmp_path / "data"), nodes, port, "id")


def test_a_node_of_three_names_every_voter_and_replicates(tmp_path: Path) -> None:
    """Node 2 of three: its own id, the three voters' controller ports, replication 3 with
    two in sync, and no dynamic-quorum bootstrap (the quorum is static)."""
    cluster = _cluster(tmp_path)
    props = _props(broker.server_properties(cluster.paths(2), cluster.ports(2),
                                            cluster.quorum(2)))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:20001,2@127.0.0.1:20003,3@127.0.0.1:20005")
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:20002,CONTROLLER://127.0.0.1:20003"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert "controller.quorum.bootstrap.servers" not in props
    assert cluster.bootstrap == "127.0.0.1:20000,127.0.0.1:20002,127.0.0.1:20004"


def test_the_single_broker_keeps_its_standalone_settings(tmp_path: Path) -> None:
    """Without a quorum, the one node is its own voter and nothing is replicated."""
    paths = broker.Paths(tmp_path / "home", tmp_path / "data")
    props = _props(broker.server_properties(paths, broker.Ports(9092, 9093)))
    assert props["node.id"] == "1"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:9093"
    assert props["default.replication.factor"] == props["min.insync.replicas"] == "1"
    assert "controller.quorum.voters" not in props


def test_the_active_controller_is_the_leader_of_the_latest_epoch(tmp_path: Path) -> None:
    """A node that was away remembers an old leader; the highest epoch any node saw wins."""
    cluster = _cluster(tmp_path)
    assert cluster.active_controller() is None  # nothing on disk yet
    for node, (leader, epoch) in {1: (3, 4), 2: (1, 2), 3: (3, 4)}.items():
        state = cluster.paths(node).kraft_dir / "__cluster_metadata-0" / "quorum-state"
        state.parent.mkdir(parents=True)
        state.write_text(json.dumps({"leaderId": leader, "leaderEpoch": epoch}))
    assert cluster.active_controller() == 3


def test_a_cluster_is_described_in_its_data_dir(tmp_path: Path) -> None:
    """What start writes, stop, status, kill and start --node read back."""
    cluster = _cluster(tmp_path, nodes=5, port=21000)
    cluster.save()
    loaded = broker.Cluster.load(cluster.root)
    assert loaded == cluster
    assert loaded is not None and loaded.quorum(5).replication == 3
    assert broker.Cluster.load(broker.Paths(tmp_path, tmp_path / "elsewhere")) is None


def test_broker_paths_are_absolute_whatever_they_were_given_as(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker runs in its data directory, so a relative ``LATCH_BROKER_DIR`` (or
    ``latch chaos --work-dir``) must be taken from the caller's directory, not the broker's:
    a relative path used to name a place inside the data directory, and a restarted broker
    never came back."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LATCH_BROKER_DIR", "rel/broker")
    paths = broker.Paths.from_env()
    assert paths.data == tmp_path / "rel" / "broker"
    assert broker.Paths(Path("h"), Path("d")).home == tmp_path / "h"


def test_free_ports_are_a_free_block_below_the_ephemeral_range() -> None:
    """A block no outgoing connection can take before a broker binds it: every port of it
    binds now, and all lie below the first port the kernel hands out as a source port."""
    low = broker._ephemeral_low()
    for count in (1, 2, 6):
        first = broker.free_ports(count)
        assert first >= 10_000 and first + count <= low
        with contextlib.ExitStack() as held:
            for port in range(first, first + count):
                sock = held.enter_context(socket.socket())
                sock.bind((broker.HOST, port))


def test_free_ports_skips_a_block_that_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block with a port held by a listener is passed over for the next candidate."""
    with socket.socket() as listener:
        held = broker.free_ports(1)
        listener.bind((broker.HOST, held))
        listener.listen()
        candidates = iter([held - 1, held + 1])  # the first block covers the held port

        class Scripted:
            def randrange(self, *_: object) -> int:
                return next(candidates)

        monkeypatch.setattr("worker.tools.broker.random.Random", Scripted)
        assert broker.free_ports(3) == held + 1
