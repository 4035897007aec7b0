"""Types of worker/core/csrc/peek.c, the C extension built with the compiled core."""

ANTHROPIC_TEXT: int
ANTHROPIC_JSON: int
CHAT_TEXT: int
CHAT_ARGS: int
RESPONSES_TEXT: int
RESPONSES_ARGS: int
RESPONSES_INPUT: int
MAX_BYTES: int
MAX_DEPTH: int

def peek(value: bytes, /) -> tuple[int, str, int, int | None, int, str] | None: ...
