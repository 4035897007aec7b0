"""What the faust engine sends for a record, and what it learns from refusals.

The engine (``engine.py``) hands the driver a record; the driver returns what it needs
sent, prepared (:meth:`Driver.apply_all`'s ``Work``); :class:`Sends` sends it, in order
(:meth:`Sends.publish`; a record's audit records once its other outputs are confirmed, so that
a refused outcome's says ``refused``), and hands the partition the confirm of each send
(:class:`_Refusable`, awaited by :meth:`PartitionState.confirm` before the record is acked). A
record the broker refuses for its own sake (worker/runtime/refusals.py) is replaced by its
``output_refused`` DLQ record (:meth:`Sends.refuse`); the output topics' limits are read at
start and after a refusal for size (:meth:`Sends.read_limits`), and aiokafka's batches are
kept below the smallest.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka.errors import (  # type: ignore[import-untyped]
    CorruptRecordException,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)
from faust.exceptions import ProducerSendError
from faust.types import TopicT

from worker.core import Emit, Topic
from worker.runtime import admin, refusals
from worker.runtime.config import Config
from worker.runtime.driver import Driver, Outgoing
from worker.runtime.hooks import EngineHooks
from worker.runtime.partition import PartitionState
from worker.runtime.step import Source

__all__ = ["Sends", "refusal"]


class Sends:
    """The faust engine's sends of outputs into ``outputs`` (faust topics by :class:`Topic`;
    ``names``: their names), their confirms and delivery metrics; ``app_conf``: the app's
    configuration, whose producer batch size :meth:`read_limits` keeps below the limits."""

    def __init__(self, config: Config, driver: Driver, hooks: EngineHooks,
                 outputs: Mapping[Topic, TopicT], names: Mapping[Topic, str], app_conf: Any
                 ) -> None:
        self.config, self.driver, self.hooks = config, driver, hooks
        self.outputs, self.names, self.app_conf = outputs, names, app_conf
        #: The output topics' limits (the driver's): the driver checks each output before it
        #: is sent.
        self.limits = driver.limits

    async def publish(self, state: PartitionState, outs: Sequence[Outgoing]) -> None:
        """Send each prepared output (:attr:`Work.out`: with its run's trace headers, a DLQ
        record keyed by the input record's key), in order. One over its topic's limit was
        prepared as its ``output_refused`` DLQ record (:meth:`Driver.outgoing`), and one the
        broker refuses for its own sake is not sent again: its ``output_refused`` DLQ record
        goes in its place (worker/runtime/refusals.py, :class:`_Refusable`).

        Audit records go last, once the other outputs are confirmed: the broker answers a
        send after it returns, so only then is it known whether an outcome reached its
        topic, and a refused outcome's audit record says ``refused`` (decision 0016,
        :meth:`Driver.reaudit`)."""
        if any(out.topic is Topic.AUDIT for out in outs):
            await self._send(state, [out for out in outs if out.topic is not Topic.AUDIT])
            await state.confirm()  # (a refusal noted by the driver: Driver.refused)
            driver = self.driver
            outs = [driver.reaudit(out) for out in outs if out.topic is Topic.AUDIT]
        await self._send(state, outs)

    async def _send(self, state: PartitionState, outs: Sequence[Outgoing]) -> None:
        """:meth:`publish` of ``outs``, in order; their confirms left to the partition."""
        for out in outs:
            emit, name, out_key, value, headers = (out.emit, out.name, out.key, out.value,
                                                   out.headers)
            topic = self.outputs[out.topic]
            if out.refused:
                await (await topic.send(key=out_key, value=value))
                continue
            # topic.send, with the message's future at hand: it is what a failure is set on
            # (awaited by the confirm, so never an unretrieved exception); ``send`` returns
            # aiokafka's future instead
            message = topic.as_future_message(key=out_key, value=value, headers=headers)
            key, source = out.in_key, out.source
            try:
                await topic.publish_message(message)
            except ProducerSendError as exc:  # refused by aiokafka at once
                error = refusal(exc.__cause__)
                if error is None:
                    raise
                await (await self.refuse(emit, name, out_key,
                                         refusals.batch_size(out_key, value, headers), error,
                                         key, source))
                continue
            if emit.topic is not Topic.PROGRESS:
                state.unconfirmed.append(_Refusable(self, message, emit, name, out_key, value,
                                                    headers, key, source))
                message.add_done_callback(self._delivery(emit.topic, out.record_ms))

    async def refuse(self, emit: Emit, name: str, out_key: bytes | None, size: int,
                     error: str, key: bytes | None, source: Source | None
                     ) -> Awaitable[Any]:
        """Send, instead of ``emit`` (for topic ``name``), its ``output_refused`` DLQ record,
        keyed by the input record's ``key`` (:meth:`Driver.refused`); return the send's
        future."""
        return await self.outputs[Topic.DLQ].send(
            key=key, value=self.driver.refused(emit, name, out_key, size, error, key, source))

    def _delivery(self, topic: Topic, record_ms: int | None) -> Callable[[Any], None]:
        """The done-callback of one send: a failure, or a committed call's latency."""
        def done(future: Any) -> None:
            self.hooks.delivered(topic, record_ms,
                                 not future.cancelled() and future.exception() is None)
        return done

    def read_limits(self) -> None:
        """The output topics' limits (:class:`refusals.Limits`); aiokafka's batches kept
        below the smallest (the broker refuses a whole batch over it)."""
        _, batch = admin.read_limits(
            self.limits, self.config.kafka.confluent_config(),
            [topic.get_topic_name() for topic in self.outputs.values()],
            int(self.app_conf.producer_max_batch_size))
        if batch is not None:
            with warnings.catch_warnings():  # the producer is made when the app starts
                warnings.simplefilter("ignore")
                self.app_conf.producer_max_batch_size = batch


class _Refusable:
    """The confirm of one send (awaited by :meth:`PartitionState.confirm`): the send's
    future, or, if the broker refused the record for its own sake, the ``output_refused``
    DLQ record that replaces it. A refusal for size counts only once the topic's limit, read
    again, is below the record's size (the broker refuses a whole batch: a record that fits
    was refused for another's sake, and the failure stands); aiokafka cannot tell which
    record of a batch the broker found invalid, so each record of that batch is replaced."""

    __slots__ = ("emit", "headers", "key", "name", "out_key", "sends", "sent", "source",
                 "value")

    def __init__(self, sends: Sends, sent: Awaitable[Any], emit: Emit, name: str,
                 out_key: bytes | None, value: bytes, headers: Any, key: bytes | None,
                 source: Source | None) -> None:
        self.sends, self.sent, self.emit, self.name = sends, sent, emit, name
        self.out_key, self.value, self.headers = out_key, value, headers
        self.key, self.source = key, source

    def __await__(self) -> Any:
        return self._confirm().__await__()

    async def _confirm(self) -> Any:
        try:
            return await self.sent
        except Exception as exc:
            error = refusal(exc)
            if error is None:
                raise
            sends, name = self.sends, self.name
            size = refusals.batch_size(self.out_key, self.value, self.headers)
            if error in _TOO_LARGE:
                sends.limits.update(await asyncio.to_thread(
                    admin.max_message_bytes, sends.config.kafka.confluent_config(), [name]))
                if size <= sends.limits.limit(name):
                    raise
            return await (await sends.refuse(self.emit, name, self.out_key, size, error,
                                              self.key, self.source))


#: aiokafka's errors of a record refused for its size, by the Kafka error name they stand for.
_TOO_LARGE = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"})


def refusal(exc: BaseException | None) -> str | None:
    """The Kafka error name if ``exc`` (aiokafka's) refuses a record for its own sake."""
    if isinstance(exc, (MessageSizeTooLargeError, RecordListTooLargeError)):
        return "MSG_SIZE_TOO_LARGE" if isinstance(exc, MessageSizeTooLargeError) \
            else "RECORD_LIST_TOO_LARGE"
    if isinstance(exc, CorruptRecordException) or getattr(exc, "errno", None) == 87:
        return "INVALID_RECORD"
    return None
