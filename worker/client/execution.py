"""How a runner runs one tool: in a thread of its own, while its consumer keeps its group.

A Kafka consumer that does not call ``poll`` for ``max.poll.interval.ms`` (300 s by default)
leaves its group: another runner takes its partitions, finds the call neither journaled nor
committed, and runs it again while the first is still running it. So a tool runs in a
:class:`ToolRun` thread and the runner's thread, past :data:`HOLD_AFTER_S`, holds the
membership with a :class:`Holding`: every assigned partition paused (librdkafka drops what it
fetched and, on resume, fetches again from the last record handed out), ``poll(0)`` every
:data:`POLL_EVERY_S` (the poll keeps the member alive and serves rebalance callbacks).

Who sends what (habit 11):

* the call (``arguments`` or ``input``) is the model's, checked by the worker's latch and
  signed by it; the tool gets it as it is (:func:`tool_input`) and treats it as untrusted
  input (a custom call's grammar is not checked, decision 0004);
* the tool's return value and exceptions are the tool author's code: a result, an error
  result, never a crash of the runner (KeyboardInterrupt, the operator's, excepted);
* a record that ``poll`` hands out while the partitions are paused (a partition assigned
  during the wait) is the committed topic's: it is kept, one per partition (its partition is
  paused at once), and handled after the running call, unless its partition was revoked
  meanwhile (then its new owner reads it from the committed offset).

A rebalance that takes the running call's partition (a runner joining the group) waits for
the call: the revoke callback waits for the tool and records its outcome before it returns
(``Runner._revoked``). With the default (eager) assignor the group waits for a member at most
``max.poll.interval.ms`` (the rebalance timeout): a tool that outlasts it *during a
rebalance* loses the partition all the same, and the call can run twice (the first runner
then stops with ``JournalError``). A ``tool_timeout_s`` some seconds below
``max.poll.interval.ms`` closes that window.

A tool given ``tool_timeout_s`` that has not returned by then is answered with an error
result whose content starts with ``tool_timeout`` (:data:`TOOL_TIMEOUT`), recorded like any
result (never run again). Python cannot stop a thread: the tool's thread runs on, its return
value discarded; a tool with side effects should honour a deadline of its own.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from confluent_kafka import TopicPartition

__all__ = ["HOLD_AFTER_S", "POLL_EVERY_S", "TOOL_TIMEOUT", "Holding", "ToolRun", "current_call",
           "key_id_of", "tool_input", "wait"]

#: How long a tool may run before the runner pauses its partitions and polls while it waits
#: (a pause drops the prefetched records: quick tools do not pay for it).
HOLD_AFTER_S = 1.0
#: How often the waiting runner polls (well under any ``max.poll.interval.ms``).
POLL_EVERY_S = 0.5
#: The first word of a timed-out call's error result.
TOOL_TIMEOUT = "tool_timeout"
#: The committed call whose tool runs in this context (:class:`ToolRun` sets it).
_CALL: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "latch_committed_call", default=None)


def current_call() -> Mapping[str, Any] | None:
    """Inside a tool: the committed call it runs for (``schemas/committed-call.schema.json``;
    its ``idempotency_key`` for a tool that keeps its own record, or passes the key on, as an
    MCP tool does: :mod:`worker.client.mcp`); None outside a :class:`ToolRun`. Read only."""
    return _CALL.get()


def tool_input(call: Mapping[str, Any]) -> Any:
    """What the tool function of ``call`` receives (``schemas/committed-call.schema.json``):
    a custom call's ``input`` text (``kind: custom``, never parsed); every other call's
    decoded ``arguments`` (a function call's JSON value; a client item's fields as an object:
    ``computer_call`` ``{"action", "pending_safety_checks"}``, ``local_shell_call``
    ``{"action"}``, ``mcp_approval_request`` ``{"server_label", "name", "arguments"}``); but
    a ``shell_call``'s ``action`` (``{"commands", "timeout_ms"?, "max_output_length"?}``) and an
    ``apply_patch_call``'s ``operation`` (``{"type": "create_file" | "update_file" |
    "delete_file", "path", "diff"?}``), the one field of their arguments (issue 33; None when
    the item had none: the tool answers that with an error)."""
    kind = call.get("kind")
    if kind == "custom":
        return call["input"]
    field = _ITEM_FIELDS.get(kind) if isinstance(kind, str) else None
    if field is not None:
        arguments = call["arguments"]
        return arguments.get(field) if isinstance(arguments, dict) else None
    return call["arguments"]


#: The kinds whose tool gets one field of the arguments (the arguments hold only it).
_ITEM_FIELDS = {"shell_call": "action", "apply_patch_call": "operation"}


def key_id_of(headers: Any) -> str:
    """The signing key id a record's headers name (``latch-signature-key``), decoded and cut
    to 64 characters for an error message: the header is whoever wrote the record (the
    worker, or a writer the ACLs failed to stop), never a key."""
    for name, data in headers or ():
        if name == "latch-signature-key" and data is not None:
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
            return text[:64]
    return ""


class ToolRun:
    """One execution of a tool, in a daemon thread, in a copy of the caller's context (the
    execution span stays the parent of the tool's own spans)."""

    __slots__ = ("_done", "error", "result", "thread")

    def __init__(self, tool: Callable[[Any], Any], argument: Any, name: str,
                 call: Mapping[str, Any] | None = None) -> None:
        self.result: Any = None
        #: What the tool raised (any ``BaseException``), or None.
        self.error: BaseException | None = None
        self._done = threading.Event()
        context = contextvars.copy_context()
        # (:func:`current_call`: in the tool's context only, read only)
        context.run(_CALL.set, None if call is None else MappingProxyType(call))
        self.thread = threading.Thread(target=context.run, args=(self._run, tool, argument),
                                       name=f"latch-tool-{name[:40]}", daemon=True)
        self.thread.start()

    def _run(self, tool: Callable[[Any], Any], argument: Any) -> None:
        try:
            self.result = tool(argument)
        except BaseException as exc:  # reported to the runner's thread, which answers it
            self.error = exc
        finally:
            self._done.set()

    def wait(self, timeout: float | None) -> bool:
        """Whether the tool has returned (or raised), waiting up to ``timeout`` seconds."""
        return self._done.wait(None if timeout is None else max(timeout, 0.0))


class Holding:
    """The consumer's membership held while a tool runs: the assigned partitions paused, a
    ``poll(0)`` per :meth:`poll`; records that arrive anyway are kept in :attr:`kept`."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        #: (topic, partition) -> the first record ``poll`` handed out for it while holding.
        self.kept: dict[tuple[str, int], Any] = {}

    def __enter__(self) -> Holding:
        self.consumer.pause(self.consumer.assignment())
        return self

    def poll(self) -> None:
        """Poll once without waiting (rebalance callbacks run inside it)."""
        message = self.consumer.poll(0)
        if message is None or message.error() is not None:
            return
        where = (message.topic(), message.partition())
        self.kept.setdefault(where, message)
        self.consumer.pause([_partition(message)])

    def forget(self, partitions: Any) -> None:
        """Drop the kept records of revoked ``partitions`` (their new owner reads them)."""
        for tp in partitions:
            self.kept.pop((tp.topic, tp.partition), None)

    def __exit__(self, *_: object) -> None:
        self.consumer.resume(self.consumer.assignment())


def _partition(message: Any) -> TopicPartition:
    return TopicPartition(message.topic(), message.partition())


def wait(run: ToolRun, deadline: float | None, holding: Holding | None) -> bool:
    """Wait for ``run`` until ``deadline`` (``time.monotonic()``; None: no limit); past
    :data:`HOLD_AFTER_S`, hold the membership with ``holding`` (None: only wait). Whether
    the tool returned."""

    def left(cap: float) -> float:
        return cap if deadline is None else min(cap, deadline - time.monotonic())

    if run.wait(left(HOLD_AFTER_S)):
        return True
    if holding is None:
        return run.wait(None if deadline is None else left(float("inf")))
    with holding:
        while not run.wait(left(POLL_EVERY_S)):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            holding.poll()
    return True
