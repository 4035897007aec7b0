"""Latch: emit a streamed LLM tool call only after it is complete and valid."""

__version__ = "0.1.0"
