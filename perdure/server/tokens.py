"""Scoped session tokens: what the admin token hands to a browser.

A scoped token names one session, a scope (``read``: look; ``write``: also send
input and answer approvals) and an expiry. It is a JSON Web Token (RFC 7519),
HS256-signed with PyJWT under the daemon's *token key*, with the claims ``sub``
(the session), ``scope``, ``exp`` and ``iat`` (seconds since the epoch), ``aud``
(``perdure-session``, so no other JWT signed with the same key passes for one) and
``jti`` (a nonce). Nothing about it is stored: the daemon checks the signature, the
audience and the expiry on every request, so rotating the key (replacing the key
file, or giving another key) revokes every token minted under the old one.

Why a JWT rather than an itsdangerous token: a frontend, in whatever language,
can read a JWT's claims with any JWT library (to show its scope, or to mint a new
one before ``exp``) and an operator can inspect one with common tools; the format
and its checks are a published standard instead of a Python library's own. The
tokens of the earlier ``pdt1.`` format are refused with a message saying to mint a
new one.

The key comes from ``--token-key-file`` or ``PERDURE_TOKEN_KEY`` if given, else
from ``token.key`` in an LMDB log's directory (generated with mode 0600 on first
use, like the admin token). A PostgreSQL log has no directory: without a given
key, the key is derived from the admin token (so every node agrees, and rotating
the admin token revokes the scoped ones too).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from attrs import frozen

from perdure._setup import SetupError
from perdure.storage import is_postgres

OLD_PREFIX: Final = "pdt1."
AUDIENCE: Final = "perdure-session"
ALGORITHM: Final = "HS256"
KEY_FILE: Final = "token.key"
MAX_TTL: Final = 30 * 24 * 3600  # a month: a browser token is not a service account
Scope = Literal["read", "write"]
SCOPES: Final[dict[str, Scope]] = {"read": "read", "write": "write"}
# A JWS in compact form: three base64url parts (an admin token has no dots).
_JWT_SHAPE: Final = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")


class TokenRejected(Exception):
    """A scoped token that is malformed, forged (wrong signature), expired or outdated."""


@frozen
class Claim:
    """What a verified scoped token says: its session, scope and expiry."""

    session_id: str
    scope: Scope
    expires_at: int

    def allows(self, session_id: str, write: bool) -> bool:
        return session_id == self.session_id and (self.scope == "write" or not write)


def is_scoped(token: str) -> bool:
    """Whether ``token`` has the shape of a scoped token (of this or the old format)."""
    return token.startswith(OLD_PREFIX) or _JWT_SHAPE.match(token) is not None


class TokenSigner:
    """Mints and verifies scoped tokens under one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a token key must be at least 16 bytes")
        # The signing key proper: 32 bytes (what HS256 asks for) derived from the key
        # material, whatever its length, and used for nothing but these tokens.
        self._key = hmac.new(key, b"perdure scoped token (JWT)", hashlib.sha256).digest()

    def mint(self, session_id: str, scope: Scope, ttl_s: int, now: float) -> tuple[str, int]:
        """``(token, expires_at)``; ``expires_at`` in whole seconds since the epoch."""
        import jwt  # PyJWT, imported when a daemon first needs it

        expires_at = int(now) + ttl_s
        claims = {
            "sub": session_id,
            "scope": scope,
            "aud": AUDIENCE,
            "iat": int(now),
            "exp": expires_at,
            "jti": secrets.token_hex(8),
        }
        return jwt.encode(claims, self._key, algorithm=ALGORITHM), expires_at

    def verify(self, token: str, now: float) -> Claim:
        """The claim of a genuine, unexpired token; ``TokenRejected`` otherwise."""
        import jwt

        if token.startswith(OLD_PREFIX):
            raise TokenRejected(
                "this is a token of the old pdt1 format, which is no longer accepted: "
                "mint a new one (POST /v1/sessions/{session_id}/tokens)"
            )
        try:
            # Expiry is checked below against ``now``, so one clock decides everywhere.
            body: dict[str, Any] = jwt.decode(
                token,
                self._key,
                algorithms=[ALGORITHM],
                audience=AUDIENCE,
                options={"require": ["sub", "scope", "exp", "aud"], "verify_exp": False},
            )
        except jwt.InvalidSignatureError:
            raise TokenRejected(
                "the token's signature is wrong (forged, or the key was rotated)"
            ) from None
        except jwt.InvalidTokenError as exc:
            raise TokenRejected(f"the token is malformed: {exc}") from None
        scope = SCOPES.get(body["scope"]) if isinstance(body["scope"], str) else None
        expires_at = body["exp"]
        if (
            scope is None
            or not isinstance(body["sub"], str)
            or isinstance(expires_at, bool)
            or not isinstance(expires_at, int)
        ):
            raise TokenRejected("the token's claims are malformed")
        if now >= expires_at:
            raise TokenRejected("the token has expired")
        return Claim(body["sub"], scope, expires_at)


def resolve_token_key(
    log: str | Path, key_file: Path | None, env: Mapping[str, str], admin_token: str
) -> tuple[bytes, str]:
    """``(key, where it came from)``. Blocking file I/O: call before the trio loop."""
    if key_file is not None:
        try:
            text = key_file.read_text().strip()
        except OSError as exc:
            raise SetupError(f"cannot read --token-key-file {key_file}: {exc}") from None
        if len(text) < 16:
            raise SetupError(f"--token-key-file {key_file} must hold at least 16 characters")
        return text.encode(), f"--token-key-file {key_file}"
    if env.get("PERDURE_TOKEN_KEY"):
        text = env["PERDURE_TOKEN_KEY"].strip()
        if len(text) < 16:
            raise SetupError("PERDURE_TOKEN_KEY must be at least 16 characters")
        return text.encode(), "PERDURE_TOKEN_KEY"
    if is_postgres(log):
        derived = hmac.new(admin_token.encode(), b"perdure token key v1", hashlib.sha256).digest()
        return derived, "derived from the admin token"
    path = Path(log) / KEY_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    if len(text) >= 16:
        os.chmod(path, 0o600)
        return text.encode(), str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)
    return text.encode(), f"{path} (generated)"


def route_allowed(claim: Claim, method: str, path: str) -> bool:
    """Whether a scoped token opens ``method path``: the page, ``/v1/whoami``, and its
    own session's routes (reading with any scope; the rest with ``write``). Minting
    tokens, listing or creating sessions and the operator's routes need the admin
    token."""
    if method in ("GET", "HEAD") and (
        path in ("/", "/openapi.json", "/docs") or path.startswith(("/static/", "/docs/"))
    ):
        return True
    if path == "/v1/whoami":
        return True
    parts = path.split("/")
    if len(parts) < 4 or parts[:3] != ["", "v1", "sessions"] or parts[3] != claim.session_id:
        return False
    if len(parts) >= 5 and parts[4] == "tokens":
        return False
    return claim.allows(claim.session_id, write=method not in ("GET", "HEAD"))
