"""A consumed record as confluent-kafka's ``Consumer.consume`` hands it to the kafka engine,
for tests that drive the engine's loop without a broker (its record time: one second after an
epoch of 1,700,000,000,000 ms per offset, ``CreateTime``)."""

from __future__ import annotations


class EngineMessage:
    """A consumed record of ``topic[partition]`` at ``offset``, with no headers."""

    def __init__(self, topic: str, offset: int, key: bytes, value: bytes,
                 partition: int = 0) -> None:
        self._topic, self._offset, self._key, self._value = topic, offset, key, value
        self._partition = partition

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000 + self._offset

    def headers(self) -> None:
        return None
