"""A call that needs a person, seen and answered the ways a person would: through a real
``perdure serve`` (HTTP, across a SIGKILL of the daemon), ``perdure show``, and the web
page in a real browser (skipped only without Playwright or Chromium).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.failures.test_crash import ledger
from tests.support.checker import assert_sound
from tests.support.daemon import ROOT, Daemon, idle, wait_for

TOOLS = "tests.failures.tools:TOOLS"


def charge(cents: int) -> dict[str, Any]:
    return {"name": "charge_card", "input": {"cents": cents}}


def waiting_for_a_person(summary: dict[str, Any]) -> bool:
    return bool(summary["awaiting_resolution"])


def perdure_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PERDURE_FAULT", None)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "perdure.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def error(resp: Any, status: int, code: str, field: str | None = None) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert body["code"] == code, body
    if field is not None:
        assert body["field"] == field


def test_a_call_that_needs_a_person_over_http_across_a_daemon_crash(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(
        [{"text": "paying", "tool_uses": [charge(250)]}, {"text": "paid"}], tools=TOOLS
    )
    daemon.start()
    with daemon.client() as c:
        assert c.post("/v1/sessions", json={"session_id": "s1"}).status_code == 201
        sent = c.post("/v1/sessions/s1/messages", json={"text": "pay", "request_id": "r1"})
        assert sent.status_code == 202, sent.text
        summary = wait_for(c, "s1", waiting_for_a_person)
    # The daemon dies while the call waits; the next one finds it still waiting.
    daemon.kill()
    daemon.restart()
    with daemon.client() as c:
        summary = wait_for(c, "s1", waiting_for_a_person)
        assert summary["status"] == "awaiting_human"
        (waiting,) = summary["awaiting_resolution"]
        assert waiting["tool"] == "charge_card" and "card was declined" in waiting["reason"]
        assert any("wait for a person to resolve charge_card" in s for s in summary["next"])
        assert any(d["action"] == "keep waiting" for d in summary["decisions"])
        call = waiting["call_id"]
        url = f"/v1/sessions/s1/calls/{call}/resolution"
        error(
            c.post(url, json={"action": "ignore", "request_id": "p0"}),
            400,
            "invalid_field",
            "action",
        )
        error(c.post(url, json={"request_id": "p0"}), 400, "missing_field", "action")
        error(c.post(url, json={"action": "retry"}), 400, "missing_field", "request_id")
        error(
            c.post(url, json={"action": "retry", "result": 1, "request_id": "p0"}),
            400,
            "invalid_field",
            "result",
        )
        error(
            c.post(
                "/v1/sessions/s1/calls/nope/resolution",
                json={"action": "retry", "request_id": "p0"},
            ),
            404,
            "not_found",
        )
        ok = c.post(url, json={"action": "retry", "request_id": "p1"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["recorded"] is True and ok.json()["action"] == "retry"
        again = c.post(url, json={"action": "retry", "request_id": "p1"})
        assert again.json() == {**ok.json(), "duplicate": True}
        error(c.post(url, json={"action": "skip", "request_id": "p1"}), 409, "conflict")
        summary = wait_for(c, "s1", idle)
        error(c.post(url, json={"action": "retry", "request_id": "p2"}), 409, "invalid_state")
        (task,) = summary["tasks"]
        assert (task["phase"], task["attempt"], task["result"]["output"]) == (
            "completed",
            2,
            "charged 250",
        )
    daemon.stop()
    assert len(ledger({"workspace": daemon.workspace}, "charge_card", "effect")) == 1
    assert_sound({"log": daemon.log, "workspace": daemon.workspace})
    # perdure show tells the whole story.
    shown = perdure_cli("show", "s1", "--log", str(daemon.log))
    assert shown.returncode == 0, shown.stderr
    assert "NEEDS A PERSON: the card was declined" in shown.stdout
    assert "a person chose to run it again" in shown.stdout
    assert "charge_card [" in shown.stdout and "executing (never, attempt 2" in shown.stdout


def test_perdure_run_without_a_terminal_fails_the_call_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    script = tmp_path / "script.json"
    replies = [
        {"text": "booking", "tool_uses": [{"name": "flaky_book", "input": {"item": "room"}}]},
        {"text": "paying", "tool_uses": [charge(250)]},
        {"text": "could not pay"},
    ]
    script.write_text(json.dumps({"replies": replies}))
    (tmp_path / "ws").mkdir()
    args = ["--provider", f"scripted:{script}", "--tools", TOOLS, "--log", str(tmp_path / "log")]
    proc = perdure_cli("run", "book and pay", *args, "--workspace", str(tmp_path / "ws"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "[toolu_001_1] attempt 1 failed (The tool raised RetryableError: 503" in out
    assert "[toolu_001_1] completed" in out and "booked room" in out
    assert "charge_card [toolu_002_1] NEEDS A PERSON: the card was declined" in out
    assert "resolved: toolu_002_1 (fail)" in out
    assert "a person chose to fail it" in out
    assert re.search(r"run \S+ completed", out)


# -- the page ---------------------------------------------------------------------------------

ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]


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


def test_the_page_shows_a_call_that_needs_a_person_and_its_three_actions(
    browser: Any, make_daemon: Callable[..., Daemon]
) -> None:
    from playwright.sync_api import expect

    script = [
        {"text": "first payment", "tool_uses": [charge(100)]},
        {"text": "second payment", "tool_uses": [charge(200)]},
        {"text": "a wire", "tool_uses": [{"name": "wire_money", "input": {"cents": 300}}]},
        {"text": "all settled"},
    ]
    daemon = make_daemon(script, tools=TOOLS).start()
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: dialog.accept('{"paid": "by phone"}'))
    page.goto(f"{daemon.url}/?token={daemon.token}")
    page.fill("#new-text", "Take both payments")
    page.click("#new-session button")

    first = page.locator(".tool", has_text="charge_card").first
    expect(first).to_have_attribute("data-phase", "awaiting_human", timeout=15_000)
    expect(first.locator(".note")).to_contain_text("card was declined")
    expect(page.locator("#status")).to_have_text("awaiting human", timeout=10_000)
    expect(first.locator(".actions button")).to_have_text(["Retry", "Skip…", "Fail…"])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-page-needs-a-person.png"))
    first.locator("button.resolve-skip").click()  # the dialog answers with a JSON result
    expect(first).to_have_attribute("data-phase", "completed", timeout=15_000)
    expect(first.locator(".output")).to_have_text('{"paid": "by phone"}')

    second = page.locator(".tool", has_text="charge_card").nth(1)
    expect(second).to_have_attribute("data-phase", "awaiting_human", timeout=15_000)
    second.locator("button.resolve-retry").click()
    expect(second).to_have_attribute("data-phase", "completed", timeout=15_000)
    expect(second.locator(".output")).to_have_text("charged 200")

    # An unknown outcome its tool sends to a person: the buttons say what happened.
    wire = page.locator(".tool", has_text="wire_money")
    expect(wire).to_have_attribute("data-phase", "awaiting_human", timeout=15_000)
    expect(wire.locator(".note")).to_contain_text("a person must say whether it took effect")
    expect(wire.locator(".note")).to_contain_text("the bank's answer was lost")
    expect(wire.locator(".actions button")).to_have_text(
        ["Applied…", "Not applied: run once more", "Failed…"]
    )
    wire.locator("button.resolve-retry").click()  # not applied: once more, same key
    expect(wire).to_have_attribute("data-phase", "completed", timeout=15_000)
    expect(wire.locator(".output")).to_have_text("wired 300")
    expect(page.locator(".event.run-finished.completed")).to_be_visible(timeout=15_000)
    expect(page.locator(".tool .actions")).to_have_count(0)
    assert errors == []
