"""The operability hooks of a worker engine, in the one sequence both engines call them.

Either engine (faust's :mod:`worker.runtime.faust_engine.engine`, the confluent-kafka
:mod:`worker.runtime.kafka_engine`) holds one :class:`EngineHooks` (its driver too) and calls

* :attr:`EngineHooks.metrics` and :attr:`EngineHooks.tracing` for each record, through the
  partition driver (:meth:`worker.runtime.driver.Driver.apply_all`): the record's metrics
  (:mod:`worker.runtime.observability.metrics`, a counter increment when nothing ends) and its
  run's span (:mod:`worker.runtime.observability.tracing`);
* :meth:`EngineHooks.traced` for the trace id of each audit record, from the same run's trace;
* :meth:`EngineHooks.headers` for the trace headers of each output record (its run's; the
  driver's outgoing chain adds a committed call's signature after them:
  :class:`worker.runtime.governance.signing.SignCommitted`);
* :meth:`EngineHooks.delivered` when an output's delivery is known (faust: the send's future;
  the kafka engine: its transaction committed or aborted);
* :meth:`EngineHooks.assigned` / :meth:`EngineHooks.revoked` with the events partitions of a
  rebalance, and :meth:`EngineHooks.rebuilding` around each takeover's rebuild (readiness,
  rebuild metrics; :mod:`worker.runtime.observability.health`);
* :meth:`EngineHooks.views` for the partition gauges (runs open, bytes, lag), given a function
  that reads a partition's end offset from the engine's consumer;
* :meth:`EngineHooks.serve_http` and :meth:`EngineHooks.stop` around the run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass

from worker.core import Emit, Topic
from worker.runtime.config import Config
from worker.runtime.observability.health import Health, HttpServer
from worker.runtime.observability.metrics import PartitionView
from worker.runtime.observability.telemetry import Telemetry
from worker.runtime.observability.tracing import Headers
from worker.runtime.partition import PartitionState

__all__ = ["EngineHooks", "Rebuild"]


@dataclass(slots=True)
class Rebuild:
    """One takeover's rebuild, as :meth:`EngineHooks.rebuilding` measures it: the engine
    sets the state it built and the records it re-read."""

    began: float
    state: PartitionState | None = None
    records: int = 0


class EngineHooks:
    """Metrics, run spans, health and the HTTP port of one worker, whatever its engine."""

    def __init__(self, config: Config) -> None:
        worker = config.worker
        self.config = config
        self.telemetry = Telemetry(worker.otel_exporter, labels=worker.metrics_labels,
                                   label_cap=worker.metrics_label_cap,
                                   label_values={"tool": worker.metrics_label_tools,
                                                 "tenant": worker.metrics_label_tenants})
        self.metrics, self.tracing = self.telemetry.metrics, self.telemetry.tracing
        self.health = Health()

    # -- per record ---------------------------------------------------------------------

    def routed(self, emit: Emit) -> None:
        """Count a control record that went to the DLQ instead of its run's partition."""
        self.metrics.record([emit])

    def traced(self, emits: list[Emit]) -> None:
        """Write the run's trace id into the audit records among ``emits`` (the core leaves
        it null); after :meth:`RunTracer.on_record` of their record, so that a run that
        opened with it has its trace."""
        tracing = self.tracing
        for emit in emits:
            if emit.topic is Topic.AUDIT:
                emit.value["trace_id"] = tracing.trace_id(emit.key)

    def headers(self, emit: Emit) -> Headers | None:
        """The trace headers of an output record: its run's trace (None: no trace)."""
        return self.tracing.headers(emit.key)

    def delivered(self, topic: Topic, record_ms: int | None, ok: bool) -> None:
        """An output record was delivered (visible to readers), or its delivery failed;
        ``record_ms``: the time of the input record that produced it."""
        if not ok:
            self.metrics.send_failed(topic)
        elif topic is Topic.COMMITTED:
            self.metrics.commit_delivered(record_ms, time.time())

    # -- partitions ---------------------------------------------------------------------

    def assigned(self, partitions: Collection[int], control: Collection[int] = ()) -> None:
        """The group gave this worker these events and control partitions (the whole
        assignment)."""
        self.health.assigned(partitions, control)

    def revoked(self, partitions: Collection[int], control: Collection[int] = ()) -> None:
        """These events and control partitions were taken away: not ready until the next
        assignment; the events partitions' runs' spans end here."""
        self.health.revoked(partitions, control)
        for partition in partitions:
            self.tracing.forget_partition(partition)

    @contextlib.contextmanager
    def rebuilding(self, partition: int) -> Iterator[Rebuild]:
        """Around a takeover's rebuild of ``partition``: not ready meanwhile; then its time
        and records re-read are counted, and argument sizes count from here."""
        rebuild = Rebuild(time.monotonic())
        with self.health.rebuilding(partition):
            yield rebuild
        if rebuild.state is not None:
            rebuild.state.assembler.sizes = []  # a rebuild's calls are not new
        self.metrics.rebuilt(time.monotonic() - rebuild.began, rebuild.records)

    def views(self, partitions: Mapping[int, PartitionState],
              lag_of: Callable[[int, PartitionState], int | None]) -> list[PartitionView]:
        """The owned partitions for the gauges; ``lag_of(partition, state)``: the records
        the consumer can read that the partition has not applied (None: unknown). Reads only
        (any thread)."""
        views, now = [], time.time()
        budget = self.config.assemble.max_buffered_bytes
        for partition, state in tuple(partitions.items()):
            lag = lag_of(partition, state)
            seconds = None if lag is None else (
                max(0.0, now - state.clock_ms / 1000) if lag and state.clock_ms else 0.0)
            views.append(PartitionView(partition, state.assembler.open_runs,
                                       state.assembler.buffered_bytes, budget, lag, seconds))
        return views

    # -- running ------------------------------------------------------------------------

    def serve_http(self) -> HttpServer | None:
        """Start the HTTP port (``worker.http_port``; 0: none); OSError if it cannot bind."""
        worker = self.config.worker
        if worker.http_port == 0:
            return None
        return HttpServer(worker.http_host, worker.http_port, self.health,
                          self.metrics.exposition).start()

    def http_error(self, exc: OSError) -> str:
        """The message of a worker that cannot serve ``worker.http_port`` (it exits 2)."""
        return f"latch worker: cannot serve worker.http_port {self.config.worker.http_port}: " \
               f"{exc.strerror}"

    def stop(self, server: HttpServer | None) -> None:
        """The worker is stopping: leave the group's readiness, stop the port, flush."""
        self.health.left()
        if server is not None:
            server.stop()
        self.telemetry.shutdown()

