"""Scoped session tokens against a real daemon: every route with every kind of token.

The admin token mints tokens for one session (``read`` or ``write``); such a token
reaches only that session's routes (403 elsewhere), and an expired, forged or
re-keyed one is a 401. The key lives in the log directory: replacing it revokes
every token minted under the old one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from perdure.server.tokens import KEY_FILE, Claim, TokenRejected, TokenSigner, is_scoped
from tests.server.conftest import APPROVAL_SCRIPT
from tests.support.daemon import Daemon

SID = "alpha"
OTHER = "beta"

ROUTES: list[tuple[str, str, dict[str, Any] | None, bool]] = [
    # (method, path, body, opened by a read token of SID)
    ("GET", f"/v1/sessions/{SID}", None, True),
    ("GET", f"/v1/sessions/{SID}/transcript", None, True),
    ("GET", f"/v1/sessions/{SID}/events?live=0", None, True),
    ("GET", f"/v1/sessions/{SID}/events?live=0&format=ai-sdk", None, True),
    ("GET", f"/v1/sessions/{SID}/events?live=0&format=ag-ui", None, True),
    ("GET", f"/v1/sessions/{SID}/chat/{SID}/stream", None, True),
    ("POST", f"/v1/sessions/{SID}/messages", {"text": "hi", "request_id": "tok-1"}, False),
    ("POST", f"/v1/sessions/{SID}/cancel", {"request_id": "tok-2"}, False),
    ("POST", f"/v1/sessions/{SID}/approvals/nope", {"approved": True, "request_id": "t3"}, False),
    ("POST", f"/v1/sessions/{SID}/revisions", {"text": "again", "request_id": "tok-4"}, False),
    ("POST", f"/v1/sessions/{SID}/pause", {"request_id": "tok-5"}, False),
    ("POST", f"/v1/sessions/{SID}/resume", {"request_id": "tok-6"}, False),
    ("POST", f"/v1/sessions/{SID}/compensations/nope", {"request_id": "tok-7"}, False),
    ("POST", f"/v1/sessions/{SID}/calls/nope/resolution", {"action": "skip"}, False),
    ("POST", f"/v1/sessions/{SID}/chat", {"messages": []}, False),
    ("POST", f"/v1/sessions/{SID}/ag-ui", {"threadId": SID}, False),
]
ADMIN_ONLY: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/sessions", None),
    ("POST", "/v1/sessions", {}),
    ("GET", "/v1/stats", None),
    ("POST", f"/v1/sessions/{SID}/tokens", {"scope": "read"}),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("tokens"), APPROVAL_SCRIPT).start()
    with d.client() as c:
        for sid in (SID, OTHER):
            assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    yield d
    d.close()


def mint(d: Daemon, sid: str, scope: str, ttl_s: int = 600) -> str:
    with d.client() as c:
        resp = c.post(f"/v1/sessions/{sid}/tokens", json={"scope": scope, "ttl_s": ttl_s})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["session_id"] == sid and body["scope"] == scope
    assert isinstance(body["expires_at"], int)
    token: str = body["token"]
    return token


def call(d: Daemon, token: str, method: str, path: str, body: dict[str, Any] | None) -> int:
    with httpx.Client(base_url=d.url, timeout=30) as c:
        resp = c.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})
    if resp.status_code in (401, 403):
        assert resp.json()["error"]["code"] in ("unauthorized", "forbidden")
    return resp.status_code


def test_every_route_with_every_kind_of_token(daemon: Daemon) -> None:
    read, write = mint(daemon, SID, "read"), mint(daemon, SID, "write")
    other = mint(daemon, OTHER, "write")
    key = (daemon.log / KEY_FILE).read_text().strip().encode()
    expired, _ = TokenSigner(key).mint(SID, "write", 60, time.time() - 3600)
    forged = write[:-2] + ("AA" if not write.endswith("AA") else "BB")
    foreign, _ = TokenSigner(b"another key, not the daemon's").mint(SID, "write", 600, time.time())
    for method, path, body, readable in ROUTES:
        got = call(daemon, read, method, path, body)
        assert (got not in (401, 403)) if readable else got == 403, (method, path, got)
        got = call(daemon, write, method, path, body)
        assert got not in (401, 403), (method, path, got)
        assert call(daemon, other, method, path, body) == 403, (method, path)
        for bad in (expired, forged, foreign):
            assert call(daemon, bad, method, path, body) == 401, (method, path)
        with daemon.client() as c:  # and the admin token still opens everything
            assert c.request(method, path, json=body).status_code not in (401, 403)
    for method, path, body in ADMIN_ONLY:
        for token in (read, write, other):
            assert call(daemon, token, method, path, body) == 403, (method, path)
        for bad in (expired, forged):
            assert call(daemon, bad, method, path, body) == 401, (method, path)


def test_whoami_the_page_cookie_and_the_stream_query(daemon: Daemon) -> None:
    read = mint(daemon, SID, "read")
    with httpx.Client(base_url=daemon.url, timeout=30) as c:
        resp = c.get(f"/?token={read}", follow_redirects=False)
        assert resp.status_code == 303 and resp.headers["location"] == "/"
        assert "perdure_scoped" in resp.cookies
        assert c.get("/").status_code == 200  # the page, by the cookie alone
        me = c.get("/v1/whoami").json()
        assert me == {"scope": "read", "session_id": SID, "expires_at": me["expires_at"]}
        assert c.get("/v1/sessions").status_code == 403
        assert c.get(f"/v1/sessions/{OTHER}").status_code == 403
    # A browser's EventSource cannot set a header: the token may ride in the query.
    with httpx.Client(base_url=daemon.url, timeout=30) as c:
        assert c.get(f"/v1/sessions/{SID}/events?live=0&token={read}").status_code == 200
        assert c.get(f"/v1/sessions/{OTHER}/events?live=0&token={read}").status_code == 403
        assert c.get(f"/v1/sessions/{SID}?token={read}").status_code == 401  # not there
    with daemon.client() as c:
        assert c.get("/v1/whoami").json()["scope"] == "admin"


def test_minting_rejects_bad_requests(daemon: Daemon) -> None:
    with daemon.client() as c:
        for body, field in (
            ({"scope": "admin"}, "scope"),
            ({}, "scope"),
            ({"scope": "read", "ttl_s": 0}, "ttl_s"),
            ({"scope": "read", "ttl_s": "60"}, "ttl_s"),
            ({"scope": "read", "ttl_s": 10**9}, "ttl_s"),
        ):
            resp = c.post(f"/v1/sessions/{SID}/tokens", json=body)
            assert resp.status_code == 400 and resp.json()["error"]["field"] == field
        assert c.post("/v1/sessions/nobody/tokens", json={"scope": "read"}).status_code == 404


def test_rotating_the_key_revokes_every_token(make_daemon: Any) -> None:
    d: Daemon = make_daemon(APPROVAL_SCRIPT).start()
    with d.client() as c:
        assert c.post("/v1/sessions", json={"session_id": SID}).status_code == 201
    token = mint(d, SID, "read")
    assert call(d, token, "GET", f"/v1/sessions/{SID}", None) == 200
    d.stop()
    (d.log / KEY_FILE).write_text("a brand new key of enough length\n")
    d.start()
    assert call(d, token, "GET", f"/v1/sessions/{SID}", None) == 401
    fresh = mint(d, SID, "read")
    assert call(d, fresh, "GET", f"/v1/sessions/{SID}", None) == 200


# -- the token format: a standard JWT ------------------------------------------------------


def test_a_scoped_token_is_a_jwt_that_any_jwt_library_reads() -> None:
    import jwt

    signer = TokenSigner(b"sixteen bytes at least")
    token, expires_at = signer.mint(SID, "write", 600, 1_000_000.0)
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["sub"] == SID and claims["scope"] == "write"
    assert claims["exp"] == expires_at == 1_000_600 and claims["iat"] == 1_000_000
    assert claims["aud"] == "perdure-session"
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    assert signer.verify(token, 1_000_599.0) == Claim(SID, "write", 1_000_600)
    with pytest.raises(TokenRejected, match="expired"):
        signer.verify(token, 1_000_600.0)


def test_tokens_that_are_not_ours_are_refused_saying_why() -> None:
    import jwt

    material = b"sixteen bytes at least"
    signer = TokenSigner(material)
    key = signer._key  # the derived HS256 key, to forge tokens that are signed right
    exp = int(time.time()) + 600
    base = {"sub": SID, "scope": "read", "aud": "perdure-session", "exp": exp}
    cases = {
        "audience": jwt.encode({**base, "aud": "someone-else"}, key, algorithm="HS256"),
        "scope": jwt.encode({**base, "scope": "admin"}, key, algorithm="HS256"),
        "sub": jwt.encode({k: v for k, v in base.items() if k != "sub"}, key, algorithm="HS256"),
        "signature": jwt.encode(base, b"another key of thirty-two bytes!", algorithm="HS256"),
        "none": jwt.encode(base, None, algorithm="none"),
    }
    for what, token in cases.items():
        with pytest.raises(TokenRejected) as refused:
            signer.verify(token, time.time())
        assert str(refused.value), what
    with pytest.raises(TokenRejected, match="signature is wrong"):
        signer.verify(cases["signature"], time.time())


def test_an_old_pdt1_token_is_refused_with_a_clear_error(daemon: Daemon) -> None:
    old = "pdt1.eyJzIjoiYWxwaGEiLCJjIjoid3JpdGUiLCJlIjo5OTk5OTk5OTk5LCJuIjoiMDAifQ.c2ln"
    assert is_scoped(old)
    with httpx.Client(base_url=daemon.url, timeout=30) as c:
        resp = c.get(f"/v1/sessions/{SID}", headers={"Authorization": f"Bearer {old}"})
    assert resp.status_code == 401
    message = resp.json()["error"]["message"]
    assert "old pdt1 format" in message and "mint a new one" in message
