"""Provider adapters: one per streaming API, each turning raw events into :mod:`ops`."""

from __future__ import annotations

from worker.core.ops import Adapter
from worker.core.providers.anthropic_messages import AnthropicMessages
from worker.core.providers.openai_chat import OpenAIChat
from worker.core.providers.openai_responses import OpenAIResponses

ADAPTERS: dict[str, type[OpenAIChat] | type[OpenAIResponses] | type[AnthropicMessages]] = {
    "openai.chat": OpenAIChat,
    "openai.responses": OpenAIResponses,
    "anthropic.messages": AnthropicMessages,
}


def adapter_for(provider: str) -> Adapter:
    """A fresh adapter for one run of ``provider`` (a name from ``envelope.PROVIDERS``)."""
    return ADAPTERS[provider]()
