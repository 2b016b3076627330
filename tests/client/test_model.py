"""The clients' shared model without a daemon: error mapping, SSE parsing, retries."""

from __future__ import annotations

import json

import pytest
import trio
from starlette.routing import Route

import perdure
from perdure.client import _model as m
from perdure.client import errors
from perdure.server.app import create_app


@pytest.mark.parametrize(
    ("status", "code", "kind", "also"),
    [
        (404, "not_found", errors.NotFound, perdure.Refused),
        (409, "conflict", errors.Conflict, perdure.Refused),
        (409, "invalid_state", errors.InvalidState, perdure.Refused),
        (409, "not_owner", errors.NotOwner, perdure.NotOwnerRefused),
        (409, "busy", errors.Busy, perdure.Refused),
        (423, "parked", errors.Parked, perdure.SessionParkedError),
        (401, "unauthorized", errors.Unauthorized, errors.DaemonError),
        (403, "forbidden", errors.Forbidden, errors.DaemonError),
        (413, "too_large", errors.TooLarge, errors.DaemonError),
        (400, "invalid_field", errors.BadRequest, ValueError),
        (503, "session_restarting", errors.Restarting, perdure.SessionRestarting),
        (503, "log_unavailable", errors.LogUnavailable, perdure.LogUnavailable),
        (500, "corrupt_record", errors.CorruptRecord, perdure.CorruptRecord),
        (500, "internal", errors.ServerError, errors.DaemonError),
        (502, "http_502", errors.ServerError, errors.DaemonError),
        (405, "method_not_allowed", errors.BadRequest, errors.DaemonError),
    ],
)
def test_error_codes_map_to_the_runtime_types(
    status: int, code: str, kind: type[Exception], also: type[Exception]
) -> None:
    body = {"error": {"code": code, "message": "why", "field": "text"}}
    error = errors.error_from(status, body)
    assert type(error) is kind and isinstance(error, also)
    assert (error.status, error.code, error.message, error.field) == (status, code, "why", "text")
    if isinstance(error, perdure.Refused):
        assert error.code == code
    retryable = kind in (errors.Restarting, errors.LogUnavailable, errors.ServerError)
    assert error.retryable is retryable


def test_an_error_answer_that_is_not_the_daemons_shape_still_has_a_type() -> None:
    error = errors.error_from(502, None)
    assert isinstance(error, errors.ServerError) and error.code == "http_502"
    assert isinstance(errors.error_from(404, "<html>"), errors.NotFound)
    call = m.state("s1")
    with pytest.raises(errors.ProtocolError):
        call.answer(200, b"not json")
    with pytest.raises(errors.ProtocolError):
        call.answer(200, b'{"unexpected": true}')


def feed(follower: m.Follower, text: str) -> list[m.StreamEvent]:
    events = []
    for line in text.split("\n"):
        event = follower.line(line)
        if event is not None:
            events.append(event)
    return events


def test_the_follower_parses_frames_and_drops_what_it_has_seen() -> None:
    follower = m.Follower("s1", after=3, live=True)
    stream = (
        "retry: 1000\n: after 3\n\n"
        'id: 3\nevent: InputAccepted\ndata: {"seq":3,"type":"InputAccepted",'
        '"session_id":"s1","record":{}}\n\n'
        'id: 4\nevent: RunStarted\ndata: {"seq":4,"type":"RunStarted",\n'
        'data: "session_id":"s1","record":{"run_id":"r"}}\n\n'
        ": keepalive\n\n"
        'event: text_delta\ndata: {"type":"text_delta","session_id":"s1","data":{"text":"hi"}}\n\n'
    )
    events = feed(follower, stream)
    assert events == [
        m.RecordEvent(4, "RunStarted", "s1", {"run_id": "r"}),
        m.EphemeralEvent("text_delta", "s1", {"text": "hi"}),
    ]
    assert follower.last == 4 and follower.retry_ms == 1000
    assert follower.headers()["Last-Event-ID"] == "4"
    # A reconnection that replays seq 4 again yields nothing new.
    follower.opened(200, None)
    again = (
        'id: 4\nevent: RunStarted\ndata: {"seq":4,"type":"RunStarted","session_id":"s1",'
        '"record":{}}\n\n'
    )
    assert feed(follower, again) == []
    with pytest.raises(errors.ProtocolError):
        feed(follower, "id: 5\ndata: {broken\n\n")
    with pytest.raises(errors.NotFound):
        follower.opened(404, b'{"error": {"code": "not_found", "message": "no session"}}')


def test_attempts_back_off_and_give_up_on_time_or_on_a_final_error() -> None:
    attempts = m.Attempts(m.Retry(timeout=60.0, base=0.1, cap=0.4))
    unavailable = errors.Unavailable(0, "unreachable", "down")
    delays = [attempts.after(unavailable) for _ in range(5)]
    assert all(0 < d <= 0.4 for d in delays) and delays[-1] > 0.1
    with pytest.raises(errors.Conflict):
        attempts.after(errors.Conflict(409, "conflict", "no"))
    never = m.Attempts(m.Retry(timeout=0))
    with pytest.raises(errors.Unavailable):
        never.after(unavailable)


def test_commands_carry_a_request_id_and_sessions_an_id_of_their_own() -> None:
    first, second = m.submit("s1", "hi", None), m.submit("s1", "hi", None)
    assert first.body is not None and second.body is not None
    assert first.body["request_id"] != second.body["request_id"]
    assert m.submit("s1", "hi", "mine").body == {"text": "hi", "request_id": "mine"}
    created = m.create_session(None, None).body
    assert created is not None and created["session_id"].startswith("s-")
    assert m.approve("a/b", "c d", True, "r", "").path == "/v1/sessions/a%2Fb/approvals/c%20d"


# Routes of the daemon that are not the client's: the page, its files, the frontend
# protocols (their own SDKs speak them) and the Prometheus scrape.
_NOT_THE_CLIENTS = {"/", "/static/{name}", "/metrics", "/openapi.json", "/docs", "/docs/{name}"}
_FRONTEND_SUFFIXES = ("/chat", "/chat/{chat_id}/stream", "/ag-ui")


def test_every_v1_route_of_the_daemon_has_a_client_call() -> None:
    app = create_app(None, token="t", closing=trio.Event())  # type: ignore[arg-type]
    routes = {
        (method, route.path)
        for route in app.app.routes  # type: ignore[attr-defined]
        if isinstance(route, Route)
        and route.path not in _NOT_THE_CLIENTS
        and not route.path.endswith(_FRONTEND_SUFFIXES)
        for method in (route.methods or ()) - {"HEAD"}
    }
    sid, call = "{session_id}", "{call_id}"
    calls = [
        m.health(),
        m.stats(),
        m.whoami(),
        m.sessions(),
        m.create_session(None, None),
        m.state(sid),
        m.delete_session(sid),
        m.transcript(sid),
        m.submit(sid, "hi", None),
        m.cancel(sid, None),
        m.fork(sid, None, None, None),
        m.approve(sid, call, True, None, ""),
        m.revise(sid, "x", None),
        m.pause(sid, None),
        m.resume(sid, None),
        m.compact_context(sid, None),
        m.compensate(sid, call, None),
        m.resolve(sid, call, "skip", None, None),
        m.mint_token(sid, "read", 60),
    ]
    covered = {(c.method, c.path.replace("%7B", "{").replace("%7D", "}")) for c in calls}
    covered.add(("GET", m.Follower(sid, 0, True).path.replace("%7B", "{").replace("%7D", "}")))
    assert routes - covered == set(), "daemon routes without a client call"
    assert covered - routes == set(), "client calls to routes the daemon does not have"


def test_new_commands_send_what_the_daemon_reads() -> None:
    sub = m.submit(
        "s 1", "hi", "r1", if_busy="steer", traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    )
    assert sub.path == "/v1/sessions/s%201/messages"
    assert sub.body == {"text": "hi", "request_id": "r1", "if_busy": "steer"}
    assert sub.headers == {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    plain = m.submit("s", "hi", None)
    assert plain.headers is None and "if_busy" not in (plain.body or {})
    answer = {"submission_id": "sub", "seq": 7, "duplicate": False, "disposition": "interrupted"}
    assert sub.answer(202, json.dumps(answer).encode()) == perdure.Accepted(
        "sub", 7, False, "interrupted"
    )
    fork = m.fork("src", 12, "dst", "rf")
    assert (fork.method, fork.path) == ("POST", "/v1/sessions/src/forks")
    assert fork.body == {"request_id": "rf", "at": 12, "session_id": "dst"}
    got = fork.answer(
        201, b'{"session_id": "dst", "source": "src", "position": 12, "duplicate": false}'
    )
    assert got == perdure.Forked("dst", "src", 12, duplicate=False)
    with pytest.raises(ValueError, match="at must be"):
        m.fork("src", True, None, None)
    created = m.create_session("s", None, "reject")
    assert created.body == {"session_id": "s", "if_busy": "reject"}
    token = m.mint_token("s", "write", 90)
    assert token.body == {"scope": "write", "ttl_s": 90} and token.ok == (201,)
