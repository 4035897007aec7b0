"""``worker.core.outputs``: the records the core emits. Idempotency keys (issue 9):
each part percent-encoded (``%`` and ``:``), so ids holding ``:`` never collide.
"""

from __future__ import annotations

from typing import Any

from builders import (
    CHAT,
    committed,
    errors,
    feed,
    finals,
    provider_run,
)
from test_assembler import checked

from worker.core import Assembler, AssembleSettings
from worker.core.outputs import idempotency_key

OBJECT = {"type": "object"}


def make(**settings: Any) -> Assembler:
    return Assembler(AssembleSettings(**settings))


# -- idempotency keys ----------------------------------------------------------------------


def test_idempotency_keys_of_colon_ids_do_not_collide() -> None:
    """Run ``a:7`` with call ``c`` and run ``a`` with call ``7:c`` commit under two different
    keys, where joining the parts with ``:`` alone gave both ``a:7:c``."""
    emits = checked(feed(make(), [*provider_run(CHAT, "a:7", {"f": OBJECT}, [("c", "f", "{}")]),
                                  *provider_run(CHAT, "a", {"f": OBJECT}, [("7:c", "f", "{}")])]))
    keys = [c["idempotency_key"] for c in committed(emits)]
    assert keys == ["a%3A7:c", "a:7%3Ac"]
    assert len({f["idempotency_key"] for f in finals(emits)}) == 2


def test_idempotency_key_parts_are_percent_encoded() -> None:
    """``%`` is encoded too, so an id that already holds ``%3A`` cannot pass for a ``:``; keys
    without either character are unchanged (``run:call``)."""
    assert idempotency_key("a%3A7", "c") == "a%253A7:c" != idempotency_key("a:7", "c")
    assert idempotency_key("r1", "call_1") == "r1:call_1"
    assert idempotency_key("a", "b:c", "0.1") == "a:b%3Ac:0.1"


def test_error_keys_of_shared_ids_are_encoded() -> None:
    """Two calls sharing an id that holds ``:`` fail ``duplicate_call_id`` with keys that add
    the encoded buffer key: distinct, and none ambiguous."""
    emits = checked(feed(make(), provider_run(CHAT, "r", {"f": OBJECT},
                                              [("x:1", "f", "{}"), ("x:1", "f", "{}")])))
    keys = [e["idempotency_key"] for e in errors(emits)]
    assert keys == ["r:x%3A1:0.0", "r:x%3A1:0.1"]
