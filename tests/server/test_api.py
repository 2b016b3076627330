"""Every endpoint and every error status, against one real daemon (the approval script)."""

from __future__ import annotations

import itertools
import json
import time
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from tests.server.conftest import APPROVAL_SCRIPT
from tests.support.daemon import Daemon, Stream, awaiting_approval, follow, idle, wait_for
from tests.support.ledger_tools import effects

_ids = itertools.count(1)


def new_session(c: httpx.Client, **body: Any) -> str:
    resp = c.post("/v1/sessions", json=body)
    assert resp.status_code == 201, resp.text
    sid: str = resp.json()["session_id"]
    return sid


def submit(c: httpx.Client, sid: str, text: str = "deploy the site", rid: str | None = None) -> Any:
    resp = c.post(
        f"/v1/sessions/{sid}/messages", json={"text": text, "request_id": rid or f"r{next(_ids)}"}
    )
    assert resp.status_code == 202, resp.text
    return resp.json()


def assert_error(resp: httpx.Response, status: int, code: str, field: str | None = None) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code, error
    assert error["message"]
    if field is not None:
        assert error["field"] == field
        assert field in error["message"]


# -- auth ------------------------------------------------------------------------------


def test_healthz_needs_no_token(api_daemon: Daemon) -> None:
    resp = httpx.get(api_daemon.url + "/healthz")
    assert resp.status_code == 200
    assert resp.json()["status"] == "ok"


def test_requests_without_or_with_a_wrong_token_are_refused(api_daemon: Daemon) -> None:
    url = api_daemon.url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
        for method, path in (
            ("GET", "/v1/sessions"),
            ("POST", "/v1/sessions"),
            ("GET", "/v1/sessions/x/events"),
            ("GET", "/static/app.js"),
        ):
            resp = httpx.request(method, url + path, headers=headers, json={})
            assert_error(resp, 401, "unauthorized")
            assert resp.headers["www-authenticate"].startswith("Bearer")
    # A token in the query string is only for the page and the event stream.
    resp = httpx.get(url + "/v1/sessions", params={"token": api_daemon.token})
    assert_error(resp, 401, "unauthorized")
    assert httpx.get(url + "/v1/sessions", cookies={"perdure_session": "forged"}).status_code == 401
    # Non-ASCII garbage is refused, not a crash.
    bad = httpx.get(url + "/v1/sessions", headers={"Authorization": "Bearer é".encode()})
    assert bad.status_code == 401


def test_the_page_trades_the_token_for_a_cookie(api_daemon: Daemon) -> None:
    url = api_daemon.url
    login = httpx.get(url + "/")
    assert login.status_code == 401
    assert "token" in login.text and "<form" in login.text
    with httpx.Client(base_url=url) as browser:
        resp = browser.get("/", params={"token": api_daemon.token})
        assert resp.status_code == 303 and resp.headers["location"] == "/"
        cookie = resp.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert api_daemon.token not in cookie  # the cookie is derived, not the token
        page = browser.get("/")
        assert page.status_code == 200 and "<script" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert browser.get("/static/app.js").status_code == 200
        assert browser.get("/static/style.css").headers["content-type"].startswith("text/css")
        assert browser.get("/v1/sessions").status_code == 200
        assert_error(browser.get("/static/nope.js"), 404, "not_found")


# -- sessions --------------------------------------------------------------------------


def test_create_list_and_get_sessions(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        generated = new_session(c)
        assert generated.startswith("s-")
        resp = c.post("/v1/sessions", json={"session_id": "named-1", "system": "be brief"})
        assert resp.status_code == 201 and resp.json() == {"session_id": "named-1", "created": True}
        again = c.post("/v1/sessions", json={"session_id": "named-1", "system": "be brief"})
        assert again.status_code == 200 and again.json()["created"] is False
        assert c.post("/v1/sessions", json={"session_id": "named-1"}).status_code == 200
        assert_error(
            c.post("/v1/sessions", json={"session_id": "named-1", "system": "other"}),
            409,
            "conflict",
        )
        assert_error(
            c.post("/v1/sessions", json={"session_id": "bad id/"}),
            400,
            "invalid_field",
            "session_id",
        )
        assert_error(c.post("/v1/sessions", json={"system": 5}), 400, "invalid_field", "system")
        # A grant of tools: recorded once; another is a conflict; unknown names are 400.
        grant = {"session_id": "granted-1", "tools": ["send_note"]}
        assert c.post("/v1/sessions", json=grant).status_code == 201
        assert c.post("/v1/sessions", json=grant).status_code == 200
        other = {"session_id": "granted-1", "tools": ["send_note", "slow_lookup"]}
        assert_error(c.post("/v1/sessions", json=other), 409, "conflict")
        for bad in (["send_note", "nope"], "send_note", [5], {}, {"send_note": 1}):
            unknown = {"session_id": "granted-2", "tools": bad}
            assert_error(c.post("/v1/sessions", json=unknown), 400, "invalid_field", "tools")
        listed = {s["session_id"]: s for s in c.get("/v1/sessions").json()["sessions"]}
        assert {generated, "named-1"} <= set(listed)
        assert listed["named-1"]["active"] is False
        summary = c.get("/v1/sessions/named-1").json()
        assert summary["session_id"] == "named-1"
        assert summary["system"] == "be brief"
        assert summary["status"] == "idle"
        assert summary["runs"] == [] and summary["request"]["text"] is None
        assert_error(c.get("/v1/sessions/nope"), 404, "not_found")
        assert_error(c.get("/v1/sessions/" + "x" * 300), 404, "not_found")
        assert_error(c.get("/v1/nothing-here"), 404, "not_found")


def test_the_session_list_pages_by_id(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        for sid in ("page-c", "page-a", "page-b"):
            assert c.post("/v1/sessions", json={"session_id": sid}).status_code in (200, 201)
        everything = c.get("/v1/sessions").json()
        assert "next" not in everything  # the whole list, in order of creation
        ids = [s["session_id"] for s in everything["sessions"]]
        assert ids.index("page-c") < ids.index("page-a") < ids.index("page-b")
        walked, after, pages = [], "", 0
        while after is not None:
            page = c.get("/v1/sessions", params={"limit": 2, "after": after}).json()
            assert len(page["sessions"]) <= 2
            walked += [s["session_id"] for s in page["sessions"]]
            after, pages = page["next"], pages + 1
        assert walked == sorted(ids, key=str.encode)  # every session once, in id order
        assert pages == -(-len(ids) // 2)  # no empty page at the end
        first = c.get("/v1/sessions", params={"limit": 1, "after": "page-a"}).json()
        assert [s["session_id"] for s in first["sessions"]] == ["page-b"]
        assert first["sessions"][0]["active"] is False and first["sessions"][0]["stuck"] is None
        for bad in ("0", "-1", "x", "10001", "1.5"):
            resp = c.get("/v1/sessions", params={"limit": bad})
            assert_error(resp, 400, "invalid_field", "limit")
        assert_error(c.delete("/v1/sessions"), 405, "method_not_allowed")


def test_the_session_list_pages_newest_first(api_daemon: Daemon) -> None:
    """``order=newest``: the page the web page asks for, newest first by creation,
    ``next`` the ``before`` of the next page (``after`` is the other order's cursor)."""
    with api_daemon.client() as c:
        for sid in ("new-c", "new-a", "new-b"):
            assert c.post("/v1/sessions", json={"session_id": sid}).status_code in (200, 201)
        everything = [s["session_id"] for s in c.get("/v1/sessions").json()["sessions"]]
        walked, before, pages = [], "0", 0
        while before is not None:
            params = {"order": "newest", "limit": 2, "before": before, "after": "zzz"}
            page = c.get("/v1/sessions", params=params).json()
            assert len(page["sessions"]) <= 2
            walked += [s["session_id"] for s in page["sessions"]]
            before, pages = page["next"], pages + 1
        assert walked == everything[::-1]  # every session once, newest first
        assert walked[:3] == ["new-b", "new-a", "new-c"]
        assert pages == -(-len(everything) // 2)
        first = c.get("/v1/sessions", params={"order": "newest", "limit": 1}).json()
        assert [s["session_id"] for s in first["sessions"]] == ["new-b"]
        assert first["next"] is not None and first["sessions"][0]["stuck"] is None
        idle = c.get("/v1/sessions", params={"order": "newest", "active": "1"}).json()
        assert idle == {"next": None, "sessions": []}  # none has unfinished work
        for params, field in (
            ({"order": "oldest"}, "order"),
            ({"order": "newest", "before": "new-a"}, "before"),
            ({"order": "newest", "before": "-3"}, "before"),
        ):
            assert_error(c.get("/v1/sessions", params=params), 400, "invalid_field", field)


def test_malformed_bodies_are_400_and_huge_ones_413(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        sid = new_session(c)
        path = f"/v1/sessions/{sid}/messages"
        assert_error(c.post(path, content=b'{"text": '), 400, "invalid_json")
        assert_error(c.post(path, content=b"[1, 2]"), 400, "invalid_json")
        assert_error(c.post(path, content=b"\xff\xfe"), 400, "invalid_json")
        assert_error(c.post(path, json={"request_id": "a"}), 400, "missing_field", "text")
        assert_error(c.post(path, json={"text": "hi"}), 400, "missing_field", "request_id")
        assert_error(
            c.post(path, json={"text": 3, "request_id": "a"}), 400, "invalid_field", "text"
        )
        assert_error(
            c.post(path, json={"text": "  ", "request_id": "a"}), 400, "invalid_field", "text"
        )
        assert_error(
            c.post(path, json={"text": "hi", "request_id": "r" * 201}),
            400,
            "invalid_field",
            "request_id",
        )
        big = json.dumps({"text": "x" * (1 << 20), "request_id": "big"}).encode()
        assert_error(c.post(path, content=big), 413, "too_large")

        def chunks() -> Any:  # no Content-Length: the limit holds while reading
            for _ in range(20):
                yield b" " * 65536

        assert_error(c.post(path, content=chunks()), 413, "too_large")
        # Nothing was accepted by any of these.
        assert c.get(f"/v1/sessions/{sid}").json()["queue"] == []
        assert c.get(f"/v1/sessions/{sid}").json()["runs"] == []


# -- messages, approvals, transcript --------------------------------------------------------


def test_a_run_with_approval_from_message_to_answer(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        sid = new_session(c)
        first = submit(c, sid, rid="task-1")
        assert first["submission_id"] == "in1" and first["seq"] > 0
        assert first["duplicate"] is False
        # Same request id, same body: the same answer. Another body: 409.
        again = c.post(
            f"/v1/sessions/{sid}/messages", json={"text": "deploy the site", "request_id": "task-1"}
        )
        assert again.status_code == 202
        assert again.json() == {**first, "duplicate": True}
        assert_error(
            c.post(f"/v1/sessions/{sid}/messages", json={"text": "other", "request_id": "task-1"}),
            409,
            "conflict",
        )
        assert_error(
            c.post("/v1/sessions/nope/messages", json={"text": "x", "request_id": "y"}),
            404,
            "not_found",
        )
        summary = wait_for(c, sid, awaiting_approval)
        assert summary["status"] == "awaiting_approval"
        [pending] = summary["pending_approvals"]
        assert pending["tool"] == "deploy" and pending["input"] == {"target": "prod"}
        assert summary["request"] == {
            "goal_rev": 0,
            "submission_id": "in1",
            "text": "deploy the site",
            "revised": False,
            "revision_of": None,
        }
        assert [t["kind"] for t in summary["done"]["tool_calls_this_request"]] == ["ok", "ok"]
        assert any("approve or deny deploy" in step for step in summary["next"])
        phases = {t["tool"]: t["phase"] for t in summary["tasks"]}
        assert phases == {"lookup": "completed", "book": "completed", "deploy": "awaiting_approval"}
        assert summary["unconfirmed"] == []
        call = pending["call_id"]
        approvals = f"/v1/sessions/{sid}/approvals"
        assert_error(
            c.post(f"{approvals}/no-such-call", json={"approved": True, "request_id": "a0"}),
            404,
            "not_found",
        )
        assert_error(c.post(f"{approvals}/{call}", json={"request_id": "a0"}), 400, "missing_field")
        assert_error(
            c.post(f"{approvals}/{call}", json={"approved": "yes", "request_id": "a0"}),
            400,
            "invalid_field",
            "approved",
        )
        ok = c.post(f"{approvals}/{call}", json={"approved": True, "request_id": "a1"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["recorded"] is True and ok.json()["call_id"] == call
        dup = c.post(f"{approvals}/{call}", json={"approved": True, "request_id": "a1"})
        assert dup.json() == {**ok.json(), "duplicate": True}
        assert_error(
            c.post(f"{approvals}/{call}", json={"approved": False, "request_id": "a1"}),
            409,
            "conflict",
        )
        summary = wait_for(c, sid, idle)
        assert_error(
            c.post(f"{approvals}/{call}", json={"approved": True, "request_id": "a2"}),
            409,
            "invalid_state",
        )
        [run] = summary["runs"]
        assert run["status"] == "completed" and run["final_text"] == "Deployed: all done."
        assert summary["done"]["inputs"][0]["status"] == "completed"
        assert summary["usage"]["input_tokens"] == 30
        transcript = c.get(f"/v1/sessions/{sid}/transcript").json()["messages"]
        assert [m["role"] for m in transcript] == ["user", "assistant"] * 3
        results = [b for m in transcript for b in m["content"] if b["type"] == "tool_result"]
        assert len(results) == 3 and results[-1]["content"] == "deployed prod"
        assert_error(c.get("/v1/sessions/nope/transcript"), 404, "not_found")


def test_a_denied_call_is_not_run(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        sid = new_session(c)
        submit(c, sid)
        call = wait_for(c, sid, awaiting_approval)["pending_approvals"][0]["call_id"]
        resp = c.post(
            f"/v1/sessions/{sid}/approvals/{call}",
            json={"approved": False, "request_id": "no", "note": "not today"},
        )
        assert resp.status_code == 200 and resp.json()["approved"] is False
        summary = wait_for(c, sid, idle)
        deploy = next(t for t in summary["tasks"] if t["call_id"] == call)
        assert deploy["phase"] == "completed" and deploy["result"]["kind"] == "denied"
        assert deploy["replay"] is None  # never executed


# -- changes of course -------------------------------------------------------------------


def test_revision_changes_the_request_in_force(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        sid = new_session(c)
        revise = f"/v1/sessions/{sid}/revisions"
        assert_error(c.post(revise, json={"text": "x", "request_id": "v0"}), 409, "invalid_state")
        assert_error(c.post(revise, json={"request_id": "v0"}), 400, "missing_field", "text")
        submit(c, sid)
        call = wait_for(c, sid, awaiting_approval)["pending_approvals"][0]["call_id"]
        resp = c.post(revise, json={"text": "deploy to staging only", "request_id": "v1"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["goal_rev"] == 1 and resp.json()["recorded"] is True
        dup = c.post(revise, json={"text": "deploy to staging only", "request_id": "v1"})
        assert dup.json()["duplicate"] is True and dup.json()["goal_rev"] == 1
        assert_error(c.post(revise, json={"text": "other", "request_id": "v1"}), 409, "conflict")
        summary = wait_for(c, sid, idle)
        assert summary["request"]["goal_rev"] == 1
        assert summary["request"]["text"] == "deploy to staging only"
        assert summary["request"]["revised"] is True
        assert summary["request"]["revision_of"] == "deploy the site"
        deploy = next(t for t in summary["tasks"] if t["call_id"] == call)
        assert deploy["phase"] == "cancelled"  # not started: cancelled before dispatch


def test_cancel_pause_and_resume(api_daemon: Daemon) -> None:
    with api_daemon.client() as c:
        sid = new_session(c)
        cancel = f"/v1/sessions/{sid}/cancel"
        nothing = c.post(cancel, json={"request_id": "c0"})
        assert nothing.status_code == 200 and nothing.json()["recorded"] is False
        assert_error(c.post(cancel, json={}), 400, "missing_field", "request_id")
        assert_error(c.post("/v1/sessions/nope/cancel", json={"request_id": "c"}), 404, "not_found")

        # Pause while a call waits for approval: the approval is recorded, nothing runs.
        submit(c, sid)
        call = wait_for(c, sid, awaiting_approval)["pending_approvals"][0]["call_id"]
        paused = c.post(f"/v1/sessions/{sid}/pause", json={"request_id": "p1"})
        assert paused.status_code == 200 and paused.json()["recorded"] is True
        again = c.post(f"/v1/sessions/{sid}/pause", json={"request_id": "p2"})
        assert again.json()["recorded"] is False  # already paused
        assert_error(c.post(f"/v1/sessions/{sid}/pause", json={}), 400, "missing_field")
        c.post(f"/v1/sessions/{sid}/approvals/{call}", json={"approved": True, "request_id": "a"})
        summary = wait_for(c, sid, lambda s: s["paused"])
        assert summary["status"] == "paused"
        assert next(t for t in summary["tasks"] if t["call_id"] == call)["phase"] == "approved"
        resumed = c.post(f"/v1/sessions/{sid}/resume", json={"request_id": "p3"})
        assert resumed.status_code == 200 and resumed.json()["paused"] is False
        assert wait_for(c, sid, idle)["runs"][0]["status"] == "completed"

        # Cancel a run that waits for approval (a new session: the script counts turns).
        sid = new_session(c)
        cancel = f"/v1/sessions/{sid}/cancel"
        submit(c, sid, "deploy again")
        wait_for(c, sid, awaiting_approval)
        done = c.post(cancel, json={"request_id": "c1"})
        assert done.status_code == 200 and done.json()["run_id"] == "in1.r0"
        assert c.post(cancel, json={"request_id": "c1"}).json()["duplicate"] is True
        summary = wait_for(c, sid, idle)
        assert summary["runs"][-1]["status"] == "cancelled"


# -- the event stream ----------------------------------------------------------------------


async def test_event_stream_replays_then_streams_live(api_daemon: Daemon) -> None:
    async with api_daemon.aclient() as c:
        sid = (await c.post("/v1/sessions", json={})).json()["session_id"]
        # Live events (text deltas) are not replayed: the input goes in only once the
        # stream is open (it has replayed SessionCreated), or a loaded machine could
        # run the first turns before the stream subscribes.
        stream = Stream()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(
                    follow,
                    c,
                    sid,
                    after=0,
                    until=lambda e: e.event == "ToolAwaitingApproval",
                    stream=stream,
                )
            )
            with trio.fail_after(30):
                while not stream.events:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            message = {"text": "go", "request_id": "e1"}
            await c.post(f"/v1/sessions/{sid}/messages", json=message)
        assert stream.retry == 1000
        assert stream.seqs == sorted(set(stream.seqs))
        types = [e.event for e in stream.events]
        assert types[:3] == ["SessionCreated", "InputAccepted", "RunStarted"]
        assert "text_delta" in types and "model_call" in types
        for e in stream.events:
            if e.id is None:
                assert e.data["type"] == e.event and "data" in e.data
            else:
                assert e.data["seq"] == e.id and e.data["record"]["t"] == e.event
        # Only the committed record after ``after`` come back, from the log, and ``live=0``
        # ends the response once the replay is done.
        resp = await c.get(f"/v1/sessions/{sid}/events", params={"after": 0, "live": "0"})
        replayed = [int(x.split(": ")[1]) for x in resp.text.splitlines() if x.startswith("id:")]
        assert replayed == stream.seqs
        resp = await c.get(
            f"/v1/sessions/{sid}/events",
            params={"after": 0, "live": "0"},
            headers={"Last-Event-ID": str(stream.seqs[2])},
        )
        again = [int(x.split(": ")[1]) for x in resp.text.splitlines() if x.startswith("id:")]
        assert again == stream.seqs[3:]  # Last-Event-ID wins over ?after=
        # The query token works for clients that cannot set headers (EventSource).
        async with api_daemon.aclient(headers={}) as bare:
            url = f"/v1/sessions/{sid}/events"
            resp = await bare.get(url, params={"live": "0", "token": api_daemon.token})
            assert resp.status_code == 200 and "InputAccepted" in resp.text
        bad = await c.get(f"/v1/sessions/{sid}/events", params={"after": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "after"
        bad = await c.get(f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": "-3"})
        assert bad.status_code == 400
        assert (await c.get("/v1/sessions/nope/events")).status_code == 404


async def test_idle_streams_get_heartbeats(api_daemon: Daemon) -> None:
    async with api_daemon.aclient() as c:
        sid = (await c.post("/v1/sessions", json={})).json()["session_id"]
        stream = Stream()
        with trio.move_on_after(3.5):  # the test daemon sends one every second
            await follow(c, sid, after=0, until=lambda _: False, stream=stream, limit=10)
        assert stream.comments.count("keepalive") >= 2
        assert [e.event for e in stream.events] == ["SessionCreated"]


@pytest.mark.parametrize("path", ["/v1/sessions", "/healthz"])
def test_json_everywhere(api_daemon: Daemon, path: str) -> None:
    with api_daemon.client() as c:
        assert c.get(path).headers["content-type"] == "application/json"


TICKET_SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Opening a ticket and looking around.",
        "tool_uses": [
            {"name": "open_ticket", "input": {"title": "review"}},
            {"name": "lookup", "input": {"query": "q"}},
        ],
    },
    {"text": "Ticket opened."},
]


def test_compensation_undoes_a_completed_call(make_daemon: Any) -> None:
    daemon = make_daemon(TICKET_SCRIPT, name="tickets").start()
    with daemon.client() as c:
        sid = new_session(c)
        submit(c, sid, "open a review ticket")
        summary = wait_for(c, sid, idle)
        opened = next(t for t in summary["tasks"] if t["tool"] == "open_ticket")
        looked = next(t for t in summary["tasks"] if t["tool"] == "lookup")
        route = f"/v1/sessions/{sid}/compensations"
        assert_error(c.post(f"{route}/nope", json={"request_id": "k0"}), 404, "not_found")
        no_undo = c.post(f"{route}/{looked['call_id']}", json={"request_id": "k1"})
        assert_error(no_undo, 409, "invalid_state")
        assert_error(c.post(f"{route}/{opened['call_id']}", json={}), 400, "missing_field")
        resp = c.post(f"{route}/{opened['call_id']}", json={"request_id": "k2"})
        assert resp.status_code == 200, resp.text
        comp = resp.json()["compensation_id"]
        assert resp.json()["recorded"] is True
        assert c.post(f"{route}/{opened['call_id']}", json={"request_id": "k2"}).json()["duplicate"]
        # The compensation is a durable task of its own; this one needs approval.
        waiting = wait_for(c, sid, awaiting_approval)
        assert waiting["pending_approvals"][0]["call_id"] == comp
        approve = c.post(
            f"/v1/sessions/{sid}/approvals/{comp}", json={"approved": True, "request_id": "a"}
        )
        assert approve.status_code == 200, approve.text
        done = wait_for(c, sid, idle)
        undo = next(t for t in done["tasks"] if t["call_id"] == comp)
        assert undo["phase"] == "completed"
    ledger = [e["tool"] for e in effects(daemon.workspace)]
    assert ledger.count("open_ticket") == 1
    assert ledger.count("close_ticket") == 1


def test_an_idle_session_leaves_memory_and_answers_as_before(tmp_path: Any) -> None:
    daemon = Daemon(tmp_path, APPROVAL_SCRIPT, extra_args=("--idle-timeout", "0.5")).start()
    try:
        with daemon.client() as c:
            sid = new_session(c)
            first = submit(c, sid, rid="task-1")
            [pending] = wait_for(c, sid, awaiting_approval)["pending_approvals"]
            time.sleep(1.0)  # twice the idle timeout with an approval pending
            assert c.get("/v1/stats").json()["evictions"] == 0
            decided = c.post(
                f"/v1/sessions/{sid}/approvals/{pending['call_id']}",
                json={"approved": True, "request_id": "yes"},
            )
            assert decided.status_code == 200, decided.text
            before = wait_for(c, sid, idle)

            deadline = time.monotonic() + 30
            while (stats := c.get("/v1/stats").json())["evictions"] == 0:
                assert time.monotonic() < deadline, stats
                time.sleep(0.1)
            assert stats["resident_sessions"] == 0
            # Back from the log: the same summary, the same answer to a repeated request.
            assert c.get(f"/v1/sessions/{sid}").json() == before
            again = c.post(
                f"/v1/sessions/{sid}/messages",
                json={"text": "deploy the site", "request_id": "task-1"},
            )
            assert again.json() == {**first, "duplicate": True}
            assert c.get("/v1/stats").json()["resident_sessions"] == 1
    finally:
        daemon.close()


def test_an_idle_session_hibernates_and_answers_as_before(tmp_path: Any) -> None:
    script = [{"text": "first answer"}, {"text": "second answer"}]
    args = ("--hibernate-after", "0.2", "--idle-timeout", "60")
    daemon = Daemon(tmp_path, script, extra_args=args).start()
    try:
        with daemon.client() as c:
            sid = new_session(c)
            first = submit(c, sid, text="one", rid="task-1")
            before = wait_for(c, sid, idle)

            def hibernated() -> float:
                scrape = c.get("/metrics").text
                line = next(x for x in scrape.splitlines() if x.startswith("perdure_hib"))
                return float(line.split()[-1])

            deadline = time.monotonic() + 30
            while hibernated() != 1.0:
                assert time.monotonic() < deadline, c.get("/v1/stats").json()
                time.sleep(0.1)
            stats = c.get("/v1/stats").json()
            assert (stats["resident_sessions"], stats["evictions"]) == (1, 0)
            assert c.get(f"/v1/sessions/{sid}").json() == before  # woken on its state
            again = submit(c, sid, text="one", rid="task-1")
            assert again == {**first, "duplicate": True}
            submit(c, sid, text="two", rid="task-2")
            done = wait_for(c, sid, lambda s: idle(s) and len(s["runs"]) == 2)
            assert done["runs"][-1]["final_text"] == "second answer"
    finally:
        daemon.close()


def test_the_transcript_shows_reasoning_but_not_its_opaque_payloads() -> None:
    from perdure.providers.base import Message, RedactedThinkingBlock, TextBlock, ThinkingBlock
    from perdure.server.app import message_json

    message = Message(
        "assistant",
        (ThinkingBlock("weigh it", "sig-1"), RedactedThinkingBlock("opaque"), TextBlock("ok")),
    )
    assert message_json(message) == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "weigh it"},
            {"type": "redacted_thinking"},
            {"type": "text", "text": "ok"},
        ],
    }
