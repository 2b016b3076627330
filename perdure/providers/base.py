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

A model turn may be answered by a different provider than the one that failed it
(``perdure.providers.FallbackProvider``). The facts such a choice needs are durable
and travel on the request: ``ModelRequest.failed`` lists the turn's earlier failed
attempts (from its ``RetryPending`` records: who failed, and whether that failure
moved the turn on to the next provider) and ``ModelRequest.answered_by`` names the
provider that answered the previous turn of the same input. A provider reports who
failed through ``ProviderError.provider``; ``ProviderError.exhausted`` says that
waiting will not help that provider (a quota or spend limit), though another might.
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
    "FailedAttempt",
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
class FailedAttempt:
    """An earlier attempt of the same model turn that failed (its ``RetryPending`` record)."""

    attempt: int
    provider: str  # who failed it ("" in logs written before it was recorded)
    fallback: bool = False  # the failure moved the turn on to the next provider


@frozen(kw_only=True)
class ModelRequest:
    system: str | None
    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...] = ()
    attempt: int = 1
    session_id: str = ""
    generation_id: str = ""
    submission_id: str = ""  # the input this turn answers (events name it)
    failed: tuple[FailedAttempt, ...] = ()  # this turn's earlier attempts, in order
    answered_by: str = ""  # the provider that answered the input's previous turn


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
    """A model call failed. ``retryable`` decides between back-off and failing the run.

    ``provider`` names who failed (recorded on ``RetryPending``); ``exhausted`` says the
    provider cannot serve until someone acts (quota, spend limit), so a fallback moves
    on at once; ``fallback`` says the next attempt goes to the next provider, without
    a back-off (set by ``FallbackProvider``, recorded so a restart keeps the choice).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        status: int | None = None,
        usage: Usage | None = None,
        model: str = "",
        provider: str = "",
        exhausted: bool = False,
        fallback: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        self.usage = usage or Usage()
        self.model = model  # the model asked, when the provider knows it
        self.provider = provider
        self.exhausted = exhausted
        self.fallback = fallback


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
