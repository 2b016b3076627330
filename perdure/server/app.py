"""The HTTP API over one ``Runtime``: the routes, and ``create_app`` that assembles them.

Every command is answered only after its record is durable, and carries a
``request_id``: the same id with the same body gets the same answer (also after a
restart of the daemon, the dedup lives in the log); the same id with another body
is a 409. Errors are ``{"error": {"code", "message"[, "field"]}}``:

=====  =====================================================================
400    malformed JSON, a missing or invalid field (``field`` names it)
401    no or wrong token; a scoped token that is forged, expired or of the old format
403    a scoped session token on a route it does not open (``perdure.server.tokens``)
404    unknown session, tool call or route
409    ``conflict`` (request id reused with another body), ``invalid_state``, or
       ``not_owner`` (another node leases the session; ``owner`` names it)
413    body larger than ``max_body`` (1 MiB)
423    the session is parked (its actor kept crashing; see ``GET`` the session)
501    ``not_installed``: AG-UI input without its optional package
500    a damaged record (``corrupt_record``, naming its seq) or a bug
503    ``session_restarting`` (its actor crashed with the command pending: retry with
       the same request id) or ``log_unavailable`` (disk full, outage, ownership
       lost); ``/healthz`` while stopping
=====  =====================================================================

The pieces: ``auth`` decides who may call (``tokens``: scoped session tokens),
``payloads`` parses bodies and shapes answers, ``errors`` turns exceptions into the
error shape, ``streams`` pumps the event streams, ``frontends`` speaks the AI SDK's
and AG-UI's protocols from the same streams, ``openapi`` builds the OpenAPI document
(``/openapi.json``, ``/docs``) from the routes below and the ``Operation`` each one
carries. A route here only reads its input, calls the runtime, and answers.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from perdure import Done, Runtime, __version__
from perdure.answers import check_if_busy
from perdure.observability.hooks import check_traceparent
from perdure.server import frontends, tokens
from perdure.server.auth import (
    COOKIE,
    SCOPED_COOKIE,
    Authenticator,
    AuthMiddleware,
    Grant,
    cookie_value,
    grant_of,
)
from perdure.server.errors import HANDLERS, ApiError
from perdure.server.openapi import (
    AG_UI_DOC,
    AG_UI_EVENT,
    AG_UI_REQUEST,
    AI_SDK_DOC,
    AI_SDK_EVENT,
    ANY_EVENT,
    CHAT_DOC,
    CHAT_REQUEST,
    DIFF_PARAMS,
    EVENT_PARAMS,
    EVENTS_DOC,
    FORK_REQUEST,
    HEALTH,
    HTML,
    REWIND_REQUEST,
    SESSION_LIST,
    SESSION_LIST_DOC,
    SESSION_LIST_PARAMS,
    SESSION_SUMMARY,
    SSE,
    TRACEPARENT,
    TRANSCRIPT,
    TRANSCRIPT_PARAMS,
    WORKSPACE_DIFF,
    Body,
    Operation,
    documented,
    openapi_document,
)
from perdure.server.payloads import (
    MAX_BODY,
    ApprovalAnswer,
    ApprovalBody,
    CancelAnswer,
    CommandBody,
    CompactionAnswer,
    CompensationAnswer,
    CreateSessionBody,
    ForkAnswer,
    ForkBody,
    MessageAccepted,
    MessageBody,
    PauseAnswer,
    ResolutionAnswer,
    ResolutionBody,
    RevisionAnswer,
    RewindAnswer,
    RewindBody,
    SessionCreatedAnswer,
    SessionDeletedAnswer,
    StatsAnswer,
    SubmitBody,
    TokenAnswer,
    TokenBody,
    WhoamiAnswer,
    answer,
    message_json,
    parse,
    path_session,
    read_body,
    read_json,
    session_list,
    session_page,
    stream_start,
)
from perdure.server.streams import EventStreamResponse, FrameCache, Streams
from perdure.server.tokens import TokenSigner

if TYPE_CHECKING:
    from perdure.observability.metrics import RuntimeMetrics

_STATIC: Final = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# The API's docs page: Swagger UI (vendored from the swagger-ui-dist package, Apache-2.0,
# its licence beside it) and the few lines that point it at /openapi.json.
_PAGE_POLICY: Final = "default-src 'self'; connect-src 'self'"
# Swagger UI sets inline styles and draws data: images; no script inline.
_DOCS_POLICY: Final = (
    "default-src 'self'; connect-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"
)
_DOCS: Final = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "docs.js": "text/javascript; charset=utf-8",
}


def _json(value: object, status: int = 200) -> JSONResponse:
    return JSONResponse(answer(value), status_code=status)


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
        signer: TokenSigner | None = None,
    ) -> None:
        self.rt = rt
        self.token = token
        self.closing = closing
        self.max_body = max_body
        self.streams = Streams(rt, FrameCache(), closing, heartbeat, retry_ms)
        self.auth = Authenticator(token, signer)
        self.chats = frontends.ChatRoutes(self)
        static = resources.files("perdure.server") / "static"
        self.static = {name: (static / name).read_bytes() for name in _STATIC}
        self.index = (static / "index.html").read_bytes()
        self.login = (static / "login.html").read_text()
        self.document: dict[str, Any] | None = None
        self.docs_files: dict[str, bytes] = {}

    # -- pages -----------------------------------------------------------------------

    @documented(
        Operation(
            summary="Liveness: ok, or shutting_down while the daemon stops",
            tag="operator",
            access="none",
            answers={200: Body(schema=HEALTH), 503: Body(schema=HEALTH, description="stopping")},
        )
    )
    async def healthz(self, request: Request) -> Response:
        if self.closing.is_set():
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok", "version": __version__})

    @documented(
        Operation(
            summary="Operator counters: the log's commits and the sessions in memory",
            tag="operator",
            answers={200: Body(StatsAnswer)},
        )
    )
    async def stats(self, request: Request) -> Response:
        """Operator counters: the Journal's commits and which sessions are in memory."""
        journal = self.rt.stats()
        return _json(
            StatsAnswer(
                appends=journal.appends,
                transactions=journal.transactions,
                records=journal.records,
                largest_transaction=journal.largest_transaction,
                resident_sessions=len(self.rt.resident_sessions),
                evictions=self.rt.evictions,
            )
        )

    @documented(
        Operation(
            summary="The browser page (a login form without credentials)",
            tag="pages",
            description="`?token=` trades a token for an HttpOnly cookie and redirects to `/` "
            "(303).",
            access="query",
            answers={
                200: Body(schema={"type": "string"}, media=HTML, description="the page"),
                303: Body(description="the token was traded for a cookie"),
            },
        )
    )
    async def page(self, request: Request) -> Response:
        return await self._html_page(request, "/", self._index_page, _PAGE_POLICY)

    def _cookie_for(self, grant: Grant, then: str) -> Response:
        """Trade the token in the URL for a cookie, and drop it from the address bar.
        One page, one credential: the other kind's cookie is cleared."""
        response: Response = RedirectResponse(then, status_code=303)
        if grant.claim is None or grant.token is None:
            response.set_cookie(
                COOKIE, cookie_value(self.token), httponly=True, samesite="strict", path="/"
            )
            response.delete_cookie(SCOPED_COOKIE, path="/")
        else:
            response.set_cookie(
                SCOPED_COOKIE,
                grant.token,
                max_age=max(1, grant.claim.expires_at - int(time.time())),
                httponly=True,
                samesite="strict",
                path="/",
            )
            response.delete_cookie(COOKIE, path="/")
        return response

    @documented(
        Operation(
            summary="What the caller's credential opens",
            tag="tokens",
            access="session",
            answers={200: Body(WhoamiAnswer)},
        )
    )
    async def whoami(self, request: Request) -> Response:
        """What the caller's credential opens (the page adapts to a scoped token)."""
        claim = grant_of(request).claim
        if claim is None:
            return _json(WhoamiAnswer("admin", None, None))
        return _json(WhoamiAnswer(claim.scope, claim.session_id, claim.expires_at))

    @documented(
        Operation(
            summary="Mint a scoped token (a JWT) for this session only",
            tag="tokens",
            body=Body(TokenBody),
            answers={201: Body(TokenAnswer, description="the token")},
            errors=(400, 404, 413),
        )
    )
    async def mint_token(self, request: Request) -> Response:
        """``POST /v1/sessions/{id}/tokens {scope, ttl_s}``: a token for that session only."""
        sid = path_session(request)
        body = await read_body(request, TokenBody, self.max_body)
        if await self.rt.session_info(sid) is None:
            raise ApiError(404, "not_found", f"no session {sid!r} in this log")
        scope = tokens.SCOPES[body.scope]
        token, expires_at = self.auth.signer.mint(sid, scope, body.ttl_s, time.time())
        return _json(TokenAnswer(token, expires_at, sid, scope), 201)

    @documented(
        Operation(
            summary="The page's script and style sheet",
            tag="pages",
            access="session",
            answers={200: Body(schema={"type": "string"}, media="text/plain")},
            errors=(404,),
        )
    )
    async def static_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.static:
            raise ApiError(404, "not_found", f"no static file {name!r}")
        return Response(self.static[name], media_type=_STATIC[name])

    # -- the contract ----------------------------------------------------------------

    @documented(
        Operation(
            summary="This document: the API as OpenAPI 3.1",
            tag="pages",
            access="session",
            answers={200: Body(schema={"type": "object"})},
        )
    )
    async def openapi(self, request: Request) -> Response:
        if self.document is None:
            self.document = openapi_document(request.app.routes, tool_names=list(self.rt.tools))
        return JSONResponse(self.document)

    @documented(
        Operation(
            summary="The API's documentation for people (Swagger UI over /openapi.json)",
            tag="pages",
            description="`?token=` trades a token for the page's cookie and redirects to "
            "`/docs` (303).",
            access="query",
            answers={
                200: Body(schema={"type": "string"}, media=HTML, description="the page"),
                303: Body(description="the token was traded for a cookie"),
            },
        )
    )
    async def docs_page(self, request: Request) -> Response:
        return await self._html_page(request, "/docs", self._docs_page, _DOCS_POLICY)

    async def _html_page(
        self,
        request: Request,
        path: str,
        body: Callable[[], Awaitable[bytes]],
        policy: str,
    ) -> Response:
        """One of the two HTML pages: a token in the URL becomes a cookie first."""
        grant = grant_of(request)
        if grant.via == "query":
            return self._cookie_for(grant, path)
        return Response(
            await body(),
            media_type="text/html; charset=utf-8",
            headers={"Content-Security-Policy": policy, "Cache-Control": "no-store"},
        )

    @documented(
        Operation(
            summary="The docs page's script and style sheet",
            tag="pages",
            access="session",
            answers={200: Body(schema={"type": "string"}, media="text/plain")},
            errors=(404,),
        )
    )
    async def docs_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _DOCS:
            raise ApiError(404, "not_found", f"no docs file {name!r}")
        return Response(await self._docs_file(name), media_type=_DOCS[name])

    async def _index_page(self) -> bytes:
        return self.index

    async def _docs_page(self) -> bytes:
        return await self._docs_file("docs.html")

    async def _docs_file(self, name: str) -> bytes:
        # Read on first use, in a worker thread: Swagger UI is 2 MB that most daemons
        # never serve, and a read that size would stall every stream on the loop.
        if name not in self.docs_files:
            folder = resources.files("perdure.server") / "static" / "swagger-ui"
            self.docs_files[name] = await trio.to_thread.run_sync((folder / name).read_bytes)
        return self.docs_files[name]

    # -- sessions --------------------------------------------------------------------

    @documented(
        Operation(
            summary="The sessions of the log: every one in order of creation, or a page",
            description=SESSION_LIST_DOC,
            tag="sessions",
            answers={200: Body(schema=SESSION_LIST)},
            errors=(400,),
            params=SESSION_LIST_PARAMS,
        )
    )
    async def list_sessions(self, request: Request) -> Response:
        page = session_page(request)
        if page is None:
            infos = sorted(await self.rt.sessions(), key=lambda i: i.first_seq)
            return JSONResponse(session_list(infos, await self.rt.stuck_runs()))
        # One more than asked: whether a next page exists, without a second read.
        limit = page.limit
        if page.newest:
            infos = await self.rt.newest_sessions(
                before=page.before, limit=limit + 1, active=page.active
            )
        else:
            infos = await self.rt.sessions(after=page.after, limit=limit + 1, active=page.active)
        more = len(infos) > limit
        infos = infos[:limit]
        stuck = await self.rt.stuck_runs(among=infos)
        next_after = None
        if more:
            last = infos[-1]
            next_after = str(last.first_seq) if page.newest else last.session_id
        return JSONResponse(session_list(infos, stuck, next_after=next_after))

    @documented(
        Operation(
            summary="Create a session (with an id of your own, or one generated)",
            tag="sessions",
            body=Body(CreateSessionBody, required=False),
            yields_session=True,
            answers={
                201: Body(SessionCreatedAnswer, description="created"),
                200: Body(SessionCreatedAnswer, description="it was already there, alike"),
            },
            errors=(400, 409, 413),
        )
    )
    async def create_session(self, request: Request) -> Response:
        body = await read_body(request, CreateSessionBody, self.max_body)
        if_busy = check_if_busy(body.if_busy)
        sid = body.session_id
        try:
            if sid is None:
                sid = await self.rt.create_session(
                    None, system=body.system, if_busy=if_busy, tools=body.tools
                )
                return _json(SessionCreatedAnswer(sid, True), 201)
            # The supervisor decides: created, already there alike, or a conflict (409).
            created = await self.rt.ensure_session(
                sid, system=body.system, if_busy=if_busy, tools=body.tools
            )
        except ValueError as exc:  # the grant names a tool the daemon does not have
            raise ApiError(400, "invalid_field", str(exc), "tools") from None
        return _json(SessionCreatedAnswer(sid, created), 201 if created else 200)

    @documented(
        Operation(
            summary="The session's state: request in force, done, next, unconfirmed effects",
            tag="sessions",
            access="session",
            answers={200: Body(schema=SESSION_SUMMARY)},
            errors=(404,),
        )
    )
    async def get_session(self, request: Request) -> Response:
        sid = path_session(request)
        # The live state when the session is in memory (no fold of its whole log), else
        # the log's; never wakes an actor.
        return JSONResponse(await self.rt.summary(sid, wake=False))

    @documented(
        Operation(
            summary="The messages as the model sees them",
            tag="sessions",
            access="session",
            answers={200: Body(schema=TRANSCRIPT)},
            params=TRANSCRIPT_PARAMS,
            errors=(404,),
        )
    )
    async def transcript(self, request: Request) -> Response:
        sid = path_session(request)
        history = request.query_params.get("history", "0") in ("1", "true", "yes")
        messages = await self.rt.transcript(sid, history=history)
        return JSONResponse({"session_id": sid, "messages": [message_json(m) for m in messages]})

    # -- commands --------------------------------------------------------------------

    @documented(
        Operation(
            summary="Submit an input (answered once durable)",
            tag="commands",
            access="session",
            body=Body(SubmitBody),
            answers={202: Body(MessageAccepted)},
            errors=(400, 404, 409, 413, 423),
            params=(TRACEPARENT,),
        )
    )
    async def post_message(self, request: Request) -> Response:
        sid = path_session(request)
        body = await read_body(request, SubmitBody, self.max_body)
        accepted = await self.rt.submit(
            sid,
            body.text,
            request_id=body.request_id,
            if_busy=check_if_busy(body.if_busy),
            traceparent=_trace(request),
        )
        answer = MessageAccepted(
            accepted.submission_id, accepted.seq, accepted.duplicate, accepted.disposition
        )
        return _json(answer, 202)

    @documented(
        Operation(
            summary="Remove a finished session from the log",
            tag="sessions",
            access="session",
            answers={200: Body(SessionDeletedAnswer)},
            errors=(404, 409, 423),
        )
    )
    async def delete_session(self, request: Request) -> Response:
        """Remove a finished session from the log (409 ``busy`` while it has work)."""
        sid = path_session(request)
        count = await self.rt.delete_session(sid, reason="deleted through the API")
        return _json(SessionDeletedAnswer(sid, True, count))

    @documented(
        Operation(
            summary="A new session from this one's history up to a settled point",
            tag="commands",
            access="session",
            body=Body(schema=FORK_REQUEST),
            yields_session=True,
            answers={
                201: Body(ForkAnswer, description="forked"),
                200: Body(ForkAnswer, description="a repeat of the same request"),
            },
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def fork(self, request: Request) -> Response:
        """A new session from this one's history up to a settled point (``at``)."""
        sid = path_session(request)
        data = await read_json(request, self.max_body)
        body = parse({k: v for k, v in data.items() if k != "at"}, ForkBody)
        at = data.get("at")
        if isinstance(at, bool) or not (at is None or isinstance(at, int | str)):
            why = "the field 'at' must be a run id, a sequence number or null"
            raise ApiError(400, "invalid_field", why, "at")
        forked = await self.rt.fork(
            sid, at=at, session_id=body.session_id, request_id=body.request_id, files=body.files
        )
        answer = ForkAnswer(forked.session_id, forked.source, forked.position, forked.duplicate)
        return _json(answer, 200 if forked.duplicate else 201)

    @documented(
        Operation(
            summary="Put the workspace's files back as they were at a call or a settled point",
            tag="commands",
            access="session",
            body=Body(schema=REWIND_REQUEST),
            answers={200: Body(RewindAnswer, description="the files are back")},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def rewind(self, request: Request) -> Response:
        """Restore the workspace's files (``to``: a call id or a settled point's seq);
        409 ``invalid_state`` while a run is active or if the store cannot prove the
        checkpoint whole."""
        sid = path_session(request)
        data = await read_json(request, self.max_body)
        body = parse({k: v for k, v in data.items() if k != "to"}, RewindBody)
        to = data.get("to")
        if isinstance(to, bool) or not isinstance(to, int | str):
            why = "the field 'to' must be a call id or a sequence number"
            raise ApiError(400, "invalid_field", why, "to")
        done = await self.rt.rewind(sid, to=to, request_id=body.request_id)
        return _json(RewindAnswer(sid, done.tree, done.position, done.before, done.duplicate))

    @documented(
        Operation(
            summary="What each workspace call of the session changed, with its diff",
            tag="sessions",
            access="session",
            params=DIFF_PARAMS,
            answers={200: Body(schema=WORKSPACE_DIFF)},
            errors=(404,),
        )
    )
    async def workspace_diff(self, request: Request) -> Response:
        sid = path_session(request)
        call_id = request.query_params.get("call_id") or None
        diffs = await self.rt.workspace_diff(sid, call_id)
        calls = [
            {
                "call_id": d.call_id,
                "attempt": d.attempt,
                "tool_name": d.tool_name,
                "before": d.before,
                "after": d.after,
                "changed": list(d.changed),
                "skipped": list(d.skipped),
                "patch": d.patch,
            }
            for d in diffs
        ]
        return JSONResponse({"session_id": sid, "calls": calls})

    @documented(
        Operation(
            summary="Cancel the run in progress",
            tag="commands",
            access="session",
            body=Body(CommandBody),
            answers={200: Body(CancelAnswer)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def cancel(self, request: Request) -> Response:
        sid = path_session(request)
        body = await read_body(request, CommandBody, self.max_body)
        done = await self.rt.cancel(sid, request_id=body.request_id)
        return _json(CancelAnswer(**_recorded(done), run_id=done.ref or None))

    @documented(
        Operation(
            summary="Approve or deny a tool call waiting for approval",
            tag="commands",
            access="session",
            body=Body(ApprovalBody),
            answers={200: Body(ApprovalAnswer)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def approve(self, request: Request) -> Response:
        sid = path_session(request)
        call_id: str = request.path_params["call_id"]
        body = await read_body(request, ApprovalBody, self.max_body)
        done = await self.rt.approve(
            sid, call_id, approved=body.approved, request_id=body.request_id, note=body.note
        )
        return _json(ApprovalAnswer(**_recorded(done), call_id=call_id, approved=body.approved))

    @documented(
        Operation(
            summary="Revise the request of the run in progress",
            tag="commands",
            access="session",
            body=Body(MessageBody),
            answers={200: Body(RevisionAnswer)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def revise(self, request: Request) -> Response:
        sid = path_session(request)
        body = await read_body(request, MessageBody, self.max_body)
        done = await self.rt.revise(sid, body.text, request_id=body.request_id)
        return _json(RevisionAnswer(**_recorded(done), goal_rev=int(done.ref)))

    @documented(
        Operation(
            summary="Pause the session (no new model call or tool call starts)",
            tag="commands",
            access="session",
            body=Body(CommandBody),
            answers={200: Body(PauseAnswer)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def pause(self, request: Request) -> Response:
        sid = path_session(request)
        body = await read_body(request, CommandBody, self.max_body)
        done = await self.rt.pause(sid, request_id=body.request_id)
        return _json(PauseAnswer(**_recorded(done), paused=True))

    @documented(
        Operation(
            summary="Resume a paused session",
            tag="commands",
            access="session",
            body=Body(CommandBody),
            answers={200: Body(PauseAnswer)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def resume(self, request: Request) -> Response:
        sid = path_session(request)
        body = await read_body(request, CommandBody, self.max_body)
        done = await self.rt.resume(sid, request_id=body.request_id)
        return _json(PauseAnswer(**_recorded(done), paused=False))

    @documented(
        Operation(
            summary="Compact the session's context now (summarise what the model is sent)",
            tag="commands",
            access="session",
            body=Body(CommandBody),
            answers={200: Body(CompactionAnswer)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def compact_context(self, request: Request) -> Response:
        """Start a context compaction: a summary replaces the older messages in what the
        model is sent; the log keeps them all. Not the log's compaction."""
        sid = path_session(request)
        body = await read_body(request, CommandBody, self.max_body)
        done = await self.rt.compact_context(sid, request_id=body.request_id)
        return _json(CompactionAnswer(**_recorded(done), compaction_id=done.ref))

    @documented(
        Operation(
            summary="Undo a completed tool call with its compensation",
            tag="commands",
            access="session",
            body=Body(CommandBody),
            answers={200: Body(CompensationAnswer)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def compensate(self, request: Request) -> Response:
        sid = path_session(request)
        call_id: str = request.path_params["call_id"]
        body = await read_body(request, CommandBody, self.max_body)
        done = await self.rt.compensate(sid, call_id, request_id=body.request_id)
        return _json(
            CompensationAnswer(**_recorded(done), call_id=call_id, compensation_id=done.ref)
        )

    @documented(
        Operation(
            summary="Answer a call that needs a person: retry, skip or fail it",
            tag="commands",
            access="session",
            body=Body(ResolutionBody),
            answers={200: Body(ResolutionAnswer)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def resolve(self, request: Request) -> Response:
        """A person's answer to a call that raised NeedsHuman: retry, skip or fail it."""
        sid = path_session(request)
        call_id: str = request.path_params["call_id"]
        body = await read_body(request, ResolutionBody, self.max_body)
        done = await self.rt.resolve(
            sid, call_id, action=body.resolution, result=body.result, request_id=body.request_id
        )
        return _json(ResolutionAnswer(**_recorded(done), call_id=call_id, action=body.action))

    # -- events ----------------------------------------------------------------------

    @documented(
        Operation(
            summary="The session's events as Server-Sent Events (replay, then live)",
            tag="streams",
            description=EVENTS_DOC,
            access="query",
            params=EVENT_PARAMS,
            answers={200: Body(schema=ANY_EVENT, media=SSE, description="the stream")},
            errors=(400, 404),
        )
    )
    async def events(self, request: Request) -> Response:
        sid = path_session(request)
        after = stream_start(request)
        live = request.query_params.get("live", "1") not in ("0", "false", "no")
        fmt = request.query_params.get("format", "perdure")
        if fmt not in ("perdure", *frontends.FORMATS):
            raise ApiError(
                400, "invalid_field", "format must be perdure, ai-sdk or ag-ui", "format"
            )
        if await self.rt.session_info(sid) is None:
            raise ApiError(404, "not_found", f"no session {sid!r} in this log")
        if fmt != "perdure":
            return frontends.session_stream(self, sid, fmt, after, live)
        return EventStreamResponse(self.streams, sid, after, live)

    # -- frontend protocols (perdure.server.frontends) ---------------------------------

    @documented(
        Operation(
            summary="The AI SDK chat transport: submit and stream the reply",
            tag="frontends",
            description=CHAT_DOC,
            access="session",
            body=Body(schema=CHAT_REQUEST),
            answers={200: Body(schema=AI_SDK_EVENT, media=SSE, description=AI_SDK_DOC)},
            errors=(400, 404, 409, 413, 423),
        )
    )
    async def chat(self, request: Request) -> Response:
        sid = path_session(request)
        data = await read_json(request, self.max_body)
        return await self.chats.chat(sid, data)

    @documented(
        Operation(
            summary="The AI SDK transport's resume: the reply in progress, from its start",
            tag="frontends",
            access="session",
            answers={
                200: Body(schema=AI_SDK_EVENT, media=SSE, description=AI_SDK_DOC),
                204: Body(description="no reply in progress"),
            },
            errors=(404,),
        )
    )
    async def chat_stream(self, request: Request) -> Response:
        sid = path_session(request)
        if request.path_params["chat_id"] != sid:
            raise ApiError(404, "not_found", "the chat id must be the session id of the URL")
        if await self.rt.session_info(sid) is None:
            return Response(status_code=204)
        return await self.chats.chat_resume(sid)

    @documented(
        Operation(
            summary="An AG-UI run: RunAgentInput in, AG-UI events out",
            tag="frontends",
            description=AG_UI_DOC,
            access="session",
            body=Body(schema=AG_UI_REQUEST),
            answers={200: Body(schema=AG_UI_EVENT, media=SSE, description="AG-UI events")},
            errors=(400, 404, 409, 413, 423, 501),
        )
    )
    async def ag_ui(self, request: Request) -> Response:
        sid = path_session(request)
        data = await read_json(request, self.max_body)
        return await self.chats.ag_ui_run(sid, data)


def _trace(request: Request) -> str | None:
    """The W3C ``traceparent`` header, if well formed (else ignored, as W3C asks)."""
    value = request.headers.get("traceparent", "").strip()
    try:
        return check_traceparent(value) if value else None
    except ValueError:
        return None


def _recorded(done: Done) -> dict[str, Any]:
    """The fields every command's answer shares, from the runtime's ``Done``."""
    return {"seq": done.seq or None, "recorded": bool(done.seq), "duplicate": done.duplicate}


def create_app(
    rt: Runtime,
    *,
    token: str,
    closing: trio.Event,
    heartbeat: float = 15.0,
    max_body: int = MAX_BODY,
    token_key: bytes | None = None,
    metrics: RuntimeMetrics | None = None,
) -> ASGIApp:
    """The ASGI application: routes, JSON errors, and the auth middleware around them.

    With ``metrics``, ``GET /metrics`` (behind the token like the rest) serves them.

    ``token_key`` signs scoped session tokens (``perdure.server.tokens``).
    """
    signer = TokenSigner(token_key) if token_key is not None else None
    api = Api(
        rt, token=token, closing=closing, heartbeat=heartbeat, max_body=max_body, signer=signer
    )
    s = "/v1/sessions/{session_id}"
    routes = [
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/", api.page, methods=["GET"]),
        Route("/static/{name}", api.static_file, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route("/docs", api.docs_page, methods=["GET"]),
        Route("/docs/{name}", api.docs_file, methods=["GET"]),
        Route("/v1/stats", api.stats, methods=["GET"]),
        Route("/v1/whoami", api.whoami, methods=["GET"]),
        Route("/v1/sessions", api.list_sessions, methods=["GET"]),
        Route("/v1/sessions", api.create_session, methods=["POST"]),
        Route(s, api.get_session, methods=["GET"]),
        Route(s, api.delete_session, methods=["DELETE"]),
        Route(s + "/transcript", api.transcript, methods=["GET"]),
        Route(s + "/events", api.events, methods=["GET"]),
        Route(s + "/messages", api.post_message, methods=["POST"]),
        Route(s + "/cancel", api.cancel, methods=["POST"]),
        Route(s + "/forks", api.fork, methods=["POST"]),
        Route(s + "/rewind", api.rewind, methods=["POST"]),
        Route(s + "/diff", api.workspace_diff, methods=["GET"]),
        Route(s + "/approvals/{call_id}", api.approve, methods=["POST"]),
        Route(s + "/revisions", api.revise, methods=["POST"]),
        Route(s + "/pause", api.pause, methods=["POST"]),
        Route(s + "/compact-context", api.compact_context, methods=["POST"]),
        Route(s + "/resume", api.resume, methods=["POST"]),
        Route(s + "/compensations/{call_id}", api.compensate, methods=["POST"]),
        Route(s + "/calls/{call_id}/resolution", api.resolve, methods=["POST"]),
        Route(s + "/tokens", api.mint_token, methods=["POST"]),
        Route(s + "/chat", api.chat, methods=["POST"]),
        Route(s + "/chat/{chat_id}/stream", api.chat_stream, methods=["GET"]),
        Route(s + "/ag-ui", api.ag_ui, methods=["POST"]),
    ]
    if metrics is not None:
        scrape = metrics.scrape

        @documented(
            Operation(
                summary="Prometheus metrics",
                tag="operator",
                answers={200: Body(schema={"type": "string"}, media="text/plain")},
            )
        )
        async def scrape_metrics(request: Request) -> Response:
            return await scrape(request)

        routes.append(Route("/metrics", scrape_metrics, methods=["GET"]))
    app = Starlette(routes=routes, exception_handlers=dict(HANDLERS))
    return AuthMiddleware(app, api.auth, api.login)
