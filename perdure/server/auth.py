"""Who may call the daemon: the one place where a request's credentials are decided.

``Authenticator.grant`` turns a request's credentials into a ``Grant`` (how the
caller proved itself, and what it may do) or None. Today there is one token, the
admin token, which may do everything; a scoped token is one more row of
``Authenticator.tokens`` with fewer scopes, and a route that needs a scope checks
``grant_of(request).allows(...)``.

Credentials, in order: ``Authorization: Bearer <token>``; the page cookie (an HMAC
of the token, so the cookie is not the token; HttpOnly, SameSite=Strict); and
``?token=`` on the page (traded for the cookie) and on the event stream (for
clients without cookies: a browser's ``EventSource`` cannot set a header).
``/healthz`` needs nothing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Final, Literal
from urllib.parse import parse_qs

from attrs import frozen
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from perdure.server.errors import error_response

COOKIE: Final = "perdure_session"
ADMIN: Final = frozenset({"admin"})
OPEN_PATHS: Final = frozenset({"/healthz"})

Via = Literal["header", "cookie", "query"]


@frozen
class Grant:
    """A caller that proved itself: how, and what it may do."""

    via: Via
    scopes: frozenset[str] = ADMIN

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison that also copes with non-ASCII input."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def cookie_value(token: str) -> str:
    """The page cookie: derived from the token, so the cookie itself is not the token."""
    return hmac.new(token.encode(), b"perdure page cookie v1", hashlib.sha256).hexdigest()


def _accepts_query_token(path: str) -> bool:
    # Only where a browser cannot send a header: the page load and EventSource.
    return path == "/" or path.endswith("/events")


class Authenticator:
    """Decides a request's grant from its credentials (pure; no I/O)."""

    def __init__(self, token: str) -> None:
        self.token = token
        # Every accepted token and its scopes; the page cookie stands for the admin token.
        self.tokens: Mapping[str, frozenset[str]] = {token: ADMIN}
        self.cookie = cookie_value(token)

    def _scopes(self, given: str) -> frozenset[str] | None:
        found = None
        for token, scopes in self.tokens.items():
            # Compare with every token (no early exit), so timing says nothing.
            if same_secret(given, token):
                found = scopes
        return found

    def grant(self, scope: Scope) -> Grant | None:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() == "bearer":
            scopes = self._scopes(given.strip())
            if scopes is not None:
                return Grant("header", scopes)
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and same_secret(value, self.cookie):
                return Grant("cookie", ADMIN)
        if _accepts_query_token(scope["path"]):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            for given in query.get("token", []):
                scopes = self._scopes(given)
                if scopes is not None:
                    return Grant("query", scopes)
        return None


def grant_of(request: Request) -> Grant:
    """The grant the middleware gave this request (routes behind it always have one)."""
    grant: Grant = request.scope["state"]["grant"]
    return grant


class AuthMiddleware:
    """Lets through only the requests the ``Authenticator`` grants (``/healthz`` always)."""

    def __init__(self, app: ASGIApp, auth: Authenticator, login_page: str) -> None:
        self.app = app
        self.auth = auth
        self.login_page = login_page

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        grant = self.auth.grant(scope)
        if grant is None:
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
        scope.setdefault("state", {})["grant"] = grant
        await self.app(scope, receive, send)
