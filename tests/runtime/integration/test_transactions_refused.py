"""A cluster that refuses Kafka transactions (issue 34), on a real broker of this module's
own: one KRaft node with Kafka's ``StandardAuthorizer`` and a ``transaction.state.log.
replication.factor`` of 3 that its single broker cannot meet. The kafka engine stops at start
with one log line that names the cause and says that ``worker.engine: faust`` works without
transactions, and exit status 1, for each way a cluster refuses:

* no WRITE on the worker's transactional id (a DENY ACL on the stack's ``<app_id>-`` prefix;
  every other resource has no ACL, which ``allow.everyone.if.no.acl.found`` allows):
  librdkafka's fatal TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
* no transaction coordinator (``__transaction_state`` cannot be created with 3 replicas on
  one broker): InitProducerId never completes, and ``worker.init_timeout_s`` (3 s here)
  bounds the wait.

The faust engine, which needs no transactions, runs on the same broker and stack where the
kafka engine was refused. The session's shared broker is never touched; the mapping of each
error to its line is ``tests/runtime/unit/test_kafka_engine_refused.py``."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from worker_harness import Stack, WorkerProcess, make_stack

from worker.tools import broker

#: What a refusing node adds to the development broker's settings.
REFUSING = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
    "transaction.state.log.replication.factor": "3",
}
FAUST = "run worker.engine: faust, which works without transactions"


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory,
             kafka_bootstrap: str) -> Iterator[str]:
    """A broker of this module's own (spare ports, a temp data directory, the jars the
    session's broker uses) that refuses transactions; stopped after the module."""
    paths = broker.Paths(home=broker.Paths.from_env().home,
                         data=tmp_path_factory.mktemp("refusing-broker"))
    java = broker.find_java()
    broker.ensure_jars(paths)
    port = broker.free_ports(2)
    ports = broker.Ports(port, port + 1)
    broker.prepare_data_dir(java, paths, ports)
    with paths.properties.open("a") as properties:
        properties.writelines(f"{key}={value}\n" for key, value in REFUSING.items())
    pid = broker.spawn(java, paths)
    try:
        broker.wait_ready(pid, paths, ports.bootstrap, broker.START_TIMEOUT_S)
        broker.coordinator_ready(ports.bootstrap, 30.0)
        yield ports.bootstrap
    finally:
        broker.terminate(pid)
        paths.pid_file.unlink(missing_ok=True)


@pytest.fixture
def stack(refusing: str, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with make_stack(refusing, request.node.name, partitions=1, worker__engine="kafka",
                    worker__instance_id="worker-0", worker__init_timeout_s="3") as made:
        yield made


def _deny_transactional_ids(stack: Stack) -> None:
    """No WRITE on the stack's transactional ids for anyone (the broker's PLAINTEXT clients
    are all ``User:ANONYMOUS``)."""
    deny = AclBinding(ResourceType.TRANSACTIONAL_ID, f"{stack.app_id}-",
                      ResourcePatternType.PREFIXED, "User:ANONYMOUS", "*", AclOperation.WRITE,
                      AclPermissionType.DENY)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    for future in admin.create_acls([deny]).values():
        future.result(timeout=30)
    # the ACL reaches the broker's authorizer through the metadata log: DescribeAcls answers
    # from that authorizer, so once it lists the binding, the broker enforces it
    wanted = AclBindingFilter(ResourceType.TRANSACTIONAL_ID, f"{stack.app_id}-",
                              ResourcePatternType.PREFIXED, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)
    deadline = time.monotonic() + 30
    while not admin.describe_acls(wanted).result(timeout=30):
        assert time.monotonic() < deadline, "the broker never listed the DENY ACL"
        time.sleep(0.1)


def _refused(stack: Stack, tmp_path: Path) -> str:
    """Run the kafka engine; return its one ``not starting`` line after its exit status 1."""
    worker = WorkerProcess(stack, tmp_path / "kafka.log")
    try:
        assert worker.proc.wait(90) == 1, worker.tail()
    finally:
        if worker.proc.poll() is None:
            worker.kill()
    log = worker.log()
    assert "kafka engine ready" not in log
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if "not starting:" in line]
    assert len(lines) == 1, log
    assert len([line for line in log.splitlines() if "worker.engine: faust" in line]) == 1, log
    assert FAUST in lines[0]
    assert re.search(r"\bERROR\b", lines[0]), lines[0]
    return lines[0]


def test_no_write_on_the_transactional_id_stops_the_kafka_engine(
        stack: Stack, tmp_path: Path) -> None:
    """A DENY on the stack's transactional ids: refused at once (no wait for the time-out),
    naming the ACL; then the faust engine runs the same stack on the same broker."""
    _deny_transactional_ids(stack)
    began = time.monotonic()
    line = _refused(stack, tmp_path)
    assert (f"the cluster denies this worker's principal the transactional id "
            f"{stack.app_id}-worker-0 (Kafka ACLs") in line, line
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in line
    assert time.monotonic() - began < 60

    faust_stack = Stack(stack.bootstrap, stack.app_id, stack.partitions,
                        {**stack.settings, "LATCH_WORKER__ENGINE": "faust"})
    faust = WorkerProcess(faust_stack, tmp_path / "faust.log")
    try:
        faust.wait_ready()
        assert faust.stop() == 0, faust.tail()
    finally:
        if faust.proc.poll() is None:
            faust.kill()


def test_no_transaction_coordinator_stops_the_kafka_engine_after_its_init_timeout(
        stack: Stack, tmp_path: Path) -> None:
    """Allowed, but ``__transaction_state`` cannot have its 3 replicas: InitProducerId never
    completes; the engine gives up after ``worker.init_timeout_s`` and says why."""
    line = _refused(stack, tmp_path)
    assert (f"no transaction coordinator registered transactional id {stack.app_id}-worker-0 "
            "within 3s (worker.init_timeout_s)") in line, line
    assert "transaction.state.log.replication.factor" in line
