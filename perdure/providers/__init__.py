"""Model providers: the neutral interface, a scripted provider, Anthropic, OpenAI, fallback.

``AnthropicProvider``, ``provider_from_env`` (Anthropic's) and ``OpenAIProvider`` are
imported on first use, so that ``import perdure`` does not load a vendor SDK (and
its HTTP stack) until a program actually asks for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from perdure.providers.base import ModelReply, ModelRequest, Provider, ProviderError
from perdure.providers.fallback import FallbackProvider
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

if TYPE_CHECKING:
    from perdure.providers.anthropic import AnthropicProvider, provider_from_env
    from perdure.providers.openai import OpenAIProvider

__all__ = [
    "AnthropicProvider",
    "FallbackProvider",
    "ModelReply",
    "ModelRequest",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "Reply",
    "ScriptedProvider",
    "ToolUse",
    "provider_from_env",
]

_LAZY = {
    "AnthropicProvider": "anthropic",
    "provider_from_env": "anthropic",
    "OpenAIProvider": "openai",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"perdure.providers.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
