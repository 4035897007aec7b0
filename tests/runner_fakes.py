"""A consumer and a producer that stand in for confluent-kafka's in a runner's loop
(``Runner.run``) without a broker: records handed out in order, commits, pauses and the
rebalance callbacks recorded; results delivered at ``flush``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import TopicPartition

COMMITTED = "tool.calls.committed"


class Message:
    """A committed-topic record as ``Consumer.poll`` returns it."""

    def __init__(self, value: bytes, offset: int = 0, partition: int = 0,
                 headers: Any = None, topic: str = COMMITTED) -> None:
        self._value, self._offset, self._partition = value, offset, partition
        self._headers, self._topic = headers, topic

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def headers(self) -> Any:
        return self._headers

    def error(self) -> None:
        return None


class LoopConsumer:
    """Hands out ``messages`` one per poll (none from a paused partition), then sets ``stop``
    once they are all out and ``idle_polls`` empty polls passed; ``on_poll`` runs before each
    poll (a test's rebalance). Records what the runner asked of it."""

    def __init__(self, messages: list[Message], stop: Any, idle_polls: int = 1) -> None:
        self.messages, self.stop, self.idle_polls = list(messages), stop, idle_polls
        self.commits: list[int] = []
        self.paused: set[int] = set()
        self.pauses = self.polls = 0
        self.partitions = sorted({m.partition() for m in messages} | {0})
        self.on_assign: Callable[..., None] | None = None
        self.on_revoke: Callable[..., None] | None = None
        self.on_poll: Callable[[LoopConsumer], None] | None = None

    def subscribe(self, topics: list[str], on_assign: Any = None, on_revoke: Any = None
                  ) -> None:
        self.on_assign, self.on_revoke = on_assign, on_revoke
        if on_assign is not None:
            on_assign(self, self.assignment())

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(COMMITTED, p) for p in self.partitions]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.pauses += 1
        self.paused |= {tp.partition for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in partitions}

    def poll(self, timeout: float) -> Message | None:
        self.polls += 1
        if self.on_poll is not None:
            self.on_poll(self)
        for message in self.messages:
            if message.partition() not in self.paused:
                self.messages.remove(message)
                return message
        if not self.messages:
            self.idle_polls -= 1
            if self.idle_polls < 0:
                self.stop.set()
        return None

    def revoke(self, partition: int) -> None:
        """A rebalance takes ``partition`` away (the revoke callback runs)."""
        self.partitions.remove(partition)
        self.paused.discard(partition)
        if self.on_revoke is not None:
            self.on_revoke(self, [TopicPartition(COMMITTED, partition)])

    def commit(self, message: Message, asynchronous: bool) -> None:
        self.commits.append(message.offset())

    def consumer_group_metadata(self) -> str:
        return "group-metadata"

    def close(self) -> None:
        pass


class Producer:
    """Delivers every record at ``flush`` (or at once inside a transaction); ``sent`` holds
    (topic, value) in order, ``calls`` the transactional calls with the offsets sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.calls: list[str] = []
        self._pending: list[Any] = []

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self.calls += [f"offset {o.partition}:{o.offset}" for o in offsets]

    def commit_transaction(self, timeout: float) -> None:
        self.flush()
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def produce(self, topic: str, key: bytes, value: bytes, headers: Any = None,
                on_delivery: Any = None) -> None:
        self.sent.append((topic, orjson.loads(value)))
        if on_delivery is not None:
            self._pending.append(on_delivery)

    def flush(self, timeout: float = 0) -> int:
        for callback in self._pending:
            callback(None, None)
        self._pending.clear()
        return 0

    def results(self) -> list[dict[str, Any]]:
        return [value for topic, value in self.sent if topic == "tool.calls.results"]
