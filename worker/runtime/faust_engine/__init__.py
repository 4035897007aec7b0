"""The faust engine (``worker.engine: faust``): faust around the partition driver.

* :mod:`.engine`: :class:`FaustEngine`, the faust app, its topics, its heads table and the
  partitions it owns: the events loop, offset order, ticks.
* :mod:`.rebalance`: faust's assigned and revoked signals, and the takeover of a partition
  (mixed into :class:`FaustEngine`).
* :mod:`.forwarding`: the control records forwarded into the events topic, and the control
  repair (mixed into :class:`FaustEngine`).
* :mod:`.sends`: a record's outputs sent, confirmed, refused for their size.
* :mod:`.heads`: the heads table as faust keeps it (:class:`~.heads.FaustHeadsTable`, its
  :class:`~.heads.HeadsCodec`, and :class:`~.heads.FaustHeadsMap` that the driver writes).
* :mod:`.app`: faust's :class:`~.app.App`, its table recovery reading through transaction markers
  (decision 0009).
* :mod:`.gaps`: the watch on a partition whose next record faust does not deliver.
* :mod:`.kafka_io`: aiokafka's connection options and the plain reads of the log.
* :mod:`.settings`: faust's settings from latch.yaml, and its lean monitor.

Imported by :mod:`worker.runtime.engine` only when ``worker.engine`` is ``faust``.
"""

from worker.runtime.faust_engine.engine import FaustEngine

__all__ = ["FaustEngine"]
