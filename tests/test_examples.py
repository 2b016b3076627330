"""The README's main command and the examples run, as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PERDURE_FAULT", None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def test_perdure_demo_runs_and_appends_exactly_once() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "perdure.cli", "demo"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CHANGELOG.md holds the entry 1 time(s)" in proc.stdout
    assert "OUTCOME UNKNOWN" in proc.stdout
    assert "recovery:" in proc.stdout


def test_changelog_example_recovers_after_a_crash(tmp_path: Path) -> None:
    script = ROOT / "examples" / "changelog.py"
    crashed = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(PERDURE_FAULT="tool.after:append_note"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert crashed.returncode == -9, crashed.stderr
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "recovered unfinished work in: ['changelog']" in done.stdout
    assert "completed:" in done.stdout
    text = (tmp_path / "changelog-demo" / "workspace" / "CHANGELOG.md").read_text()
    assert text.count("- Fixed retries.") == 1


def test_review_task_example_every_window_leaves_exactly_one_ticket() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "review_task.py")],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True
    windows = summary["results"]
    assert len(windows) == 4
    assert all(w["tickets"] == 1 for w in windows)
    keyed_after = windows[1]
    assert keyed_after["result_kind"] == "ToolCompleted"
    never = windows[3]
    assert never["posts"] == 1, "the non-deduplicating service was retried"
    assert "UNKNOWN" in never["ticket_result"]


def test_revise_midway_example() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "revise_midway.py")],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "open_team_ticket [toolu_001_2] cancelled" in proc.stdout
    assert "request revised (revision 1)" in proc.stdout


def test_tools_from_another_framework_run_with_one_decorator(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "bring_your_tools.py")],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "get_forecast: Get the weather forecast for a city." in out
    assert '"description": "the city, and its ISO country code."' in out
    # the plain def ran (in a thread) and its pydantic result reached the model as JSON
    assert 'model read (ok): {"city": "Lyon", "day": "2026-03-01", "high": 21.5' in out
    assert "model read (error): perdure: invalid arguments for 'send_alert': recipients[0]" in out
    assert "run: completed" in out
