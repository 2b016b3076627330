"""A stuck run on the daemon: ``GET /v1/sessions`` says what it waits for, the
``perdure_stuck_runs`` metric counts it, and the page marks it (real Chromium).

The daemon runs with ``--stuck-after 1``; a run held at its approval-gated call
commits nothing more until a person answers, so it becomes stuck a second later, and
is no longer once approved and finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import APPROVAL_SCRIPT
from tests.server.test_browser import browser  # noqa: F401 (the fixture)
from tests.support.daemon import Daemon, awaiting_approval, idle, wait_for

STUCK_ARGS = ("--stuck-after", "1")


def listed(c: httpx.Client, sid: str) -> dict[str, Any]:
    """The session's entry in the whole list; its entry in a page is the same."""
    resp = c.get("/v1/sessions")
    assert resp.status_code == 200, resp.text
    [entry] = [s for s in resp.json()["sessions"] if s["session_id"] == sid]
    page = c.get("/v1/sessions", params={"limit": 1, "after": sid[:-1]}).json()
    [paged] = page["sessions"]
    assert paged["session_id"] == sid
    assert (paged["stuck"] is None) == (entry["stuck"] is None)
    return entry  # type: ignore[no-any-return]


def stuck_gauge(c: httpx.Client) -> dict[str, float]:
    text = c.get("/metrics").text
    return {
        s.labels["waiting"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "perdure_stuck_runs"
    }


def start_held_run(c: httpx.Client, sid: str) -> str:
    """Start a run and wait until it is held at its approval; the call's id."""
    assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    resp = c.post(f"/v1/sessions/{sid}/messages", json={"text": "deploy", "request_id": "r1"})
    assert resp.status_code == 202, resp.text
    summary = wait_for(c, sid, awaiting_approval, timeout=30)
    [call_id] = [p["call_id"] for p in summary["pending_approvals"]]
    return str(call_id)


def test_the_session_list_and_the_metric_report_a_run_held_at_an_approval(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(APPROVAL_SCRIPT, extra_args=STUCK_ARGS).start()
    with daemon.client() as c:
        call_id = start_held_run(c, "held")
        deadline = time.monotonic() + 30
        while (entry := listed(c, "held"))["stuck"] is None:
            assert time.monotonic() < deadline, entry
            time.sleep(0.2)
        stuck = entry["stuck"]
        assert stuck["waiting"] == "approval" and stuck["detail"] == "deploy"
        assert stuck["call_id"] == call_id and stuck["run_id"]
        assert stuck["idle_for"] >= 1
        assert stuck["describe"] == f"approval deploy (call {call_id})"
        gauge = stuck_gauge(c)
        assert gauge["approval"] == 1 and sum(gauge.values()) == 1

        resp = c.post(
            f"/v1/sessions/held/approvals/{call_id}",
            json={"approved": True, "request_id": "a1"},
        )
        assert resp.status_code in (200, 202), resp.text
        wait_for(c, "held", idle, timeout=30)
        assert listed(c, "held")["stuck"] is None
        assert sum(stuck_gauge(c).values()) == 0


def test_the_page_marks_a_stuck_session(
    browser: Any,  # noqa: F811
    make_daemon: Callable[..., Daemon],
) -> None:
    from playwright.sync_api import expect

    daemon = make_daemon(APPROVAL_SCRIPT, extra_args=STUCK_ARGS).start()
    with daemon.client() as c:
        call_id = start_held_run(c, "held")
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{daemon.url}/?token={daemon.token}")
    mark = page.locator("#sessions li", has_text="held").locator(".stuck")
    # The list is reloaded every 3 s; the run is stuck a second after its last record.
    expect(mark).to_have_text(f"stuck: approval deploy (call {call_id})", timeout=15_000)
    assert errors == []
