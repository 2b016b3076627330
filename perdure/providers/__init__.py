"""Model providers: the neutral interface, a scripted provider, and Anthropic."""

from perdure.providers.base import ModelReply, ModelRequest, Provider, ProviderError
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

__all__ = [
    "ModelReply",
    "ModelRequest",
    "Provider",
    "ProviderError",
    "Reply",
    "ScriptedProvider",
    "ToolUse",
]
