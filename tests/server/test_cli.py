"""``perdure run | sessions | show | check`` and ``serve``'s refusals, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from perdure import open_runtime
from perdure.providers.scripted import ScriptedProvider
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import InputAccepted
from tests.server.test_recovery import flip_marker
from tests.support.daemon import LEDGER_TOOLS, ROOT
from tests.support.procs import run_child


def perdure(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Any:
    full = dict(os.environ)
    for name in ("PERDURE_FAULT", "PERDURE_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        full.pop(name, None)
    full["PYTHONPATH"] = str(ROOT)
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "perdure.cli", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_script(path: Path, replies: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"replies": replies}))
    return path


def test_run_streams_a_task_to_completion(tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "text": "Looking it up first.",
                "tool_uses": [{"name": "lookup", "input": {"query": "x"}}],
            },
            {"text": "Found it; the answer is 42."},
        ],
    )
    (tmp_path / "ws").mkdir()
    common = [
        "--provider",
        f"scripted:{script}",
        "--tools",
        LEDGER_TOOLS,
        "--log",
        str(tmp_path / "log"),
        "--workspace",
        str(tmp_path / "ws"),
    ]
    proc = perdure("run", "what is the answer?", *common)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # The same lines as ``perdure show`` (one timeline renderer), as they happen.
    assert "Looking it up first." in out and "→ calls lookup(query='x')" in out
    assert "lookup [toolu_001_1] completed" in out and "'found: x'" in out
    assert "Found it; the answer is 42." in out
    assert re.search(r"run \S+ completed", out)
    # The same command again is the same request: nothing is submitted twice.
    again = perdure("run", "what is the answer?", *common, "--session", _session(out))
    assert again.returncode == 0, again.stderr
    assert "this task already finished" in again.stdout
    log = LmdbLog(tmp_path / "log", readonly=True)
    try:
        inputs = [c for c in log.read_global() if isinstance(c.record, InputAccepted)]
    finally:
        log.close()
    assert len(inputs) == 1


def _session(out: str) -> str:
    first = out.splitlines()[0]
    assert first.startswith("session ")
    return first.split()[1].rstrip(",")


def test_run_asks_for_approval_and_yes_approves(tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            {"text": "Deploying.", "tool_uses": [{"name": "deploy", "input": {"target": "prod"}}]},
            {"text": "Deployed."},
        ],
    )
    (tmp_path / "ws").mkdir()
    args = ["--provider", f"scripted:{script}", "--tools", LEDGER_TOOLS]
    args += ["--log", str(tmp_path / "log"), "--workspace", str(tmp_path / "ws")]
    approved = perdure("run", "deploy", *args, "--yes")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert "approved: toolu_001_1 (approved with --yes)" in approved.stdout
    assert "deployed prod" in approved.stdout
    # Without a terminal and without --yes, the call is denied, never run.
    denied = perdure("run", "deploy", *args, "--log", str(tmp_path / "log2"))
    assert "denied: toolu_001_1" in denied.stdout
    assert "the user denied this call" in denied.stdout


def test_run_asks_before_the_built_in_tools_change_files(tmp_path: Path) -> None:
    """Without --tools the model gets the workspace tools; those that write ask first."""
    script = write_script(
        tmp_path / "s.json",
        [
            {
                "text": "Writing it.",
                "tool_uses": [
                    {"name": "write_file", "input": {"path": "notes.txt", "content": "hi"}}
                ],
            },
            {"text": "Done."},
        ],
    )
    (tmp_path / "ws").mkdir()
    args = ["--provider", f"scripted:{script}", "--workspace", str(tmp_path / "ws")]
    denied = perdure("run", "write a note", *args, "--log", str(tmp_path / "log1"))
    assert "denied: toolu_001_1 (no terminal to ask; run with --yes" in denied.stdout
    assert not (tmp_path / "ws" / "notes.txt").exists()
    approved = perdure("run", "write a note", *args, "--log", str(tmp_path / "log2"), "--yes")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert "approved: toolu_001_1 (approved with --yes)" in approved.stdout
    assert (tmp_path / "ws" / "notes.txt").read_text() == "hi"
    listed = json.loads(perdure("tools", "--json").stdout)
    approval = {row["name"]: row["approval"] for row in listed}
    assert approval["write_file"] is True and approval["edit_file"] is True
    assert approval["append_file"] is True and approval["read_file"] is False
    assert "ask for approval" in perdure("run", "--help").stdout


def test_run_without_an_api_key_says_how_to_proceed(tmp_path: Path) -> None:
    proc = perdure("run", "hello", "--log", str(tmp_path / "log"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "ANTHROPIC_API_KEY" in proc.stderr
    assert "--provider scripted:FILE" in proc.stderr
    assert not (tmp_path / "log").exists()  # nothing was opened
    bad = perdure("run", "hello", "--provider", "nope", cwd=tmp_path)
    assert bad.returncode == 2 and "unknown provider" in bad.stderr
    tools = perdure("run", "hi", "--provider", "scripted:x.json", "--tools", "no_such_mod:X")
    assert tools.returncode == 2


def test_serve_refuses_unsafe_or_broken_setups(tmp_path: Path) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "hi"}])
    base = ["serve", "--log", str(tmp_path / "log"), "--provider", f"scripted:{script}"]
    exposed = perdure(*base, "--host", "0.0.0.0", "--port", "0")
    assert exposed.returncode == 2
    assert "--token-file" in exposed.stderr and "PERDURE_TOKEN" in exposed.stderr
    (tmp_path / "empty").write_text("\n")
    empty = perdure(*base, "--token-file", str(tmp_path / "empty"))
    assert empty.returncode == 2 and "empty" in empty.stderr
    blank = perdure(*base, env={"PERDURE_TOKEN": " "})
    assert blank.returncode == 2
    missing = perdure(*base[:3], "--provider", f"scripted:{tmp_path / 'nope.json'}")
    assert missing.returncode == 2 and "cannot read script" in missing.stderr


@pytest.fixture(scope="module")
def recovered_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A log whose run was SIGKILLed right after a NEVER side effect, then recovered."""
    root = tmp_path_factory.mktemp("crashed")
    (root / "ws").mkdir()
    plan = {
        "log": str(root / "log"),
        "workspace": str(root / "ws"),
        "script": [
            {
                "text": "Sending the note.",
                "tool_uses": [{"name": "send_note", "input": {"text": "hi"}}],
            },
            {"text": "Checking.", "tool_uses": [{"name": "lookup", "input": {"query": "note"}}]},
            {"text": "The note's outcome is unknown; I did not resend it."},
        ],
        "sessions": {"s1": [{"text": "MARKER-input send a note", "request_id": "r1"}]},
    }
    crashed = run_child(plan, fault="tool.after:send_note")
    assert crashed.killed
    run_child(plan)
    log = LmdbLog(root / "log", readonly=True)
    try:
        [seq] = [c.seq for c in log.read_global() if isinstance(c.record, InputAccepted)]
    finally:
        log.close()
    return root / "log", seq


def test_sessions_stuck_lists_a_run_killed_in_a_tool_call(tmp_path: Path) -> None:
    """A process SIGKILLed inside a NEVER call leaves a run that nothing moves: stuck,
    waiting for that tool call, once the threshold has passed (and not before)."""
    (tmp_path / "ws").mkdir()
    plan = {
        "log": str(tmp_path / "log"),
        "workspace": str(tmp_path / "ws"),
        "script": [
            {"text": "Sending.", "tool_uses": [{"name": "send_note", "input": {"text": "hi"}}]},
            {"text": "Sent."},
        ],
        "sessions": {"s1": [{"text": "send a note", "request_id": "r1"}]},
    }
    assert run_child(plan, fault="tool.after:send_note").killed
    log = str(tmp_path / "log")
    proc = perdure("sessions", "--log", log, "--stuck", "--stuck-after", "0")
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert header.split() == ["SESSION", "RUN", "IDLE", "WAITING", "FOR"]
    session, run, _idle, *waiting = row.split()
    assert session == "s1" and run != "-"
    assert waiting[:2] == ["tool_call", "send_note"] and waiting[2] == "(call"
    later = perdure("sessions", "--log", log, "--stuck", "--stuck-after", "3600")
    assert later.returncode == 0, later.stderr
    assert later.stdout.strip() == f"no stuck sessions in {log} (threshold 3600s)"
    bad = perdure("sessions", "--log", log, "--stuck", "--stuck-after", "-1")
    assert bad.returncode == 2 and "--stuck-after" in bad.stderr


def test_sessions_lists_the_log(recovered_log: tuple[Path, int]) -> None:
    log, _ = recovered_log
    proc = perdure("sessions", "--log", str(log))
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert header.split() == ["SESSION", "RECORDS", "FIRST", "LAST", "REV", "OPEN"]
    assert row.split()[0] == "s1" and row.split()[-1] == "0"
    assert perdure("sessions", "--log", str(log.parent / "nowhere")).returncode == 2
    page = perdure("sessions", "--log", str(log), "--limit", "1")
    assert page.returncode == 0 and page.stdout == proc.stdout
    after = perdure("sessions", "--log", str(log), "--after", "s1")
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == f"no sessions in this page of {log}"
    assert perdure("sessions", "--log", str(log), "--limit", "0").returncode == 2


def test_sessions_lists_a_page_newest_first_and_says_how_to_see_more(tmp_path: Path) -> None:
    """A big log answers with a page: the newest 50 by default, and on standard error
    the option that gives the next page; following it reaches the oldest; --all lists
    every session; --json is the daemon's ``GET /v1/sessions`` body, with its cursor."""
    log = tmp_path / "log"

    async def create(count: int) -> None:
        async with open_runtime(log, provider=ScriptedProvider([]), durability="fast") as rt:
            for i in range(count):
                await rt.create_session(f"s{i:02d}")

    trio.run(create, 53)
    newest = [f"s{i:02d}" for i in reversed(range(53))]
    first = perdure("sessions", "--log", str(log))
    assert first.returncode == 0, first.stderr
    header, *rows = first.stdout.splitlines()
    assert header.split()[0] == "SESSION"
    assert [row.split()[0] for row in rows] == newest[:50]
    hint = re.fullmatch(
        r"more sessions: the next page with (--before \d+) \(every session: --all\)\n",
        first.stderr,
    )
    assert hint is not None, first.stderr
    rest = perdure("sessions", "--log", str(log), *hint.group(1).split())
    assert rest.returncode == 0 and rest.stderr == "", rest.stderr  # the last page: no hint
    assert [row.split()[0] for row in rest.stdout.splitlines()[1:]] == newest[50:]

    every = perdure("sessions", "--log", str(log), "--all", "--json")
    assert every.returncode == 0, every.stderr
    listed = json.loads(every.stdout)
    assert "next" not in listed  # not a page, as the daemon's whole list
    assert [s["session_id"] for s in listed["sessions"]] == newest
    assert listed["sessions"][0] == {
        "session_id": "s52",
        "first_seq": listed["sessions"][0]["first_seq"],
        "last_seq": listed["sessions"][0]["first_seq"],
        "records": 1,
        "goal_rev": 0,
        "open_submissions": 0,
        "active": False,
        "stuck": None,
    }
    by_id = json.loads(
        perdure("sessions", "--log", str(log), "--order", "id", "--limit", "2", "--json").stdout
    )
    assert [s["session_id"] for s in by_id["sessions"]] == ["s00", "s01"]
    assert by_id["next"] == "s01"  # the --after of the next page

    refused = perdure("sessions", "--log", str(log), "--all", "--limit", "2")
    assert refused.returncode == 2
    assert "--all lists every session: leave out --limit, --after and --before" in refused.stderr


def test_show_tells_the_restart_and_what_recovery_decided(recovered_log: tuple[Path, int]) -> None:
    log, _ = recovered_log
    proc = perdure("show", "s1", "--log", str(log))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "── runtime started (epoch 2" in out
    assert "recovery: toolu_001_1: found executing → report outcome unknown" in out
    assert "send_note [toolu_001_1] OUTCOME UNKNOWN" in out
    assert "run in1.r0 interrupted" in out and "run in1.r1 started (resumes in1.r0" in out
    assert 'run in1.r1 completed: "The note\'s outcome is unknown; I did not resend it."' in out
    assert "session s1: idle" in out
    assert "unconfirmed side effects:" in out and "outcome unknown" in out
    assert "usage: 30 input / 15 output tokens" in out
    assert out.index("runtime started (epoch 2") < out.index("recovery:")
    summary = json.loads(perdure("show", "s1", "--log", str(log), "--json").stdout)
    assert "report outcome unknown" in [d["action"] for d in summary["decisions"]]
    [unconfirmed] = summary["unconfirmed"]
    assert unconfirmed["tool"] == "send_note" and unconfirmed["phase"] == "outcome_unknown"
    assert [r["status"] for r in summary["runs"]] == ["interrupted", "completed"]
    assert summary["runs"][1]["resumed_from"] == summary["runs"][0]["run_id"]
    assert perdure("show", "nope", "--log", str(log)).returncode == 2


def test_check_passes_a_recovered_log_and_names_a_flipped_byte(
    recovered_log: tuple[Path, int], tmp_path: Path
) -> None:
    log, seq = recovered_log
    ok = perdure("check", "--log", str(log), "--settled")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK: every record is intact and every invariant holds" in ok.stdout
    copy = tmp_path / "copy"
    shutil.copytree(log, copy)
    assert flip_marker(copy, b"MARKER-input") >= 1
    bad = perdure("check", "--log", str(copy))
    assert bad.returncode == 1
    assert f"DAMAGED: record {seq}" in bad.stdout
    assert f"record {seq} is damaged or unreadable: checksum mismatch" in bad.stdout
    assert "FAILED" in bad.stdout
    # The original is untouched.
    assert perdure("check", "--log", str(log)).returncode == 0
    assert perdure("check", "--log", str(tmp_path / "none")).returncode == 2
