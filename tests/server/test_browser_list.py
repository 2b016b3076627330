"""The page's session list in a real browser: one page of the newest, then "More".

With more sessions than a page holds, the page shows the newest 100, newest first,
and a "More" button that follows the page's ``next``; every list request it makes
is a page (``order=newest`` with a ``limit``), never the whole list, and the refresh
keeps what "More" added. Skipped only when Playwright or Chromium is unavailable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.server.conftest import APPROVAL_SCRIPT
from tests.server.test_browser import browser  # noqa: F401 (the fixture)
from tests.support.daemon import Daemon

PAGE = 100  # app.js's LIST_PAGE
SESSIONS = PAGE + 3


def test_the_page_lists_the_newest_sessions_a_page_at_a_time(
    browser: Any,  # noqa: F811
    make_daemon: Callable[..., Daemon],
) -> None:
    from playwright.sync_api import expect

    daemon = make_daemon(APPROVAL_SCRIPT).start()
    ids = [f"list-{i:03d}" for i in range(SESSIONS)]  # created in this order
    with daemon.client() as c:
        for sid in ids:
            assert c.post("/v1/sessions", json={"session_id": sid}).status_code == 201
    page = browser.new_page()
    errors: list[str] = []
    asked: list[dict[str, list[str]]] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def note(request: Any) -> None:
        url = urlsplit(request.url)
        if url.path == "/v1/sessions" and request.method == "GET":
            asked.append(parse_qs(url.query))

    page.on("request", note)
    page.goto(f"{daemon.url}/?token={daemon.token}")
    rows = page.locator("#sessions li[data-sid]")
    expect(rows).to_have_count(PAGE, timeout=15_000)
    assert rows.first.get_attribute("data-sid") == ids[-1]  # the newest first
    assert rows.last.get_attribute("data-sid") == ids[-PAGE]
    more = page.locator("#sessions li.more button")
    expect(more).to_have_count(1)
    more.click()
    expect(rows).to_have_count(SESSIONS, timeout=15_000)
    assert [rows.nth(i).get_attribute("data-sid") for i in range(SESSIONS)] == ids[::-1]
    expect(more).to_have_count(0)  # the last page: nothing more
    # The refresh (every 3 s) asks for as many as are shown, and shows them all again.
    page.wait_for_timeout(3_500)
    expect(rows).to_have_count(SESSIONS)
    expect(more).to_have_count(0)
    assert asked and all(q["order"] == ["newest"] and "limit" in q for q in asked), asked
    assert any(q.get("before") for q in asked)  # "More" followed a page's next
    assert any(q["limit"] == [str(2 * PAGE)] for q in asked)  # the refresh after it
    assert errors == []
