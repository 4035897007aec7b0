"""What a provider adapter tells the assembler, in provider-neutral words.

An adapter reads one raw provider event and returns a list of ops. It owns what is
provider-specific (which field is the key, when a block ends, which stop reason means
truncation, how the final message looks); the assembler owns what is common (buffers,
limits, the completion latch, outcomes). Every call is addressed by a *buffer key*, a string
the adapter makes unique within the run:

* chat: ``"<choice>.<tool index>"``, and ``"<choice>.<tool index>#<n>"`` when a new id
  reuses an index (contract rule 2);
* Anthropic: ``"<content block index>"``;
* Responses: ``"<output_index>"``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from worker.core.strictjson import MAX_DEPTH, nested_deeper

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OpenCall:
    """A call starts at ``key``; ``index`` is the provider's order key."""

    key: str
    index: int
    choice: int | None = None
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Identify:
    """An id or name seen again for ``key``: fills what is missing, never concatenates."""

    key: str
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class AppendArgs:
    """One fragment of argument text, appended as opaque text."""

    key: str
    text: str


@dataclass(frozen=True, slots=True)
class SetArgs:
    """The provider's own full argument text (Responses ``.done``), which replaces the buffer."""

    key: str
    text: str


@dataclass(frozen=True, slots=True)
class CloseCall:
    """No more argument text will come for ``key`` (a block-level end)."""

    key: str


@dataclass(frozen=True, slots=True)
class Truncated:
    """The provider cut the message short: calls of ``choice`` (all when None) fail."""

    choice: int | None = None


@dataclass(frozen=True, slots=True)
class Complete:
    """The provider's own end of the message (Anthropic ``message_stop``, Responses
    ``response.completed``): the run finalizes."""


@dataclass(frozen=True, slots=True)
class UpstreamError:
    """The provider reported an error: open calls fail ``upstream_error``."""

    detail: str


class EventRefused(ValueError):
    """A provider event an adapter refuses (it goes to the DLQ as ``invalid_envelope``); the
    message names the problem and quotes no provider text."""


def kept(value: T) -> T:
    """A copy of ``value`` for the final message. Refuses (:class:`EventRefused`) a value
    that nests arrays and objects deeper than ``strictjson.MAX_DEPTH`` levels: the copy and
    the final message that writes it back must not depend on how much stack the caller has
    left. Only what is kept is bounded: an event is read where it stands and dropped."""
    if nested_deeper(value):
        raise EventRefused(f"arrays and objects nested deeper than {MAX_DEPTH} levels")
    return copy.deepcopy(value)


def is_index(value: Any) -> bool:
    """Whether a provider's order key can be emitted as a call's ``index``: an int >= 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: What ``Adapter.final`` returns: the message, and per-choice messages when n > 1.
FinalMessage = tuple[dict[str, Any], list[dict[str, Any]] | None]

Op = OpenCall | Identify | AppendArgs | SetArgs | CloseCall | Truncated | Complete | UpstreamError

#: What an event without ops returns.
NO_OPS: tuple[Op, ...] = ()


@dataclass(frozen=True, slots=True)
class CallView:
    """What an adapter may read of a call to write the final message."""

    key: str
    tool_call_id: str
    name: str
    text: str | None
    arguments: Any
    parsed: bool


class Adapter(Protocol):
    """Per-run provider state: reads events, writes the final message."""

    #: Whether ``stream.end`` alone completes the message (chat), or the provider's own
    #: terminal event must have arrived first (Anthropic, Responses).
    completes_on_stream_end: bool

    def feed(self, event: dict[str, Any]) -> Sequence[Op]:
        """Read one raw provider event; may raise on a malformed one (the caller contains it).
        Most events (text deltas) give no op: :data:`NO_OPS`, shared, never a new list."""
        ...

    def final(self, calls: Sequence[CallView]) -> FinalMessage:
        """The assistant message in the provider's format, and per-choice messages when n > 1."""
        ...
