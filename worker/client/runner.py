"""The runner's side of the contract: execute committed calls once, publish their results.

A runner consumes the committed topic (``tool.calls.committed``), and for each record:

1. refuses anything that is not a committed call (not JSON, or the committed-call schema
   fails) and, when it holds signing keys (``signing.keys``, :mod:`worker.runtime.signing`),
   anything the worker did not sign with one of them: nothing runs,
   ``tool_execute_rejected_not_committed_total{reason}`` counts it, and the record is
   skipped (a runner must never execute what the worker did not commit);
2. skips a call whose ``idempotency_key`` the :class:`DedupStore` has seen (delivery is at
   least once: the same committed call may arrive twice);
3. calls the Python function registered under the call's ``name`` with the decoded
   ``arguments``; its return value (a string as is, anything else as JSON) or the exception
   it raised becomes one ``tool.calls.results`` record (``schemas/tool-result.schema.json``),
   keyed by ``run_id``, paired by ``tool_call_id``, with the call's trace context in its
   headers (the run's trace continues: :mod:`worker.runtime.observability.tracing`);
4. waits until the result is delivered, then remembers the key, then commits the offset (a
   result the broker refuses as too large is answered by an error result instead; any other
   failed delivery stops the runner before the offset is committed).

A crash between the function's return and step 4 runs the function again after a restart:
the store makes a redelivered call run once, not a crashed execution. A tool with side
effects that must happen at most once keeps its own record under the idempotency key (or
uses a store that shares the tool's transaction). The default store keeps keys in memory
(bounded, least recently seen dropped first): a restart forgets them, which is what
:class:`DedupStore` implementations with a database behind them are for.

``docs/runner.md`` shows how an agent loop feeds results and error results back to the model
for each provider. ``examples/runner.py`` is a runnable runner.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from opentelemetry import trace

from worker.runtime import signing
from worker.runtime.config import Config
from worker.runtime.observability import logs, tracing
from worker.runtime.observability.metrics import Metrics
from worker.runtime.schemas import validator

__all__ = ["DedupStore", "MemoryStore", "Outcome", "Runner", "answer", "result_record"]

log = logging.getLogger("latch.runner")

#: A tool: the call's decoded arguments in, a JSON-serialisable result (or a string) out.
Tool = Callable[[Any], Any]
#: The most bytes a result's content may hold, JSON-escaped as the record carries it (the
#: results topic takes ~1 MB records).
MAX_RESULT_BYTES = 900_000


class DedupStore(Protocol):
    """Which idempotency keys have been executed (and their results delivered)."""

    def seen(self, key: str) -> bool: ...

    def remember(self, key: str) -> None: ...


class MemoryStore:
    """The default store: the last ``max_keys`` keys, in memory."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self.max_keys = max_keys
        self._keys: OrderedDict[str, None] = OrderedDict()

    def seen(self, key: str) -> bool:
        if key in self._keys:
            self._keys.move_to_end(key)
            return True
        return False

    def remember(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What :meth:`Runner.handle` decided for one record: ``status`` is ``executed``,
    ``duplicate`` or ``rejected``; ``value`` is the result record to publish (executed)."""

    status: str
    key: bytes | None = None
    value: bytes | None = None
    idempotency_key: str | None = None
    reason: str | None = None


def result_record(call: Mapping[str, Any], is_error: bool, content: str) -> dict[str, Any]:
    """The ``tool.calls.results`` value answering the committed ``call``."""
    return {"v": 1, "run_id": call["run_id"], "tenant": call["tenant"],
            "provider": call["provider"], "tool_call_id": call["call_id"],
            "name": call["name"], "idempotency_key": call["idempotency_key"],
            "is_error": is_error, "content": content}


def _content(result: Any) -> tuple[bool, str]:
    """A tool's return value as the result's content: a string as is, anything else as JSON
    (or an error result when it is not JSON)."""
    if isinstance(result, str):
        return False, str.__str__(result)  # a subclass's own __str__ is not asked
    try:
        return False, orjson.dumps(result).decode()
    except Exception as exc:  # orjson's TypeError; a lone surrogate is one, too
        return True, f"the tool returned a value that is not JSON ({type(exc).__name__})"


def _escaped(text: str) -> str:
    """``text`` without lone surrogates (what Python decodes a non-UTF-8 file name to,
    ``os.fsdecode(b"\\xff")``): each becomes the six characters ``\\udcff``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _failure(exc: BaseException) -> str:
    """An exception as an error result's content: its type, then its message."""
    try:
        message = str(exc)
    except Exception:  # a __str__ that raises, or returns something other than a str
        return f"{type(exc).__name__} (its message could not be read)"
    return f"{type(exc).__name__}: {message}"[:2000]


def answer(call: Mapping[str, Any], is_error: bool, content: str, max_bytes: int) -> bytes:
    """The result record answering ``call``, as bytes: always one record. A lone surrogate
    in ``content`` is escaped; content whose JSON text is over ``max_bytes`` becomes an
    error result (the record would not reach the results topic)."""
    try:
        text = orjson.dumps(content)
    except TypeError:  # a lone surrogate: the only str orjson refuses
        content = _escaped(content)
        text = orjson.dumps(content)
    if len(text) - 2 > max_bytes:
        is_error, content = True, f"the tool's result is larger than {max_bytes} bytes"
    return orjson.dumps(result_record(call, is_error, content))


class Runner:
    """Execute committed calls with registered functions; see the module docstring."""

    def __init__(self, config: Config, tools: Mapping[str, Tool], *,
                 store: DedupStore | None = None, metrics: Metrics | None = None,
                 group_id: str = "latch-runner", max_result_bytes: int = MAX_RESULT_BYTES,
                 consumer: Any = None, producer: Any = None,
                 tracer: trace.Tracer | None = None,
                 verifier: signing.Verifier | None = None) -> None:
        self.config = config
        self.tools = dict(tools)
        self.store: DedupStore = store if store is not None else MemoryStore()
        self.metrics = metrics if metrics is not None else Metrics(prometheus=False)
        self.max_result_bytes = max_result_bytes
        self._check = validator("committed-call")
        #: The keys a committed record must be signed by (config's ``signing.keys``; none:
        #: signatures are not checked).
        self.verifier = verifier if verifier is not None else signing.verifier(config)
        settings = config.kafka.confluent_config()
        self.consumer = consumer if consumer is not None else Consumer(logs.kafka_config({
            **settings, "group.id": group_id, "enable.auto.commit": False,
            "auto.offset.reset": "earliest"}))
        self.producer = producer if producer is not None else Producer(logs.kafka_config({
            **settings, "enable.idempotence": True, "partitioner": "murmur2_random"}))
        self.executed = 0
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
        is_error, content = self._execute(call)
        value = answer(call, is_error, content, self.max_result_bytes)
        return Outcome("executed", call["run_id"].encode(), value, key)

    def _reject(self, reason: str) -> Outcome:
        self.metrics.rejected_not_committed(reason)
        log.warning("refused a record that is not a committed call (%s)", reason)
        return Outcome("rejected", reason=reason)

    def _execute(self, call: dict[str, Any]) -> tuple[bool, str]:
        tool = self.tools.get(call["name"])
        if tool is None:
            return True, f"no tool named {call['name']!r} is registered with this runner"
        self.executed += 1
        try:
            result = tool(call["arguments"])
        except KeyboardInterrupt:
            raise  # the operator stops the runner: the interrupted call runs again
        except BaseException as exc:  # sys.exit in a tool is answered, too
            # The arguments are never logged: only where the tool failed.
            log.warning("tool %s raised %s", call["name"], _escaped(type(exc).__name__),
                        extra=logs.where(run_id=call["run_id"]))
            log.debug(_escaped("".join(traceback.format_tb(exc.__traceback__))))
            return True, _failure(exc)
        return _content(result)

    # -- the loop -----------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, timeout: float = 1.0,
            max_records: int | None = None) -> int:
        """Consume until ``stop`` is set (or ``max_records`` were handled); return how many
        records were handled."""
        stop = stop or threading.Event()
        self.consumer.subscribe([self.config.topics.committed])
        handled = 0
        try:
            while not stop.is_set() and (max_records is None or handled < max_records):
                message = self.consumer.poll(timeout)
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
            self.producer.flush(30)
        return handled

    def _process(self, message: Any) -> None:
        received = message.headers()
        parent = tracing.extract(received)
        with self.tracer.start_as_current_span("latch.tool.execute", context=parent,
                                               kind=trace.SpanKind.CONSUMER):
            outcome = self.handle(message.value(), message.topic(), received)
            headers = tracing.inject()  # this span's context: the trace goes on
        if outcome.status == "executed":
            self._deliver(outcome, list(headers) or None)
            self.store.remember(outcome.idempotency_key or "")
        self.consumer.commit(message=message, asynchronous=False)

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

