"""The member names the core reads on its per-event path, as the objects orjson returns.

A dict lookup compares the key it is given with the dict's own key first by identity, then,
when that fails, by length and content (``memcmp``). orjson returns each object key of up to
64 bytes from a cache of ``str`` objects, the same object every time, but not the interned
literal a ``doc.get("type")`` passes: every read of a parsed record paid the content
comparison. ``perf`` put ``memcmp`` under those reads at 3% of the core's time in
``bench/bench_core.py``, with the hash probing around it about twice that.

Each name here is the object orjson gives for that key, taken once at import by parsing a
document that holds it. Reading with it finds the parsed dict's key by identity. It is only
ever an optimisation: the lookup still compares by value, so a name that is not orjson's
object (orjson's cache is direct-mapped, 2,048 entries, and a key whose hash takes the same
slot replaces it, after which orjson makes a new object) reads the same value as a literal
would, at a literal's cost.

Only the reads on the per-event path use these (the envelope's members, and each provider's
text delta and argument fragment); everything else reads with literals.
"""

from __future__ import annotations

from typing import Final

from orjson import dumps, loads


def parsed(name: str) -> str:
    """The ``str`` that orjson returns for an object key ``name``."""
    key: str = next(iter(loads(dumps({name: 0}))))
    return key


# the envelope (worker.core.assembler.Assembler.feed_record)
TYPE: Final = parsed("type")
RUN_ID: Final = parsed("run_id")
V: Final = parsed("v")
SEQ: Final = parsed("seq")
EVENT: Final = parsed("event")
TS: Final = parsed("ts")
# provider events
INDEX: Final = parsed("index")
DELTA: Final = parsed("delta")
TEXT: Final = parsed("text")
PARTIAL_JSON: Final = parsed("partial_json")
CHOICES: Final = parsed("choices")
CONTENT: Final = parsed("content")
FINISH_REASON: Final = parsed("finish_reason")
TOOL_CALLS: Final = parsed("tool_calls")
FUNCTION: Final = parsed("function")
ARGUMENTS: Final = parsed("arguments")
ID: Final = parsed("id")
NAME: Final = parsed("name")
OUTPUT_INDEX: Final = parsed("output_index")
ITEM_ID: Final = parsed("item_id")
