"""Provider adapters: one per streaming API, each turning raw events into :mod:`ops`."""

from __future__ import annotations

from worker.core.ops import Adapter
from worker.core.providers.anthropic_messages import AnthropicMessages
from worker.core.providers.bedrock_converse import BedrockConverse
from worker.core.providers.gemini import Gemini
from worker.core.providers.openai_chat import OpenAIChat
from worker.core.providers.openai_responses import OpenAIResponses

ADAPTERS: dict[str, type[Adapter]] = {
    "openai.chat": OpenAIChat,
    "openai.responses": OpenAIResponses,
    "anthropic.messages": AnthropicMessages,
    "bedrock.converse": BedrockConverse,
    "google.gemini": Gemini,
}


def adapter_for(provider: str, run_id: str = "") -> Adapter:
    """A fresh adapter for one run of ``provider`` (a name from ``envelope.PROVIDERS``);
    ``run_id`` makes the ids of the calls a provider sends without one (Gemini)."""
    if provider == "google.gemini":
        return Gemini(run_id)
    return ADAPTERS[provider]()
