"""Issue 10, item 3: the route for a second engine, by measurement (decision 0011).

    python bench/engine_route.py --bootstrap 127.0.0.1:PORT [--runs 400] [--only kafka,quix]

On the same backlog (``--runs`` runs of the three providers, two calls each, argument text
in 4-character fragments: about 215 envelopes a run), published before the worker starts,
one process each:

* ``kafka``: ``python -m worker worker`` with ``worker.engine: kafka`` (exactly once);
* ``faust``: ``python -m worker worker`` with the default engine (at least once), for scale;
* ``bare``: a bare confluent-kafka loop (parse each envelope, forward one record per
  ``stream.end`` to the final topic; no transactions): the ceiling issue 10 measures against;
* ``quix``: Quix Streams (``pip install quixstreams``; not a dependency of Latch) hosting
  Latch's ``step.step``: ``processing_guarantee="exactly-once"``, one in-memory assembler per
  partition, the run heads in Quix's changelog-backed state, outputs routed by topic through
  five branches of the dataframe. It has the per-record path of a Quix-hosted Latch; it does
  NOT have the rebuild on assignment, the ticks or the cancel forwarding (see the decision).

Two figures, both seen by a read_committed reader in this process: envelopes / (last final
message - first output), start-up excluded but flattering a loop whose first output comes
late (the bare loop's first output is the first ``stream.end``); and envelopes / (last final
message - the process's start), start-up (imports, group join) included. The machine is
shared: compare the rows of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import orjson  # noqa: E402
from worker_harness import (  # noqa: E402
    PROVIDERS,
    Reader,
    WorkerProcess,
    make_stack,
    provider_run,
    publish_envelopes,
)

ROLES = ("committed", "errors", "final", "progress", "dlq")


def backlog(runs: int) -> list[dict[str, object]]:
    envelopes = []
    for n in range(runs):
        run_id = f"route-{n}"
        calls = [(f"call_{n}_{i}", "read_file", orjson.dumps({"path": "/d/" + "x" * 380}).decode())
                 for i in range(2)]
        envelopes += provider_run(PROVIDERS[n % 3], run_id, calls, size=4)
    return envelopes


def timed(stack, runs: int, popen, log: Path) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """Seconds from the first output to the last final message, seconds from now (the
    process was just started) to the last final message, outputs read."""
    began = time.monotonic()
    reader = Reader(stack, ROLES)
    first = None
    deadline = time.monotonic() + 300
    while len(reader.of("final")) < runs:
        if popen.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the worker stopped or stalled:\n{log.read_text()[-3000:]}")
        reader._poll(deadline)
        if first is None and reader.records:
            first = time.monotonic()
    elapsed = time.monotonic() - (first or time.monotonic())
    wall = time.monotonic() - began
    count = len(reader.records)
    reader.close()
    return elapsed, wall, count


def quix_worker() -> None:  # pragma: no cover - runs in its own process
    from quixstreams import Application, message_context
    from quixstreams.models.serializers import Serializer

    from worker.core import Assembler, Topic
    from worker.runtime import partition as partition_module
    from worker.runtime import step
    from worker.runtime.config import load_config

    config = load_config(None)
    names = config.topics
    app = Application(broker_address=config.kafka.bootstrap_servers,
                      consumer_group=config.worker.app_id, auto_offset_reset="earliest",
                      processing_guarantee="exactly-once", commit_interval=0.1,
                      commit_every=2000, state_dir=os.environ["QUIX_STATE_DIR"],
                      auto_create_topics=True, loglevel="WARNING")
    raw = {"key_deserializer": "bytes", "value_deserializer": "bytes",
           "key_serializer": "bytes", "value_serializer": "bytes"}
    events = app.topic(names.events, **raw)
    class Third(Serializer):  # the value of an (topic, key, value) output
        def __call__(self, value: tuple[str, bytes, bytes], ctx: object) -> bytes:
            return value[2]

    outputs = {t: app.topic(getattr(names, t.value), key_serializer="bytes",
                            value_serializer=Third()) for t in Topic}
    assemblers: dict[int, Assembler] = {}

    def latch(value: bytes, key: bytes, timestamp: int, headers: object, state: object
              ) -> list[tuple[str, bytes | None, bytes]]:
        ctx = message_context()
        partition, offset = ctx.partition, ctx.offset
        assembler = assemblers.setdefault(partition, Assembler(config.assemble))
        run_id = key.decode("utf-8", "replace")
        was_open = assembler.is_open(run_id)
        emits = step.step(assembler, step.record(key, value, timestamp, names.events,
                                                 partition, offset))
        if not was_open and assembler.is_open(run_id):
            state.set("head", {"p": partition, "start": offset})  # type: ignore[attr-defined]
        for finished in partition_module.finished_runs(emits):
            seq, status = assembler.finished(finished) or (None, None)
            state.set("head", {"p": partition, "done": True, "seq": seq,  # type: ignore[attr-defined]
                               "status": status})
        return [(e.topic.value, step.out_key(e, key), step.out_value(e)) for e in emits]

    sdf = app.dataframe(events).apply(latch, stateful=True, expand=True, metadata=True)
    for topic, out in outputs.items():
        branch = sdf.filter(lambda v, name=topic.value: v[0] == name)
        branch.to_topic(out, key=lambda v: v[1])
    app.run()


def bare_worker() -> None:  # pragma: no cover - runs in its own process
    import signal

    from confluent_kafka import Consumer, Producer

    from worker.runtime.config import load_config

    config = load_config(None)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    consumer = Consumer({"bootstrap.servers": config.kafka.bootstrap_servers,
                         "group.id": config.worker.app_id, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers, "linger.ms": 5})
    consumer.subscribe([config.topics.events])
    final = config.topics.final
    while not stop:
        for msg in consumer.consume(1000, timeout=0.2):
            if msg.error() is None:
                envelope = orjson.loads(msg.value() or b"{}")
                if envelope.get("type") == "stream.end":
                    producer.produce(final, orjson.dumps({"run_id": envelope["run_id"]}),
                                     msg.key())
        producer.poll(0)
    producer.flush(10)
    consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--only", default="bare,kafka,quix,faust")
    args = parser.parse_args()
    envelopes = backlog(args.runs)
    print(f"backlog: {args.runs} runs, {len(envelopes)} envelopes; machine shared with other "
          "sessions (2 cores)")
    for contender in args.only.split(","):
        settings = {"worker__engine": "kafka"} if contender == "kafka" else {}
        with make_stack(args.bootstrap, f"route-{contender}", partitions=3,
                        **settings) as stack, tempfile.TemporaryDirectory() as tmp:
            publish_envelopes(stack.bootstrap, stack.topic("events"), envelopes)
            log = Path(tmp) / "worker.log"
            if contender in ("kafka", "faust"):
                proc = WorkerProcess(stack, log)
                popen = proc.proc
            else:
                env = os.environ | stack.env() | {"QUIX_STATE_DIR": tmp}
                mode = f"--{contender}-worker"
                with open(log, "wb") as out:
                    popen = subprocess.Popen([sys.executable, __file__, mode],
                                             env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                elapsed, wall, count = timed(stack, args.runs, popen, log)
            finally:
                popen.terminate()
                popen.wait(30)
            print(f"{contender}: {len(envelopes) / elapsed:,.0f} envelopes/s first output to "
                  f"last final ({elapsed:.2f} s); {len(envelopes) / wall:,.0f} envelopes/s from "
                  f"the process start ({wall:.2f} s); {count} output records", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--quix-worker"]:
        quix_worker()
    elif sys.argv[1:] == ["--bare-worker"]:
        bare_worker()
    else:
        sys.exit(main())
