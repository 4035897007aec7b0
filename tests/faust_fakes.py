"""A stand-in for faust's stream as the worker's agents (``FaustEngine._consume``) use it,
for tests that drive an agent without a broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace


class FaustStream:
    """faust's stream with its automatic acks on: each value yielded with the stream's
    ``current_event`` set to its event, and the event acked when the loop asks for the next
    one or the stream closes (faust's ``Stream.__aiter__``), unless the message is already
    marked acked (faust's ``Message.ack``); each ack logged as ``ack OFFSET``."""

    def __init__(self, log: list[str], messages: list[SimpleNamespace]) -> None:
        self.log, self.messages = log, messages
        self.current_event: SimpleNamespace | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for message in self.messages:
            message.acked = False
            self.current_event = SimpleNamespace(message=message)
            try:
                yield message.value
            finally:
                self.current_event = None
                if not message.acked:
                    message.acked = True
                    self.log.append(f"ack {message.offset}")
