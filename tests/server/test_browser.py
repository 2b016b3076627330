"""The web page in a real browser (Debian's Chromium, driven by Playwright).

It opens the page with the token, starts a task, watches the reply stream in, sees
the daemon SIGKILLed and restarted underneath it (the page reconnects by itself
with Last-Event-ID and marks the restart and what recovery decided), clicks
Approve on the approval-gated call, and sees the run complete. A screenshot goes
to tests/artifacts/. Skipped only when Playwright or Chromium is unavailable.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import ROOT, Daemon

ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Looking up the current release before deploying anything.",
        "tool_uses": [{"name": "slow_lookup", "input": {"query": "release", "seconds": 2.0}}],
    },
    {
        "text": "Release found. Deploying now.",
        "tool_uses": [{"name": "deploy", "input": {"target": "prod"}}],
    },
    {"text": "Deployed: all done."},
]


@pytest.fixture
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    executable = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(executable).exists():
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    with sync_api.sync_playwright() as p:
        try:
            instance = p.chromium.launch(
                executable_path=executable, headless=True, args=CHROMIUM_ARGS
            )
        except Exception as exc:  # any launch failure means "no browser here"
            pytest.skip(f"Chromium cannot be started: {exc}")
        yield instance
        instance.close()


def test_the_page_streams_survives_a_restart_and_approves(
    browser: Any, make_daemon: Callable[..., Daemon]
) -> None:
    from playwright.sync_api import expect

    daemon = make_daemon(SCRIPT).start()
    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    page.goto(f"{daemon.url}/?token={daemon.token}")
    assert page.url == daemon.url + "/"  # the token left the address bar for a cookie
    page.fill("#new-text", "Deploy the site to production")
    page.click("#new-session button")

    # The reply streams in, and the slow lookup runs.
    first = page.locator(".assistant").first
    expect(first.locator(".text")).to_have_text(
        "Looking up the current release before deploying anything.", timeout=10_000
    )
    assert int(first.get_attribute("data-deltas") or 0) > 1  # it arrived in pieces
    lookup = page.locator(".tool", has_text="slow_lookup")
    expect(lookup).to_have_attribute("data-phase", "executing", timeout=10_000)

    # The daemon dies mid-tool and comes back on the same port; the page reconnects.
    daemon.kill()
    expect(page.locator("#conn")).to_have_attribute("data-state", "reconnecting", timeout=10_000)
    daemon.restart()
    expect(page.locator("#transcript .restart")).to_have_count(1, timeout=15_000)
    expect(page.locator("#transcript .restart")).to_contain_text("runtime restarted")
    expect(page.locator("#transcript .recovery").first).to_contain_text("recovery:")
    expect(
        page.locator(".recovery", has_text="re-run with the same idempotency key")
    ).to_have_count(1, timeout=10_000)

    # The gated call waits for a human; approve it.
    deploy = page.locator(".tool", has_text="deploy")
    expect(deploy).to_have_attribute("data-phase", "awaiting_approval", timeout=15_000)
    expect(page.locator("#status")).to_have_text("awaiting approval", timeout=10_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-page-approval.png"))
    deploy.locator("button.approve").click()
    expect(page.locator(".event.run-finished.completed")).to_be_visible(timeout=15_000)
    expect(deploy).to_have_attribute("data-phase", "completed")
    expect(deploy.locator(".output")).to_have_text("deployed prod")
    expect(lookup).to_have_attribute("data-phase", "completed")
    expect(page.locator(".assistant").last.locator(".text")).to_have_text("Deployed: all done.")
    expect(page.locator("#status")).to_have_text("idle", timeout=10_000)
    # The spend so far, from the log's usage (the cost is visible on the page).
    expect(page.locator("#summary .spend")).to_contain_text(
        re.compile(r"tokens: [1-9]\d* in, [1-9]\d* out; cost: \$\d+\.\d{4}")
    )

    # Nothing was rendered twice across the reconnect.
    expect(page.locator(".user")).to_have_count(1)
    expect(page.locator(".assistant")).to_have_count(3)
    expect(page.locator(".event.run-finished.interrupted")).to_have_count(1)
    expect(page.locator("#sessions li .active")).to_have_count(0, timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "web-page.png"), full_page=True)
    assert errors == []
