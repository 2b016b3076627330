"""Raw bytes against a real daemon: only documented errors, never a 500.

What schemathesis cannot send (``test_schemathesis`` covers every schema-shaped
input, path segment, parameter and header from the OpenAPI document): bodies that
are not JSON at all, not UTF-8, or cut short, at every write route. Every answer
must be one of the documented statuses with a JSON error body, and the daemon must
keep serving.
"""

from __future__ import annotations

import json
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
# Bytes, and JSON documents cut short (the shape a dropped connection leaves).
bodies = st.one_of(
    st.binary(max_size=200),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5).flatmap(
        lambda v: st.integers(1, max(1, len(json.dumps(v)) - 1)).map(
            lambda cut: json.dumps(v).encode()[:cut]
        )
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
    max_examples=150,
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


def test_the_daemon_still_serves_after_the_fuzzing(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/v1/sessions").status_code == 200


def teardown_module() -> None:
    record_stat("http_fuzz", requests=_sent["requests"])
