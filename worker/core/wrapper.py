"""The parallel wrapper (docs/providers.md, "The parallel wrapper").

OpenAI's models may call ``multi_tool_use.parallel`` (or ``parallel``), a tool no run
registers, whose ``tool_uses`` array names the calls the model meant to make.
A :class:`~worker.core.run.Run` whose adapter names such a wrapper (``Adapter.wrapper_names``)
and that did not register the name itself hands its complete wrapper call to :func:`unwrap`,
which replaces it by one call per entry; each is then decided like any other call.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from orjson import dumps

from worker.core import strictjson
from worker.core.call import Call, usable
from worker.core.model import CallEvent, Reason
from worker.core.settings import MAX_NAME_CHARACTERS

__all__ = ["WRAPPED_ID_SEPARATOR", "unwrap"]

#: Between a parallel wrapper's call id and an entry's position in the ids of the calls it is
#: unwrapped into (``call_abc`` -> ``call_abc#0``, ``call_abc#1``; docs/providers.md, "The parallel
#: wrapper"). OpenAI's call ids are ``call_`` and letters and digits, never ``#``; an id that
#: equals a derived one anyway is shared by two calls, and both fail ``duplicate_call_id``.
WRAPPED_ID_SEPARATOR = "#"


def unwrap(call: Call, calls: dict[str, Call], room: int, stats: Counter[str]
           ) -> list[Call] | None:
    """Replace an ``ARGS_COMPLETE`` wrapper ``call`` by one ``ARGS_COMPLETE`` call per
    ``tool_uses[]`` entry, added to the run's ``calls``, and return those; None (and nothing
    changed) when its text is not a strict JSON object whose ``tool_uses`` is a non-empty
    array. A wrapper with more entries than the run may still hold calls (``room``: the most
    it may hold) fails ``too_many_tool_calls`` instead (and returns []). ``stats``: the
    partition's counters."""
    text = "".join(call.parts)
    value = strictjson.parse(text)
    uses = value.get("tool_uses") if isinstance(value, dict) else None
    if not isinstance(uses, list) or not uses:
        return None
    if len(calls) + len(uses) > room:
        call.fail(Reason.TOO_MANY_TOOL_CALLS, f"the parallel wrapper holds {len(uses)} "
                  f"calls; the run may hold at most {room}")
        return []
    call.text, call.parts = text, []
    call.step(CallEvent.UNWRAP)
    children = []
    for n, use in enumerate(uses):
        name, arguments = _tool_use(use)
        name = usable(name, MAX_NAME_CHARACTERS)  # (too long: missing_id_or_name)
        child = Call(f"{call.key}/{n}", call.index, call.choice, len(calls),
                     f"{call.call_id}{WRAPPED_ID_SEPARATOR}{n}", name)
        child.parent = call.key
        child.parts.append(arguments)
        child.step(CallEvent.CLOSE)
        calls[child.key] = child
        children.append(child)
    stats["parallel_wrappers_unwrapped"] += 1
    return children


def _tool_use(use: Any) -> tuple[str | None, str]:
    """The name and argument text of one ``tool_uses[]`` entry: ``recipient_name`` without
    its ``functions.`` namespace (None when it is not a non-empty string, so the call fails
    ``missing_id_or_name``), and ``parameters`` written back as JSON (empty when absent, which
    the latch reads as ``{}``)."""
    if not isinstance(use, dict):
        return None, ""
    recipient = use.get("recipient_name")
    name = None
    if isinstance(recipient, str):
        name = recipient.removeprefix("functions.") or None
    parameters = use.get("parameters")
    arguments = "" if "parameters" not in use else dumps(parameters).decode()
    return name, arguments
