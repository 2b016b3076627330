"""The page offers an undo only where one exists, in a real browser (Chromium, Playwright).

A completed call of a tool that declares a compensation gets a Compensate button once
a cancel lists it as compensable, and the button leads to a recorded compensation; a
call of a tool without one (here, the cancelled lookup) never gets one. The page's
other undo-free case, an unknown outcome, is in test_browser_scoped.py. Skipped only
when Playwright or Chromium is unavailable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.server.test_browser import browser  # noqa: F401 (the fixture)
from tests.support.daemon import Daemon

SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Opening the ticket.",
        "tool_uses": [{"name": "open_ticket", "input": {"title": "v2"}}],
    },
    {
        "text": "Looking up who to tell.",
        "tool_uses": [{"name": "slow_lookup", "input": {"query": "owners", "seconds": 30}}],
    },
    {"text": "Done."},
]


def test_compensate_is_offered_only_for_a_call_whose_tool_has_an_undo(
    browser: Any,  # noqa: F811
    make_daemon: Callable[..., Daemon],
) -> None:
    from playwright.sync_api import expect

    daemon = make_daemon(SCRIPT, tools="tests.support.page_tools:TOOLS").start()
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{daemon.url}/?token={daemon.token}")
    page.fill("#new-text", "Open a ticket for v2 and tell its owners")
    page.click("#new-session button")

    ticket = page.locator(".tool", has_text="open_ticket")
    lookup = page.locator(".tool", has_text="slow_lookup")
    expect(ticket).to_have_attribute("data-phase", "completed", timeout=15_000)
    # Pin the card by its call id: the compensation gets a card of its own later.
    ticket = page.locator(f'.tool[data-call="{ticket.get_attribute("data-call")}"]')
    expect(lookup).to_have_attribute("data-phase", "executing", timeout=15_000)
    expect(page.locator("button.compensate")).to_have_count(0)  # nothing to undo yet

    page.click("#cancel")
    expect(page.locator(".event", has_text="cancel requested")).to_have_count(1, timeout=10_000)
    expect(lookup).to_have_attribute("data-phase", "cancelled", timeout=10_000)
    expect(ticket.locator("button.compensate")).to_be_visible()
    expect(lookup.locator("button.compensate")).to_have_count(0)  # it has no undo

    ticket.locator("button.compensate").click()
    expect(ticket.locator(".note")).to_contain_text("compensation comp-", timeout=10_000)
    expect(page.locator("button.compensate")).to_have_count(0)  # requested once
    with daemon.client() as http:
        state = http.get(f"/v1/sessions/{page.locator('#sid').inner_text()}").json()
    assert any(t["call_id"].startswith("comp-") for t in state["tasks"])
    assert errors == []
