"""One tool call being assembled: its buffer of argument text and its state.

A call changes state only by :meth:`Call.step`, which looks the move up in
``model.TRANSITIONS``: an event the table refuses leaves the call as it was and says so
(False), the defined outcome of a late or repeated signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from worker.core.model import TRANSITIONS, CallEvent, CallState, Reason
from worker.core.ops import FUNCTION, Op, OpenCall
from worker.core.policy import PolicyDecision
from worker.core.settings import MAX_ID_CHARACTERS, MAX_NAME_CHARACTERS

#: Loose argument fragments a call holds before :meth:`Call.fold` joins them: a fragment held
#: as its own ``str`` costs about 57 bytes besides its text (bench/bench_memory.py).
FOLD_PIECES = 16
#: The largest order key (tool, content block or output index; choice) a call may carry. Every
#: outcome repeats it, JSON readers lose precision beyond 2**53, and orjson writes nothing
#: beyond 2**64 - 1 (which a chat call without an index after one at 2**64 - 1 would get).
MAX_ORDER_KEY = 2**53 - 1


class Call:
    """A tool call being assembled; ``parts`` is its opaque argument text, in pieces: the
    first ``folded`` are joined runs of fragments (:meth:`fold`), the rest fragments as they
    came.

    (A slotted class with its ``__init__`` written out, like the other per-call and per-run
    state, rather than a dataclass: compiled, a dataclass is still built by the interpreter.)
    """

    __slots__ = ("announced", "approval", "arguments", "call_id", "choice", "decision", "detail",
                 "emitted", "folded", "held", "held_ms", "index", "key", "kind", "name",
                 "nbytes", "order", "parent", "parsed", "parts", "reason", "refused", "state",
                 "text", "tool")

    def __init__(self, key: str, index: int, choice: int | None, order: int,
                 call_id: str | None = None, name: str | None = None,
                 kind: str = FUNCTION, tool: str | None = None) -> None:
        self.key = key
        self.index = index
        self.choice = choice
        self.order = order
        self.call_id = call_id
        self.name = name
        #: What its text is (``ops.CALL_KINDS``), and the key its tool is registered under
        #: when that is not its name.
        self.kind = kind
        self.tool = tool
        #: The buffer key of the parallel wrapper it was unwrapped from, else None.
        self.parent: str | None = None
        self.parts: list[str] = []
        self.folded = 0
        #: UTF-8 bytes of ``parts``.
        self.nbytes = 0
        self.state = CallState.OPEN
        self.reason: Reason | None = None
        self.detail = ""
        #: The parsed value, once ``parsed``.
        self.arguments: Any = None
        self.parsed = False
        #: Whether its outcome has been emitted.
        self.emitted = False
        #: The whole text, once decided.
        self.text: str | None = None
        #: Why its arguments, sent as a parsed value, have no one meaning (``ops.RefuseArgs``):
        #: the latch's JSON step fails it ``invalid_json`` with this. None: nothing refused.
        self.refused: str | None = None
        #: What the policy said of it (:mod:`worker.core.policy`), once the latch asked; None:
        #: no policy in force (``policy.mode: off``) or the call failed an earlier check.
        self.decision: PolicyDecision | None = None
        #: Why it waits for approval (``latch.APPROVAL_CAUSES``), once held; () otherwise.
        self.held: tuple[str, ...] = ()
        #: The record time it was held at (``PENDING_APPROVAL``), and whether its pending
        #: record has been emitted.
        self.held_ms = 0
        self.announced = False
        #: The decision that decided it once held, and by whom: (``approve``/``deny``/``edit``,
        #: the approver, the id of the key that signed it or None); its audit record names it.
        self.approval: tuple[str, str, str | None] | None = None

    def __repr__(self) -> str:  # never the text: it may hold a secret
        return f"Call({self.key!r}, {self.call_id!r}, {self.name!r}, {self.state})"

    @property
    def tool_call_id(self) -> str:
        """The id the outcome pairs with: the provider's, else the buffer key."""
        return self.call_id or self.key

    def step(self, event: CallEvent) -> bool:
        """Move the call as ``TRANSITIONS`` says ``event`` moves it from its state; False (and
        nothing changed) when the table refuses the event there."""
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            return False
        self.state = new
        return True

    def fail(self, reason: Reason, detail: str) -> bool:
        """End the call with ``reason``; ``detail`` must not quote argument text. False (and
        nothing changed) for a call that is no longer open or complete."""
        if not self.step(CallEvent.CANCEL if reason is Reason.CANCELLED else CallEvent.FAIL):
            return False
        self.reason, self.detail = reason, detail
        if reason is Reason.ARGUMENTS_EXCEED_MAX_BYTES:
            self.parts.clear()
            self.folded = 0
        return True

    def duplicate(self, detail: str) -> bool:
        """Fail a call whose id another call of the run shares, once it failed or was
        cancelled: ``duplicate_call_id`` replaces whatever ended it (one kind of outcome per
        id, ``ending.outcomes``). False (and nothing changed) for any other call: a committed
        call is never taken back."""
        if not self.step(CallEvent.DUPLICATE):
            return False
        self.reason, self.detail = Reason.DUPLICATE_CALL_ID, detail
        return True

    def add(self, text: str, replace: bool) -> None:
        """Append one fragment of argument text (or, ``replace``, the provider's whole text).

        Fragments are joined as they come, whatever they look like: a server that re-sends
        the whole arguments so far on every chunk (cumulative, not deltas: some
        OpenAI-compatible servers) gives a joined text that does not parse (each re-sent prefix
        leaves an object or a string open, so the join never closes: ``invalid_json``), and
        what a fragment looks like is never a reason to treat the same text two ways
        (tests/core/property: any cut of a text, the outcome of the whole). The provider's own
        whole text (``replace``: Responses ``.done``) is the call's text, whatever the
        fragments were."""
        parts = self.parts
        if replace:  # the provider's own whole text: what the fragments looked like is moot
            parts.clear()
            self.folded = 0
        parts.append(text)
        if len(parts) - self.folded >= FOLD_PIECES:
            self.fold()

    def fold(self) -> None:
        """Join the loose fragments at the end of ``parts`` into one piece, then merge it with
        the pieces before it while they are no longer than it: ``parts`` keeps O(log n)
        pieces and each byte is copied O(log n) times (the text itself never changes)."""
        parts = self.parts
        at = min(self.folded, len(parts))
        piece = "".join(parts[at:])
        del parts[at:]
        while parts and len(parts[-1]) <= len(piece):
            piece = parts.pop() + piece
        parts.append(piece)
        self.folded = len(parts)

    def sort_key(self) -> tuple[int, int, int]:
        return (self.choice or 0, self.index, self.order)


def utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def check_order_keys(ops: Sequence[Op]) -> None:
    """Refuse (ValueError: the event goes to the DLQ) a call whose order key is not an integer
    (``true`` is not one), is negative, or is beyond :data:`MAX_ORDER_KEY`."""
    for item in ops:
        if isinstance(item, OpenCall) and not (
                _order_key(item.index) and (item.choice is None or _order_key(item.choice))):
            raise ValueError("a call index out of range")


def _order_key(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_ORDER_KEY


def usable(text: str | None, limit: int) -> str | None:
    """A provider id or name, or None when it is longer than ``limit`` characters."""
    return text if text is None or len(text) <= limit else None


def too_long(call_id: str | None, name: str | None) -> str:
    """Why a call's id or name is too long to be used, or "" when neither is."""
    if call_id is not None and len(call_id) > MAX_ID_CHARACTERS:
        return f"the provider's call id has more than {MAX_ID_CHARACTERS} characters"
    if name is not None and len(name) > MAX_NAME_CHARACTERS:
        return f"the provider's tool name has more than {MAX_NAME_CHARACTERS} characters"
    return ""
