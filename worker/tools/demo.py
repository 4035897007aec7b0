"""``latch demo``: Latch end to end on a real broker, in one command.

::

    latch demo [--config FILE] [--keep] [--timeout S] [--file FILE] [--policy FILE | --no-policy]

1. **broker**: use the cluster at ``kafka.bootstrap_servers`` if one answers; otherwise, when
   that address is on this machine, start the local broker (:mod:`worker.tools.broker`);
2. **topics**: provision every topic (:func:`worker.runtime.admin.create`, as
   ``latch topics create``);
3. **worker**: start ``python -m worker worker`` with the same configuration and environment,
   and wait until its consumer group owns the events partitions;
4. **publish**: send ``examples/demo.jsonl`` with run ids under a prefix unique to this
   invocation (so repeated demos never collide); a cancel is sent after the first events of
   its run, and that run's later envelopes are held back until the worker has applied the
   cancel, then sent (the worker ignores them, as the contract says);
5. **outcomes**: print each record the worker emits for these runs (``latch tail``'s lines)
   until every run has its final message and its turn record, or ``--timeout`` seconds pass.
   A call the policy holds for approval (its pending record) is approved on the control topic,
   as an operator would with ``latch approve``, signed (:mod:`worker.tools.demo_approver`),
   and commits. The demo plays the runner (:mod:`worker.tools.demo_runner`): it answers each
   committed call with a made-up result on the results topic, but one, the first of the
   ``anthropic.messages`` run, which the latch answers ``tool_timeout`` after the demo
   worker's ``results.deadline_s`` (5 s); each run's turn record is shown (provider,
   outcomes), and the messages of two runs of different providers.

The worker runs with ``policy.mode`` ``enforce`` and the shipped ``examples/demo.cedar``
(tenant ``acme`` may call its tools, and search files only under ``/srv/``), so exactly one
call of the example file, the Kimi K2 run's ``glob_search`` of ``**/*cursor*``, is denied:
``policy_denied``, nothing committed; and one, the parallel run's ``get_stock_price``, is
permitted by a policy annotated ``@approval("required")``, so it waits on the pending topic
until the demo approves it. ``--policy FILE`` enforces another policy file,
``--no-policy`` runs without one; a configuration whose ``policy.mode`` is not ``off`` is used as
it is, and so is one given ``--file`` (the shipped policy is written for the shipped envelopes).

Then it stops what it started: the worker (SIGTERM), and the broker unless it was running
already or ``--keep`` is given. The configured topic names are used, so ``latch tail
--from-beginning --run PREFIX`` shows the demo's records again afterwards.

Exit 0 when every run got its final message (and its turn record); 1 when a step failed or
the wait timed out; 2 when the configuration or the example file is unusable.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from worker.client.publisher import Publisher, PublishError
from worker.runtime.config import Config, ConfigError, load_config
from worker.runtime.observability import logs
from worker.tools import broker, tail
from worker.tools.demo_approver import approver_env
from worker.tools.demo_outcomes import Tally, Timeout, indented, say, watch
from worker.tools.demo_runner import DemoRunner, ResultsProducer, left_run, results_env, summary

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
STEPS = 5
DEFAULT_TIMEOUT_S = 120.0
WORKER_STOP_TIMEOUT_S = 30.0
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
OUTPUT_TOPICS = ("committed", "errors", "final", "dlq", "pending")
#: What the demo reads besides, with the result latch on.
RESULT_TOPICS = ("results", "turns")

_PACKAGE = Path(__file__).resolve().parents[1]  # worker/
#: Where the example files are looked for: a source checkout, then installed package data.
EXAMPLE_DIRS = (_PACKAGE.parent / "examples", _PACKAGE / "_examples")
EXAMPLE_CANDIDATES = tuple(d / "demo.jsonl" for d in EXAMPLE_DIRS)
POLICY_CANDIDATES = tuple(d / "demo.cedar" for d in EXAMPLE_DIRS)


class DemoError(Exception):
    """A step failed; the message says why (and where to look)."""


def example_file() -> Path:
    """The shipped ``demo.jsonl``."""
    for candidate in EXAMPLE_CANDIDATES:
        if candidate.is_file():
            return candidate
    raise DemoError(f"no demo.jsonl in {[str(c) for c in EXAMPLE_CANDIDATES]}; pass --file")


def example_policy() -> Path:
    """The shipped ``demo.cedar``, the policy set the demo enforces."""
    for candidate in POLICY_CANDIDATES:
        if candidate.is_file():
            return candidate
    raise DemoError(f"no demo.cedar in {[str(c) for c in POLICY_CANDIDATES]}; pass --policy "
                    "or --no-policy")


def demo_policy(args: argparse.Namespace, config: Config) -> Path | None:
    """The policy file this demo enforces, None to leave ``policy`` as configured."""
    if args.policy is not None:
        return Path(args.policy)
    if args.no_policy or args.file is not None or config.policy.mode != "off":
        return None
    return example_policy()


def load_envelopes(path: Path, prefix: str) -> list[dict[str, Any]]:
    """The file's envelopes, each ``run_id`` put under ``prefix``."""
    envelopes = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise DemoError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("run_id"), str):
            raise DemoError(f"{path}:{number}: not an envelope with a run_id")
        envelopes.append({**doc, "run_id": prefix + doc["run_id"]})
    if not envelopes:
        raise DemoError(f"{path} holds no envelopes")
    return envelopes


# -- output --------------------------------------------------------------------------------


class Steps:
    """``[n/5] name ... ok (detail)`` lines."""

    def __init__(self, total: int = STEPS) -> None:
        self.total = total
        self.number = 0

    def start(self, name: str) -> None:
        self.number += 1
        say(f"[{self.number}/{self.total}] {name} ...", end="")

    @staticmethod
    def ok(detail: str = "") -> None:
        say(f" ok ({detail})" if detail else " ok")

    @staticmethod
    def failed(detail: str) -> None:
        say(f" FAILED: {detail}")


# -- 1. the broker ---------------------------------------------------------------------------


def _servers(config: Config) -> list[tuple[str, int]]:
    servers = []
    for server in config.kafka.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if port.isdigit():
            servers.append((host.strip("[]"), int(port)))
    return servers


def cluster_answers(config: Config, timeout: float = 5.0) -> bool:
    """Whether a cluster answers a metadata request with the configured settings."""
    servers = _servers(config)
    if servers and all(host in LOOPBACK for host, _ in servers) and not any(
        broker.port_open(f"{host}:{port}") for host, port in servers
    ):
        return False  # nothing listens: no need to let librdkafka log connection errors
    admin = AdminClient(logs.kafka_config({**config.kafka.confluent_config(), "log_level": 0}))
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


@dataclass
class Started:
    """What this demo started, so that it stops exactly that."""

    broker: bool = False
    worker: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None
    log: Path | None = None
    keep_workdir: bool = False
    held: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: The LATCH_ variables this demo sets for its worker (engine, policy, approver key): given
    #: to the worker subprocess, never written into this process's environment.
    env: dict[str, str] = field(default_factory=dict, repr=False)


def ensure_broker(config: Config, started: Started) -> str:
    bootstrap = config.kafka.bootstrap_servers
    if cluster_answers(config):
        return f"using the cluster at {bootstrap}"
    servers = _servers(config)
    if len(servers) != 1 or servers[0][0] not in LOOPBACK:
        raise DemoError(f"no Kafka cluster answers at {bootstrap} (kafka.bootstrap_servers), "
                        "and it is not a local address this demo could start a broker on")
    port = servers[0][1]
    was_running, _ = broker.status()
    paths = broker.Paths.from_env()
    quiet = broker.jars_present(paths)
    if not quiet:
        say(" (first start: downloading Apache Kafka with Maven, this takes a while)")
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured) if quiet else contextlib.nullcontext():
            address = broker.start(broker.Ports(port, port + 1))
    except broker.BrokerError as exc:
        raise DemoError(f"the local broker did not start: {exc}\n"
                        f"{captured.getvalue()}".rstrip()) from None
    started.broker = was_running is None
    if address != f"{broker.HOST}:{port}" or not cluster_answers(config):
        raise DemoError(f"the local broker answers at {address}, not at {bootstrap}")
    how = "started the local broker" if started.broker else "local broker already running"
    return f"{how}, {address}"


# -- 2. the topics ---------------------------------------------------------------------------


def ensure_topics(config: Config) -> str:
    from worker.runtime import admin

    client = AdminClient(logs.kafka_config(config.kafka.confluent_config()))
    try:
        lines = admin.create(client, admin.specs(config))
    except admin.TopicsError as exc:
        raise DemoError(f"{exc} (the demo uses the configured topic names)") from None
    except KafkaException as exc:
        raise DemoError(f"Kafka error: {exc.args[0].str() if exc.args else exc}") from None
    created = sum(line.startswith("created") for line in lines)
    single = "the registry and faust's leader topic" if config.worker.engine == "faust" else (
        "the registry")
    return (f"{len(lines)} topics, {config.topics.partitions} partitions each ({single} 1); "
            f"{created} created, {len(lines) - created} already there")


# -- 3. the worker -----------------------------------------------------------------------------


def start_worker(config: Config, started: Started, timeout: float) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="latch-demo-"))
    started.workdir, started.log = workdir, workdir / "worker.log"
    command = [sys.executable, "-m", "worker", "worker"]
    if config.source is not None:
        command += ["--config", str(config.source.resolve())]
    env = {**os.environ, **started.env}
    note = ""
    for port, variable, what in ((config.worker.web_port, "WEB_PORT", "web server"),
                                 (config.worker.http_port, "HTTP_PORT", "metrics and health")):
        if port > 0 and _port_in_use(port):
            env[f"LATCH_WORKER__{variable}"] = "0"
            note += f"; port {port} is taken, {what} off"
    with started.log.open("wb") as log:
        started.worker = subprocess.Popen(
            command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    members = wait_for_group(config, started, timeout)
    return f"pid {started.worker.pid}, group {config.worker.app_id}: {members}{note}"


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for_group(config: Config, started: Started, timeout: float) -> str:
    """Wait until the worker's consumer group owns every events partition."""
    admin = AdminClient(logs.kafka_config(config.kafka.confluent_config()))
    group, events = config.worker.app_id, config.topics.events
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _check_worker_alive(started)
        try:
            futures = admin.describe_consumer_groups([group], request_timeout=10)
            description = futures[group].result(timeout=15)
        except (KafkaException, TimeoutError):  # a new broker may still load its coordinator
            time.sleep(0.5)
            continue
        owned = {tp.partition for member in description.members
                 for tp in (member.assignment.topic_partitions if member.assignment else [])
                 if tp.topic == events}
        if len(owned) >= config.topics.partitions:
            count = len(description.members)
            return f"{count} member{'s' * (count != 1)} own all {len(owned)} events partitions"
        time.sleep(0.5)
    raise DemoError(f"the worker's group {group} did not take the {events} partitions within "
                    f"{timeout:g}s; worker log: {started.log}\n{_log_tail(started)}")


def _check_worker_alive(started: Started) -> None:
    if started.worker is not None and started.worker.poll() is not None:
        started.keep_workdir = True
        raise DemoError(f"the worker exited with status {started.worker.returncode}; "
                        f"log: {started.log}\n{_log_tail(started)}")


def _log_tail(started: Started, lines: int = 25) -> str:
    if started.log is None or not started.log.is_file():
        return ""
    text = started.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return indented("\n".join(text), "      | ")


def stop_worker(started: Started) -> str:
    proc = started.worker
    if proc is None or proc.poll() is not None:
        return "already stopped"
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(WORKER_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return f"did not stop within {WORKER_STOP_TIMEOUT_S:g}s of SIGTERM; killed"
    return f"exit status {proc.returncode}"


# -- 4. publish (5. outcomes: demo_outcomes.py) ----------------------------------------------


def publish(publisher: Publisher, envelopes: list[dict[str, Any]], started: Started) -> str:
    """Send the envelopes in file order; hold back a run's envelopes that follow its cancel."""
    for envelope in envelopes:
        run_id = envelope["run_id"]
        if run_id in started.held:
            started.held[run_id].append(envelope)
            continue
        if envelope.get("type") == "cancel":
            # The run's earlier events must be in the events topic before the worker can
            # forward the cancel behind them.
            publisher.flush()
            publisher.send_envelope(envelope)
            publisher.flush()
            started.held[run_id] = []
            continue
        publisher.send_envelope(envelope)
    publisher.flush()
    runs = len({e["run_id"] for e in envelopes})
    held = sum(len(v) for v in started.held.values())
    sent = len(envelopes) - held
    text = f"{sent} envelopes for {runs} runs"
    if held:
        text += f"; {held} after a cancel held back until the worker applies it"
    return text


# -- the command -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latch demo",
        description="Run Latch end to end: broker, topics, worker, example streams, outcomes.",
    )
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    parser.add_argument("--keep", action="store_true",
                        help="leave a broker this demo started running afterwards")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds to wait for the worker, and then for the outcomes "
                             "(default: %(default)s)")
    parser.add_argument("--file", type=Path, help="envelopes to send instead of the shipped "
                        "examples/demo.jsonl")
    parser.add_argument("--engine", choices=("faust", "kafka"),
                        help="worker.engine for this demo (default: the configuration's)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--policy", metavar="FILE", help="a .cedar file to enforce instead of "
                       "the shipped examples/demo.cedar")
    which.add_argument("--no-policy", action="store_true",
                       help="no policy (policy as configured, 'off' by default)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``latch demo``; see the module docstring."""
    args = build_parser().parse_args(argv)
    logs.quiet_kafka()  # librdkafka's lines never reach the demo's output
    prefix = f"demo-{secrets.token_hex(3)}/"
    started = Started()
    if args.engine:  # the worker subprocess reads it as well
        started.env["LATCH_WORKER__ENGINE"] = args.engine
    try:
        config = load_config(args.config, env={**os.environ, **started.env})
        policy = demo_policy(args, config)
        if policy is not None:  # the worker subprocess reads them as well
            started.env["LATCH_POLICY__MODE"] = "enforce"
            started.env["LATCH_POLICY__FILE"] = str(policy.resolve())
        started.env |= approver_env(config) | results_env(config)  # (a bad policy stops here)
        config = load_config(args.config, env={**os.environ, **started.env})
        path = args.file or example_file()
        envelopes = load_envelopes(path, prefix)
    except (ConfigError, DemoError, OSError) as exc:
        print(f"latch demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    runs = list(dict.fromkeys(e["run_id"] for e in envelopes))
    say(f"latch demo: {len(runs)} runs from {path}, run ids under {prefix}, "
        f"engine {config.worker.engine}, policy {_policy_text(config)}")
    steps = Steps()
    began = time.monotonic()
    status = EXIT_FAILED
    try:  # whatever happens, stop what was started
        steps.start("broker")
        steps.ok(ensure_broker(config, started))
        steps.start("topics")
        steps.ok(ensure_topics(config))
        steps.start("worker")
        steps.ok(start_worker(config, started, args.timeout))
        tally = _publish_and_watch(config, envelopes, runs, prefix, started, steps, args.timeout)
        elapsed = time.monotonic() - began
        reasons = ", ".join(f"{n} {r}" for r, n in sorted(tally.reasons.items()))
        say(f"done in {elapsed:.1f}s: {len(runs)} runs, {tally.counts['committed']} committed "
            f"calls, {tally.counts['errors']} error results ({reasons or 'none'}), "
            f"{tally.counts['dlq']} dead letters")
        if config.policy.mode == "enforce":
            denied = tally.reasons["policy_denied"]
            say(f"policy enforce: {denied} call{'s' * (denied != 1)} denied (policy_denied), "
                "not committed")
        if tally.approved:
            held = len(tally.approved)
            say(f"approvals: {held} call{'s' * (held != 1)} waited for a person "
                f"(tool.calls.pending) and {'were' if held != 1 else 'was'} approved, "
                "then committed")
        if tally.runner is not None:
            say(summary(tally.runner, tally.turns))
        say(f"again: latch tail --from-beginning --run {prefix} --timeout 5")
        if tally.runner is not None and tally.runner.left is not None:
            say(f"a run's next turn: latch results {tally.runner.left[0]}")
        status = EXIT_OK
    except (DemoError, Timeout, PublishError, tail.TailError, KafkaException) as exc:
        steps.failed(str(exc))
    except KeyboardInterrupt:
        say("\ninterrupted")
        raise
    except BaseException:
        say(" FAILED: unexpected error (traceback below)")
        raise
    finally:
        started.keep_workdir = status != EXIT_OK
        status = _cleanup(started, args.keep, status)
    return status


def _policy_text(config: Config) -> str:
    if config.policy.mode == "off":
        return "off"
    return f"{config.policy.mode} ({config.policy.file})"


def _publish_and_watch(config: Config, envelopes: list[dict[str, Any]], runs: list[str],
                       prefix: str, started: Started, steps: Steps, timeout: float) -> Tally:
    latch = config.results.enabled
    topics = [getattr(config.topics, name)
              for name in OUTPUT_TOPICS + (RESULT_TOPICS if latch else ())]
    consumer, missing = tail.open_consumer(config, topics, from_beginning=False, exact_end=True)
    try:
        if missing:
            raise DemoError(f"output topics missing: {', '.join(missing)}")
        steps.start("publish")
        with _publisher(config, {**os.environ, **started.env}) as publisher:
            publisher.check_topics()
            steps.ok(publish(publisher, envelopes, started))
            steps.start("outcomes")
            tally = Tally()
            if latch:
                tally.runner = DemoRunner(
                    ResultsProducer(config, publisher.producer_config()).send,
                    left_run(envelopes), config.results.max_bytes, config.topics.results)
            say(f" waiting for {len(runs)} final messages"
                f"{' and turn records' if latch else ''} (up to {timeout:g}s)")
            if latch:
                say(indented("(the demo plays the runner: it answers each committed call with a "
                             f"made-up result on {config.topics.results}, but one)"))
            watch(config, consumer, publisher, runs, prefix, timeout, tally, held=started.held,
                  alive=lambda: _check_worker_alive(started), log=started.log)
            for line in tally.turns.messages(runs):
                say(indented(line))
        return tally
    finally:
        consumer.close()


@contextlib.contextmanager
def _publisher(config: Config, env: dict[str, str]) -> Iterator[Publisher]:
    publisher = Publisher(config, env=env)
    try:
        yield publisher
    finally:
        with contextlib.suppress(PublishError):
            publisher.flush(10)


def _cleanup(started: Started, keep: bool, status: int) -> int:
    if started.worker is not None:
        say(f"stopping the worker ... {stop_worker(started)}")
    if started.broker and not keep:
        say("stopping the broker ... ", end="")
        try:
            broker.stop()
            say("ok")
        except broker.BrokerError as exc:
            say(f"FAILED: {exc}")
            status = EXIT_FAILED
    elif started.broker:
        say("the broker keeps running (--keep); `latch broker stop` ends it")
    if started.workdir is not None:
        if started.keep_workdir:
            say(f"worker log kept: {started.log}")
        else:
            shutil.rmtree(started.workdir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
