"""``perdure demo``: the CHANGELOG story, offline, with a real crash and a real recovery.

The agent is asked to append a line to CHANGELOG.md, run a check and report. The
model (a scripted provider, so the demo needs no API key) calls ``append_note``,
a NEVER tool; the process is SIGKILLed right after the line is appended and
before its result is saved. A second process opens the same log, recovers, tells
the model the truth about the append, runs the SAFE check and finishes. The demo
prints the timeline and verifies that the file holds exactly one appended line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import trio

import perdure
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

ENTRY = "- Fixed: retries no longer double-charge the card."
TASK = "Append a line to CHANGELOG.md about the retry fix, run the changelog check, and report."


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)
async def append_note(ctx: perdure.ToolContext, line: str) -> str:
    """Append one line to CHANGELOG.md (not idempotent: never re-run blindly)."""
    assert ctx.workspace is not None
    path = trio.Path(ctx.workspace / "CHANGELOG.md")
    async with await path.open("a") as f:
        await f.write(line + "\n")
    return f"appended {line!r}"


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def check_changelog(ctx: perdure.ToolContext) -> str:
    """Check CHANGELOG.md: count the entries and report duplicated lines."""
    assert ctx.workspace is not None
    text = await trio.Path(ctx.workspace / "CHANGELOG.md").read_text()
    entries = [line for line in text.splitlines() if line.startswith("- ")]
    duplicates = sorted({e for e in entries if entries.count(e) > 1})
    verdict = "no duplicates" if not duplicates else f"DUPLICATED: {duplicates}"
    return f"{len(entries)} entries; {verdict}"


SCRIPT = [
    Reply(
        text="I'll append the entry first.",
        tool_uses=[ToolUse("append_note", {"line": ENTRY})],
    ),
    Reply(
        text="The append's outcome was reported; let me check the file before going on.",
        tool_uses=[ToolUse("check_changelog", {})],
    ),
    Reply(
        text=(
            "Done. The append was interrupted by a crash and perdure could not confirm it, "
            "so I did not repeat it; the check shows the entry is present exactly once."
        )
    ),
]


async def run_agent(root: Path) -> perdure.RunFinished | None:
    """One process's share of the work: open (recovering), submit, wait."""
    async with perdure.open_runtime(
        root / "log",
        provider=ScriptedProvider(SCRIPT),
        tools=[append_note, check_changelog],
        workspace=root / "workspace",
    ) as rt:
        sid = await rt.create_session("changelog")
        # A retrying caller re-sends the same request id; perdure accepts it once.
        await rt.submit(sid, TASK, request_id="demo-request-1")
        return await rt.wait_idle(sid)


def _child(root: Path) -> None:
    trio.run(run_agent, root)


def main(echo: Callable[[str, str], None], keep: bool = False) -> int:
    """Run the demo; ``echo(text, style)`` prints. Returns the exit code."""
    tmp = tempfile.mkdtemp(prefix="perdure-demo-")
    root = Path(tmp)
    (root / "workspace").mkdir()
    changelog = root / "workspace" / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n")
    echo(f"workspace: {root / 'workspace'}", "plain")
    echo(f"task: {TASK}", "input")
    echo("", "plain")
    echo("1) process A runs the agent; it is killed right after the append", "title")
    env = dict(os.environ, PERDURE_FAULT="tool.after:append_note")
    proc = subprocess.run(
        [sys.executable, "-m", "perdure.demo", "child", str(root)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != -9:
        echo(f"process A was expected to die by SIGKILL; it exited {proc.returncode}", "warning")
        echo(proc.stderr, "plain")
        return 1
    echo("   process A: killed by SIGKILL (exit -9)", "warning")
    echo(f"   CHANGELOG.md now: {changelog.read_text().splitlines()[2:]}", "plain")
    echo("", "plain")
    echo("2) process B opens the same log: recovery, then the run continues", "title")
    outcome = trio.run(run_agent, root)
    echo("", "plain")
    echo("Timeline (from the log):", "title")
    for line in _timeline(root / "log"):
        echo(*line)
    echo("", "plain")
    appended = [line for line in changelog.read_text().splitlines() if line == ENTRY]
    echo(f"final answer: {outcome.final_text if outcome else None}", "outcome")
    echo(f"CHANGELOG.md holds the entry {len(appended)} time(s)", "outcome")
    ok = outcome is not None and outcome.status == "completed" and len(appended) == 1
    echo(
        "OK: exactly one line appended, and the model was told the truth." if ok else "FAILED",
        "title",
    )
    if keep:
        echo(f"files kept in {root}", "plain")
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


def _timeline(log_dir: Path) -> list[tuple[str, str]]:
    from perdure.storage.lmdb_log import LmdbLog
    from perdure.timeline import render, with_restarts

    log = LmdbLog(log_dir, readonly=True)
    try:
        everything = log.read_global()
    finally:
        log.close()
    session = [c for c in everything if c.record.session_id == "changelog"]
    system = [c for c in everything if not c.record.session_id]
    return [
        (f"  #{seq:<3} {text}", kind) for seq, kind, text in render(with_restarts(session, system))
    ]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        _child(Path(sys.argv[2]))
    else:
        raise SystemExit(main(lambda text, style: print(text)))
