"""The kafka engine's per-record path without a broker: CPU µs per envelope, by stage.

    python bench/kafka_engine_path.py [--runs 400] [--repeat 5] [--profile out.prof]

The backlog of ``bench/bench_worker.py`` (``bench/bench_core.py``'s generator), as
confluent-kafka ``Message`` objects in 6 partitions (crc32 of the key; record times as the
broker's append times), fed in offset order through, each timed by CPU time (best of
``--repeat``):

* ``bare``: what ``bench/bare.py loop`` does per record: ``orjson.loads`` of the value and,
  for a ``stream.end``, one ``produce``;
* ``core``: the core's ``Assembler.feed_record`` alone, one assembler per partition;
* ``engine``: ``KafkaEngine._apply_events`` (hooks, heads, outputs, the batch's offsets) with a
  real, never-connecting ``Producer`` (its ``produce`` queues locally), a transaction "committed"
  (the batch replaced, its committed outputs counted delivered) every 10,000 records as the
  loop's ``worker.batch_max_records`` does.

What the figures leave out, the same for the engine and the bare loop: ``consume`` and
librdkafka's threads; and the engine's commits (a few per 100,000 records). ``--profile``
writes a cProfile of one ``engine`` pass (read it with ``python -m pstats``).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import bench_core  # noqa: E402
import orjson  # noqa: E402
from confluent_kafka import Message, Producer  # noqa: E402

# what `latch worker` imports (faust too): the heap the cyclic GC walks
import worker.runtime.faust_engine.engine  # noqa: E402,F401
from worker.core import Assembler, Topic  # noqa: E402
from worker.runtime.config import load_config  # noqa: E402
from worker.runtime.kafka_engine.engine import KafkaEngine  # noqa: E402
from worker.runtime.partition import PartitionState  # noqa: E402

PARTITIONS = 6
EVENTS = "bench.events"
#: librdkafka's TIMESTAMP_LOG_APPEND_TIME (the benchmark's topics use append times).
APPEND_TIME = 2
BATCH = 10_000
CONSUME = 1000


Fields = tuple[int, int, bytes, bytes, tuple[int, int]]


def messages(runs: int) -> list[Fields]:
    """The backlog's records: (partition, offset, key, value, timestamp)."""
    offsets = [0] * PARTITIONS
    out = []
    for key, value, now in bench_core.corpus(fixtures(), runs):
        p = zlib.crc32(key) % PARTITIONS
        out.append((p, offsets[p], key, value, (APPEND_TIME, now)))
        offsets[p] += 1
    return out


def consumed(fields: list[Fields]) -> Iterator[list[Message]]:
    """The records as ``consume(1000)`` hands them over: new ``Message`` objects, 1,000 a
    call (what the cyclic GC sees of a real consumer's allocations)."""
    for start in range(0, len(fields), CONSUME):
        yield [Message(topic=EVENTS, partition=p, offset=o, key=k, value=v, timestamp=t)
               for p, o, k, v, t in fields[start:start + CONSUME]]


def fixtures() -> Path:
    """The shared provider fixtures: beside the checkout, or beside one of its parents."""
    for base in ROOT.parents:
        candidate = base / "shared" / "fixtures" / "providers"
        if candidate.is_dir():
            return candidate
    raise SystemExit("no shared/fixtures/providers beside the checkout")


def sink() -> Producer:
    """A producer that never connects: ``produce`` only queues (as in a transaction)."""
    return Producer({"bootstrap.servers": "127.0.0.1:1", "linger.ms": 5,
                     "queue.buffering.max.messages": 10_000_000,
                     "queue.buffering.max.kbytes": 2_000_000, "log_level": 0})


def floor(msgs: list[Fields]) -> Callable[[], None]:
    def run() -> None:
        for chunk in consumed(msgs):
            for _msg in chunk:
                pass
    return run


def bare(msgs: list[Fields]) -> Callable[[], None]:
    producer = sink()

    def run() -> None:
        loads, produce = orjson.loads, producer.produce
        for chunk in consumed(msgs):
            for msg in chunk:
                doc = loads(msg.value())
                if doc.get("type") == "stream.end":
                    produce("bench.final", b'{"type":"final"}', msg.key())
        producer.purge()
    return run


def core(msgs: list[Fields]) -> Callable[[], None]:
    settings = load_config(None, env={}).assemble

    def run() -> None:
        assemblers = [Assembler(settings) for _ in range(PARTITIONS)]
        for chunk in consumed(msgs):
            for msg in chunk:
                p = msg.partition()
                assemblers[p].feed_record(msg.key(), msg.value(), msg.timestamp()[1], {
                    "topic": EVENTS, "partition": p, "offset": msg.offset()})
    return run


def engine(msgs: list[Fields]) -> tuple[Callable[[], None], Callable[[], KafkaEngine]]:
    config = load_config(None, env={"LATCH_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
                                    "LATCH_TOPICS__EVENTS": EVENTS})
    holder: list[KafkaEngine] = []

    def fresh() -> KafkaEngine:
        if holder:
            _txn(holder[0]).producer.purge()
            return_engine = holder[0]
        else:
            return_engine = KafkaEngine(config)
            return_engine.consumer.close()
            _txn(return_engine).producer = sink()
            holder.append(return_engine)
        e = return_engine
        e.partitions.clear()  # (the driver's dict: filled, not replaced)
        e.partitions.update({p: PartitionState(Assembler(config.assemble), next_offset=0)
                             for p in range(PARTITIONS)})
        e.table.data.clear()
        e.table.pending.clear()
        _txn(e).batch = None
        return e

    def run() -> None:
        e = fresh()
        hooks, txn = e.hooks, _txn(e)
        apply_events = getattr(e, "_apply_events", None)
        if apply_events is None:  # an engine of before the batch method: record by record
            def apply_events(chunk: list[Message]) -> None:
                for msg in chunk:
                    e._apply_event(msg)  # type: ignore[attr-defined]
        begin = lambda: _begin(e, txn)  # noqa: E731
        if txn is e:  # an engine of before transaction.py
            e._begin = begin  # type: ignore[attr-defined,unused-ignore]
        else:
            txn.begin = begin
        for chunk in consumed(msgs):
            apply_events(chunk)
            if txn.batch is not None and txn.batch.records >= BATCH:  # a commit, no broker
                batch, txn.batch = txn.batch, None
                for record_ms in batch.committed:
                    hooks.delivered(Topic.COMMITTED, record_ms, True)
                batch.positions()
        txn.producer.purge()
    return run, fresh


def _txn(e: KafkaEngine) -> Any:
    """What holds the producer and the open batch: the engine's transaction
    (``kafka_engine/transaction.py``), or the engine itself before it had one."""
    return getattr(e, "txn", e)


def _begin(e: KafkaEngine, txn: Any) -> Any:
    """Open a batch without a transaction (the producer never connects)."""
    if txn.batch is None:
        batch = sys.modules[type(txn).__module__].Batch
        txn.batch = batch(time.monotonic(), events_topic=e.events)
    return txn.batch


def best(run: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        run()
        times.append(time.process_time() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--only", default="consume,bare,core,engine")
    parser.add_argument("--gc", choices=("on", "freeze", "off"), default="on",
                        help="the cyclic GC as it runs, after gc.freeze(), or disabled")
    args = parser.parse_args()
    import worker
    msgs = messages(args.runs)
    if args.gc == "freeze":
        gc.freeze()
    elif args.gc == "off":
        gc.disable()
    print(f"{len(msgs):,} envelopes; core compiled: {worker.compiled_core()}; "
          f"load {os.getloadavg()[0]:.2f}")
    run_engine, _ = engine(msgs)
    contenders = {"consume": floor(msgs), "bare": bare(msgs), "core": core(msgs),
                  "engine": run_engine}
    figures = {}
    for name in args.only.split(","):
        figures[name] = best(contenders[name], args.repeat) / len(msgs) * 1e6
        print(f"{name:8s} {figures[name]:6.2f} µs/envelope")
    if "bare" in figures and "engine" in figures:
        print(f"engine / bare (per-record CPU): {figures['engine'] / figures['bare']:.2f}x")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run_engine)
        profiler.dump_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
