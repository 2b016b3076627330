"""The one place a request's credentials are decided: ``perdure.server.auth``."""

from __future__ import annotations

from typing import Any

from perdure.server.auth import COOKIE, Authenticator, Grant, cookie_value

TOKEN = "s3cret-token"


def scope(
    path: str = "/v1/sessions", headers: dict[str, str] | None = None, query: str = ""
) -> Any:
    return {
        "type": "http",
        "path": path,
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }


def test_the_bearer_header_grants_admin_and_a_wrong_one_nothing() -> None:
    auth = Authenticator(TOKEN)
    assert auth.grant(scope(headers={"Authorization": f"Bearer {TOKEN}"})) == Grant("header")
    assert auth.grant(scope(headers={"Authorization": f"bearer  {TOKEN} "})) == Grant("header")
    assert auth.grant(scope(headers={"Authorization": "Bearer nope"})) is None
    assert auth.grant(scope(headers={"Authorization": f"Basic {TOKEN}"})) is None
    assert auth.grant(scope(headers={"Authorization": "Bearer ünïcode"})) is None
    assert auth.grant(scope()) is None


def test_the_cookie_is_derived_from_the_token_and_is_not_the_token() -> None:
    auth = Authenticator(TOKEN)
    good = {"Cookie": f"other=1; {COOKIE}={cookie_value(TOKEN)}"}
    assert auth.grant(scope(headers=good)) == Grant("cookie")
    assert auth.grant(scope(headers={"Cookie": f"{COOKIE}={TOKEN}"})) is None
    assert cookie_value(TOKEN) != cookie_value("another token")


def test_a_query_token_counts_only_where_a_browser_cannot_send_a_header() -> None:
    auth = Authenticator(TOKEN)
    assert auth.grant(scope("/", query=f"token={TOKEN}")) == Grant("query")
    assert auth.grant(scope("/v1/sessions/s1/events", query=f"token={TOKEN}")) == Grant("query")
    assert auth.grant(scope("/v1/sessions", query=f"token={TOKEN}")) is None
    assert auth.grant(scope("/", query="token=wrong")) is None


def test_a_scoped_token_is_one_more_row() -> None:
    auth = Authenticator(TOKEN)
    auth.tokens = {**auth.tokens, "reader": frozenset({"read"})}
    grant = auth.grant(scope(headers={"Authorization": "Bearer reader"}))
    assert grant is not None and grant.allows("read") and not grant.allows("write")
    admin = auth.grant(scope(headers={"Authorization": f"Bearer {TOKEN}"}))
    assert admin is not None and admin.allows("write")
