"""The OpenAI provider: perdure's neutral model request over an OpenAI-compatible API.

``OpenAIProvider`` speaks Chat Completions (``api="chat"``, the default: OpenAI, and
the OpenAI-compatible servers of vLLM, Ollama, LiteLLM, OpenRouter ...) or the
Responses API (``api="responses"``) through the official ``openai`` SDK. Every call
is streamed: text and tool-call argument deltas are published as ephemeral events
(``text_delta``, ``tool_use_start``, ``tool_input_delta``, as Anthropic's) while they
arrive, and only the complete reply is returned. A stream that ends before its end
marker (``data: [DONE]``; ``response.completed`` / ``response.incomplete``) is an
error, never a short reply.

The SDK's own retries are off (``max_retries=0``): retrying is the runtime's job, with
a durable back-off. Failures go through the same classification as Anthropic's
(``perdure.providers._retry``); a 429 for an exhausted quota is not retried, and
marks the provider exhausted so that a ``FallbackProvider`` moves on at once.

How the neutral conversation maps onto each API:

====================  ==========================================  ==========================
perdure               Chat Completions                            Responses
====================  ==========================================  ==========================
system prompt         a ``system`` message                        ``instructions``
text                  ``user`` / ``assistant`` message content    an input message
tool call             ``assistant.tool_calls[]`` (JSON arguments)  a ``function_call`` item
tool result           a ``tool`` message after the call           ``function_call_output``
result with is_error  content prefixed ``Error: ``                output prefixed ``Error: ``
reasoning blocks      left out (another vendor's, opaque)         left out
stop reasons          stop→end_turn, length→max_tokens,           incomplete
                      tool_calls→tool_use,                        max_output_tokens→
                      content_filter→refusal                      max_tokens, content_filter
                                                                  →refusal
usage                 prompt - cached → input, cached → cache     the same from
                      read, completion → output                   input/output_tokens
====================  ==========================================  ==========================

Usage is mapped so that it adds up as Anthropic's does: ``input_tokens`` counts the
prompt tokens that were *not* read from the cache, ``cache_read_input_tokens`` those
that were (OpenAI's ``cached_tokens``).

The SDK is imported only by this module, so ``import perdure`` does not pay for it;
``perdure.providers`` exports ``OpenAIProvider`` lazily.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, Literal

import openai
from attrs import define, field

from perdure.providers._retry import (
    StatusDetails,
    StreamBroken,
    Vendor,
    classify_failure,
)
from perdure.providers._sdk import EventFolder, OwnsClient, json_object, read_sse, split_options
from perdure.providers.base import (
    Emit,
    Message,
    ModelReply,
    ModelRequest,
    ProviderError,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.storage.records import ToolCall, Usage
from perdure.tools.params import strict_compatible

__all__ = [
    "OpenAIProvider",
    "classify_error",
    "provider_from_env",
]

Api = Literal["chat", "responses"]

# Request fields the provider owns; passing them as request options is a mistake.
_RESERVED: dict[Api, frozenset[str]] = {
    "chat": frozenset({"model", "messages", "tools", "stream", "stream_options"}),
    "responses": frozenset({"model", "input", "instructions", "tools", "stream"}),
}

# A 429 with one of these codes is a quota, not a rate: waiting does not cure it.
_QUOTAS = frozenset({"insufficient_quota", "billing_hard_limit_reached"})

# The error kinds (``error.code``, else ``error.type``) an in-stream error event may carry,
# and the status each one stands for. Unknown kinds count as a server error.
_KIND_STATUS: dict[str, int] = {
    "invalid_request_error": 400,
    "invalid_prompt": 400,
    "context_length_exceeded": 400,
    "authentication_error": 401,
    "invalid_api_key": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "model_not_found": 404,
    "rate_limit_exceeded": 429,
    "rate_limit_error": 429,
    "insufficient_quota": 429,
    "server_error": 500,
    "api_error": 500,
    "timeout": 504,
}

_CHAT_STOPS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

_ERROR_PREFIX = "Error: "


class MissingCredentials(RuntimeError):
    """No API key for the OpenAI provider was found in the environment."""


# -- the classification ---------------------------------------------------------------------


def _describe(exc: Exception) -> tuple[int, StatusDetails]:
    assert isinstance(exc, openai.APIStatusError)
    body = exc.body if isinstance(exc.body, dict) else {}
    code = exc.code or ""
    label = f"{exc.status_code} {exc.type or ''}".strip()
    if code and code != exc.type:
        label += f"/{code}"
    message = body.get("message")
    details = StatusDetails(
        label=label,
        message=message if isinstance(message, str) and message else str(exc.message),
        request_id=exc.request_id,
        exhausted=exc.status_code == 429 and (code in _QUOTAS or exc.type in _QUOTAS),
    )
    return exc.status_code, details


def _stream_error(exc: StreamBroken) -> tuple[int, bool]:
    kind = exc.error_type or ""
    return _KIND_STATUS.get(kind, 500), kind in _QUOTAS


VENDOR = Vendor.of_sdk(openai, "OpenAI", _describe, _stream_error)


def classify_error(exc: BaseException, usage: Usage | None = None) -> ProviderError:
    """What an OpenAI failure means for the runtime (the shared table in
    ``perdure.providers._retry``): a 429 is retried with ``retry-after`` honoured
    unless its code says the quota is used up (``insufficient_quota``: not retried,
    the provider is exhausted); an error event midway is classified by its code."""
    return classify_failure(VENDOR, exc, usage)


# -- the request ----------------------------------------------------------------------------


def _result_text(block: ToolResultBlock) -> str:
    # Neither API has an error flag on a tool result: the model reads it in the text.
    return _ERROR_PREFIX + block.content if block.is_error else block.content


def _arguments(block: ToolUseBlock) -> str:
    return json.dumps(block.input, ensure_ascii=False)


def _conversation(
    messages: tuple[Message, ...],
    assistant: Callable[[str, list[ToolUseBlock]], list[dict[str, Any]]],
    result: Callable[[ToolResultBlock], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The neutral conversation in one API's shape: ``assistant`` renders an assistant
    turn (its text and calls), ``result`` one tool result."""
    out: list[dict[str, Any]] = []
    for message in messages:
        text = "".join(b.text for b in message.content if isinstance(b, TextBlock))
        if message.role == "assistant":
            out += assistant(text, [b for b in message.content if isinstance(b, ToolUseBlock)])
            continue
        # Tool results answer the assistant turn before them, so they come first.
        results = [b for b in message.content if isinstance(b, ToolResultBlock)]
        out += [result(b) for b in results]
        if text.strip() or not results:
            out.append({"role": "user", "content": text or "(empty)"})
    return out


def _chat_assistant(text: str, calls: list[ToolUseBlock]) -> list[dict[str, Any]]:
    entry: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        entry["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _arguments(c)},
            }
            for c in calls
        ]
    return [entry]


def _responses_assistant(text: str, calls: list[ToolUseBlock]) -> list[dict[str, Any]]:
    items = [{"role": "assistant", "content": text}] if text else []
    items += [
        {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": _arguments(c)}
        for c in calls
    ]
    return items


def chat_messages(system: str | None, messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` for a neutral conversation."""
    head = [{"role": "system", "content": system}] if system else []
    return head + _conversation(
        messages,
        _chat_assistant,
        lambda b: {"role": "tool", "tool_call_id": b.tool_use_id, "content": _result_text(b)},
    )


def responses_input(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """The Responses API ``input`` items for a neutral conversation."""
    return _conversation(
        messages,
        _responses_assistant,
        lambda b: {
            "type": "function_call_output",
            "call_id": b.tool_use_id,
            "output": _result_text(b),
        },
    )


# -- the stream -----------------------------------------------------------------------------


@define
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(factory=list)

    def tool_call(self, stop_reason: str) -> ToolCall | None:
        raw = "".join(self.arguments)
        try:
            value = json.loads(raw) if raw.strip() else {}
        except ValueError:
            value = None
        if not isinstance(value, dict):
            if stop_reason == "max_tokens":
                return None  # cut off by the token limit: the call is incomplete
            raise StreamBroken(f"the arguments of tool call {self.id} are not a JSON object")
        return ToolCall(call_id=self.id, name=self.name, input=value)


# The names of the prompt, completion and prompt-details counts in each API's usage.
_CHAT_USAGE = ("prompt_tokens", "completion_tokens", "prompt_tokens_details")
_RESPONSES_USAGE = ("input_tokens", "output_tokens", "input_tokens_details")


def _usage(raw: Any, prompt: str, completion: str, details: str) -> Usage | None:
    if not isinstance(raw, dict):
        return None

    def count(value: Any) -> int:
        return value if isinstance(value, int) and value > 0 else 0

    cached_in = raw.get(details)
    cached = count(cached_in.get("cached_tokens")) if isinstance(cached_in, dict) else 0
    return Usage(
        input_tokens=max(0, count(raw.get(prompt)) - cached),
        output_tokens=count(raw.get(completion)),
        cache_read_input_tokens=cached,
    )


class _Builder(EventFolder):
    """Folds one API's stream events into a reply, emitting deltas as it goes."""

    def __init__(self, emit: Emit, provider: str) -> None:
        super().__init__()
        self._emit = emit
        self.provider = provider
        self.text: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.usage = Usage()
        self.stop_reason: str | None = None
        self.refused = False
        self.done = False
        self.started = False
        self.model = ""
        self.response_id = ""

    def skips(self, name: str) -> bool:
        return self.done

    @staticmethod
    def _error(error: Any) -> StreamBroken:
        if not isinstance(error, dict):
            error = {}
        kind = error.get("code") or error.get("type") or "server_error"
        return StreamBroken(
            str(error.get("message") or "the server reported an error"), error_type=str(kind)
        )

    def _add_text(self, piece: str) -> None:
        if piece:
            self.text.append(piece)
            self._emit("text_delta", {"text": piece})

    def _call(self, index: int, call_id: str, name: str) -> _Call:
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = _Call(id=call_id, name=name)
            self._emit("tool_use_start", {"index": index, "id": call_id, "name": name})
        return call

    def _add_arguments(self, index: int, piece: str) -> None:
        call = self.calls.get(index)
        if call is None:
            raise StreamBroken(f"the stream sent arguments for unknown tool call {index}")
        call.arguments.append(piece)
        if piece:
            self._emit("tool_input_delta", {"index": index, "partial_json": piece})

    def reply(self, end_marker: str) -> ModelReply:
        where = "midway" if self.started else "before its first event"
        self.check_ended(self.done, f"the response stream ended {where}, before {end_marker}")
        stop = self.stop_reason or "end_turn"
        if self.refused and stop == "end_turn":
            stop = "refusal"
        calls = [c for c in (self.calls[i].tool_call(stop) for i in sorted(self.calls)) if c]
        if calls and stop == "end_turn":  # some compatible servers say "stop" with calls
            stop = "tool_use"
        return ModelReply(
            text="".join(self.text),
            tool_calls=tuple(calls),
            stop_reason=stop,
            usage=self.usage,
            provider=self.provider,
            model=self.model,
            response_id=self.response_id,
        )


class _ChatBuilder(_Builder):
    """Chat Completions chunks: ``data: {chunk}`` ... ``data: [DONE]``."""

    def fold(self, name: str, raw: str) -> None:
        if raw.strip() == "[DONE]":
            self.done = True
            return
        data = json_object(name, raw)
        if name == "error" or data.get("error"):
            raise self._error(data.get("error", data))
        self.started = True
        self.response_id = str(data.get("id") or self.response_id)
        self.model = str(data.get("model") or self.model)
        usage = _usage(data.get("usage"), *_CHAT_USAGE)
        if usage is not None:
            self.usage = usage
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # n > 1: only the first choice is a reply
            delta = choice.get("delta") or {}
            self._add_text(str(delta.get("content") or ""))
            if delta.get("refusal"):
                self.refused = True
                self._add_text(str(delta["refusal"]))
            for piece in delta.get("tool_calls") or []:
                index = int(piece.get("index", 0))
                function = piece.get("function") or {}
                call = self._call(
                    index, str(piece.get("id") or ""), str(function.get("name") or "")
                )
                call.id = call.id or str(piece.get("id") or "")
                call.name = call.name or str(function.get("name") or "")
                if function.get("arguments") is not None:
                    self._add_arguments(index, str(function["arguments"]))
            reason = choice.get("finish_reason")
            if reason:
                self.stop_reason = _CHAT_STOPS.get(str(reason), str(reason))


class _ResponsesBuilder(_Builder):
    """Responses API events: ``response.created`` ... ``response.completed``."""

    def fold(self, name: str, raw: str) -> None:
        data = json_object(name, raw)
        kind = str(data.get("type") or name)
        self.started = True
        if kind == "error":
            raise self._error(data.get("error", data))
        response = data.get("response")
        if isinstance(response, dict):
            self.response_id = str(response.get("id") or self.response_id)
            self.model = str(response.get("model") or self.model)
        if kind == "response.output_item.added":
            item = data["item"]
            if item.get("type") == "function_call":
                index = int(data["output_index"])
                self._call(index, str(item.get("call_id") or ""), str(item.get("name") or ""))
                if item.get("arguments"):
                    self._add_arguments(index, str(item["arguments"]))
        elif kind == "response.output_text.delta":
            self._add_text(str(data.get("delta") or ""))
        elif kind == "response.refusal.delta":
            self.refused = True
            self._add_text(str(data.get("delta") or ""))
        elif kind == "response.function_call_arguments.delta":
            self._add_arguments(int(data["output_index"]), str(data.get("delta") or ""))
        elif kind == "response.output_item.done":
            item = data["item"]
            call = self.calls.get(int(data["output_index"]))
            if item.get("type") == "function_call" and call is not None:
                call.arguments = [str(item.get("arguments") or "")]  # the whole, as sent
                call.id = str(item.get("call_id") or call.id)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self._finish(kind, response if isinstance(response, dict) else {})

    def _finish(self, kind: str, response: dict[str, Any]) -> None:
        usage = _usage(response.get("usage"), *_RESPONSES_USAGE)
        if usage is not None:
            self.usage = usage
        if kind == "response.failed":
            raise self._error(response.get("error"))
        self.done = True
        if kind == "response.incomplete":
            details = response.get("incomplete_details") or {}
            reason = str(details.get("reason") or "")
            self.stop_reason = {"max_output_tokens": "max_tokens", "content_filter": "refusal"}.get(
                reason, reason or "max_tokens"
            )


# -- the provider ---------------------------------------------------------------------------


class OpenAIProvider(OwnsClient):
    """A ``Provider`` backed by an OpenAI-compatible API (streaming).

    ``client`` defaults to ``openai.AsyncOpenAI(max_retries=0)``, which reads
    ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL`` from the environment (``base_url=``
    overrides the latter; ``api_key=`` the former). A client you pass in is used with
    ``max_retries=0`` as well. ``name`` is what the log records as the provider that
    answered or failed (give two providers in one ``FallbackProvider`` distinct
    names). ``request_options`` (``max_completion_tokens``, ``temperature``,
    ``parallel_tool_calls``, ``reasoning_effort``, a compatible server's own fields
    ...) are sent with every request: as arguments of the SDK's ``create`` where it
    has them, as extra body fields otherwise. ``stream_usage=False`` leaves out
    ``stream_options`` for a Chat Completions server that does not accept it (usage
    is then not reported).
    """

    client: openai.AsyncOpenAI

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api: Api = "chat",
        client: openai.AsyncOpenAI | None = None,
        api_key: str | None = None,
        name: str = "openai",
        stream_usage: bool = True,
        **request_options: Any,
    ) -> None:
        if api not in _RESERVED:
            raise ValueError(f"api must be 'chat' or 'responses', not {api!r}")
        if not model:
            raise ValueError("OpenAIProvider needs model= (the model name the server serves)")
        reserved = sorted(_RESERVED[api] & request_options.keys())
        if reserved:
            raise TypeError(
                f"OpenAIProvider sets {', '.join(reserved)} itself; pass model= as an argument"
            )
        self.model = model
        self.api: Api = api
        self.name = name
        self.stream_usage = stream_usage
        self._owns_client = client is None
        if client is None:
            try:
                client = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0)
            except openai.OpenAIError as exc:
                raise MissingCredentials(
                    "the OpenAI provider needs an API key: set OPENAI_API_KEY (a compatible "
                    "server that checks none still needs one: any placeholder will do) "
                    f"[{exc}]"
                ) from None
        else:
            changes: dict[str, Any] = {}
            if client.max_retries != 0:
                # Retries inside the SDK would be invisible to the log: no RetryPending,
                # no durable back-off, no usage of the failed attempts.
                changes["max_retries"] = 0
            if base_url is not None:
                changes["base_url"] = base_url
            if changes:
                client = client.with_options(**changes)
        self.client = client
        create = client.chat.completions.create if api == "chat" else client.responses.create
        self.request_options = split_options(create, request_options)

    def __repr__(self) -> str:
        return (
            f"OpenAIProvider(model={self.model!r}, api={self.api!r}, "
            f"base_url={str(self.client.base_url)!r}, name={self.name!r})"
        )

    def params(self, request: ModelRequest) -> dict[str, Any]:
        """The SDK ``create`` arguments for ``request`` (without ``stream``)."""
        params: dict[str, Any] = {"model": self.model}
        if self.api == "chat":
            params["messages"] = chat_messages(request.system, request.messages)
            if request.tools:
                params["tools"] = [
                    {
                        "type": "function",
                        "function": {
                            "name": t.name,
                            "description": t.description,
                            "parameters": t.input_schema,
                            "strict": strict_compatible(t.input_schema),
                        },
                    }
                    for t in request.tools
                ]
            if self.stream_usage:
                params["stream_options"] = {"include_usage": True}
        else:
            params["input"] = responses_input(request.messages)
            if request.system:
                params["instructions"] = request.system
            if request.tools:
                params["tools"] = [
                    {
                        "type": "function",
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema,
                        "strict": strict_compatible(t.input_schema),
                    }
                    for t in request.tools
                ]
        params.update(self.request_options)
        return params

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        """One streamed model call. Raises ``ProviderError`` (see ``classify_error``)."""
        params = self.params(request)
        chat = self.api == "chat"
        builder = _ChatBuilder(emit, self.name) if chat else _ResponsesBuilder(emit, self.name)
        try:
            stream: Any
            if chat:
                stream = await self.client.chat.completions.create(**params, stream=True)
            else:
                stream = await self.client.responses.create(**params, stream=True)
            await read_sse(stream, builder.on_event)
            return builder.reply("data: [DONE]" if chat else "response.completed")
        except Exception as exc:
            failure = classify_error(exc, builder.usage)
            failure.model = failure.model or self.model  # its usage is priced at this model
            raise failure from exc


def provider_from_env(model: str | None, *, api: Api = "chat") -> OpenAIProvider:
    """An ``OpenAIProvider`` configured from the environment, or a clear error.

    Needs ``OPENAI_API_KEY`` and a model name; ``OPENAI_BASE_URL`` points it at an
    OpenAI-compatible server (vLLM, Ollama, LiteLLM, OpenRouter ...).
    """
    if not os.environ.get("OPENAI_API_KEY"):
        raise MissingCredentials(
            "the OpenAI provider needs an API key: set OPENAI_API_KEY (and OPENAI_BASE_URL "
            "for an OpenAI-compatible server; one that checks no key still needs a "
            "placeholder), or use --provider scripted:FILE to run without a model API"
        )
    if not model:
        raise ValueError(
            "the OpenAI provider needs a model name: pass --model (e.g. gpt-4.1, or the "
            "name your compatible server serves)"
        )
    return OpenAIProvider(model=model, api=api)
