"""The web page with a scoped token, in a real browser (Debian's Chromium, Playwright).

A write token opens the page on its one session only (no session list); the reply's
reasoning streams in before its text; each turn shows its tokens and the summary
shows usage and cost per run. The daemon is SIGKILLed while a NEVER tool runs, so
after the restart its outcome is unknown: the page makes that call stand out and
says what the user can do (look, tell the agent), and offers no undo (the tool has
none, and the runtime compensates only completed calls). A read-only token
then sees the same session with no buttons at all. Screenshots go to
tests/artifacts/. Skipped only when Playwright or Chromium is unavailable.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.server.test_browser import ARTIFACTS, browser  # noqa: F401 (the fixture)
from tests.support.daemon import Daemon

THINKING = (
    "The user wants the release announced. Announcing twice would confuse people, "
    "so I will send it once and then confirm."
)
SCRIPT: list[dict[str, Any]] = [
    {
        "thinking": THINKING,
        "text": "Announcing the release now.",
        "tool_uses": [{"name": "slow_announce", "input": {"text": "v2 is out", "seconds": 3.0}}],
    },
    {"text": "I could not confirm whether the announcement went out; please check."},
]
SID = "page-scoped"


def test_the_page_with_a_scoped_token_reasoning_and_an_unknown_outcome(
    browser: Any,  # noqa: F811
    make_daemon: Callable[..., Daemon],
) -> None:
    from playwright.sync_api import expect

    daemon = make_daemon(SCRIPT, tools="tests.support.page_tools:TOOLS").start()
    with daemon.client() as c:
        assert c.post("/v1/sessions", json={"session_id": SID}).status_code == 201
        write = c.post(f"/v1/sessions/{SID}/tokens", json={"scope": "write"}).json()["token"]
        read = c.post(f"/v1/sessions/{SID}/tokens", json={"scope": "read"}).json()["token"]

    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{daemon.url}/?token={write}")
    assert page.url == daemon.url + "/"  # the token left the address bar for a cookie
    expect(page.locator("#scope")).to_contain_text(f"read & write access to {SID}")
    expect(page.locator("aside")).to_be_hidden()  # no session list for a scoped token
    expect(page.locator("#sid")).to_have_text(SID)
    expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=10_000)

    page.fill("#text", "Announce the release")
    page.click("#send button[type=submit]")

    # The reasoning streams in (the live part opens it), then the text.
    first = page.locator(".assistant").first
    reasoning = first.locator(".reasoning")
    expect(reasoning.locator(".thinking")).to_have_text(THINKING, timeout=10_000)
    expect(reasoning).to_have_attribute("open", "")
    expect(first.locator(".text")).to_have_text("Announcing the release now.")
    expect(first.locator(".usage")).to_have_text(re.compile(r"10 in / 5 out tokens"))
    announce = page.locator(".tool", has_text="slow_announce")
    expect(announce).to_have_attribute("data-phase", "executing", timeout=10_000)

    # The daemon dies while the NEVER tool runs; after the restart nobody knows
    # whether the announcement went out.
    daemon.kill()
    daemon.restart()
    expect(announce).to_have_attribute("data-phase", "outcome_unknown", timeout=20_000)
    expect(announce).to_have_class(re.compile(r"\bunknown\b"))
    nxt = announce.locator(".next")
    expect(nxt).to_contain_text("Outcome unknown")
    expect(nxt).to_contain_text("Look:")
    expect(announce.locator("button.compensate")).to_have_count(0)
    expect(nxt).not_to_contain_text("Compensate")
    nxt.locator("button.tell").click()
    expect(page.locator("#text")).to_have_value(re.compile(r"^About slow_announce \[toolu_001_1\]"))
    expect(page.locator(".assistant").last.locator(".text")).to_have_text(
        SCRIPT[1]["text"], timeout=15_000
    )
    # Usage and cost per run, in the summary (two runs: the interrupted one and its sequel).
    runs = page.locator("#summary table.runs tr[data-run]")
    expect(runs).to_have_count(2, timeout=10_000)
    expect(runs.last).to_contain_text(re.compile(r"completed\s*\d+\s*\d+\s*\$\d+\.\d{4}"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-page-scoped-unknown.png"), full_page=True)
    context.close()

    # A read-only token: the same session, and no button anywhere.
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{daemon.url}/?token={read}")
    expect(page.locator("#scope")).to_contain_text(f"read-only access to {SID}")
    expect(page.locator(".tool.unknown")).to_have_count(1, timeout=10_000)
    expect(page.locator(".assistant .reasoning .thinking").first).to_have_text(THINKING)
    expect(page.locator("#send")).to_be_hidden()
    expect(page.locator("#pause")).to_be_hidden()
    expect(page.locator(".tool.unknown .actions")).to_be_hidden()
    page.screenshot(path=str(ARTIFACTS / "web-page-read-only.png"), full_page=True)
    context.close()
    assert errors == []
