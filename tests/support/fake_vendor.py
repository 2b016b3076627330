"""The machinery of a fake model API: a real HTTP server on 127.0.0.1, scripted per test.

``tests/fake_anthropic.py`` and ``tests/fake_openai.py`` speak their vendor's wire
format on top of it. What they share lives here: a threaded HTTP/1.1 server (so it
works the same from trio tests, plain tests, and for a child process handed its
URL), a queue of scripted answers, a record of every request, and a ``Wire`` that
writes one response — JSON, an error, a dropped connection, or a Server-Sent-Events
stream that may be slowed down, cut midway (``"abort"``: in the middle of a chunk,
which the client sees as a protocol error; ``"eof"``: a body without framing that
just ends) or end in an error event.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Literal, Protocol, Self, TypeVar

from attrs import define, frozen

__all__ = ["Disconnect", "FakeVendor", "Received", "StreamLog", "Wire"]

A = TypeVar("A")


@frozen(kw_only=True)
class Disconnect:
    """Close the connection without sending any response."""


@frozen
class Received:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float  # wall-clock time.time() when the request arrived


class Pacing(Protocol):
    """How a scripted reply streams (both fakes' ``Reply`` has these fields)."""

    @property
    def cut_after(self) -> int | None: ...
    @property
    def cut_mode(self) -> Literal["abort", "eof"]: ...
    @property
    def event_delay(self) -> float: ...


@define
class StreamLog:
    """What the server did with one streamed response (for tests of cancellation)."""

    total: int  # frames the response has
    sent: int = 0  # frames written before the stream ended
    aborted: bool = False  # the client went away before the stream ended


class Wire:
    """Writes the response to one request."""

    def __init__(
        self,
        handler: BaseHTTPRequestHandler,
        on_stream: Callable[[StreamLog], None] = lambda log: None,
    ) -> None:
        self._handler = handler
        self._on_stream = on_stream

    def disconnect(self) -> None:
        self._handler.close_connection = True
        with contextlib.suppress(OSError):
            self._handler.connection.shutdown(socket.SHUT_RDWR)

    def json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
        data = json.dumps(payload).encode()
        h = self._handler
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)

    def stream(self, frames: Sequence[bytes], headers: dict[str, str], pace: Pacing) -> None:
        """Send ``frames`` (whole SSE events) as a streamed body, paced by a scripted
        reply: ``event_delay`` between frames, ``cut_after=n`` drops the connection
        after n of them (``cut_mode``)."""
        cut_after, cut_mode, event_delay = pace.cut_after, pace.cut_mode, pace.event_delay
        log = StreamLog(len(frames))
        self._on_stream(log)
        h = self._handler
        chunked = not (cut_after is not None and cut_mode == "eof")
        h.send_response(200)
        h.send_header("content-type", "text/event-stream; charset=utf-8")
        h.send_header("cache-control", "no-cache")
        for name, value in headers.items():
            h.send_header(name, value)
        if chunked:
            h.send_header("transfer-encoding", "chunked")
        else:
            h.send_header("connection", "close")  # the body ends when the socket does
        h.end_headers()

        def write(data: bytes) -> None:
            if chunked:
                data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
            h.wfile.write(data)
            h.wfile.flush()

        try:
            for i, frame in enumerate(frames):
                if cut_after is not None and i >= cut_after:
                    self._cut(chunked)
                    return
                if event_delay and i:
                    time.sleep(event_delay)
                write(frame)
                log.sent = i + 1
            if chunked:
                h.wfile.write(b"0\r\n\r\n")
                h.wfile.flush()
        except OSError:
            log.aborted = True
            h.close_connection = True  # the client went away (cancelled): fine

    def _cut(self, chunked: bool) -> None:
        """Drop the connection in the middle of the response body."""
        if chunked:  # announce a chunk and never finish it
            self._handler.wfile.write(b'400\r\ndata: {"ty')
            self._handler.wfile.flush()
        self.disconnect()


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One Server-Sent Event frame."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


class FakeVendor(Generic[A]):
    """The server. Use as a context manager. A subclass answers through ``respond``."""

    thread_name = "fake-vendor"

    def __init__(self, *, default: A | None = None) -> None:
        self._lock = threading.Lock()
        self._script: deque[A] = deque()
        self._requests: list[Received] = []
        self._default = default
        self._ids = 0
        self._open: set[socket.socket] = set()
        self._streams: list[StreamLog] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- what a vendor provides --------------------------------------------------------

    def no_script(self) -> A:
        """The answer when the script is used up and there is no default."""
        raise NotImplementedError

    def refuse(self, received: Received) -> A | None:
        """An answer that takes precedence over the script (a request the API refuses)."""
        return None

    def taken(self, action: A) -> None:
        """``action`` was chosen for a request (called under the lock)."""

    def respond(self, wire: Wire, received: Received, action: A, n: int) -> None:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FakeVendor[A]:
        fake = self
        respond: Callable[[BaseHTTPRequestHandler], None] = self._handle

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive and chunked bodies, like the real APIs
            # Each frame of a stream goes out when written, as a vendor's servers send
            # them: with Nagle's algorithm a frame written shortly after the last one
            # waited for the client's delayed ACK (up to 40 ms on Linux), which the
            # first-token benchmark read as the runtime's latency.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                respond(self)

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
            name=self.thread_name,
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

    @property
    def root(self) -> str:
        assert self._server is not None, "the server is not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- scripting --------------------------------------------------------------------

    def script(self, *actions: A) -> None:
        """Append answers; each request takes the next one."""
        with self._lock:
            self._script.extend(actions)

    def set_default(self, action: A | None) -> None:
        """The answer once the script is used up (``None``: an error saying so)."""
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
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._requests)

    def _next(self, received: Received) -> tuple[A, int]:
        with self._lock:
            self._requests.append(received)
            self._ids += 1
            refusal = self.refuse(received)
            if refusal is not None:  # refused before any answer is chosen, as upstream
                return refusal, self._ids
            if self._script:
                action = self._script.popleft()
            elif self._default is not None:
                action = self._default
            else:
                action = self.no_script()
            self.taken(action)
            return action, self._ids

    @property
    def streams(self) -> list[StreamLog]:
        """Every streamed response so far, in the order they started."""
        with self._lock:
            return list(self._streams)

    def _stream_started(self, log: StreamLog) -> None:
        with self._lock:
            self._streams.append(log)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsable": raw.decode(errors="replace")}
        received = Received(
            path=handler.path,
            headers={k.lower(): v for k, v in handler.headers.items()},
            body=body,
            at=time.time(),
        )
        action, n = self._next(received)
        wire = Wire(handler, self._stream_started)
        if isinstance(action, Disconnect):
            wire.disconnect()
            return
        delay = getattr(action, "delay", 0.0)
        if delay:
            time.sleep(delay)
        self.respond(wire, received, action, n)
