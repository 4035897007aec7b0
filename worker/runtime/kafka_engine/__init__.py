"""The kafka engine (``worker.engine: kafka``): a confluent-kafka consume, step, produce loop
with Kafka transactions, around the same per-partition logic as the faust engine.

* :mod:`.heads`: the heads table as a dict whose writes go to the heads changelog (the topic
  and encoding the faust engine's table uses), restored from it on assignment.
* :mod:`.reader`: a bounded, ``read_committed`` reader of one partition (rebuilds, restores).
* :mod:`.transaction`: the Kafka transaction from begin to settled or aborted (the producer,
  the open batch, the overlapped commit, the retry and abort policies).
* :mod:`.engine`: :class:`KafkaEngine` itself, its loop and its batches;
  ``docs/decisions/0011-kafka-engine.md`` says why it is built this way.
* :mod:`.rebalance`: the consumer's assign, revoke and lost callbacks and the takeover
  (rebuild) they drive.
* :mod:`.forwarding`: the control records forwarded into the events topic.
"""

from __future__ import annotations

import logging.config

from worker.runtime.config import Config
from worker.runtime.kafka_engine.engine import KafkaEngine
from worker.runtime.observability import logs

__all__ = ["KafkaEngine", "build"]


def build(config: Config) -> KafkaEngine:
    """The engine of ``latch worker`` with ``worker.engine: kafka``, logging as configured;
    ``.run()`` runs it to SIGTERM."""
    logging.config.dictConfig(logs.faust_logging_config(config.worker))
    return KafkaEngine(config)
