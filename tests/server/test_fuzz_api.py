"""Arbitrary payloads against a real daemon: only documented errors, never a 500.

Hypothesis throws raw bytes, arbitrary JSON, objects with the right field names
holding the wrong types, and strange path segments and headers at every write
route and at the event stream. Every answer must be one of the documented
statuses with a JSON error body, and the daemon must keep serving.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.daemon import Daemon
from tests.support.stats import record_stat

DOCUMENTED = {200, 201, 202, 400, 401, 404, 405, 409, 413, 423}
ROUTES = [
    "/v1/sessions",
    "/v1/sessions/{sid}/messages",
    "/v1/sessions/{sid}/cancel",
    "/v1/sessions/{sid}/approvals/{call}",
    "/v1/sessions/{sid}/revisions",
    "/v1/sessions/{sid}/pause",
    "/v1/sessions/{sid}/resume",
    "/v1/sessions/{sid}/compensations/{call}",
    "/v1/sessions/{sid}/tokens",
    "/v1/sessions/{sid}/chat",
    "/v1/sessions/{sid}/ag-ui",
]
FIELDS = [
    "text",
    "request_id",
    "approved",
    "note",
    "session_id",
    "system",
    "scope",
    "ttl_s",
    "id",
    "messages",
    "threadId",
    "runId",
    "resume",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5).map(
        lambda v: json.dumps(v).encode()
    ),
)
segments = st.one_of(
    st.just("fuzz"), st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s)
)

_sent = {"requests": 0}


def _assert_documented(resp: httpx.Response) -> None:
    assert resp.status_code in DOCUMENTED, (resp.status_code, resp.text)
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert error["code"]
        assert error["message"]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=st.sampled_from(ROUTES), sid=segments, call=segments, body=bodies)
def test_write_routes_answer_only_documented_errors(
    api_daemon: Daemon, route: str, sid: str, call: str, body: bytes
) -> None:
    path = route.format(sid=quote(sid, safe=""), call=quote(call, safe=""))
    resp = httpx.post(
        api_daemon.url + path,
        content=body,
        headers={**api_daemon.headers(), "Content-Type": "application/json"},
        timeout=10,
    )
    _sent["requests"] += 1
    _assert_documented(resp)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(last=st.text(max_size=12), after=st.text(max_size=12))
def test_event_stream_cursor_is_validated(api_daemon: Daemon, last: str, after: str) -> None:
    headers: dict[str, Any] = {**api_daemon.headers()}
    if last and last == last.strip() and last.isprintable() and last.isascii():
        headers["Last-Event-ID"] = last  # (what an HTTP client can send at all)
    resp = httpx.get(
        api_daemon.url + "/v1/sessions/fuzz/events",
        params={"after": after, "live": "0"},
        headers=headers,
        timeout=10,
    )
    _sent["requests"] += 1
    _assert_documented(resp)


def test_the_daemon_still_serves_after_the_fuzzing(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/v1/sessions").status_code == 200


def teardown_module() -> None:
    record_stat("http_fuzz", requests=_sent["requests"])
