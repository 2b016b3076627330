"""What a model provider is: a neutral conversation in, one complete reply out.

Providers stream partial output through ``emit`` (ephemeral events, never stored)
and return the complete reply; the runtime commits only complete replies. Every
failure a provider can meet is a ``ProviderError`` that says whether it is worth
retrying; ``classify`` maps anything else a provider raised onto that one shape.

Reasoning ("extended thinking") is carried as two neutral blocks rather than as an
opaque per-provider payload: ``ThinkingBlock`` (the reasoning text and its
signature) and ``RedactedThinkingBlock`` (encrypted reasoning). They are the same
frozen value types the log stores in ``GenerationCompleted.thinking``, so a reply's
reasoning goes from the provider to the log and back into the next request without
translation, and stays readable in ``perdure show``. Their payloads (``signature``,
``data``) are opaque: a provider that returned them gets them back unchanged; a
provider that does not understand them leaves them out of its requests (the
scripted one ignores them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from attrs import field, frozen

from perdure.storage.records import (
    RedactedThinkingBlock,
    Thinking,
    ThinkingBlock,
    ToolCall,
    Usage,
)

__all__ = [
    "Block",
    "Emit",
    "Message",
    "ModelReply",
    "ModelRequest",
    "Provider",
    "ProviderError",
    "RedactedThinkingBlock",
    "TextBlock",
    "Thinking",
    "ThinkingBlock",
    "ToolDefinition",
    "ToolResultBlock",
    "ToolUseBlock",
    "classify",
]

Emit = Callable[[str, dict[str, Any]], None]


@frozen
class TextBlock:
    text: str


@frozen
class ToolUseBlock:
    id: str
    name: str
    input: dict[str, Any]


@frozen
class ToolResultBlock:
    tool_use_id: str
    content: str
    is_error: bool = False


# In an assistant message, reasoning blocks come first, as the model produced them.
Block = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


Role = Literal["user", "assistant"]


@frozen
class Message:
    role: Role
    content: tuple[Block, ...]


@frozen
class ToolDefinition:
    name: str
    description: str
    input_schema: dict[str, Any]


@frozen(kw_only=True)
class ModelRequest:
    system: str | None
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...] = ()
    attempt: int = 1
    session_id: str = ""
    generation_id: str = ""
    submission_id: str = ""  # the input this turn answers (events name it)


@frozen(kw_only=True)
class ModelReply:
    """One complete reply. ``thinking``: its reasoning blocks, complete (signed), in order."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    thinking: tuple[Thinking, ...] = ()
    stop_reason: str = "end_turn"
    usage: Usage = field(factory=Usage)
    provider: str = ""  # who answered (``Provider.name``), recorded with the reply
    model: str = ""  # the model that answered, as the vendor reported it
    response_id: str = ""  # the vendor's id of this response, if it gives one


class ProviderError(Exception):
    """A model call failed. ``retryable`` decides between back-off and failing the run."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        status: int | None = None,
        usage: Usage | None = None,
        model: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        self.usage = usage or Usage()
        self.model = model  # the model asked, when the provider knows it


class Provider(Protocol):
    """A model. ``complete`` must be cancellable (it runs under a trio cancel scope)."""

    name: str

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply: ...


def classify(exc: BaseException) -> ProviderError:
    """Map any exception a provider raised onto a ProviderError (the one place that decides)."""
    if isinstance(exc, ProviderError):
        return exc
    if isinstance(exc, ConnectionError | TimeoutError | OSError):
        return ProviderError(f"{type(exc).__name__}: {exc}", retryable=True)
    return ProviderError(f"provider raised {type(exc).__name__}: {exc}", retryable=False)
