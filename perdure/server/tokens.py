"""Scoped session tokens: what the admin token hands to a browser.

A scoped token names one session, a scope (``read``: look; ``write``: also send
input and answer approvals) and an expiry, and is signed with HMAC-SHA256 under
the daemon's *token key*. Nothing about it is stored: the daemon checks the
signature and the expiry on every request, so rotating the key (replacing the
key file, or giving another key) revokes every token minted under the old one.

Shape: ``pdt1.<payload>.<signature>``, both base64url without padding; the payload
is compact JSON ``{"s": session, "c": scope, "e": expires_at, "n": nonce}``.

The key comes from ``--token-key-file`` or ``PERDURE_TOKEN_KEY`` if given, else
from ``token.key`` in an LMDB log's directory (generated with mode 0600 on first
use, like the admin token). A PostgreSQL log has no directory: without a given
key, the key is derived from the admin token (so every node agrees, and rotating
the admin token revokes the scoped ones too).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal

from attrs import frozen

from perdure._setup import SetupError
from perdure.storage import is_postgres

PREFIX: Final = "pdt1."
KEY_FILE: Final = "token.key"
MAX_TTL: Final = 30 * 24 * 3600  # a month: a browser token is not a service account
Scope = Literal["read", "write"]
SCOPES: Final[dict[str, Scope]] = {"read": "read", "write": "write"}


class TokenRejected(Exception):
    """A scoped token that is malformed, forged (wrong signature) or expired."""


@frozen
class Claim:
    """What a verified scoped token says: its session, scope and expiry."""

    session_id: str
    scope: Scope
    expires_at: int

    def allows(self, session_id: str, write: bool) -> bool:
        return session_id == self.session_id and (self.scope == "write" or not write)


def is_scoped(token: str) -> bool:
    return token.startswith(PREFIX)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Mints and verifies scoped tokens under one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a token key must be at least 16 bytes")
        self._key = key

    def _sign(self, payload: str) -> str:
        mac = hmac.new(self._key, b"perdure scoped token v1\0" + payload.encode(), hashlib.sha256)
        return _b64(mac.digest())

    def mint(self, session_id: str, scope: Scope, ttl_s: int, now: float) -> tuple[str, int]:
        """``(token, expires_at)``; ``expires_at`` in whole seconds since the epoch."""
        expires_at = int(now) + ttl_s
        body = {"s": session_id, "c": scope, "e": expires_at, "n": secrets.token_hex(8)}
        payload = _b64(json.dumps(body, separators=(",", ":")).encode())
        return f"{PREFIX}{payload}.{self._sign(payload)}", expires_at

    def verify(self, token: str, now: float) -> Claim:
        """The claim of a genuine, unexpired token; ``TokenRejected`` otherwise."""
        if not is_scoped(token):
            raise TokenRejected("not a scoped token")
        payload, sep, signature = token[len(PREFIX) :].partition(".")
        if not sep or not hmac.compare_digest(
            signature.encode("utf-8", "replace"), self._sign(payload).encode()
        ):
            raise TokenRejected("the token's signature is wrong (forged, or the key was rotated)")
        try:
            body = json.loads(_unb64(payload))
            claim = Claim(str(body["s"]), SCOPES[body["c"]], int(body["e"]))
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise TokenRejected("the token's payload is malformed") from None
        if now >= claim.expires_at:
            raise TokenRejected("the token has expired")
        return claim


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
