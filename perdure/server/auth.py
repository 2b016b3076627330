"""Who may call the daemon: the one place where a request's credentials are decided.

``Authenticator.grant`` turns a request's credentials into a ``Grant`` (how the
caller proved itself, and what it may do) or None. The admin token may do
everything. A scoped session token (``perdure.server.tokens``: signed, for one
session, ``read`` or ``write``, with an expiry) gives a grant with its ``claim``:
the middleware lets it reach only that session's routes (``tokens.route_allowed``;
403 elsewhere), and a forged, expired or re-keyed one is a 401.

Credentials, in order: ``Authorization: Bearer <token>``; the page cookie (an HMAC
of the token, so the cookie is not the token; HttpOnly, SameSite=Strict); and
``?token=`` on the page and the API docs page (traded for the cookie) and on the
event streams (for clients without cookies: a browser's ``EventSource`` cannot set
a header). A
scoped token's page cookie is the token itself (``perdure_scoped``): it is already
limited, signed and expiring.
``/healthz`` needs nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from typing import Final, Literal
from urllib.parse import parse_qs

from attrs import frozen
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from perdure.server import tokens
from perdure.server.errors import error_response
from perdure.server.tokens import Claim, TokenRejected, TokenSigner

COOKIE: Final = "perdure_session"
SCOPED_COOKIE: Final = "perdure_scoped"
_STREAM_PATH: Final = re.compile(r"^/v1/sessions/[^/]+/(events|chat/[^/]+/stream)$")
ADMIN: Final = frozenset({"admin"})
OPEN_PATHS: Final = frozenset({"/healthz"})

Via = Literal["header", "cookie", "query"]


@frozen
class Grant:
    """A caller that proved itself: how, and what it may do."""

    via: Via
    scopes: frozenset[str] = ADMIN
    claim: Claim | None = None  # a scoped token's session, scope and expiry
    token: str | None = None  # the scoped token itself (for its page cookie)

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
    return path in ("/", "/docs") or _STREAM_PATH.match(path) is not None


class Authenticator:
    """Decides a request's grant from its credentials (pure; no I/O)."""

    def __init__(self, token: str, signer: TokenSigner | None = None) -> None:
        self.token = token
        # Without a key of its own, scoped tokens are signed with a key derived from
        # the admin token (tests and embedders; ``perdure serve`` always gives one).
        self.signer = signer or TokenSigner(
            hmac.new(token.encode(), b"perdure token key v1", hashlib.sha256).digest()
        )
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

    def _scoped(self, via: Via, given: str) -> Grant:
        """The grant of a scoped token; ``TokenRejected`` if forged or expired."""
        claim = self.signer.verify(given, time.time())
        return Grant(via, frozenset({claim.scope}), claim, given)

    def grant(self, scope: Scope) -> Grant | None:
        """The caller's grant, None without credentials; ``TokenRejected`` for a scoped
        token that is forged, expired or of the old format."""
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() == "bearer":
            # The admin token first: one chosen by hand may look like a JWT.
            scopes = self._scopes(given.strip())
            if scopes is not None:
                return Grant("header", scopes)
            if tokens.is_scoped(given.strip()):
                return self._scoped("header", given.strip())
        if _accepts_query_token(scope["path"]):
            # Before the cookies: a link with a token says who the page is for now.
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            for given in query.get("token", []):
                scopes = self._scopes(given)
                if scopes is not None:
                    return Grant("query", scopes)
                if tokens.is_scoped(given):
                    return self._scoped("query", given)
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and same_secret(value, self.cookie):
                return Grant("cookie", ADMIN)
            if name == SCOPED_COOKIE and tokens.is_scoped(value):
                return self._scoped("cookie", value)
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
        try:
            grant = self.auth.grant(scope)
        except TokenRejected as exc:
            await _unauthorized(f"scoped token rejected: {exc}")(scope, receive, send)
            return
        if grant is not None and grant.claim is not None:
            claim = grant.claim
            if not tokens.route_allowed(claim, scope["method"], scope["path"]):
                forbidden = error_response(
                    403,
                    "forbidden",
                    f"a {claim.scope} token of session {claim.session_id!r} "
                    f"does not open {scope['method']} {scope['path']}",
                )
                await forbidden(scope, receive, send)
                return
        if grant is None:
            response: Response
            if scope["path"] in ("/", "/docs") and scope["method"] == "GET":
                response = HTMLResponse(self.login_page, status_code=401)
            else:
                response = _unauthorized(
                    "missing or wrong token: send 'Authorization: Bearer <token>'"
                )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["grant"] = grant
        await self.app(scope, receive, send)


def _unauthorized(message: str) -> Response:
    return error_response(
        401, "unauthorized", message, headers={"WWW-Authenticate": 'Bearer realm="perdure"'}
    )
