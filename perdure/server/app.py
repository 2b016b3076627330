"""The HTTP API over one ``Runtime``: Starlette routes, bearer auth, Server-Sent Events.

Every command is answered only after its record is durable, and carries a
``request_id``: the same id with the same body gets the same answer (also after a
restart of the daemon, the dedup lives in the log); the same id with another body
is a 409. Errors are ``{"error": {"code", "message"[, "field"]}}``:

=====  =====================================================================
400    malformed JSON, a missing or invalid field (``field`` names it)
401    no or wrong token
404    unknown session, tool call or route
409    ``conflict`` (request id reused with another body) or ``invalid_state``
413    body larger than ``max_body`` (1 MiB)
423    the session is parked (its actor kept crashing; see ``GET`` the session)
500    a damaged record (``corrupt_record``, naming its seq) or a bug
503    the log cannot be written (disk full, ownership lost); ``/healthz`` while stopping
=====  =====================================================================

Auth: ``Authorization: Bearer <token>`` everywhere but ``/healthz``. A browser
cannot set that header on a page load or an ``EventSource``, so ``GET /?token=``
trades the token for an HttpOnly, SameSite=Strict cookie (an HMAC of the token, so
the cookie is not the token), accepted on every route; ``?token=`` is also accepted
on the events route for clients without cookies.

The event stream (``GET /v1/sessions/{id}/events``) sends each committed record
as ``id: seq`` / ``event: RecordType`` / ``data: {...}``, ephemeral events (text
deltas, progress) without an ``id``, restart markers (``LogOpened``) in sequence
order, and a comment every ``heartbeat`` seconds. ``Last-Event-ID`` (or
``?after=N``) replays from the log and continues live with no gap and no
duplicate. A client too slow to keep up is dropped by the runtime's bus (the
runtime never waits for it): its response ends and it reconnects from its last id.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from importlib import resources
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import parse_qs

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from perdure import __version__
from perdure._runtime import Runtime
from perdure.errors import Refused, SessionRestarting
from perdure.inspect import summarize
from perdure.observability.hooks import check_traceparent
from perdure.providers.base import Message as ModelMessage
from perdure.providers.base import (
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.storage import LogError, check_session_id
from perdure.storage.bus import Event, EventStreamLagged
from perdure.storage.codec import CorruptRecord, converter
from perdure.storage.records import Record, ResolutionAction

if TYPE_CHECKING:
    from perdure.observability.metrics import RuntimeMetrics

MAX_BODY: Final = 1 << 20
DRAIN_FACTOR: Final = 16
MAX_REQUEST_ID: Final = 200
COOKIE: Final = "perdure_session"
_STATIC: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_REFUSED_STATUS: Final = {
    "not_found": 404,
    "conflict": 409,
    "invalid_state": 409,
    "parked": 423,
    "not_owner": 409,
    "busy": 409,
}


_ACTIONS: Final[dict[str, ResolutionAction]] = {"retry": "retry", "skip": "skip", "fail": "fail"}

T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        body["field"] = field
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison that also copes with non-ASCII input."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def cookie_value(token: str) -> str:
    """The page cookie: derived from the token, so the cookie itself is not the token."""
    return hmac.new(token.encode(), b"perdure page cookie v1", hashlib.sha256).hexdigest()


# -- request parsing ---------------------------------------------------------------------


async def read_json(request: Request, max_body: int) -> dict[str, Any]:
    """The body as a JSON object, or an ``ApiError`` (400 malformed, 413 too large).

    An oversized body is still read (and dropped) up to ``DRAIN_FACTOR`` times the
    limit, so the client, which is still sending, gets the 413 instead of a reset
    connection; beyond that the connection is closed after the answer.
    """
    too_large = ApiError(413, "too_large", f"the body exceeds the limit of {max_body} bytes")
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "invalid_header", "Content-Length is not a number") from None
        if size > max_body * DRAIN_FACTOR:
            raise too_large
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_body * DRAIN_FACTOR:
            raise too_large
        if total <= max_body:
            chunks.append(chunk)
    if total > max_body:
        raise too_large
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "the body must be a JSON object")
    return data


def text_field(data: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    if name not in data or data[name] is None:
        if required:
            raise ApiError(400, "missing_field", f"the field {name!r} is required", name)
        return None
    value = data[name]
    if not isinstance(value, str) or (required and not value.strip()):
        raise ApiError(400, "invalid_field", f"the field {name!r} must be a non-empty string", name)
    return value


def request_id_field(data: dict[str, Any]) -> str:
    rid = text_field(data, "request_id")
    assert rid is not None
    if len(rid) > MAX_REQUEST_ID:
        raise ApiError(
            400,
            "invalid_field",
            f"the field 'request_id' must be at most {MAX_REQUEST_ID} characters",
            "request_id",
        )
    return rid


def bool_field(data: dict[str, Any], name: str) -> bool:
    if name not in data:
        raise ApiError(400, "missing_field", f"the field {name!r} is required", name)
    value = data[name]
    if not isinstance(value, bool):
        raise ApiError(400, "invalid_field", f"the field {name!r} must be true or false", name)
    return value


def path_session(request: Request) -> str:
    sid: str = request.path_params["session_id"]
    try:
        return check_session_id(sid)
    except ValueError:
        raise ApiError(404, "not_found", f"no session {sid!r} in this log") from None


# -- JSON shapes -------------------------------------------------------------------------


def record_json(record: Record) -> dict[str, Any]:
    data: dict[str, Any] = converter.unstructure(record, unstructure_as=Record)
    return data


def event_payload(event: Event) -> dict[str, Any]:
    if event.seq is not None and event.record is not None:
        return {
            "seq": event.seq,
            "type": event.kind,
            "session_id": event.session_id,
            "record": record_json(event.record),
        }
    return {"type": event.kind, "session_id": event.session_id, "data": event.data}


def sse_frame(event: Event) -> bytes:
    data = json.dumps(event_payload(event), ensure_ascii=False, separators=(",", ":"))
    head = f"id: {event.seq}\n" if event.seq is not None else ""
    return f"{head}event: {event.kind}\ndata: {data}\n\n".encode()


class FrameCache:
    """Committed records encoded once for all the subscribers of one runtime's streams."""

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self._frames: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def frame(self, event: Event) -> bytes:
        if event.seq is None:
            return sse_frame(event)
        key = (event.session_id, event.seq)
        found = self._frames.get(key)
        if found is None:
            found = self._frames[key] = sse_frame(event)
            if len(self._frames) > self.size:
                self._frames.popitem(last=False)
        return found


def message_json(message: ModelMessage) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = []
    for b in message.content:
        if isinstance(b, TextBlock):
            blocks.append({"type": "text", "text": b.text})
        elif isinstance(b, ToolUseBlock):
            blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        elif isinstance(b, ThinkingBlock):
            blocks.append({"type": "thinking", "thinking": b.thinking})  # signature: opaque
        elif isinstance(b, RedactedThinkingBlock):
            blocks.append({"type": "redacted_thinking"})  # encrypted: nothing to show
        elif isinstance(b, ToolResultBlock):
            blocks.append(
                {
                    "type": "tool_result",
                    "tool_use_id": b.tool_use_id,
                    "content": b.content,
                    "is_error": b.is_error,
                }
            )
    return {"role": message.role, "content": blocks}


# -- the event stream --------------------------------------------------------------------


class EventStreamResponse(Response):
    """``text/event-stream`` for one session: replay, then live, with heartbeats."""

    def __init__(self, api: Api, session_id: str, after: int, live: bool) -> None:
        super().__init__(status_code=200)
        self.api = api
        self.session_id = session_id
        self.after = after
        self.live = live

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache, no-transform"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        lock = trio.Lock()

        async def write(chunk: bytes) -> None:
            async with lock:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._until_disconnect, receive, nursery.cancel_scope)
                nursery.start_soon(self._until_closing, nursery.cancel_scope)
                nursery.start_soon(self._heartbeats, write)
                await write(f"retry: {self.api.retry_ms}\n: after {self.after}\n\n".encode())
                await self._pump(write)
                nursery.cancel_scope.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-write; nothing to tell it

    async def _pump(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        """Forward the session's events; frames that pile up while a write is in
        progress go out together in the next write (one send for a burst of commits)."""
        frames_in, frames_out = trio.open_memory_channel[bytes](256)

        async def read() -> None:
            events = self.api.rt.events(
                self.session_id, after=self.after, live=self.live, restarts=True
            )
            async with frames_in:
                try:
                    async with aclosing(events) as stream:
                        async for event in stream:
                            await frames_in.send(self.api.frames.frame(event))
                except EventStreamLagged:
                    # The runtime dropped us rather than wait: end, so the client
                    # reconnects from the last id it received.
                    await frames_in.send(b": lagged behind; reconnect with Last-Event-ID\n\n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            async for frame in frames_out:
                batch = [frame]
                while True:
                    try:
                        batch.append(frames_out.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await write(b"".join(batch))

    async def _until_disconnect(self, receive: Receive, scope: trio.CancelScope) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    async def _until_closing(self, scope: trio.CancelScope) -> None:
        await self.api.closing.wait()
        scope.cancel()

    async def _heartbeats(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        while True:
            await trio.sleep(self.api.heartbeat)
            await write(b": keepalive\n\n")


# -- auth --------------------------------------------------------------------------------


class AuthMiddleware:
    """Checks the token on every HTTP request except ``/healthz``."""

    def __init__(self, app: ASGIApp, token: str, login_page: str) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie_value(token)
        self.login_page = login_page

    def _how(self, scope: Scope) -> str | None:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() == "bearer" and same_secret(given.strip(), self.token):
            return "header"
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and same_secret(value, self.cookie):
                return "cookie"
        path: str = scope["path"]
        if path == "/" or path.endswith("/events"):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            for given in query.get("token", []):
                if same_secret(given, self.token):
                    return "query"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz":
            await self.app(scope, receive, send)
            return
        how = self._how(scope)
        if how is None:
            response: Response
            if scope["path"] == "/" and scope["method"] == "GET":
                response = HTMLResponse(self.login_page, status_code=401)
            else:
                response = error_response(
                    401,
                    "unauthorized",
                    "missing or wrong token: send 'Authorization: Bearer <token>'",
                    headers={"WWW-Authenticate": 'Bearer realm="perdure"'},
                )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["auth"] = how
        await self.app(scope, receive, send)


# -- the API -----------------------------------------------------------------------------

Handler = Callable[[T, Request], Awaitable[Response]]


def api_errors(fn: Handler[T]) -> Handler[T]:
    """Turn the runtime's refusals and the log's errors into the JSON error shape."""

    async def wrapped(self: T, request: Request) -> Response:
        try:
            return await fn(self, request)
        except ApiError as exc:
            return error_response(exc.status, exc.code, exc.message, exc.field)
        except Refused as exc:
            return error_response(_REFUSED_STATUS.get(exc.code, 409), exc.code, exc.message)
        except SessionRestarting as exc:
            return error_response(503, "session_restarting", str(exc))
        except CorruptRecord as exc:
            return error_response(500, "corrupt_record", str(exc))
        except LogError as exc:
            return error_response(503, "log_unavailable", str(exc))

    return wrapped


class Api:
    """The routes, bound to one runtime."""

    def __init__(
        self,
        rt: Runtime,
        *,
        token: str,
        closing: trio.Event,
        heartbeat: float = 15.0,
        max_body: int = MAX_BODY,
        retry_ms: int = 1000,
    ) -> None:
        self.rt = rt
        self.token = token
        self.closing = closing
        self.heartbeat = heartbeat
        self.max_body = max_body
        self.frames = FrameCache()
        self.retry_ms = retry_ms
        static = resources.files("perdure.server") / "static"
        self.static = {name: (static / name).read_bytes() for name in _STATIC}
        self.index = (static / "index.html").read_bytes()
        self.login = (static / "login.html").read_text()

    # -- pages -----------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        if self.closing.is_set():
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok", "version": __version__})

    async def stats(self, request: Request) -> Response:
        """Operator counters: the Journal's commits and which sessions are in memory."""
        journal = self.rt.stats()
        return JSONResponse(
            {
                "appends": journal.appends,
                "transactions": journal.transactions,
                "records": journal.records,
                "largest_transaction": journal.largest_transaction,
                "resident_sessions": len(self.rt.resident_sessions),
                "evictions": self.rt.evictions,
            }
        )

    async def page(self, request: Request) -> Response:
        if request.scope["state"].get("auth") == "query":
            # Trade the token in the URL for a cookie, and drop it from the address bar.
            response: Response = RedirectResponse("/", status_code=303)
            response.set_cookie(
                COOKIE, cookie_value(self.token), httponly=True, samesite="strict", path="/"
            )
            return response
        return Response(
            self.index,
            media_type="text/html; charset=utf-8",
            headers={
                "Content-Security-Policy": "default-src 'self'; connect-src 'self'",
                "Cache-Control": "no-store",
            },
        )

    async def static_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.static:
            return error_response(404, "not_found", f"no static file {name!r}")
        return Response(self.static[name], media_type=_STATIC[name])

    # -- sessions --------------------------------------------------------------------

    @api_errors
    async def list_sessions(self, request: Request) -> Response:
        infos = await self.rt.sessions()
        return JSONResponse(
            {
                "sessions": [
                    {
                        "session_id": i.session_id,
                        "first_seq": i.first_seq,
                        "last_seq": i.last_seq,
                        "records": i.records,
                        "goal_rev": i.goal_rev,
                        "open_submissions": i.open_submissions,
                        "active": i.open_submissions > 0,
                    }
                    for i in sorted(infos, key=lambda i: i.first_seq)
                ]
            }
        )

    @api_errors
    async def create_session(self, request: Request) -> Response:
        data = await read_json(request, self.max_body)
        sid = text_field(data, "session_id", required=False)
        system = text_field(data, "system", required=False)
        if sid is not None:
            try:
                check_session_id(sid)
            except ValueError as exc:
                raise ApiError(
                    400, "invalid_field", f"the field 'session_id' is invalid: {exc}", "session_id"
                ) from None
            created = await self.rt.ensure_session(sid, system=system)
            return JSONResponse(
                {"session_id": sid, "created": created}, status_code=201 if created else 200
            )
        sid = await self.rt.create_session(None, system=system)
        return JSONResponse({"session_id": sid, "created": True}, status_code=201)

    @api_errors
    async def get_session(self, request: Request) -> Response:
        sid = path_session(request)
        return JSONResponse(summarize(await self.rt.load_state(sid)))

    @api_errors
    async def transcript(self, request: Request) -> Response:
        sid = path_session(request)
        messages = await self.rt.transcript(sid)
        return JSONResponse({"session_id": sid, "messages": [message_json(m) for m in messages]})

    # -- commands --------------------------------------------------------------------

    @api_errors
    async def post_message(self, request: Request) -> Response:
        sid = path_session(request)
        data = await read_json(request, self.max_body)
        text = text_field(data, "text")
        rid = request_id_field(data)
        assert text is not None
        accepted = await self.rt.submit(sid, text, request_id=rid, traceparent=_trace(request))
        return JSONResponse(
            {
                "submission_id": accepted.submission_id,
                "seq": accepted.seq,
                "duplicate": accepted.duplicate,
            },
            status_code=202,
        )

    @api_errors
    async def cancel(self, request: Request) -> Response:
        sid = path_session(request)
        rid = request_id_field(await read_json(request, self.max_body))
        done = await self.rt.cancel(sid, request_id=rid)
        return _done(done, run_id=done.ref or None)

    @api_errors
    async def approve(self, request: Request) -> Response:
        sid = path_session(request)
        call_id: str = request.path_params["call_id"]
        data = await read_json(request, self.max_body)
        approved = bool_field(data, "approved")
        rid = request_id_field(data)
        note = text_field(data, "note", required=False) or ""
        done = await self.rt.approve(sid, call_id, approved=approved, request_id=rid, note=note)
        return _done(done, call_id=call_id, approved=approved)

    @api_errors
    async def revise(self, request: Request) -> Response:
        sid = path_session(request)
        data = await read_json(request, self.max_body)
        text = text_field(data, "text")
        rid = request_id_field(data)
        assert text is not None
        done = await self.rt.revise(sid, text, request_id=rid)
        return _done(done, goal_rev=int(done.ref))

    @api_errors
    async def pause(self, request: Request) -> Response:
        sid = path_session(request)
        rid = request_id_field(await read_json(request, self.max_body))
        return _done(await self.rt.pause(sid, request_id=rid), paused=True)

    @api_errors
    async def resume(self, request: Request) -> Response:
        sid = path_session(request)
        rid = request_id_field(await read_json(request, self.max_body))
        return _done(await self.rt.resume(sid, request_id=rid), paused=False)

    @api_errors
    async def compensate(self, request: Request) -> Response:
        sid = path_session(request)
        call_id: str = request.path_params["call_id"]
        rid = request_id_field(await read_json(request, self.max_body))
        done = await self.rt.compensate(sid, call_id, request_id=rid)
        return _done(done, call_id=call_id, compensation_id=done.ref)

    @api_errors
    async def resolve(self, request: Request) -> Response:
        """A person's answer to a call that raised NeedsHuman: retry, skip or fail it."""
        sid = path_session(request)
        call_id: str = request.path_params["call_id"]
        data = await read_json(request, self.max_body)
        given = text_field(data, "action")
        action = _ACTIONS.get(given or "")
        if action is None:
            raise ApiError(
                400, "invalid_field", "the field 'action' must be retry, skip or fail", "action"
            )
        rid = request_id_field(data)
        result = data.get("result")
        if action == "retry" and result is not None:
            why = "the field 'result' goes with skip or fail, not with retry"
            raise ApiError(400, "invalid_field", why, "result")
        done = await self.rt.resolve(sid, call_id, action=action, result=result, request_id=rid)
        return _done(done, call_id=call_id, action=action)

    # -- events ----------------------------------------------------------------------

    @api_errors
    async def events(self, request: Request) -> Response:
        sid = path_session(request)
        after = _after(request)
        live = request.query_params.get("live", "1") not in ("0", "false", "no")
        if await self.rt.session_info(sid) is None:
            raise ApiError(404, "not_found", f"no session {sid!r} in this log")
        return EventStreamResponse(self, sid, after, live)


def _trace(request: Request) -> str | None:
    """The W3C ``traceparent`` header, if well formed (else ignored, as W3C asks)."""
    value = request.headers.get("traceparent", "").strip()
    try:
        return check_traceparent(value) if value else None
    except ValueError:
        return None


def _after(request: Request) -> int:
    """Where a stream resumes: ``Last-Event-ID`` (a reconnect) wins over ``?after=``."""
    for name, raw in (
        ("Last-Event-ID", request.headers.get("last-event-id")),
        ("after", request.query_params.get("after")),
    ):
        if raw is None or raw == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(
                400, "invalid_field", f"{name} must be a sequence number", name
            ) from None
        if value < 0:
            raise ApiError(400, "invalid_field", f"{name} must not be negative", name)
        return value
    return 0


def _done(done: Any, **extra: Any) -> JSONResponse:
    return JSONResponse(
        {"seq": done.seq or None, "recorded": bool(done.seq), "duplicate": done.duplicate, **extra}
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


async def _internal_error(request: Request, exc: Exception) -> Response:
    return error_response(500, "internal", f"{type(exc).__name__}: {exc}")


def create_app(
    rt: Runtime,
    *,
    token: str,
    closing: trio.Event,
    heartbeat: float = 15.0,
    max_body: int = MAX_BODY,
    metrics: RuntimeMetrics | None = None,
) -> ASGIApp:
    """The ASGI application: routes, JSON errors, and the auth middleware around them.

    With ``metrics``, ``GET /metrics`` (behind the token like the rest) serves them.
    """
    api = Api(rt, token=token, closing=closing, heartbeat=heartbeat, max_body=max_body)
    s = "/v1/sessions/{session_id}"
    routes = [
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/", api.page, methods=["GET"]),
        Route("/static/{name}", api.static_file, methods=["GET"]),
        Route("/v1/stats", api.stats, methods=["GET"]),
        Route("/v1/sessions", api.list_sessions, methods=["GET"]),
        Route("/v1/sessions", api.create_session, methods=["POST"]),
        Route(s, api.get_session, methods=["GET"]),
        Route(s + "/transcript", api.transcript, methods=["GET"]),
        Route(s + "/events", api.events, methods=["GET"]),
        Route(s + "/messages", api.post_message, methods=["POST"]),
        Route(s + "/cancel", api.cancel, methods=["POST"]),
        Route(s + "/approvals/{call_id}", api.approve, methods=["POST"]),
        Route(s + "/revisions", api.revise, methods=["POST"]),
        Route(s + "/pause", api.pause, methods=["POST"]),
        Route(s + "/resume", api.resume, methods=["POST"]),
        Route(s + "/compensations/{call_id}", api.compensate, methods=["POST"]),
        Route(s + "/calls/{call_id}/resolution", api.resolve, methods=["POST"]),
    ]
    if metrics is not None:
        routes.append(Route("/metrics", metrics.scrape, methods=["GET"]))
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    return AuthMiddleware(app, token, api.login)
