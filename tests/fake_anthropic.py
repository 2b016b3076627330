"""A fake Anthropic Messages API: a real HTTP server on 127.0.0.1, scripted per test.

It exists so that the Anthropic provider is tested through the real ``anthropic``
SDK, its real HTTP stack and real sockets; only the far end of the wire is fake.
It serves ``POST /v1/messages`` both as a Server-Sent-Events stream (``"stream":
true``) and as one JSON message, in a background thread, so it works the same
from trio tests, from plain synchronous tests, and for a child process that is
handed its URL.

A test scripts the answers in order (``server.script(...)``):

* ``Reply`` — content blocks (``Text``, ``ToolUse``, ``Thinking``,
  ``RedactedThinking``), a stop reason and usage. A thinking block streams as the
  API streams it: ``content_block_start`` with empty ``thinking`` and
  ``signature``, ``thinking_delta`` pieces, one ``signature_delta``,
  ``content_block_stop``; a redacted one arrives whole in ``content_block_start``.
  ``event_delay`` slows the stream down, ``cut_after=n`` closes the socket after n
  events (``cut_mode="abort"``: in the middle of the chunked body, which the client
  sees as a protocol error; ``"eof"``: a body without framing that just ends),
  ``error_after=n`` sends an SSE ``error`` event after n events.
* ``HttpError`` — a status with an Anthropic-shaped error body and headers (429
  with ``retry-after``, 529, 500, 400, ...).
* ``Disconnect`` — close the connection without a response.

``Reply.delay`` / ``HttpError.delay`` hold the response back (client timeouts).

Every request body the server received is kept (``server.requests``), so tests
can assert what the SDK actually sent: system blocks, tool results, ``is_error``,
``cache_control``.

Like the real API, the server refuses (400 ``invalid_request_error``, without using
up a scripted answer) a request that hands back reasoning it did not issue — a
thinking block whose signature does not match its text, redacted data it never
sent — and, when the request has ``thinking`` enabled, one whose last assistant
message makes tool calls without starting with its thinking block.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import attrs
from attrs import field, frozen

from tests.support.fake_vendor import Disconnect, FakeVendor, Received, Wire, sse
from tests.support.vendor_schemas import schema_problem

__all__ = [
    "Disconnect",
    "FakeAnthropic",
    "FakeUsage",
    "HttpError",
    "Received",
    "RedactedThinking",
    "Reply",
    "Text",
    "Thinking",
    "ToolUse",
]


@frozen
class Text:
    text: str


@frozen
class ToolUse:
    id: str
    name: str
    input: dict[str, Any] = field(factory=dict)
    raw_json: str | None = None  # stream this text as the input instead (e.g. truncated JSON)


def sign(thinking: str) -> str:
    """The fake's signature of a thinking text (the real one is opaque too)."""
    digest = hashlib.sha256(b"fake-anthropic:" + thinking.encode()).digest()
    return "EqQB" + base64.b64encode(digest).decode()


@frozen
class Thinking:
    thinking: str

    @property
    def signature(self) -> str:
        return sign(self.thinking)


@frozen
class RedactedThinking:
    data: str  # the opaque, encrypted reasoning


Block = Text | ToolUse | Thinking | RedactedThinking


@frozen(kw_only=True)
class FakeUsage:
    input_tokens: int = 10
    output_tokens: int = 5
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def as_json(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
        }


@frozen(kw_only=True)
class Reply:
    """A successful answer. ``stop_reason`` defaults to tool_use/end_turn by content."""

    content: Sequence[Block] = ()
    stop_reason: str | None = None
    usage: FakeUsage = field(factory=FakeUsage)
    chunk: int = 8  # characters per text_delta / input_json_delta / thinking_delta
    delay: float = 0.0  # seconds before the response headers
    event_delay: float = 0.0  # seconds between SSE events
    ping: bool = True  # a ping event after message_start, as the real API sends
    cut_after: int | None = None  # close the connection after this many events
    cut_mode: Literal["abort", "eof"] = "abort"
    error_after: int | None = None  # send an SSE error event after this many events
    error_type: str = "overloaded_error"
    error_message: str = "Overloaded"

    @property
    def final_stop_reason(self) -> str:
        if self.stop_reason is not None:
            return self.stop_reason
        return "tool_use" if any(isinstance(b, ToolUse) for b in self.content) else "end_turn"


@frozen(kw_only=True)
class HttpError:
    """An error response, shaped like the API's: ``{"type": "error", "error": {...}}``."""

    status: int
    type: str = "api_error"
    message: str = "Internal server error"
    headers: dict[str, str] = field(factory=dict)
    error_code: str | None = None  # error.details.error_code, e.g. a spend limit
    delay: float = 0.0  # seconds before the response


Action = Reply | HttpError | Disconnect


_NO_SCRIPT = HttpError(
    status=400,
    type="invalid_request_error",
    message="fake_anthropic: no scripted response left for this request",
)


class FakeAnthropic(FakeVendor[Action]):
    """The server. Use as a context manager; ``url`` is the SDK's ``base_url``."""

    thread_name = "fake-anthropic"

    def __init__(self, *, default: Action | None = None) -> None:
        super().__init__(default=default)
        self._redacted: set[str] = set()  # redacted_thinking data this server has sent
        # Report a reply's input tokens as the request's size (a quarter of its JSON's
        # characters) instead of the scripted count: long sessions fill a window.
        self.measure_input = False

    @property
    def url(self) -> str:
        return self.root

    def no_script(self) -> Action:
        return _NO_SCRIPT

    def refuse(self, received: Received) -> Action | None:
        return _refusal(received.body, self._redacted)

    def taken(self, action: Action) -> None:
        if isinstance(action, Reply):
            self._redacted.update(b.data for b in action.content if isinstance(b, RedactedThinking))

    def respond(self, wire: Wire, received: Received, action: Action, n: int) -> None:
        request_id = f"req_fake_{n:04d}"
        if received.path.split("?")[0] != "/v1/messages":
            action = HttpError(
                status=404, type="not_found_error", message=f"no route {received.path}"
            )
        if isinstance(action, HttpError):
            headers = {"request-id": request_id, **action.headers}
            wire.json(action.status, error_body(action, request_id), headers)
            return
        assert isinstance(action, Reply)
        if self.measure_input:
            size = len(json.dumps(received.body)) // 4
            action = attrs.evolve(action, usage=attrs.evolve(action.usage, input_tokens=size))
        model = str(received.body.get("model", "claude-fake"))
        msg_id = f"msg_fake_{n:04d}"
        if not received.body.get("stream"):
            wire.json(200, message_json(action, msg_id, model), {"request-id": request_id})
            return
        frames = [sse(data, name) for name, data in stream_events(action, msg_id, model)]
        if action.error_after is not None:
            error = {
                "type": "error",
                "error": {"type": action.error_type, "message": action.error_message},
            }
            frames = [*frames[: action.error_after], sse(error, "error")]
        wire.stream(
            frames,
            {"request-id": request_id},
            action,
        )


# -- what the real API refuses -----------------------------------------------------------


def _bad_request(message: str) -> HttpError:
    return HttpError(status=400, type="invalid_request_error", message=message)


def _refusal(body: dict[str, Any], redacted: set[str]) -> HttpError | None:
    """The 400 the real API answers ``body`` with: a tool it cannot take, or reasoning
    not handed back intact."""
    for t in body.get("tools") or []:
        problem = schema_problem(t.get("name"), t.get("input_schema"))
        if problem is not None:
            return _bad_request(f"tools: {problem}")
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    last_assistant: int | None = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            continue
        if message.get("role") == "assistant":
            last_assistant = i
        for j, block in enumerate(message["content"]):
            kind = block.get("type") if isinstance(block, dict) else None
            where = f"messages.{i}.content.{j}"
            if kind == "thinking" and block.get("signature") != sign(str(block.get("thinking"))):
                return _bad_request(f"{where}: Invalid `signature` in `thinking` block")
            if kind == "redacted_thinking" and block.get("data") not in redacted:
                return _bad_request(f"{where}: Invalid `data` in `redacted_thinking` block")
    thinking = body.get("thinking")
    enabled = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    if not enabled or last_assistant is None:
        return None
    content = messages[last_assistant]["content"]
    kinds = [b.get("type") for b in content if isinstance(b, dict)]
    if "tool_use" in kinds and kinds[0] not in ("thinking", "redacted_thinking"):
        # The real API's wording (its spelling too).
        return _bad_request(
            f"messages.{last_assistant}.content.0.type: Expected `thinking` or "
            f"`redacted_thinking`, but found `{kinds[0]}`. When `thinking` is enabled, a "
            "final `assistant` message must start with a thinking block (preceeding the "
            "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
            "thinking blocks from previous turns. To avoid this requirement, disable "
            "`thinking`. Please consult our documentation at "
            "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        )
    return None


# -- the wire format ---------------------------------------------------------------------


def message_json(reply: Reply, msg_id: str, model: str) -> dict[str, Any]:
    """The non-streaming ``Message`` object for ``reply``."""
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_block_json(b) for b in reply.content],
        "stop_reason": reply.final_stop_reason,
        "stop_sequence": None,
        "usage": reply.usage.as_json(),
    }


def _block_json(block: Block) -> dict[str, Any]:
    if isinstance(block, Text):
        return {"type": "text", "text": block.text}
    if isinstance(block, Thinking):
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    if isinstance(block, RedactedThinking):
        return {"type": "redacted_thinking", "data": block.data}
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def stream_events(reply: Reply, msg_id: str, model: str) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events (name, data) of a streamed ``reply``, as the Messages API sends them."""
    usage = reply.usage
    start_usage = usage.as_json() | {"output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        )
    ]
    if reply.ping:
        events.append(("ping", {"type": "ping"}))
    for index, block in enumerate(reply.content):
        deltas: list[dict[str, Any]]
        if isinstance(block, Text):
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block.text, reply.chunk)]
        elif isinstance(block, Thinking):
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": p}
                for p in _pieces(block.thinking, reply.chunk)
            ]
            deltas.append({"type": "signature_delta", "signature": block.signature})
        elif isinstance(block, RedactedThinking):
            start = {"type": "redacted_thinking", "data": block.data}
            deltas = []
        else:
            start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            raw = block.raw_json if block.raw_json is not None else json.dumps(block.input)
            deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                {"type": "input_json_delta", "partial_json": p} for p in _pieces(raw, reply.chunk)
            ]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.final_stop_reason, "stop_sequence": None},
                "usage": usage.as_json(),  # cumulative, as the API reports it
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def error_body(error: HttpError, request_id: str) -> dict[str, Any]:
    inner: dict[str, Any] = {"type": error.type, "message": error.message}
    if error.error_code is not None:
        inner["details"] = {"error_code": error.error_code}
    return {"type": "error", "error": inner, "request_id": request_id}


@contextlib.contextmanager
def running(*actions: Action) -> Iterator[FakeAnthropic]:
    """A started server with ``actions`` scripted; stopped on exit."""
    with FakeAnthropic() as server:
        server.script(*actions)
        yield server


def sent_messages(body: dict[str, Any], *, keep_cache: bool = False) -> list[dict[str, Any]]:
    """The messages of a request body; by default without cache_control markers, so tests
    about the conversation need not repeat where the provider placed its breakpoints."""
    messages: list[dict[str, Any]] = body["messages"]
    if keep_cache:
        return messages
    return [
        {
            **m,
            "content": [
                {k: v for k, v in block.items() if k != "cache_control"} for block in m["content"]
            ],
        }
        for m in messages
    ]
