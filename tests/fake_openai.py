"""A fake OpenAI API: Chat Completions and Responses, a real HTTP server on 127.0.0.1.

It exists so that the OpenAI provider is tested through the real ``openai`` SDK,
its real HTTP stack and real sockets; only the far end of the wire is fake. It
serves ``POST /v1/chat/completions`` and ``POST /v1/responses`` as Server-Sent-Event
streams, from a background thread (``tests/support/fake_vendor.py``), so it works
the same from trio tests, plain tests, and for a child process handed its URL
(``url`` is the SDK's ``base_url``, ending in ``/v1``).

A test scripts the answers in order (``server.script(...)``); each is rendered in
the wire format of the API the request used:

* ``Reply`` — ``Text`` and ``ToolCall`` blocks, an optional ``refusal``, a finish
  reason (by default ``tool_calls`` when there are calls, else ``stop``) and
  usage. Chat Completions streams ``chat.completion.chunk`` objects (a role chunk,
  content pieces, one chunk opening each tool call with its id and name and then
  its argument pieces, a finish chunk, a usage chunk when ``stream_options`` asks
  for it) and ``data: [DONE]``; ``interleave=True`` alternates the argument pieces
  of parallel calls, as some servers do. The Responses API streams
  ``response.created`` ... ``response.completed`` (or ``response.incomplete`` with
  ``incomplete=`` a reason). ``event_delay`` slows the stream down; ``cut_after=n``
  drops the connection after n events (``cut_mode`` as in fake_vendor);
  ``error_after=n`` sends an error after n events (``error_as="response.failed"``:
  as a failed response, Responses API only).
* ``HttpError`` — a status with an OpenAI-shaped error body and headers (429 with
  ``retry-after``, 429 ``insufficient_quota``, 500, 400, ...).
* ``Disconnect`` — close the connection without a response.

Every request body is kept (``server.requests``). Like the real API, the server
refuses (400, without using up a scripted answer) a conversation whose tool calls
and tool results do not pair up: a ``tool`` message that answers no call of the
assistant message before it, or an assistant's call left without its result (and
the Responses API's equivalents), so a test of a carried-over conversation fails
if the history arrives incomplete.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import zip_longest
from typing import Any, Literal

import attrs
from attrs import field, frozen

from tests.support.fake_vendor import Disconnect, FakeVendor, Received, Wire, sse
from tests.support.vendor_schemas import schema_problem

__all__ = [
    "Disconnect",
    "FakeOpenAI",
    "FakeUsage",
    "HttpError",
    "Received",
    "Reply",
    "Text",
    "ToolCall",
]

CREATED = 1_700_000_000


@frozen
class Text:
    text: str


@frozen
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] = field(factory=dict)
    raw: str | None = None  # stream these characters as the arguments instead

    @property
    def json(self) -> str:
        return self.raw if self.raw is not None else json.dumps(self.arguments)


Block = Text | ToolCall


@frozen(kw_only=True)
class FakeUsage:
    prompt_tokens: int = 10  # cached ones included, as the API counts them
    completion_tokens: int = 5
    cached_tokens: int = 0

    def chat(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        }

    def responses(self) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@frozen(kw_only=True)
class Reply:
    """A successful answer."""

    content: Sequence[Block] = ()
    refusal: str | None = None
    finish_reason: str | None = None  # Chat Completions; default by content
    incomplete: str | None = None  # Responses: end with response.incomplete for this reason
    usage: FakeUsage = field(factory=FakeUsage)
    chunk: int = 8  # characters per content / arguments piece
    interleave: bool = False  # alternate the argument pieces of parallel calls (chat)
    delay: float = 0.0  # seconds before the response headers
    event_delay: float = 0.0  # seconds between events
    cut_after: int | None = None  # drop the connection after this many events
    cut_mode: Literal["abort", "eof"] = "abort"
    error_after: int | None = None  # send an error after this many events
    error_code: str | None = "server_error"
    error_type: str = "server_error"
    error_message: str = "The server had an error while processing your request."
    error_as: Literal["error", "response.failed"] = "error"

    @property
    def calls(self) -> list[ToolCall]:
        return [b for b in self.content if isinstance(b, ToolCall)]

    @property
    def final_finish_reason(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.calls else "stop"


@frozen(kw_only=True)
class HttpError:
    """An error response, shaped like the API's: ``{"error": {message, type, param, code}}``."""

    status: int
    type: str = "server_error"
    code: str | None = None
    message: str = "The server had an error while processing your request."
    headers: dict[str, str] = field(factory=dict)
    delay: float = 0.0


Action = Reply | HttpError | Disconnect

_NO_SCRIPT = HttpError(
    status=400,
    type="invalid_request_error",
    message="fake_openai: no scripted response left for this request",
)

_ROUTES = ("/v1/chat/completions", "/v1/responses")


class FakeOpenAI(FakeVendor[Action]):
    """The server. Use as a context manager; ``url`` is the SDK's ``base_url``."""

    thread_name = "fake-openai"
    # Report a reply's prompt tokens as the request's size (a quarter of its JSON's
    # characters) instead of the scripted count: long sessions fill a window.
    measure_input = False

    @property
    def url(self) -> str:
        return self.root + "/v1"

    def no_script(self) -> Action:
        return _NO_SCRIPT

    def refuse(self, received: Received) -> Action | None:
        path = received.path.split("?")[0]
        if path == "/v1/chat/completions":
            problem = chat_problem(received.body)
        elif path == "/v1/responses":
            problem = responses_problem(received.body)
        else:
            return HttpError(status=404, type="invalid_request_error", message=f"no route {path}")
        if problem is None and not received.body.get("stream"):
            problem = "fake_openai serves streamed requests only"
        if problem is None:
            return None
        return HttpError(status=400, type="invalid_request_error", message=problem)

    def respond(self, wire: Wire, received: Received, action: Action, n: int) -> None:
        request_id = f"req_fake_{n:04d}"
        if isinstance(action, HttpError):
            body = {
                "error": {
                    "message": action.message,
                    "type": action.type,
                    "param": None,
                    "code": action.code,
                }
            }
            wire.json(action.status, body, {"x-request-id": request_id, **action.headers})
            return
        assert isinstance(action, Reply)
        if self.measure_input:
            size = len(json.dumps(received.body)) // 4
            action = attrs.evolve(action, usage=attrs.evolve(action.usage, prompt_tokens=size))
        model = str(received.body.get("model", "gpt-fake"))
        if received.path.startswith("/v1/chat/completions"):
            options = received.body.get("stream_options") or {}
            frames = chat_frames(action, n, model, usage=bool(options.get("include_usage")))
        else:
            frames = responses_frames(action, n, model)
        wire.stream(
            frames,
            {"x-request-id": request_id},
            action,
        )


# -- what the real API refuses -----------------------------------------------------------


def chat_problem(body: dict[str, Any]) -> str | None:
    """The 400 message the API answers a Chat Completions body with, if it refuses it."""
    for t in body.get("tools") or []:
        function = t.get("function") or {}
        problem = schema_problem(
            function.get("name"), function.get("parameters"), strict=bool(function.get("strict"))
        )
        if problem is not None:
            return problem
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    if body.get("stream_options") is not None and not body.get("stream"):
        return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    awaiting: list[str] = []  # calls of the last assistant message still without a result
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in awaiting:
                return (
                    f"Invalid parameter: messages.[{i}]: messages with role 'tool' must be a "
                    "response to a preceeding message with 'tool_calls'."
                )
            awaiting.remove(call_id)
            continue
        if awaiting:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(awaiting)}"
            )
        if role == "assistant":
            awaiting = [c["id"] for c in message.get("tool_calls") or []]
    if awaiting:
        return f"tool_call_ids without response messages: {', '.join(awaiting)}"
    return None


def responses_problem(body: dict[str, Any]) -> str | None:
    """The 400 message the API answers a Responses body with, if it refuses it."""
    for t in body.get("tools") or []:
        problem = schema_problem(t.get("name"), t.get("parameters"), strict=bool(t.get("strict")))
        if problem is not None:
            return problem
    items = body.get("input")
    if not isinstance(items, list) or not items:
        return "'input' must be a non-empty array"
    calls: set[str] = set()
    answered: set[str] = set()
    for item in items:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "function_call":
            calls.add(str(item.get("call_id")))
        elif kind == "function_call_output":
            call_id = str(item.get("call_id"))
            if call_id not in calls:
                return f"No tool call found for function call output with call_id {call_id}."
            answered.add(call_id)
    missing = sorted(calls - answered)
    if missing:
        return f"No tool output found for function call {missing[0]}."
    return None


# -- Chat Completions --------------------------------------------------------------------


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def chat_frames(reply: Reply, n: int, model: str, *, usage: bool) -> list[bytes]:
    """The SSE frames of a streamed Chat Completions ``reply``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": f"chatcmpl-fake-{n:04d}",
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage:
            data["usage"] = None
        return data

    chunks = [chunk({"role": "assistant", "content": "", "refusal": None})]
    for block in reply.content:
        if isinstance(block, Text):
            chunks += [chunk({"content": p}) for p in _pieces(block.text, reply.chunk)]
    if reply.refusal is not None:
        chunks += [chunk({"refusal": p}) for p in _pieces(reply.refusal, reply.chunk)]
    argument_runs: list[list[dict[str, Any]]] = []
    for index, call in enumerate(reply.calls):
        opening = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [opening]}))
        run = [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in _pieces(call.json, reply.chunk)
        ]
        if reply.interleave:
            argument_runs.append(run)
        else:
            chunks += run
    for group in zip_longest(*argument_runs):
        chunks += [c for c in group if c is not None]
    chunks.append(chunk({}, reply.final_finish_reason))
    if usage:
        last = chunk({})
        last["choices"] = []
        last["usage"] = reply.usage.chat()
        chunks.append(last)
    frames = [sse(c) for c in chunks] + [sse("[DONE]")]
    if reply.error_after is not None:
        error = {
            "error": {
                "message": reply.error_message,
                "type": reply.error_type,
                "param": None,
                "code": reply.error_code,
            }
        }
        frames = [*frames[: reply.error_after], sse(error)]
    return frames


# -- Responses ---------------------------------------------------------------------------


def _message_item(index: int, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if text else []
    return {
        "id": f"msg_fake_{index}",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _call_item(index: int, call: ToolCall, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": f"fc_fake_{index}",
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
    }


def responses_frames(reply: Reply, n: int, model: str) -> list[bytes]:
    """The SSE frames of a streamed Responses API ``reply``."""
    response: dict[str, Any] = {
        "id": f"resp_fake_{n:04d}",
        "object": "response",
        "created_at": CREATED,
        "status": "in_progress",
        "model": model,
        "output": [],
        "usage": None,
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": dict(response)},
        {"type": "response.in_progress", "response": dict(response)},
    ]
    output: list[dict[str, Any]] = []
    for index, block in enumerate(reply.content):
        if isinstance(block, Text):
            item_id = f"msg_fake_{index}"
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": _message_item(index, "", "in_progress"),
                }
            )
            events += [
                {"type": "response.output_text.delta", **where, "delta": p}
                for p in _pieces(block.text, reply.chunk)
            ]
            events.append({"type": "response.output_text.done", **where, "text": block.text})
            done = _message_item(index, block.text, "completed")
        else:
            where = {"item_id": f"fc_fake_{index}", "output_index": index}
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": _call_item(index, block, "", "in_progress"),
                }
            )
            events += [
                {"type": "response.function_call_arguments.delta", **where, "delta": p}
                for p in _pieces(block.json, reply.chunk)
            ]
            events.append(
                {"type": "response.function_call_arguments.done", **where, "arguments": block.json}
            )
            done = _call_item(index, block, block.json, "completed")
        events.append({"type": "response.output_item.done", "output_index": index, "item": done})
        output.append(done)
    if reply.refusal is not None:
        index = len(output)
        where = {"item_id": f"msg_fake_{index}", "output_index": index, "content_index": 0}
        item = _message_item(index, "", "in_progress")
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        events += [
            {"type": "response.refusal.delta", **where, "delta": p}
            for p in _pieces(reply.refusal, reply.chunk)
        ]
        events.append({"type": "response.refusal.done", **where, "refusal": reply.refusal})
        done = item | {"status": "completed"}
        done["content"] = [{"type": "refusal", "refusal": reply.refusal}]
        events.append({"type": "response.output_item.done", "output_index": index, "item": done})
        output.append(done)
    final = {**response, "output": output, "usage": reply.usage.responses()}
    if reply.incomplete is not None:
        final |= {"status": "incomplete", "incomplete_details": {"reason": reply.incomplete}}
        events.append({"type": "response.incomplete", "response": final})
    else:
        events.append({"type": "response.completed", "response": final | {"status": "completed"}})
    if reply.error_after is not None:
        events = events[: reply.error_after]
        error = {"code": reply.error_code, "message": reply.error_message}
        if reply.error_as == "response.failed":
            failed = {**response, "status": "failed", "error": error}
            events.append({"type": "response.failed", "response": failed})
        else:
            events.append({"type": "error", **error, "param": None})
    return [sse({**e, "sequence_number": i}, e["type"]) for i, e in enumerate(events)]
