"""docker-compose.yml stays in step with the code: services, pinned Kafka, real config keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.tools.broker import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
CONFIG_SCHEMA = ROOT / "schemas" / "config.schema.json"
PREFIX = "LATCH_"


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    compose = yaml.safe_load(COMPOSE.read_text())
    found: dict[str, Any] = compose["services"]
    return found


@pytest.fixture(scope="module")
def config_schema() -> dict[str, Any]:
    assert CONFIG_SCHEMA.is_file(), f"{CONFIG_SCHEMA} is missing (the config contract)"
    schema: dict[str, Any] = json.loads(CONFIG_SCHEMA.read_text())
    return schema


def _environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment, in either compose form (mapping or KEY=VALUE list)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.partition("=")[::2] for item in env)
    return {str(key): str(value) for key, value in env.items()}


def _schema_path(variable: str) -> list[str]:
    """LATCH_KAFKA__BOOTSTRAP_SERVERS -> ["kafka", "bootstrap_servers"] (the config's rule)."""
    section, _, key = variable.removeprefix(PREFIX).lower().partition("__")
    return [section, key]


def _declared(schema: dict[str, Any], path: list[str]) -> bool:
    node = schema
    for part in path:
        node = node.get("properties", {}).get(part)
        if node is None:
            return False
    return True


def test_services_exist(services: dict[str, Any]) -> None:
    """docker-compose.yml defines kafka, topics, worker and demo-publisher, the last in the demo
    profile only."""
    assert {"kafka", "topics", "worker", "demo-publisher"} <= set(services)
    assert services["demo-publisher"].get("profiles") == ["demo"]


def test_kafka_image_is_the_pinned_version(services: dict[str, Any]) -> None:
    """The kafka service runs the Kafka version the broker tool pins."""
    assert services["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"


def test_kafka_is_single_node_kraft(services: dict[str, Any]) -> None:
    """The kafka service is one KRaft node (broker and controller), replication factor 1 for the
    offsets and transaction logs, with a healthcheck."""
    env = _environment(services["kafka"])
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@kafka:9093"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert "healthcheck" in services["kafka"]


def test_latch_services_reach_kafka_inside_the_network(services: dict[str, Any]) -> None:
    """Latch's services reach Kafka as ``kafka:9092``, wait for it to be healthy, build from
    ``deploy/Dockerfile`` and run the documented commands."""
    for name in ("topics", "worker", "demo-publisher"):
        service = services[name]
        assert _environment(service)["LATCH_KAFKA__BOOTSTRAP_SERVERS"] == "kafka:9092", name
        assert service["depends_on"]["kafka"]["condition"] == "service_healthy", name
        assert service["build"]["dockerfile"] == "deploy/Dockerfile", name
    assert services["topics"]["command"] == ["topics", "create"]
    assert services["worker"]["command"] == ["worker"]
    assert services["demo-publisher"]["command"] == ["publish", "/app/examples/demo.jsonl"]


def test_every_latch_variable_names_a_config_key(
    services: dict[str, Any], config_schema: dict[str, Any]
) -> None:
    """Every ``LATCH_`` variable in docker-compose.yml names a key the config schema declares."""
    variables = {
        variable
        for service in services.values()
        for variable in _environment(service)
        if variable.startswith(PREFIX)
    }
    assert variables, "no LATCH_ variables in docker-compose.yml"
    unknown = sorted(
        variable
        for variable in variables
        if "__" not in variable or not _declared(config_schema, _schema_path(variable))
    )
    assert not unknown, f"not keys of {CONFIG_SCHEMA.name}: {unknown}"


def test_the_variable_check_catches_typos(config_schema: dict[str, Any]) -> None:
    """The variable check itself refuses misspelt section or key names."""
    assert _schema_path("LATCH_KAFKA__BOOTSTRAP_SERVERS") == ["kafka", "bootstrap_servers"]
    for variable, declared in [
        ("LATCH_KAFKA__BOOTSTRAP_SERVERS", True),
        ("LATCH_KAFKA__BOOTSTRAP_SERVER", False),
        ("LATCH_KAFAK__BOOTSTRAP_SERVERS", False),
    ]:
        assert _declared(config_schema, _schema_path(variable)) is declared, variable


def test_the_worker_runs_the_kafka_engine_under_a_stable_instance_id(
        services: dict[str, Any]) -> None:
    """The compose worker runs the default engine, kafka (issue 34), with a fixed
    ``worker.instance_id`` (its transactional.id survives a restart), and the file has no
    duplicate key (a second ``environment:`` of the worker once replaced the first)."""
    env = _environment(services["worker"])
    assert env["LATCH_WORKER__ENGINE"] == "kafka"
    assert env["LATCH_WORKER__INSTANCE_ID"] == "0"
    assert env["LATCH_WORKER__HTTP_PORT"] == "9464"

    class Strict(yaml.SafeLoader):
        pass

    def no_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
        keys = [k.value for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"]
        assert len(keys) == len(set(keys)), f"duplicate keys at line {node.start_mark.line + 1}"
        return loader.construct_mapping(node)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, no_duplicates)
    yaml.load(COMPOSE.read_text(), Loader=Strict)  # a SafeLoader's subclass
