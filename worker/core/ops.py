"""What a provider adapter tells the assembler, in provider-neutral words.

An adapter reads one raw provider event and returns a list of ops. It owns what is
provider-specific (which field is the key, when a block ends, which stop reason means
truncation, how the final message looks); the assembler owns what is common (buffers,
limits, the completion latch, outcomes). Every call is addressed by a *buffer key*, a string
the adapter makes unique within the run:

* chat: ``"<choice>.<tool index>"``, and ``"<choice>.<tool index>#<n>"`` when a new id
  reuses an index (contract rule 2);
* Anthropic and Bedrock: ``"<content block index>"``;
* Gemini: ``"<candidate>.<n>"`` (the candidate's n-th call);
* Responses: ``"<output_index>"``;
* a call started after a protocol break: ``"!<n>"`` (:meth:`Adapter.late_key`);
* a call unwrapped from the parallel wrapper at key ``k``: ``"k/<position>"`` (the assembler).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

import orjson

from worker.core import strictjson
from worker.core.model import Reason, RunStatus
from worker.core.strictjson import MAX_DEPTH, nested_deeper

T = TypeVar("T")


# The ops are built for nearly every argument fragment, so they are written out by hand:
# slotted classes whose attributes are ``Final``, frozen for the type checker. A frozen
# dataclass sets each field through ``object.__setattr__`` and takes 8 times as long to build
# once compiled (bench/bench_core.py, and docs/development.md).


#: The kinds of client call (``OpenCall.kind``). A ``function`` call's text is JSON arguments
#: checked against the tool's schema; a ``custom`` call's text is free-form input, committed as
#: text; the Responses items a client must answer (``computer_call``, ``local_shell_call``,
#: ``mcp_approval_request``, ``shell_call``, ``apply_patch_call``) carry their item's own fields
#: as a JSON object.
FUNCTION = "function"
CUSTOM = "custom"
CALL_KINDS = (FUNCTION, CUSTOM, "computer_call", "local_shell_call", "mcp_approval_request",
              "shell_call", "apply_patch_call")


class OpenCall:
    """A call starts at ``key``; ``index`` is the provider's order key. ``tool`` is the key
    the run's tools register it under (``tools.client_tools``), when that is not ``name``."""

    __slots__ = ("call_id", "choice", "index", "key", "kind", "name", "tool")
    __match_args__ = ("key", "index", "choice", "call_id", "name")

    def __init__(self, key: str, index: int, choice: int | None = None,
                 call_id: str | None = None, name: str | None = None,
                 kind: str = FUNCTION, tool: str | None = None) -> None:
        self.key: Final = key
        self.index: Final = index
        self.choice: Final = choice
        self.call_id: Final = call_id
        self.name: Final = name
        self.kind: Final = kind
        self.tool: Final = tool

    def __repr__(self) -> str:
        return f"OpenCall({self.key!r}, {self.index!r}, {self.choice!r})"


class Identify:
    """An id or name seen again for ``key``: fills what is missing, never concatenates."""

    __slots__ = ("call_id", "key", "name")
    __match_args__ = ("key", "call_id", "name")

    def __init__(self, key: str, call_id: str | None = None, name: str | None = None) -> None:
        self.key: Final = key
        self.call_id: Final = call_id
        self.name: Final = name

    def __repr__(self) -> str:
        return f"Identify({self.key!r})"


class _Text:
    """Argument text for the call at ``key`` (the base of the two ops that carry some)."""

    __slots__ = ("key", "text")
    __match_args__ = ("key", "text")

    def __init__(self, key: str, text: str) -> None:
        self.key: Final = key
        self.text: Final = text

    def __repr__(self) -> str:  # never the text: it may hold a secret
        return f"{type(self).__name__}({self.key!r}, <{len(self.text)} characters>)"


class AppendArgs(_Text):
    """One fragment of argument text, appended as opaque text."""

    __slots__ = ()


class SetArgs(_Text):
    """The provider's own full argument text (Responses ``.done``), which replaces the buffer."""

    __slots__ = ()


class RefuseArgs:
    """The call at ``key`` got arguments as an already parsed value that has no one meaning
    (``Adapter.arguments_text``: a repeated key, an integer beyond 64 bits, nesting deeper than
    ``strictjson.MAX_DEPTH``): the latch fails it ``invalid_json`` with ``detail`` (no argument
    text), as it fails the same arguments sent as text."""

    __slots__ = ("detail", "key")
    __match_args__ = ("key", "detail")

    def __init__(self, key: str, detail: str) -> None:
        self.key: Final = key
        self.detail: Final = detail

    def __repr__(self) -> str:
        return f"RefuseArgs({self.key!r}, {self.detail!r})"


class CloseCall:
    """No more argument text will come for ``key`` (a block-level end)."""

    __slots__ = ("key",)
    __match_args__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key: Final = key

    def __repr__(self) -> str:
        return f"CloseCall({self.key!r})"


class Stopped:
    """The provider ended choice ``choice`` (the whole message when None) with a stop that
    forbids running its calls: each of its calls not yet decided fails ``reason`` when it is
    decided, even where its text parses, and the run ends ``status`` (the most severe of its
    stops: ``failed`` over ``truncated`` over ``completed``). A call decided before the stop
    arrived (block-level early commit) keeps its outcome. A choice keeps its first stop.

    ``detail`` is Latch's own text (never the provider's)."""

    __slots__ = ("choice", "detail", "reason", "status")
    __match_args__ = ("choice", "reason", "detail", "status")

    def __init__(self, choice: int | None, reason: Reason, detail: str,
                 status: RunStatus = RunStatus.FAILED) -> None:
        self.choice: Final = choice
        self.reason: Final = reason
        self.detail: Final = detail
        self.status: Final = status

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.choice!r}, {self.reason!r})"


class Truncated(Stopped):
    """The provider cut the message (choice ``choice``; all when None) short (rule 5): its
    calls fail ``truncated`` and the run ends ``truncated``."""

    __slots__ = ()

    def __init__(self, choice: int | None = None) -> None:
        super().__init__(choice, Reason.TRUNCATED, "the provider truncated the message before "
                         "the call ended", RunStatus.TRUNCATED)


def content_stop(choice: int | None, what: str) -> Stopped:
    """The stop of a choice (the message when None) that the provider ended for its content
    (``what`` says which stop, in Latch's words): its calls fail ``content_filtered``."""
    return Stopped(choice, Reason.CONTENT_FILTERED,
                   f"{what}: the provider stopped the message for its content")


#: How severe a run's end is, for the most severe of its stops (:func:`stopped_status`).
_SEVERITY = {RunStatus.COMPLETED: 0, RunStatus.TRUNCATED: 1, RunStatus.FAILED: 2}


def add_stop(stops: tuple[Stopped, ...], stop: Stopped) -> tuple[Stopped, ...]:
    """``stops`` with ``stop`` added, unless its choice has one already (the first stands):
    at most one a choice, which ``max_choices_per_run`` bounds."""
    if any(s.choice == stop.choice for s in stops):
        return stops
    return (*stops, stop)


def stop_of(stops: tuple[Stopped, ...], choice: int | None) -> Stopped | None:
    """The stop that decides a call of ``choice``: the whole message's, else its choice's."""
    found = None
    for stop in stops:
        if stop.choice is None:
            return stop
        if stop.choice == choice:
            found = stop
    return found


def stopped_status(stops: tuple[Stopped, ...]) -> RunStatus:
    """How a run whose provider ended it ends: the most severe of its ``stops``."""
    status = RunStatus.COMPLETED
    for stop in stops:
        if _SEVERITY[stop.status] > _SEVERITY[status]:
            status = stop.status
    return status


class Complete:
    """The provider's own end of the message (Anthropic ``message_stop``, Responses
    ``response.completed``): the run finalizes."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Complete()"


class UpstreamError:
    """The provider reported an error, or a stop that fails the message: the run ends
    ``failed`` and its open calls fail ``reason`` (``upstream_error`` unless the adapter names
    a closer one: ``content_filtered``, ``malformed_output``, ``stream_error`` for a stream
    that broke its own protocol...)."""

    __slots__ = ("detail", "reason")
    __match_args__ = ("detail", "reason")

    def __init__(self, detail: str, reason: Reason = Reason.UPSTREAM_ERROR) -> None:
        self.detail: Final = detail
        self.reason: Final = reason

    def __repr__(self) -> str:
        return f"UpstreamError({self.detail!r}, {self.reason!r})"


class ProtocolError:
    """The stream broke its provider's protocol (``detail`` says how, quoting no provider
    text): every call not yet decided fails ``protocol_error``, every call started later fails
    at its start, and the run ends ``failed`` at its end (see "Protocol breaks" in
    docs/providers.md)."""

    __slots__ = ("detail",)
    __match_args__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail: Final = detail

    def __repr__(self) -> str:
        return f"ProtocolError({self.detail!r})"


class Restated:
    """The provider's terminal event restates the whole text of the call at ``key``
    (Responses ``response.completed``): a text that differs from the streamed one is a
    protocol break. Never the source of the call's text."""

    __slots__ = ("key", "text")
    __match_args__ = ("key", "text")

    def __init__(self, key: str, text: str) -> None:
        self.key: Final = key
        self.text: Final = text

    def __repr__(self) -> str:  # never the text
        return f"Restated({self.key!r}, <{len(self.text)} characters>)"


class EventRefused(ValueError):
    """A provider event an adapter refuses (it goes to the DLQ as ``invalid_envelope``); the
    message names the problem and quotes no provider text."""


def bounded(value: T) -> T:
    """``value`` itself, for an adapter to keep for the final message, once checked: a value
    that nests arrays and objects deeper than ``strictjson.MAX_DEPTH`` levels is refused
    (:class:`EventRefused`), since the final message that writes it back must not depend on how
    much stack the caller has left. Only what is kept is bounded: the rest of an event is read
    where it stands and dropped. What is kept is the event's own value, not a copy: an adapter
    never changes it, and a caller never changes an event it has fed."""
    if nested_deeper(value):
        raise EventRefused(f"arrays and objects nested deeper than {MAX_DEPTH} levels")
    return value


def utf8_len(text: str) -> int:
    """The UTF-8 length of ``text`` (a lone surrogate counted as its 3 bytes)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def json_len(value: Any) -> int:
    """The length of ``value`` written as JSON: what a value an adapter keeps for the final
    message (a block's body, an output item, a part) is counted as."""
    return len(orjson.dumps(value))


#: Bytes an adapter adds to ``Adapter.kept`` for each choice, candidate, content block or
#: output item (or item text) it keeps: the object and its map entry besides its text, at
#: most (125 to 450 bytes measured, CPython 3.11), so that ``max_buffered_bytes`` counts state
#: that holds no text (a chunk of empty choices ``{"index": n}`` keeps one per 18 bytes).
STATE_BYTES: Final = 512


def is_index(value: Any) -> bool:
    """Whether a provider's order key can be emitted as a call's ``index``: an int >= 0."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: What ``Adapter.final`` returns: the message, and per-choice messages when n > 1.
FinalMessage = tuple[dict[str, Any], list[dict[str, Any]] | None]

Op = (OpenCall | Identify | AppendArgs | SetArgs | RefuseArgs | CloseCall | Stopped | Complete
      | UpstreamError | ProtocolError | Restated)

#: What ``Adapter.feed`` returns for an event without ops (a text delta, nearly every event):
#: one shared list, so that no list is made per event. Nobody changes the lists ``feed``
#: returns (the assembler only reads them); tests/core/property/test_fast_paths.py checks that
#: this one stays empty.
NO_OPS: Final[list[Op]] = []

#: The kinds of event that ``worker.core._peek`` reads (worker/core/csrc/peek.c, which says
#: what each is; tests/core/property/test_peek.py checks that the module's own constants are
#: these), as :meth:`Adapter.fast` takes them.
ANTHROPIC_TEXT: Final = 1
ANTHROPIC_JSON: Final = 2
CHAT_TEXT: Final = 3
CHAT_ARGS: Final = 4
RESPONSES_TEXT: Final = 5
RESPONSES_ARGS: Final = 6
RESPONSES_INPUT: Final = 7


@dataclass(frozen=True, slots=True)
class CallView:
    """What an adapter may read of a call to write the final message."""

    key: str
    tool_call_id: str
    name: str
    text: str | None
    arguments: Any
    parsed: bool
    #: The buffer key of the ``multi_tool_use.parallel`` wrapper this call was unwrapped
    #: from, else None (the wrapper itself is never shown to an adapter).
    parent: str | None = None
    #: Left out of the final message (``on_invalid_json: drop_with_protocol_repair``): the
    #: adapter writes no tool call, block, item or part for it.
    dropped: bool = False
    #: What its text is (:data:`CALL_KINDS`): a chat custom call's entry is written as such.
    kind: str = FUNCTION


def unwrapped_calls(calls: Sequence[CallView]) -> dict[str, list[CallView]]:
    """The calls unwrapped from each parallel wrapper, by the wrapper's key, in order: what a
    final message shows in the wrapper's place."""
    found: dict[str, list[CallView]] = {}
    for view in calls:
        if view.parent is not None:
            found.setdefault(view.parent, []).append(view)
    return found


class Adapter:
    """Per-run provider state: reads events, writes the final message. One subclass per
    provider (a base class rather than a ``Protocol``: compiled, ``feed`` is then a direct
    call, and it is made for every event)."""

    #: Whether ``stream.end`` alone completes the message (chat), or the provider's own
    #: terminal event must have arrived first (Anthropic, Responses).
    completes_on_stream_end: ClassVar[bool] = False
    #: Names of the ``multi_tool_use.parallel`` wrapper that the assembler unwraps into one
    #: call per ``tool_uses[]`` entry when the run registered no tool of that name.
    wrapper_names: ClassVar[frozenset[str]] = frozenset()
    #: Whether :meth:`parse_arguments` is the adapter's own (else strict JSON: the latch then
    #: takes ``strictjson.parse`` itself, and a run holds no bound method for it).
    parses_own_arguments: ClassVar[bool] = False
    #: Whether :meth:`fast` reads any event (else the assembler does not peek at its run's
    #: records).
    peeked: ClassVar[bool] = False

    def __init__(self) -> None:
        #: Whether the stream broke its protocol (the adapter said :class:`ProtocolError`).
        self.broken = False
        self._late = 0
        #: Bytes the adapter kept for the final message (text, thinking, blocks, items) since
        #: the assembler last took them (it sets this back to 0 after each event, and counts
        #: them in ``max_buffered_bytes``); negative when a kept value was replaced by a
        #: smaller one. Text counts its UTF-8 bytes, a kept value its JSON text's
        #: (:func:`json_len`). Argument text is the assembler's, never counted here.
        self.kept = 0
        #: The raw record of the event being fed, which the assembler sets around ``feed``
        #: (b"" when there is none: an envelope built in memory): what
        #: :meth:`arguments_text` reads again.
        self.record = b""
        #: Choices (candidates) the run may open (``AssembleSettings.max_choices_per_run``,
        #: set by the assembler): the event that opens one more ends the run
        #: (:meth:`too_many_choices`).
        self.max_choices = 128

    def too_many_choices(self) -> UpstreamError:
        """The op that ends a run whose stream opened more than :attr:`max_choices` choices
        (its uncommitted calls fail ``budget_exceeded``)."""
        return UpstreamError(f"the stream opened more than {self.max_choices} choices "
                             "(max_choices_per_run)", Reason.BUDGET_EXCEEDED)

    def protocol_error(self, detail: str) -> ProtocolError:
        """Mark the stream broken and say so; from now on the adapter keeps no content and
        opens each call it still sees under its own :meth:`late_key`."""
        self.broken = True
        return ProtocolError(detail)

    def arguments_text(self, value: Any, option: int = 0) -> str | strictjson.ParseError:
        """The JSON text of arguments that arrived already parsed (``value``, an object
        inside the event being fed), or why they have no one meaning: the rules of argument
        text hold for them too (contract rule 1, issue 23). Nested deeper than
        ``strictjson.MAX_DEPTH`` levels, or carried by a record in which a key repeats or an
        integer is beyond 64 bits (``strictjson.one_meaning``: orjson kept the last of two
        keys and rounded the integer, where another reader of the same bytes reads other
        arguments), they are a :class:`strictjson.ParseError`, which the adapter gives the
        call as :class:`RefuseArgs`. Only the rare event that carries such a value pays for
        reading its record again. ``option``: orjson's, to write the text with."""
        if nested_deeper(value):
            return strictjson.ParseError(
                f"arrays and objects nested deeper than {MAX_DEPTH} levels")
        if self.record:
            problem = strictjson.one_meaning(self.record)
            if problem is not None:
                return problem
        return orjson.dumps(value, option=option).decode()

    def late_key(self) -> str:
        """A buffer key for a call seen after a protocol break: ``"!<n>"``, which no adapter's
        own keys (digits, ``.``, ``#``, ``/``) can equal, so each such call id keeps its own
        call and its own outcome."""
        self._late += 1
        return f"!{self._late}"

    def feed(self, event: dict[str, Any]) -> list[Op]:
        """Read one raw provider event; may raise on a malformed one (the caller contains it).
        Most events (text deltas) give no op."""
        raise NotImplementedError

    def fast(self, kind: int, index: int, text: str) -> list[Op] | None:
        """Apply one of the common events that ``worker.core._peek`` reads without building
        the event (its ``kind``, the block, choice or output ``index``, the ``text``), to the
        same effect as :meth:`feed` of the whole event; or None, with nothing done, when
        ``feed`` has more to do or the kind is not this provider's (the caller then parses the
        record and calls ``feed``: tests/core/property/test_fast_paths.py). Default: None."""
        return None

    def final(self, calls: Sequence[CallView]) -> FinalMessage:
        """The assistant message in the provider's format, and per-choice messages when n > 1."""
        raise NotImplementedError

    def end(self) -> list[Op]:
        """Ops to apply when ``stream.end`` arrives, before the run is finished: for a provider
        whose stop reason comes in an event that is not the stream's last (Bedrock's
        ``messageStop`` before ``metadata``, Gemini's ``finishReason`` before a usage chunk),
        the stop is decided here, once the stream is over. Default: none."""
        return []

    def parse_arguments(self, text: str) -> Any | strictjson.ParseError:
        """A complete call's argument text as a value, or why it is not one. Default: strict
        JSON (contract rule 1). An adapter that buffers another encoding of the arguments
        (Gemini's streamed ``partialArgs``) builds the value from it here, as strictly."""
        return strictjson.parse(text)
