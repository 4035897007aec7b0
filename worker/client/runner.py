"""The runner's side of the contract: execute committed calls once, publish their results.

A runner consumes the committed topic (``tool.calls.committed``), and for each record:

1. refuses anything that is not a committed call (not JSON, or the committed-call schema
   fails) and, when it holds signing keys (``signing.keys``, :mod:`~.governance.signing`),
   anything unsigned or mis-signed: nothing runs,
   ``tool_execute_rejected_not_committed_total{reason}`` counts it, and the record is
   skipped (a runner must never execute what the worker did not commit). A record signed
   with a key id it does not hold (``unknown_key``: a rotation ahead of this runner) stops
   it with :class:`SigningKeyError` before its offset is committed: it is never skipped;
2. skips a call whose ``idempotency_key`` the :class:`DedupStore` has seen (delivery is at
   least once: the same committed call may arrive twice);
3. calls the Python function registered under the call's ``name`` with
   :func:`~.execution.tool_input` (a custom call's ``input`` text, a ``shell_call``'s
   ``action``, an ``apply_patch_call``'s ``operation``, every other call's decoded
   ``arguments``), in a thread of its own while the consumer keeps its group
   (:mod:`~.execution`: a tool may outlast ``max.poll.interval.ms``), up to
   ``tool_timeout_s`` (then ``tool_timeout``); its return value (a string as is, anything
   else as JSON) or the exception it raised becomes one ``tool.calls.results`` record
   (``schemas/tool-result.schema.json``), keyed by ``run_id``, paired by ``tool_call_id``,
   with the call's trace context in its headers (:mod:`~.observability.tracing`);
4. records the outcome: see the two modes below.

**Transactional mode** (``Runner(..., transactional_id="latch-runner-<instance>")``, decision
0012): the store is the :class:`JournalStore`, a compacted topic (``topics.journal``) with one
record per executed call keyed by its ``idempotency_key``, read to its end at start and at
each partition assignment, before any call is consumed. Per record, one Kafka transaction
holds the result, the journal record and the consumed offset
(``send_offsets_to_transaction`` with the consumer's group metadata): they commit together
or not at all. A call whose result is recorded is never run again, by this runner or its
successor, whichever copy of it arrives. **The executions that can repeat are exactly those
a crash interrupted between the tool's start and the transaction's commit** (inside the tool,
or after it returned but before the commit): after the restart the call is consumed again and
runs again. A transaction that fails (aborted, fenced, or a producer that does not answer) is
aborted where it can be and the runner stops with :class:`JournalError`, which names the
call: it never runs the call again by itself. ``transactional_id`` must be stable per runner
instance (a StatefulSet's pod name): the restarted instance's ``init_transactions`` aborts
its predecessor's open transaction at once instead of after the transaction timeout. Readers
of the results topic read at ``read_committed`` (an aborted result is never seen).

**Plain mode** (no ``transactional_id``, the default): the result is delivered, then the key
remembered, then the offset committed (a result the broker refuses as too large is answered
by an error result instead; any other failed delivery stops the runner before the offset is
committed). A crash between the function's return and the offset commit runs the function
again after a restart. The default store keeps keys in memory (bounded, least recently seen
dropped first): a restart forgets them, so a copy of a call delivered after a restart runs
again; a :class:`DedupStore` with a database behind it closes that.

Either way, a tool with side effects that must happen at most once even across a crash
inside it keeps its own record under the idempotency key (in the tool's own transaction).

``docs/runner.md``: tool signatures, feeding results back per provider; ``examples/runner.py``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from opentelemetry import trace

from worker.client import execution
from worker.client.execution import TOOL_TIMEOUT, Holding, ToolRun
from worker.client.journal import (
    CLIENT_TIMEOUT_S,
    DedupStore,
    JournalError,
    JournalStore,
    MemoryStore,
    journal_record,
)
from worker.client.results import (
    MAX_RESULT_BYTES,
    ToolResult,
    answer,
    escaped,
    failure,
    outcome_of,
    result_record,
)
from worker.runtime.config import Config
from worker.runtime.governance import signing
from worker.runtime.observability import logs, tracing
from worker.runtime.observability.metrics import Metrics
from worker.runtime.schemas import validator

__all__ = ["CLIENT_TIMEOUT_S", "DedupStore", "JournalError", "JournalStore", "MemoryStore",
           "Outcome", "Runner", "SigningKeyError", "ToolResult", "answer", "journal_record",
           "result_record"]

log = logging.getLogger("latch.runner")

#: A tool: what :func:`~worker.client.execution.tool_input` gives (a function call's decoded
#: arguments, a custom call's input text, a client item's fields) in, a JSON-serialisable
#: result (or a string, or a :class:`~worker.client.results.ToolResult`) out. The committed
#: call itself (its ``idempotency_key``) is :func:`~worker.client.execution.current_call`.
Tool = Callable[[Any], Any]
#: How long past :data:`CLIENT_TIMEOUT_S` a transaction's commit may take before its producer
#: counts as wedged (librdkafka's ``send_offsets_to_transaction`` can wait without bound,
#: confluentinc/librdkafka#5456) and the runner stops.
WEDGED_GRACE_S = 5.0
#: How many timed-out tools may still be running before the runner stops (before the next
#: call runs: a restart is the only way to end their threads).
MAX_STRAY_TOOLS = 8


@dataclass(frozen=True, slots=True)
class Outcome:
    """What :meth:`Runner.handle` decided for one record: ``status`` is ``executed``,
    ``duplicate`` or ``rejected``; ``value`` is the result record to publish (executed)."""

    status: str
    key: bytes | None = None
    value: bytes | None = None
    idempotency_key: str | None = None
    reason: str | None = None
    #: The journal record (executed calls only).
    journal: bytes | None = None


class SigningKeyError(RuntimeError):
    """A committed record is signed with a key id this runner does not hold (``signing.key_id``
    switched before every runner held the key): the runner stops before it commits past the
    record, so that a runner holding the key (or this one, given it) runs the call."""


@dataclass(slots=True)
class _InFlight:
    """The call whose tool runs now, and the record it came in (for a revoke that takes
    its partition while it runs: :meth:`Runner._revoked`)."""

    call: dict[str, Any]
    run: ToolRun
    deadline: float | None
    message: Any
    #: Set once its outcome is recorded (by the revoke callback): not recorded again.
    recorded: bool = False


class Runner:
    """Execute committed calls with registered functions; see the module docstring."""

    def __init__(self, config: Config, tools: Mapping[str, Tool], *,
                 store: DedupStore | None = None, metrics: Metrics | None = None,
                 group_id: str = "latch-runner", max_result_bytes: int = MAX_RESULT_BYTES,
                 consumer: Any = None, producer: Any = None,
                 tracer: trace.Tracer | None = None,
                 verifier: signing.Verifier | None = None,
                 transactional_id: str | None = None,
                 transaction_timeout_s: float = 60.0,
                 tool_timeout_s: float | None = None) -> None:
        self.config = config
        self.tools = dict(tools)
        #: The transactional id (None: plain mode); see the module docstring.
        self.transactional_id = transactional_id
        settings = config.kafka.confluent_config()
        if store is None:
            store = (MemoryStore() if transactional_id is None
                     else JournalStore(settings, config.topics.journal))
        self.store: DedupStore = store
        self.metrics = metrics if metrics is not None else Metrics(prometheus=False)
        self.max_result_bytes = max_result_bytes
        self._check = validator("committed-call")
        #: The keys a committed record must be signed by (config's ``signing.keys``; none:
        #: signatures are not checked).
        self.verifier = verifier if verifier is not None else signing.verifier(config)
        self.consumer = consumer if consumer is not None else Consumer(logs.kafka_config({
            **settings, "group.id": group_id, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed"}))
        transactional = {} if transactional_id is None else {
            "transactional.id": transactional_id,
            "transaction.timeout.ms": int(transaction_timeout_s * 1000)}
        self.producer = producer if producer is not None else Producer(logs.kafka_config({
            **settings, "enable.idempotence": True, "partitioner": "murmur2_random",
            **transactional}))
        #: Test-only (the restart test's kill points): called with a step's name
        #: (``before_tool``, ``after_tool``, ``after_commit``) and the call's idempotency key.
        self._on_step: Callable[[str, str], None] | None = None
        self.executed = 0
        #: How long a tool may run before its call is answered ``tool_timeout`` (None: no
        #: limit); see :mod:`~worker.client.execution`.
        self.tool_timeout_s = tool_timeout_s
        #: Inside :meth:`run`: the membership held while a slow tool runs, the record being
        #: handled, the call whose tool runs, and timed-out tools still running.
        self._holding: Holding | None = None
        self._message: Any = None
        self._inflight: _InFlight | None = None
        self._strays: list[ToolRun] = []
        #: The process's tracer (the OpenTelemetry API's global one unless ``tracer`` is
        #: given): each execution is a span whose parent is the committed record's context.
        self.tracer = tracer if tracer is not None else trace.get_tracer("latch.runner")

    # -- one record ---------------------------------------------------------------------

    def handle(self, value: bytes | None, topic: str | None = None,
               headers: Any = None) -> Outcome:
        """Decide one record of the committed topic (runs the tool at most once per key);
        ``headers``: the record's Kafka headers (its signature)."""
        if topic is not None and topic != self.config.topics.committed:
            return self._reject("wrong_topic")
        if self.verifier.required:
            refused = self.verifier.refusal(value, headers)
            if refused is not None:
                return self._reject(refused)
        try:
            call = orjson.loads(value or b"")
        except orjson.JSONDecodeError:
            return self._reject("undecodable")
        if not isinstance(call, dict) or not self._check.is_valid(call):
            return self._reject("not_a_committed_call")
        key = call["idempotency_key"]
        if self.store.seen(key):
            return Outcome("duplicate", idempotency_key=key)
        self._step("before_tool", key)
        is_error, content, structured = self._execute(call)
        self._step("after_tool", key)
        return self._executed(call, is_error, content, structured)

    def _executed(self, call: dict[str, Any], is_error: bool, content: str,
                  structured: Any = None) -> Outcome:
        value = answer(call, is_error, content, self.max_result_bytes, structured)
        journal = orjson.dumps(journal_record(call, orjson.loads(value)["is_error"]))
        return Outcome("executed", call["run_id"].encode(), value, call["idempotency_key"],
                       journal=journal)

    def _step(self, name: str, key: str) -> None:
        if self._on_step is not None:
            self._on_step(name, key)

    def _reject(self, reason: str) -> Outcome:
        self.metrics.rejected_not_committed(reason)
        log.warning("refused a record that is not a committed call (%s)", reason)
        return Outcome("rejected", reason=reason)

    def _execute(self, call: dict[str, Any]) -> tuple[bool, str, Any]:
        """Run the call's tool in a thread of its own and wait for it (holding the
        membership when inside :meth:`run`), up to ``tool_timeout_s``: ``(is_error, content,
        structured)``."""
        tool = self.tools.get(call["name"])
        if tool is None:
            return True, f"no tool named {call['name']!r} is registered with this runner", None
        self._strays = [run for run in self._strays if not run.wait(0)]
        if len(self._strays) >= MAX_STRAY_TOOLS:
            raise RuntimeError(f"{len(self._strays)} timed-out tools are still running; "
                               "stopping before the next call runs (a restart ends them)")
        self.executed += 1
        run = ToolRun(tool, execution.tool_input(call), call["name"], call)
        deadline = (None if self.tool_timeout_s is None
                    else time.monotonic() + self.tool_timeout_s)
        if self._message is not None:
            self._inflight = _InFlight(call, run, deadline, self._message)
        if execution.wait(run, deadline, self._holding):
            return self._ran(call, run)
        self._strays.append(run)
        return self._timed_out(call)

    def _timed_out(self, call: dict[str, Any]) -> tuple[bool, str, Any]:
        log.warning("tool %s did not return within %g s: answered %s", call["name"],
                    self.tool_timeout_s, TOOL_TIMEOUT, extra=logs.where(run_id=call["run_id"]))
        return True, (f"{TOOL_TIMEOUT}: the tool did not return within "
                      f"{self.tool_timeout_s:g} s"), None

    def _ran(self, call: dict[str, Any], run: ToolRun) -> tuple[bool, str, Any]:
        """A finished run's result, or its exception as an error result."""
        exc = run.error
        if exc is None:
            return outcome_of(run.result)
        if isinstance(exc, KeyboardInterrupt):
            raise exc  # the operator stops the runner: the interrupted call runs again
        # sys.exit in a tool is answered, too. The arguments are never logged: only where
        # the tool failed.
        log.warning("tool %s raised %s", call["name"], escaped(type(exc).__name__),
                    extra=logs.where(run_id=call["run_id"]))
        log.debug(escaped("".join(traceback.format_tb(exc.__traceback__))))
        return True, failure(exc), None

    # -- the loop -----------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, timeout: float = 1.0,
            max_records: int | None = None) -> int:
        """Consume until ``stop`` is set (or ``max_records`` were handled); return how many
        records were handled."""
        stop = stop or threading.Event()
        self._holding = Holding(self.consumer)
        if self.transactional_id is None:
            self.consumer.subscribe([self.config.topics.committed], on_revoke=self._revoked)
        else:
            self._start_transactions()
        handled = 0
        try:
            while not stop.is_set() and (max_records is None or handled < max_records):
                kept = self._holding.kept
                message = (kept.pop(next(iter(kept))) if kept
                           else self.consumer.poll(timeout))
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("consumer error: %s", error.str())
                    continue
                self._process(message)
                handled += 1
        finally:
            self._holding = None
            self.producer.flush(30)
        return handled

    def _process(self, message: Any) -> None:
        received = message.headers()
        parent = tracing.extract(received)
        self._message = message
        try:
            with self.tracer.start_as_current_span("latch.tool.execute", context=parent,
                                                   kind=trace.SpanKind.CONSUMER):
                outcome = self.handle(message.value(), message.topic(), received)
                headers = tracing.inject()  # this span's context: the trace goes on
        finally:
            inflight, self._inflight, self._message = self._inflight, None, None
        if inflight is not None and inflight.recorded:
            return  # a revoke of its partition recorded it already
        if outcome.reason == signing.UNKNOWN_KEY:
            raise SigningKeyError(
                f"the record at {message.topic()} [{message.partition()}] offset "
                f"{message.offset()} is signed with key id {execution.key_id_of(received)!r}, "
                "which this runner does not hold (signing.keys): stopping before its offset "
                "is committed; give the runners that key (docs/runner.md, Rotating)")
        self._record(outcome, message, list(headers) or None)

    def _record(self, outcome: Outcome, message: Any, headers: Any) -> None:
        """Answer and commit ``message``: see the two modes in the module docstring."""
        if self.transactional_id is not None:
            self._transact(outcome, message, headers)
            return
        if outcome.status == "executed":
            self._deliver(outcome, headers)
            self.store.remember(outcome.idempotency_key or "")
        self.consumer.commit(message=message, asynchronous=False)

    def _revoked(self, _consumer: Any, partitions: Any) -> None:
        """A rebalance takes ``partitions``: kept records of them are dropped; a call of one
        of them whose tool runs is waited for and recorded here, before the partition goes
        (its next owner then finds it journaled, or its offset committed)."""
        if self._holding is not None:
            self._holding.forget(partitions)
        inflight = self._inflight
        if inflight is None or inflight.recorded:
            return
        message = inflight.message
        if (message.topic(), message.partition()) not in {(tp.topic, tp.partition)
                                                          for tp in partitions}:
            return
        left = None if inflight.deadline is None else inflight.deadline - time.monotonic()
        call = inflight.call
        done = inflight.run.wait(left)
        outcome = self._executed(call, *(self._ran(call, inflight.run) if done
                                        else self._timed_out(call)))
        self._record(outcome, message, list(tracing.inject()) or None)
        inflight.recorded = True

    # -- transactional mode -------------------------------------------------------------

    def _start_transactions(self) -> None:
        """Fence this transactional id's predecessor (aborting its open transaction), read
        the journal, and subscribe: each assignment reads the journal again before a call
        of the new partitions is consumed (another runner may have recorded calls of them)."""
        try:
            self.producer.init_transactions(CLIENT_TIMEOUT_S)
        except KafkaException as exc:
            raise JournalError(f"init_transactions as {self.transactional_id!r} failed: "
                               f"{exc.args[0].str()}") from exc
        load = getattr(self.store, "load", None)
        if load is not None:
            log.info("runner journal: read %d records", load())

        def assigned(_consumer: Any, _partitions: Any) -> None:
            if load is not None:
                load()

        self.consumer.subscribe([self.config.topics.committed], on_assign=assigned,
                                on_revoke=self._revoked)

    def _transact(self, outcome: Outcome, message: Any, headers: Any) -> None:
        """One transaction: the result and the journal record (executed calls) and the
        consumed offset. A result the broker refuses as too large is answered, in a second
        transaction, by an error result; any other failure aborts where it can and raises
        :class:`JournalError` (the call is not run again by this process)."""
        key = outcome.idempotency_key or ""
        value = outcome.value
        for attempt in (1, 2):
            refused: list[KafkaError] = []
            error = self._commit_once(outcome, value, message, headers, refused)
            if error is None:
                if outcome.status == "executed":
                    self.store.remember(key)
                    self._step("after_commit", key)
                return
            too_large = any(e.code() == KafkaError.MSG_SIZE_TOO_LARGE for e in refused)
            if attempt == 1 and too_large and error.txn_requires_abort():
                record = orjson.loads(value or b"")
                record.update(is_error=True, content="the tool's result is larger than the "
                              "results topic takes")
                value = orjson.dumps(record)
                continue
            what = (f"the call {key!r} ran and its result is not recorded: it runs again "
                    "after a restart" if outcome.status == "executed"
                    else "no call ran")
            raise JournalError(f"the transaction failed ({error.name()}: {error.str()}); "
                               f"stopping: {what}")

    def _commit_once(self, outcome: Outcome, value: bytes | None, message: Any,
                     headers: Any, refused: list[KafkaError]) -> KafkaError | None:
        """Begin, produce, send the offset, commit: None once committed, else the error
        (the transaction aborted when it could be)."""

        def delivered(error: KafkaError | None, _: Any) -> None:
            if error is not None:
                refused.append(error)

        failed: list[KafkaError] = []
        # asked here, not in the commit thread: the consumer does not answer another thread
        # while this one is inside its poll (a revoke callback commits from there)
        metadata = self.consumer.consumer_group_metadata()

        def transaction() -> None:
            try:
                self.producer.begin_transaction()
                if outcome.status == "executed":
                    self.producer.produce(self.config.topics.results, key=outcome.key,
                                          value=value, headers=headers, on_delivery=delivered)
                    self.producer.produce(self.config.topics.journal,
                                          key=(outcome.idempotency_key or "").encode(),
                                          value=outcome.journal, on_delivery=delivered)
                offset = TopicPartition(message.topic(), message.partition(),
                                        message.offset() + 1)
                _retrying(lambda: self.producer.send_offsets_to_transaction(
                    [offset], metadata, CLIENT_TIMEOUT_S))
                _retrying(lambda: self.producer.commit_transaction(CLIENT_TIMEOUT_S))
            except KafkaException as exc:
                failed.append(exc.args[0])
            except BufferError as exc:  # a produce the local queue refused
                failed.append(KafkaError(KafkaError._QUEUE_FULL, str(exc)))

        # librdkafka's send_offsets_to_transaction can wait without bound
        # (confluentinc/librdkafka#5456): a commit that does not return is given up
        worker = threading.Thread(target=transaction, name="latch-runner-commit", daemon=True)
        worker.start()
        worker.join(3 * CLIENT_TIMEOUT_S + WEDGED_GRACE_S)
        if worker.is_alive():
            key = outcome.idempotency_key
            raise JournalError(
                f"the transaction of {key!r} did not settle within "
                f"{3 * CLIENT_TIMEOUT_S + WEDGED_GRACE_S:.0f} s (a wedged producer); stopping: "
                "a restart's init_transactions fences it and aborts its transaction"
                + (" (the call runs again)" if outcome.status == "executed" else ""))
        if not failed:
            return None
        error = failed[0]
        if error.txn_requires_abort():
            try:
                self.producer.abort_transaction(CLIENT_TIMEOUT_S)
            except KafkaException as exc:
                log.error("abort_transaction failed: %s", exc.args[0].str())
        return error

    def _deliver(self, outcome: Outcome, headers: Any) -> None:
        """Publish the result and wait for its delivery. A result the broker refuses as too
        large is replaced by an error result (running the tool again would not shrink it);
        any other failure stops the runner before the offset is committed."""
        failed: list[KafkaError] = []

        def delivered(error: KafkaError | None, _: Any) -> None:
            if error is not None:
                failed.append(error)

        value = outcome.value
        for attempt in (1, 2):
            try:
                self.producer.produce(self.config.topics.results, key=outcome.key, value=value,
                                      headers=headers, on_delivery=delivered)
            except KafkaException as exc:
                failed.append(exc.args[0])
            left = self.producer.flush(30)
            if left:
                raise RuntimeError(f"{left} results not delivered within 30 s; stopping "
                                   "before the offset is committed")
            if not failed:
                return
            if attempt == 2 or failed[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise RuntimeError(f"the result was not delivered ({failed[0].name()}); "
                                   "stopping before the offset is committed")
            record = orjson.loads(value or b"")
            record.update(is_error=True, content="the tool's result is larger than the "
                          "results topic takes")
            value = orjson.dumps(record)
            failed.clear()

    def close(self) -> None:
        self.consumer.close()
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    def serve(self, timeout: float = 1.0) -> int:
        """Run a runner process's main loop: consume until SIGTERM, then close (its consumer
        leaves the group, a journal's reader stops); the number of records handled. For the
        main thread of a process of its own (a signal handler is installed)."""
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        print("started", flush=True)
        try:
            return self.run(stop, timeout=timeout)
        finally:
            self.close()


def _retrying(call: Callable[[], None]) -> None:
    """``call``, again while it fails with a retriable error (librdkafka's advice for
    ``send_offsets_to_transaction`` and ``commit_transaction``); any other is raised."""
    for _ in range(10):
        try:
            call()
            return
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal() or not error.retriable():
                raise
            log.warning("transaction: %s; retrying", error.str())
            time.sleep(0.5)
    call()

