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
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import attrs
from attrs import field, frozen

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


@frozen(kw_only=True)
class Disconnect:
    """Close the connection without sending any response."""


Action = Reply | HttpError | Disconnect


@attrs.define
class StreamLog:
    """What the server did with one streamed response (for tests of cancellation)."""

    msg_id: str
    total: int  # events the reply has
    sent: int = 0  # events written before the stream ended
    aborted: bool = False  # the client went away before the stream ended


@frozen
class Received:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float  # wall-clock time.time() when the request arrived


_NO_SCRIPT = HttpError(
    status=400,
    type="invalid_request_error",
    message="fake_anthropic: no scripted response left for this request",
)


class FakeAnthropic:
    """The server. Use as a context manager; ``url`` is the SDK's ``base_url``."""

    def __init__(self, *, default: Action | None = None) -> None:
        self._lock = threading.Lock()
        self._script: deque[Action] = deque()
        self._requests: list[Received] = []
        self._default = default
        self._ids = 0
        self._redacted: set[str] = set()  # redacted_thinking data this server has sent
        self._open: set[socket.socket] = set()
        self._streams: list[StreamLog] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> FakeAnthropic:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def process_request(self, request: Any, client_address: Any) -> None:
                with fake._lock:
                    fake._open.add(request)
                super().process_request(request, client_address)

            def shutdown_request(self, request: Any) -> None:
                with fake._lock:
                    fake._open.discard(request)
                super().shutdown_request(request)

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that went away mid-stream is part of the tests

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-anthropic",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:  # unblock handler threads waiting on idle keep-alive sockets
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._server.server_close()
        assert self._thread is not None
        self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "the server is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- scripting --------------------------------------------------------------------

    def script(self, *actions: Action) -> None:
        """Append answers; each request takes the next one."""
        with self._lock:
            self._script.extend(actions)

    def set_default(self, action: Action | None) -> None:
        """The answer once the script is used up (``None``: a 400 saying so)."""
        with self._lock:
            self._default = action

    def clear(self) -> None:
        with self._lock:
            self._script.clear()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    @property
    def streams(self) -> list[StreamLog]:
        """Every streamed response so far, in the order they started."""
        with self._lock:
            return list(self._streams)

    def _stream_started(self, log: StreamLog) -> None:
        with self._lock:
            self._streams.append(log)

    @property
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._requests)

    def _next(self, received: Received) -> tuple[Action, int]:
        with self._lock:
            self._requests.append(received)
            self._ids += 1
            refusal = _refusal(received.body, self._redacted)
            if refusal is not None:  # refused before any answer is chosen, as upstream
                return refusal, self._ids
            action = self._script.popleft() if self._script else (self._default or _NO_SCRIPT)
            if isinstance(action, Reply):
                self._redacted.update(
                    b.data for b in action.content if isinstance(b, RedactedThinking)
                )
            return action, self._ids


# -- what the real API refuses -----------------------------------------------------------


def _bad_request(message: str) -> HttpError:
    return HttpError(status=400, type="invalid_request_error", message=message)


def _refusal(body: dict[str, Any], redacted: set[str]) -> HttpError | None:
    """The 400 the real API answers ``body`` with when reasoning is not handed back intact."""
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


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def error_body(error: HttpError, request_id: str) -> dict[str, Any]:
    inner: dict[str, Any] = {"type": error.type, "message": error.message}
    if error.error_code is not None:
        inner["details"] = {"error_code": error.error_code}
    return {"type": "error", "error": inner, "request_id": request_id}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked bodies, like the real API
    server_fake: FakeAnthropic

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsable": raw.decode(errors="replace")}
        received = Received(
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            at=time.time(),
        )
        action, n = self.server_fake._next(received)
        request_id = f"req_fake_{n:04d}"
        if self.path.split("?")[0] != "/v1/messages":
            action = HttpError(status=404, type="not_found_error", message=f"no route {self.path}")
        if isinstance(action, Disconnect):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action.delay:
            time.sleep(action.delay)
        if isinstance(action, HttpError):
            headers = {"request-id": request_id, **action.headers}
            self._send_json(action.status, error_body(action, request_id), headers)
            return
        model = str(body.get("model", "claude-fake"))
        msg_id = f"msg_fake_{n:04d}"
        if body.get("stream"):
            self._stream(action, msg_id, model, request_id)
        else:
            self._send_json(200, message_json(action, msg_id, model), {"request-id": request_id})

    def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, reply: Reply, msg_id: str, model: str, request_id: str) -> None:
        events = stream_events(reply, msg_id, model)
        log = StreamLog(msg_id, len(events))
        self.server_fake._stream_started(log)
        chunked = not (reply.cut_after is not None and reply.cut_mode == "eof")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("request-id", request_id)
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("connection", "close")  # the body ends when the socket does
        self.end_headers()

        def write(data: bytes) -> None:
            if chunked:
                data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
            self.wfile.write(data)
            self.wfile.flush()

        try:
            for i, (name, data) in enumerate(events):
                if reply.cut_after is not None and i >= reply.cut_after:
                    self._cut(chunked)
                    return
                if reply.error_after is not None and i >= reply.error_after:
                    payload = {
                        "type": "error",
                        "error": {"type": reply.error_type, "message": reply.error_message},
                    }
                    write(_sse("error", payload))
                    break
                if reply.event_delay and i:
                    time.sleep(reply.event_delay)
                write(_sse(name, data))
                log.sent = i + 1
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError:
            log.aborted = True
            self.close_connection = True  # the client went away (cancelled): fine

    def _cut(self, chunked: bool) -> None:
        """Drop the connection in the middle of the response body."""
        if chunked:  # announce a chunk and never finish it
            self.wfile.write(b'400\r\nevent: content_block_delta\ndata: {"ty')
            self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


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
