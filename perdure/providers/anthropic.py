"""The Anthropic provider: perdure's neutral model request over the Messages API.

``AnthropicProvider.complete`` maps a ``ModelRequest`` (system prompt, messages of
text / tool_use / tool_result blocks, tool definitions) onto one streamed
``POST /v1/messages`` through the official ``anthropic`` SDK, publishes the
stream's text and tool-input deltas as ephemeral events while it arrives, and
returns only the complete reply. A stream that breaks before ``message_stop`` is
an error, never a short reply: the runtime commits complete replies only.

The SDK's own retries are switched off (``max_retries=0``): retrying is the
runtime's job, because its back-off is durable (``RetryPending`` is committed
before the sleep) and survives a crash. What is worth retrying is decided in one
place for every vendor (``perdure.providers._retry``, whose table applies);
``classify_error`` tells it what Anthropic's errors look like.

Extended thinking (``thinking={"type": "enabled", "budget_tokens": N}`` as a request
option) round-trips: the reply's ``thinking`` blocks (text and ``signature``, the
signature assembled from its ``signature_delta`` events) and ``redacted_thinking``
blocks become ``ModelReply.thinking``, are committed with the reply, and are sent
back verbatim at the head of that assistant message in every later request, as
the API requires while a tool-use loop continues. ``thinking_delta`` events are
published as ephemeral ``thinking_delta`` events, like text.

Prompt caching is on by default: a ``cache_control`` breakpoint on the system
prompt and on the last tool definition, the two parts of the prompt that stay the
same from turn to turn.

The SDK is imported only by this module, so ``import perdure`` does not pay for
it; ``perdure.providers`` exports ``AnthropicProvider`` lazily.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anthropic
from attrs import define, field

from perdure.providers._retry import (
    StatusDetails,
    StreamBroken,
    Vendor,
    classify_failure,
    retry_after,
)
from perdure.providers._sdk import EventFolder, OwnsClient, json_object, read_sse, split_options
from perdure.providers.base import (
    Emit,
    Message,
    ModelReply,
    ModelRequest,
    ProviderError,
    RedactedThinkingBlock,
    TextBlock,
    Thinking,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.storage.records import ToolCall, Usage

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "AnthropicProvider",
    "MissingCredentials",
    "StreamBroken",
    "classify_error",
    "provider_from_env",
    "retry_after",
]

DEFAULT_MODEL = "claude-sonnet-4-6"
DEFAULT_MAX_TOKENS = 8192

_EPHEMERAL: dict[str, str] = {"type": "ephemeral"}

# Request fields the provider owns; passing them as request options is a mistake.
_RESERVED = frozenset({"model", "max_tokens", "messages", "system", "tools", "stream"})

# Error types of the API (``error.type``) and the status each one comes with. An SSE
# ``error`` event carries only the type, so this is how a mid-stream error is classified.
_TYPE_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# 429s that waiting does not cure: a spend limit holds until someone raises it.
_SPEND_LIMITS = frozenset({"enforced_spend_limit_reached", "contract_spend_limit_reached"})


class MissingCredentials(RuntimeError):
    """No API key for the Anthropic provider was found in the environment."""


# -- the classification ---------------------------------------------------------------------


def _describe(exc: Exception) -> tuple[int, StatusDetails]:
    assert isinstance(exc, anthropic.APIStatusError)
    status = exc.status_code
    error_type = exc.type or ""
    if status < 400:  # an SSE error event read through the SDK's own stream iterator
        status = _TYPE_STATUS.get(error_type, 500)
    label = f"{status} {error_type}".strip()
    if exc.error_code:
        label += f"/{exc.error_code}"
    details = StatusDetails(
        label=label,
        message=exc.api_message or str(exc.message),
        request_id=exc.request_id,
        exhausted=status == 429 and exc.error_code in _SPEND_LIMITS,
    )
    return status, details


def _stream_error(exc: StreamBroken) -> tuple[int, bool]:
    return _TYPE_STATUS.get(exc.error_type or "", 500), False


VENDOR = Vendor.of_sdk(anthropic, "Anthropic", _describe, _stream_error)


def classify_error(exc: BaseException, usage: Usage | None = None) -> ProviderError:
    """What an Anthropic failure means for the runtime (the shared table in
    ``perdure.providers._retry``): 429 ``rate_limit_error`` and 529
    ``overloaded_error`` are retried with ``retry-after`` honoured; a 429 with a
    spend-limit error code is not (the provider is exhausted); an SSE ``error`` event
    midway is classified by its ``error.type``."""
    return classify_failure(VENDOR, exc, usage)


# -- the request ----------------------------------------------------------------------------


def _message_param(message: Message, *, final: bool) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            if block.text.strip():  # the API rejects empty text blocks
                blocks.append({"type": "text", "text": block.text})
        elif isinstance(block, ToolUseBlock):
            blocks.append(
                {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
            )
        elif isinstance(block, ThinkingBlock):
            # Verbatim: the API checks the signature against the thinking text.
            blocks.append(
                {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
            )
        elif isinstance(block, RedactedThinkingBlock):
            blocks.append({"type": "redacted_thinking", "data": block.data})
        elif isinstance(block, ToolResultBlock):
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": block.tool_use_id,
                "content": block.content,
            }
            if block.is_error:
                result["is_error"] = True
            results.append(result)
    if final and message.role == "assistant" and blocks and blocks[-1]["type"] == "text":
        # A conversation that ends with the assistant (continuing a pause_turn) must not
        # end in whitespace.
        stripped = blocks[-1]["text"].rstrip()
        if stripped:
            blocks[-1] = {"type": "text", "text": stripped}
        else:
            blocks.pop()
    # Tool results must come first in a user message.
    content = results + blocks
    if not content:
        content = [{"type": "text", "text": "(empty)"}]
    return {"role": message.role, "content": content}


# -- the stream -----------------------------------------------------------------------------


@define
class _Block:
    kind: str  # "text", "tool_use", "thinking", "redacted_thinking", or one not kept
    text: str = ""  # of a text block; the reasoning of a thinking block
    signature: str = ""  # of a thinking block
    data: str = ""  # of a redacted_thinking block
    id: str = ""
    name: str = ""
    start_input: Any = None
    partial_json: list[str] = field(factory=list)


def _usage(raw: Any, base: Usage) -> Usage:
    """Overlay the counts present in ``raw`` (cumulative, per the API) on ``base``."""
    if not isinstance(raw, dict):
        return base

    def pick(name: str, current: int) -> int:
        value = raw.get(name)
        return value if isinstance(value, int) else current

    return Usage(
        input_tokens=pick("input_tokens", base.input_tokens),
        output_tokens=pick("output_tokens", base.output_tokens),
        cache_creation_input_tokens=pick(
            "cache_creation_input_tokens", base.cache_creation_input_tokens
        ),
        cache_read_input_tokens=pick("cache_read_input_tokens", base.cache_read_input_tokens),
    )


class _ReplyBuilder(EventFolder):
    """Folds the Messages API's stream events into one reply, emitting deltas as it goes."""

    def __init__(self, emit: Emit) -> None:
        super().__init__()
        self._emit = emit
        self.blocks: dict[int, _Block] = {}
        self.usage = Usage()
        self.stop_reason: str | None = None
        self.started = False
        self.stopped = False
        self.model = ""
        self.response_id = ""

    def skips(self, name: str) -> bool:
        return name == "ping"

    def fold(self, name: str, raw: str) -> None:
        data = json_object(name, raw)
        kind = data.get("type", name)
        if name == "error" or kind == "error":
            error = data.get("error")
            if not isinstance(error, dict):
                error = {}
            raise StreamBroken(
                str(error.get("message") or "the server reported an error"),
                error_type=str(error.get("type") or "api_error"),
            )
        handler = getattr(self, "_" + str(kind), None)
        if handler is not None:  # unknown event types are ignored, as the API asks
            handler(data)

    def _message_start(self, data: dict[str, Any]) -> None:
        self.started = True
        message = data.get("message")
        if isinstance(message, dict):
            self.usage = _usage(message.get("usage"), self.usage)
            self.model = str(message.get("model") or "")
            self.response_id = str(message.get("id") or "")

    def _content_block_start(self, data: dict[str, Any]) -> None:
        index = int(data["index"])
        raw = data.get("content_block") or {}
        kind = str(raw.get("type", ""))
        block = _Block(kind)
        if kind == "tool_use":
            block.id, block.name = str(raw.get("id", "")), str(raw.get("name", ""))
            block.start_input = raw.get("input")
            self._emit("tool_use_start", {"index": index, "id": block.id, "name": block.name})
        elif kind == "thinking":
            block.signature = str(raw.get("signature") or "")
        elif kind == "redacted_thinking":
            block.data = str(raw.get("data") or "")
        self.blocks[index] = block
        if kind == "text" and raw.get("text"):
            self._add_text(block, str(raw["text"]))
        elif kind == "thinking" and raw.get("thinking"):
            self._add_thinking(block, index, str(raw["thinking"]))

    def _content_block_delta(self, data: dict[str, Any]) -> None:
        index = int(data["index"])
        block = self.blocks.get(index)
        delta = data.get("delta") or {}
        if block is None:
            raise StreamBroken(f"the stream sent a delta for unknown content block {index}")
        if delta.get("type") == "text_delta" and block.kind == "text":
            self._add_text(block, str(delta.get("text", "")))
        elif delta.get("type") == "input_json_delta" and block.kind == "tool_use":
            piece = str(delta.get("partial_json", ""))
            block.partial_json.append(piece)
            if piece:
                self._emit("tool_input_delta", {"index": index, "partial_json": piece})
        elif delta.get("type") == "thinking_delta" and block.kind == "thinking":
            self._add_thinking(block, index, str(delta.get("thinking", "")))
        elif delta.get("type") == "signature_delta" and block.kind == "thinking":
            # Not published: it is opaque, and the stored block is useless without it.
            block.signature += str(delta.get("signature", ""))

    def _add_text(self, block: _Block, text: str) -> None:
        block.text += text
        if text:
            self._emit("text_delta", {"text": text})

    def _add_thinking(self, block: _Block, index: int, text: str) -> None:
        block.text += text
        if text:
            self._emit("thinking_delta", {"index": index, "thinking": text})

    def _message_delta(self, data: dict[str, Any]) -> None:
        delta = data.get("delta") or {}
        if delta.get("stop_reason"):
            self.stop_reason = str(delta["stop_reason"])
        self.usage = _usage(data.get("usage"), self.usage)

    def _message_stop(self, data: dict[str, Any]) -> None:
        self.stopped = True

    def reply(self) -> ModelReply:
        where = "after message_start" if self.started else "before message_start"
        self.check_ended(self.stopped, f"the response stream ended {where} but before message_stop")
        stop_reason = self.stop_reason or "end_turn"
        texts: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[Thinking] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.kind == "text":
                texts.append(block.text)
            elif block.kind == "thinking":
                if not block.signature:
                    if stop_reason == "max_tokens":
                        continue  # cut off before its signature: the API would refuse it
                    raise StreamBroken(f"thinking block {index} arrived without a signature")
                thinking.append(ThinkingBlock(block.text, block.signature))
            elif block.kind == "redacted_thinking":
                if not block.data:  # handed back empty, the API would refuse the request
                    raise StreamBroken(f"redacted thinking block {index} arrived without data")
                thinking.append(RedactedThinkingBlock(block.data))
            elif block.kind == "tool_use":
                tool_input = _tool_input(block)
                if tool_input is None:
                    if stop_reason == "max_tokens":
                        continue  # cut off by the token limit: the call is incomplete
                    raise StreamBroken(f"the input of tool call {block.id} is not a JSON object")
                calls.append(ToolCall(call_id=block.id, name=block.name, input=tool_input))
        return ModelReply(
            text="".join(texts),
            tool_calls=tuple(calls),
            thinking=tuple(thinking),
            stop_reason=stop_reason,
            usage=self.usage,
            provider="anthropic",
            model=self.model,
            response_id=self.response_id,
        )


def _tool_input(block: _Block) -> dict[str, Any] | None:
    raw = "".join(block.partial_json)
    if not raw.strip():
        value = block.start_input if block.start_input is not None else {}
    else:
        try:
            value = json.loads(raw)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


# -- the provider ---------------------------------------------------------------------------


class AnthropicProvider(OwnsClient):
    """A ``Provider`` backed by the Anthropic Messages API (streaming).

    ``client`` defaults to ``anthropic.AsyncAnthropic(max_retries=0)``, which reads
    ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL`` from the environment. A client
    you pass in is used with ``max_retries=0`` as well (through ``with_options``):
    retrying is the runtime's job, with a durable back-off. ``request_options``
    (``tool_choice``, ``metadata``, ``timeout``, ``temperature``, ...) are sent with
    every request: as arguments of ``messages.create`` where it has them, as extra
    body fields otherwise.
    """

    client: anthropic.AsyncAnthropic

    name = "anthropic"

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        client: anthropic.AsyncAnthropic | None = None,
        cache: bool = True,
        **request_options: Any,
    ) -> None:
        reserved = sorted(_RESERVED & request_options.keys())
        if reserved:
            raise TypeError(
                f"AnthropicProvider sets {', '.join(reserved)} itself; "
                "pass model= and max_tokens= as arguments"
            )
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
        self.model = model
        self.max_tokens = max_tokens
        self.cache = cache
        self._owns_client = client is None
        if client is None:
            client = anthropic.AsyncAnthropic(max_retries=0)
        elif client.max_retries != 0:
            # Retries inside the SDK would be invisible to the log: no RetryPending, no
            # durable back-off, no usage of the failed attempts. The copy shares the
            # caller's connection pool.
            client = client.with_options(max_retries=0)
        self.client = client
        self.request_options = split_options(self.client.messages.create, request_options)

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r}, base_url={str(self.client.base_url)!r})"

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The ``messages.create`` arguments for ``request`` (without ``stream``)."""
        last = len(request.messages) - 1
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": [
                _message_param(m, final=i == last) for i, m in enumerate(request.messages)
            ],
        }
        if request.system:
            if self.cache:
                params["system"] = [
                    {"type": "text", "text": request.system, "cache_control": dict(_EPHEMERAL)}
                ]
            else:
                params["system"] = request.system
        if request.tools:
            tools: list[dict[str, Any]] = [
                {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                for t in request.tools
            ]
            if self.cache:
                tools[-1]["cache_control"] = dict(_EPHEMERAL)
            params["tools"] = tools
        if self.cache and params["messages"]:
            # A third breakpoint on the newest block caches the conversation prefix, which
            # in an agent loop is most of each request; the next turn reads it back. The
            # API takes no breakpoint on a thinking block: use the last other one.
            for block in reversed(params["messages"][-1]["content"]):
                if block["type"] not in ("thinking", "redacted_thinking"):
                    block["cache_control"] = dict(_EPHEMERAL)
                    break
        params.update(self.request_options)
        return params

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        """One streamed model call. Raises ``ProviderError`` (see ``classify_error``)."""
        params = self.params(request)
        builder = _ReplyBuilder(emit)
        try:
            stream = await self.client.messages.create(**params, stream=True)
            await read_sse(stream, builder.on_event)
            return builder.reply()
        except Exception as exc:
            failure = classify_error(exc, builder.usage)
            failure.model = failure.model or self.model  # its usage is priced at this model
            raise failure from exc


def provider_from_env(model: str | None = None) -> AnthropicProvider:
    """An ``AnthropicProvider`` configured from the environment, or a clear error.

    Needs ``ANTHROPIC_API_KEY`` (``ANTHROPIC_AUTH_TOKEN`` works too);
    ``ANTHROPIC_BASE_URL`` overrides the endpoint.
    """
    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        raise MissingCredentials(
            "the Anthropic provider needs an API key: set ANTHROPIC_API_KEY "
            "(or use --provider scripted:FILE to run from a scripted model without one)"
        )
    return AnthropicProvider(model=model or DEFAULT_MODEL)
