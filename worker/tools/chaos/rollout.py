"""Policy rollouts under chaos (``latch chaos --policy --policy-rollouts N``, issue 32).

The workers run ``policy.mode: enforce`` without ``policy.file``: the registry's newest policy
set version decides (docs/contract.md, *Toolsets by reference*; decisions 0013, 0014). Chaos
registers version 1 before the workers start, waits until a policy marker of it stands in every
events partition (before that, no version is in force and every call would be denied), then
registers N more versions, one each time the driver has published another ``records /
(N + 1)`` records, while workers are killed and restarted: the code path of ``latch registry
put policy`` (:func:`worker.runtime.governance.registry_io.put`), not a subprocess. At the
end it waits until every partition has a marker of the last version.

Every version decides each planned call as the policy file does (:func:`texts`: the file's
policies, ids and order unchanged, under a comment naming the version, so each version is a
text of its own), so the plan's expected records stay exact but for the audit record's
``policy.version``, which the verifier checks against the markers (verify.py, ``Rollout``).

Who writes what: the versions are chaos's own (the registry topic is the stack's); the
markers are the workers' (the events topic).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from worker.runtime.config import Config
from worker.runtime.governance import registry_io
from worker.runtime.governance.registry import POLICY, POLICY_MARKER, Invalid
from worker.tools.chaos.verify import OutRecord, markers

__all__ = ["Rollouts", "register", "texts", "wait_markers"]

#: How long one version's registration may retry through broker restarts.
REGISTER_WITHIN_S = 180.0


def texts(policy: str, count: int) -> list[str]:
    """The Cedar texts of versions 1 to ``count``: ``policy`` under a first line naming the
    version; the same policies, so every version decides every call alike."""
    return [f"// latch chaos: policy set version {n} of {count} (the same policies each)\n"
            + policy for n in range(1, count + 1)]


def register(config: Config, version: int, text: str,
             within_s: float = REGISTER_WITHIN_S) -> None:
    """Register policy set ``version`` (``latch registry put policy``), retrying Kafka
    errors (a broker restart) for ``within_s``; a version registered already with this very
    text counts (an earlier try whose delivery report was lost). Raises
    :class:`~worker.runtime.governance.registry.Invalid` for another text, or
    :class:`~worker.runtime.governance.registry_io.RegistryError` after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            registry_io.put(config, POLICY, "", version, text)
            return
        except Invalid:
            entry = registry_io.read_whole(config).get(POLICY, "", version)
            if entry is None or entry.content != text:
                raise
            return
        except registry_io.RegistryError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


class Rollouts(threading.Thread):
    """Registers versions 2 to ``len(texts)`` in a thread of its own, version ``n`` once
    ``sent()`` (the driver's published records) reaches ``(n - 1) * every``."""

    def __init__(self, config: Config, versions: list[str], every: int,
                 sent: Callable[[], int]) -> None:
        super().__init__(name="chaos-rollouts", daemon=True)
        self.config, self.versions, self.every, self.sent = config, versions, every, sent
        #: The versions registered so far, in order (version 1 by the caller).
        self.registered: list[int] = [1]
        #: Why a version could not be registered (then no later one is).
        self.error: str | None = None
        #: Per version registered here: the records published when it was due, and when it
        #: was registered (a registration takes a registry read and a delivery).
        self.lags: list[tuple[int, int]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        for version in range(2, len(self.versions) + 1):
            due = (version - 1) * self.every
            while self.sent() < due:
                if self.stopping.wait(0.05):
                    return
            try:
                register(self.config, version, self.versions[version - 1])
            except (Invalid, registry_io.RegistryError) as exc:
                self.error = f"policy set version {version} not registered: {exc}"
                return
            self.registered.append(version)
            self.lags.append((due, self.sent()))


def wait_markers(bootstrap: str, topic: str, partitions: int, version: int, timeout: float,
                 on_tick: Callable[[], None] = lambda: None) -> dict[int, list[tuple[int, int]]]:
    """Read the events ``topic`` (read_committed) from its beginning until the last policy
    marker of each of its ``partitions`` names ``version``, at most ``timeout`` seconds; the
    markers read (verify.py :func:`~worker.tools.chaos.verify.markers`)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-markers",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    found: list[OutRecord] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is None and msg.key() == POLICY_MARKER:
                    found.append(OutRecord("events", msg.partition() or 0, msg.offset() or 0,
                                           msg.key(), msg.value() or b""))
            read = markers(found)
            if all(read.get(p) and read[p][-1][1] == version for p in range(partitions)):
                return read
            on_tick()
        return markers(found)
    finally:
        consumer.close()
