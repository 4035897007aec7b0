"""The registry topic on Kafka: a reader that follows it, and ``latch registry``.

:class:`RegistryReader` is a thread with its own confluent-kafka consumer (assigned the
registry's one partition, from the start, in no group) that reads the registry whole before
the worker reports ready (:meth:`RegistryReader.start`), then follows it live, like a Kafka
Streams GlobalKTable. A Kafka error that ends its consumer is reported (:attr:`failure`: a log
line, ``/readyz`` not ready, ``latch_registry_following`` 0) and a new consumer resumes where
it stopped. Both engines use it the same way: the core's toolset lookup
(:meth:`RegistryReader.toolsets`) and the policy text of a marker (:meth:`policy_text`).

**The hold.** A ``run.start`` whose toolset answer is not final yet
(:meth:`RegistryState.settled`: the reader has read neither the version nor a record appended
after the run's deadline) holds that run only: the partition driver parks its records
(:mod:`worker.runtime.hold`) and asks :meth:`RegistryReader.ready` from time to time, which
never blocks. While any answer is awaited, the reader writes a ``fence`` tombstone into the
registry every :data:`FENCE_EVERY_S` and reads it back: its append time is the broker's clock.
The wait lasts about ``registry.wait_s``; a registry that cannot be read for :data:`HOLD_MAX_S`
more than that ends it with the answer as read (logged as an error: replay could then
differ). A lookup that is still not final blocks (:meth:`RegistryReader.toolsets`, within the
same bound): only a rebuild's, whose reader has not yet read as far as the previous owner's.

``latch registry put|list|show`` (:func:`main`): ``put`` reads the registry whole first and
refuses a version that exists already, or whose content does not validate. ``put toolset
--from-mcp URL`` registers an MCP server's ``tools/list``, read by the ``from_mcp`` that
``latch registry`` gives :func:`main` (``worker.client.mcp``: this layer has no MCP client).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from worker.runtime.config import Config, ConfigError, load_config
from worker.runtime.governance import registry
from worker.runtime.governance.registry import FENCE, POLICY, TOOLSET, Invalid, RegistryState
from worker.runtime.hold import toolset_of
from worker.runtime.observability import logs

__all__ = ["FENCE_EVERY_S", "HOLD_MAX_S", "RESUME_AFTER_S", "RegistryError", "RegistryReader",
           "main", "read_whole"]

log = logging.getLogger("latch.worker")

#: How often a waiting reader probes the broker's clock with a fence record.
FENCE_EVERY_S = 0.5
#: How long the follower waits before a new consumer resumes after a Kafka error.
RESUME_AFTER_S = 1.0
#: How long past ``registry.wait_s`` a hold may last when the registry cannot be read.
HOLD_MAX_S = 60.0
_TIMEOUT_S = 30.0


class RegistryError(Exception):
    """The registry cannot be read or written (one line for the user)."""


def _consumer(config: Config) -> Consumer:
    settings = config.kafka.confluent_config() | {
        "group.id": f"{config.worker.app_id}-registry-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest"}
    return Consumer(logs.kafka_config(settings))


def _time(msg: Message) -> int:
    return int(msg.timestamp()[1])


#: Errors that no wait mends.
_REFUSALS = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED,
                       KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                       KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})


def _end(consumer: Consumer, topic: str) -> int:
    """The registry's end offset (asked again while its leader is not known yet, as just
    after ``latch topics create``)."""
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0),
                                                     timeout=_TIMEOUT_S)
            return int(high)
        except KafkaException as exc:
            # (any error but a refusal is retried to the deadline: just after `latch topics
            # create` the topic may be unknown to this client, or its leader not elected)
            if time.monotonic() > deadline or exc.args[0].code() in _REFUSALS:
                raise RegistryError(f"cannot read topic {topic}: {exc.args[0].str()} (create "
                                    "it with `latch topics create`)") from exc
            time.sleep(0.5)


def _read_into(consumer: Consumer, state: RegistryState, topic: str, until: int,
               deadline: float) -> None:
    """Read records into ``state`` until its next offset reaches ``until``."""
    while state.next_offset < until:
        if time.monotonic() > deadline:
            raise RegistryError(f"topic {topic} was not read whole within {_TIMEOUT_S:g} s")
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                continue
            if error.fatal():
                raise RegistryError(f"reading {topic}: {error.str()}")
            continue
        state.apply(msg.key(), msg.value(), msg.offset() or 0, _time(msg))


def read_whole(config: Config) -> RegistryState:
    """The registry as it is now, read once (``latch registry``, ``latch replay``)."""
    topic = config.topics.registry
    consumer = _consumer(config)
    try:
        state = RegistryState()
        end = _end(consumer, topic)
        if end:
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            _read_into(consumer, state, topic, end, time.monotonic() + _TIMEOUT_S)
        return state
    finally:
        consumer.close()


class RegistryReader:
    """The registry as one worker follows it (module doc)."""

    def __init__(self, config: Config) -> None:
        self.config, self.topic = config, config.topics.registry
        self.wait_ms = int(config.registry.wait_s * 1000)
        self.state = RegistryState()
        self.changed = threading.Condition()
        self._fence_wanted = False
        self._stopping = False
        #: The answers the driver awaits (:meth:`ready`): (name, version, at_ms) -> when it
        #: first asked (monotonic); the reader fences while one is unsettled.
        self._awaited: dict[tuple[str, int, int], float] = {}
        #: Answers given up on after the bound (:meth:`ready`): their lookup does not block.
        self._given_up: set[tuple[str, int, int]] = set()
        #: Policy set versions given up on after the bound (:meth:`policy_text`).
        self._policies_given_up: set[int] = set()
        self._consumer: Any = None  # made by start(): no client before the worker runs
        #: Why the reader is not following the registry now (None: it is): a Kafka error
        #: ended its consumer and a new one has not read yet (:meth:`_follow`).
        self.failure: str | None = None
        self._producer: Producer | None = None
        self._thread = threading.Thread(target=self._follow, name="latch-registry",
                                        daemon=True)

    def start(self) -> None:
        """Read the registry whole (raises :class:`RegistryError`), then follow it."""
        self._consumer = _consumer(self.config)
        end = _end(self._consumer, self.topic)
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        _read_into(self._consumer, self.state, self.topic, end,
                   time.monotonic() + _TIMEOUT_S)
        log.info("registry %s read: %d versions, %d conflicts", self.topic,
                 len(self.state.entries), len(self.state.conflicts))
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):  # (closed after a failure)
                self._consumer.close()
        if self._producer is not None:
            self._producer.flush(5)

    def _follow(self) -> None:
        """Follow the registry until :meth:`stop`. A Kafka error that ends the consumer (an
        exception from ``poll``, a fatal error) does not end the following: it is logged,
        recorded in :attr:`failure` (``/readyz`` and ``latch_registry_following`` report
        it) and a new consumer resumes at the next offset after :data:`RESUME_AFTER_S`."""
        fenced = 0.0
        while not self._stopping:
            if (self._fence_wanted or self._awaiting()) and \
                    time.monotonic() - fenced >= FENCE_EVERY_S:
                fenced = time.monotonic()
                self._fence()
            try:
                msg = self._consumer.poll(0.1)
            except (KafkaException, RuntimeError) as exc:  # closed, or a fatal error
                if self._stopping:
                    return
                self._failed(str(exc))
                continue
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.fatal():
                    self._failed(error.str())
                continue
            with self.changed:
                self.state.apply(msg.key(), msg.value(), msg.offset() or 0, _time(msg))
                self.changed.notify_all()
            if self.failure is not None:
                log.info("registry reader: following %s again", self.topic)
                self.failure = None

    def _failed(self, why: str) -> None:
        """The consumer failed: say so, then resume with a new one at the next offset."""
        if self.failure is None:
            log.error("registry reader: %s; not following %s until a new consumer resumes "
                      "(every %g s)", why, self.topic, RESUME_AFTER_S)
        self.failure = why
        with contextlib.suppress(KafkaException, RuntimeError):
            self._consumer.close()
        deadline = time.monotonic() + RESUME_AFTER_S
        while not self._stopping and time.monotonic() < deadline:
            time.sleep(0.05)  # (interruptible: stop() ends the wait within 50 ms)
        if self._stopping:
            return
        try:
            self._consumer = _consumer(self.config)
            self._consumer.assign([TopicPartition(self.topic, 0, self.state.next_offset)])
        except (KafkaException, RuntimeError) as exc:
            self.failure = str(exc)

    def policy_read(self, version: int) -> str | None:
        """The Cedar text of policy set ``version`` if it is read, without waiting."""
        return self.state.policy_text(version)

    def _fence(self) -> None:
        """A tombstone whose append time tells how far the broker's clock is."""
        if self._producer is None:
            self._producer = Producer(logs.kafka_config(
                self.config.kafka.confluent_config() | {"linger.ms": 0}))
        try:
            self._producer.produce(self.topic, key=FENCE, value=None, partition=0)
            self._producer.poll(0)
        except (KafkaException, BufferError) as exc:
            log.warning("registry fence: %s", exc)

    def _awaiting(self) -> bool:
        """Whether an answer :meth:`ready` was asked for is still unsettled (those settled,
        or asked for longer ago than the bound, are forgotten)."""
        if not self._awaited:
            return False
        state, bound = self.state, self.wait_ms / 1000 + HOLD_MAX_S
        with self.changed:
            now = time.monotonic()
            for wanted, since in list(self._awaited.items()):
                if state.settled(*wanted, self.wait_ms) or now - since > bound:
                    del self._awaited[wanted]
            return bool(self._awaited)

    def ready(self, name: str, version: int, at_ms: int) -> bool:
        """Whether the answer for toolset ``name`` ``version`` at record time ``at_ms`` is
        final (the driver then applies the run it holds); never blocks. Until it is, the
        reader fences; once :data:`HOLD_MAX_S` past ``registry.wait_s`` since first asked,
        it is given up (logged as an error) and counts as final: answered as read."""
        wanted = (name, version, at_ms)
        if self.state.settled(name, version, at_ms, self.wait_ms) or wanted in self._given_up:
            return True
        now = time.monotonic()
        with self.changed:
            since = self._awaited.setdefault(wanted, now)
        if now - since <= self.wait_ms / 1000 + HOLD_MAX_S:
            return False
        log.error("registry: toolset %r version %d still unread after the hold; the run "
                  "fails unknown_toolset", name, version)
        self._given_up.add(wanted)
        return True

    def _hold(self, settled: Any) -> bool:
        """Wait until ``settled()`` (called under the lock) is true; False if it never
        became so within the bound."""
        give_up = time.monotonic() + self.wait_ms / 1000 + HOLD_MAX_S
        with self.changed:
            while not settled():
                if time.monotonic() > give_up:
                    return False
                self._fence_wanted = True
                self.changed.wait(0.2)
            self._fence_wanted = False
            return True

    def unsettled(self, value: bytes, at_ms: int | None) -> tuple[str, int, int] | None:
        """The (name, version, record time) of the toolset a ``run.start`` envelope ``value``
        names when its answer is not final yet (else None: not such a record, or known): the
        partition driver then holds the run (:mod:`worker.runtime.hold`) until :meth:`ready`,
        before the core asks :meth:`toolsets`."""
        if at_ms is None or b'"toolset"' not in value:
            return None
        named = toolset_of(value)
        if named is None or (*named, at_ms) in self._given_up or self.state.settled(
                *named, at_ms, self.wait_ms):
            return None
        return (*named, at_ms)

    def toolsets(self, name: str, version: int, at_ms: int) -> Any:
        """``Assembler.toolsets``: the version's tools for a run.start at record time
        ``at_ms`` under the wait rule, held until the answer is final (module doc)."""
        state = self.state
        if not state.settled(name, version, at_ms, self.wait_ms) and (
                name, version, at_ms) not in self._given_up and not self._hold(
                lambda: state.settled(name, version, at_ms, self.wait_ms)):
            log.error("registry: toolset %r version %d still unread after the hold; the run "
                      "fails unknown_toolset", name, version)
        return state.toolset(name, version, at_ms, self.wait_ms)

    def policy_text(self, version: int) -> str | None:
        """The Cedar text of policy set ``version`` (a marker names only versions the
        registry holds: waits until it is read, within the bound; once only for a version
        never read, e.g. a marker someone else wrote: then None at once)."""
        state = self.state
        if state.policy(version) is None and version not in self._policies_given_up and \
                not self._hold(lambda: state.policy(version) is not None):
            log.error("registry: policy set version %d still unread after the hold", version)
            self._policies_given_up.add(version)
        return state.policy_text(version)

    def policy_registered(self, version: int, at_ms: int) -> bool | None:
        """Whether policy set ``version`` was registered by a marker at record time ``at_ms``
        (``RegistryState.policy_registered``), held until the answer is final: at most a
        fence round trip past ``at_ms`` plus the clock skew allowed when the reader follows
        the registry; None (unknown) if the reader could not say within the bound, once only
        for a version (as :meth:`policy_text`: then None at once)."""
        state = self.state
        if state.policy_registered(version, at_ms) is None and \
                version not in self._policies_given_up and \
                not self._hold(lambda: state.policy_registered(version, at_ms) is not None):
            log.error("registry: whether policy set version %d was registered is still "
                      "unknown after the hold", version)
            self._policies_given_up.add(version)
        return state.policy_registered(version, at_ms)

    def latest_policy(self) -> int | None:
        return self.state.latest_policy()


# -- latch registry -------------------------------------------------------------------

EXIT_OK, EXIT_KAFKA, EXIT_USAGE = 0, 1, 2


def put(config: Config, kind: str, name: str, version: int, content: Any) -> str:
    """Register a version; raises :class:`Invalid` or :class:`RegistryError`."""
    if version < 1:
        raise Invalid("--version must be a positive integer")
    if kind == TOOLSET:
        readers = registry.check_toolset(name, content, config.assemble)
        what = f"toolset {name} version {version} ({', '.join(readers)} format)"
    else:
        registry.check_policy(content, version)
        what = f"policy set version {version}"
    state = read_whole(config)
    existing = state.get(kind, name, version)
    if existing is not None:
        raise Invalid(f"{what.split(' (')[0]} exists already (offset {existing.offset}, digest "
                      f"{existing.digest}); versions are immutable: register version "
                      f"{_next(state, kind, name)}")
    key, value = registry.encode(kind, name, version, content)
    producer = Producer(logs.kafka_config(config.kafka.confluent_config()
                                          | {"enable.idempotence": True}))
    errors: list[str] = []
    producer.produce(config.topics.registry, key=key, value=value, partition=0,
                     on_delivery=lambda err, _msg: errors.append(err.str()) if err else None)
    if producer.flush(_TIMEOUT_S) or errors:
        raise RegistryError(f"not registered: {errors[0] if errors else 'no delivery'}")
    return f"registered {what} as {key.decode()}"


def _next(state: RegistryState, kind: str, name: str) -> int:
    return 1 + max(v for (k, n, v) in state.entries if k == kind and n == name)


def listing(state: RegistryState) -> list[str]:
    lines = []
    for e in state.listing():
        what = f"toolset {e.name} {e.version}" if e.kind == TOOLSET else f"policy {e.version}"
        size = len(e.content) if e.kind == TOOLSET else len(str(e.content).encode())
        unit = "tools" if e.kind == TOOLSET else "bytes"
        lines.append(f"{what}  digest {e.digest}  offset {e.offset}  {size} {unit}")
    for e in state.conflicts:
        what = f"toolset {e.name} {e.version}" if e.kind == TOOLSET else f"policy {e.version}"
        lines.append(f"CONFLICT {what}: offset {e.offset} (digest {e.digest}) differs from the "
                     "first record, which is in force; ignored")
    for offset, why in state.invalid:
        lines.append(f"INVALID record at offset {offset}: {why}; ignored")
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latch registry",
                                     description="Toolsets and policy sets by version.")
    parser.add_argument("--config", help="latch.yaml (default: ./latch.yaml if present)")
    sub = parser.add_subparsers(required=True, dest="action", metavar="ACTION")
    put_cmd = sub.add_parser("put", help="register a version (versions are immutable)")
    put_sub = put_cmd.add_subparsers(required=True, dest="kind", metavar="KIND")
    ts = put_sub.add_parser(TOOLSET, help="a toolset: NAME --version N --tools FILE | "
                                          "--from-mcp URL")
    ts.add_argument("name")
    ts.add_argument("--version", type=int, required=True)
    given = ts.add_mutually_exclusive_group(required=True)
    given.add_argument("--tools", metavar="FILE",
                       help="a JSON array of tools, in a provider's format as run.start takes")
    given.add_argument("--from-mcp", metavar="URL", help=(
        "an MCP server's streamable HTTP endpoint: its tools/list (every page), each tool "
        "with its inputSchema, outputSchema and annotations (the operator's word)"))
    pol = put_sub.add_parser(POLICY, help="a policy set: --version N --file FILE.cedar")
    pol.add_argument("--version", type=int, required=True)
    pol.add_argument("--file", required=True, metavar="FILE")
    sub.add_parser("list", help="every version, and any conflict")
    show = sub.add_parser("show", help="show toolset NAME N | show policy N")
    show.add_argument("kind", choices=[TOOLSET, POLICY])
    show.add_argument("what", nargs="+", metavar="NAME_OR_VERSION")
    return parser


#: Reads an MCP server's tools as a toolset: (URL, config) -> the tools array; raises
#: :class:`Invalid` (``worker.client.mcp``).
FromMcp = Callable[[str, Config], Any]


def main(argv: Sequence[str] | None = None, from_mcp: FromMcp | None = None) -> int:
    """``latch registry put|list|show``; ``from_mcp`` reads ``--from-mcp URL``."""
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
        return _run(config, args, from_mcp)
    except (ConfigError, Invalid) as exc:
        print(f"latch registry: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (RegistryError, KafkaException) as exc:
        print(f"latch registry: {exc}", file=sys.stderr)
        return EXIT_KAFKA


def _run(config: Config, args: argparse.Namespace, from_mcp: FromMcp | None = None) -> int:
    if args.action == "put":
        if args.kind == TOOLSET:
            if args.from_mcp is not None and from_mcp is None:
                raise Invalid("--from-mcp needs the MCP client: run it as latch registry")
            content: Any = (from_mcp(args.from_mcp, config) if from_mcp is not None
                            and args.from_mcp is not None else _read(args.tools, json=True))
            print(put(config, TOOLSET, args.name, args.version, content))
        else:
            print(put(config, POLICY, "", args.version, _read(args.file, json=False)))
        return EXIT_OK
    state = read_whole(config)
    if args.action == "list":
        for line in listing(state):
            print(line)
        return EXIT_OK
    wanted = 2 if args.kind == TOOLSET else 1
    if len(args.what) != wanted or not args.what[-1].isdigit():
        raise Invalid("show toolset NAME VERSION | show policy VERSION")
    name, version = (args.what[0] if wanted == 2 else ""), args.what[-1]
    entry = state.get(args.kind, name, int(version))
    if entry is None:
        raise Invalid(f"no {args.kind} {name + ' ' if name else ''}version {version}")
    if args.kind == TOOLSET:
        print(orjson.dumps(entry.content, option=orjson.OPT_INDENT_2).decode())
    else:
        print(entry.content, end="" if str(entry.content).endswith("\n") else "\n")
    return EXIT_OK


def _read(path: str, json: bool) -> Any:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise Invalid(f"cannot read {path}: {exc.strerror}") from exc
    if not json:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Invalid(f"{path} is not UTF-8 text") from exc
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise Invalid(f"{path} is not JSON: {exc.msg} (line {exc.lineno}, column "
                      f"{exc.colno})") from exc
