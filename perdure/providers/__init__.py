"""Model providers: the neutral interface, a scripted provider, and Anthropic.

``AnthropicProvider`` and ``provider_from_env`` are imported on first use, so that
``import perdure`` does not load the Anthropic SDK (and its HTTP stack) until a
program actually asks for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perdure.providers.base import ModelReply, ModelRequest, Provider, ProviderError
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

if TYPE_CHECKING:
    from perdure.providers.anthropic import AnthropicProvider, provider_from_env

__all__ = [
    "AnthropicProvider",
    "ModelReply",
    "ModelRequest",
    "Provider",
    "ProviderError",
    "Reply",
    "ScriptedProvider",
    "ToolUse",
    "provider_from_env",
]

_LAZY = {"AnthropicProvider", "provider_from_env"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from perdure.providers import anthropic

        return getattr(anthropic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
