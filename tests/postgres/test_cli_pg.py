"""The read-only commands on a PostgreSQL log, as a user runs them: ``perdure sessions``,
``perdure show`` (timeline and ``--json``) and ``perdure check`` with ``--log postgresql://``.

A real runtime writes a finished session (a tool call, two model turns) into a
throwaway database; the commands then run as separate processes against it.
"""

from __future__ import annotations

import json

import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from tests.server.test_cli import perdure as run_cli


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look up."""
    return f"found {query}"


async def test_sessions_show_and_check_read_a_postgresql_log(pg_url: str) -> None:
    script = ScriptedProvider(
        [
            Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "pg"})]),
            Reply(text="the answer is 42"),
        ]
    )
    async with perdure.open_runtime(pg_url, provider=script, tools=[lookup]) as rt:
        await rt.create_session("pg-one")
        await rt.submit("pg-one", "find it", request_id="r1")
        finished = await rt.wait_idle("pg-one")
        assert finished is not None and finished.status == "completed"

    listed = await trio.to_thread.run_sync(run_cli, "sessions", "--log", pg_url)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["pg-one"]
    assert rows[0][-1] == "0"  # no open submissions: the run finished

    shown = await trio.to_thread.run_sync(run_cli, "show", "pg-one", "--log", pg_url)
    assert shown.returncode == 0, shown.stderr
    assert "Timeline of pg-one" in shown.stdout
    assert "lookup [" in shown.stdout and "completed" in shown.stdout
    assert "the answer is 42" in shown.stdout
    assert "runtime started" not in shown.stdout  # one start, before the session

    as_json = await trio.to_thread.run_sync(run_cli, "show", "pg-one", "--log", pg_url, "--json")
    assert as_json.returncode == 0, as_json.stderr
    summary = json.loads(as_json.stdout)
    assert summary["session_id"] == "pg-one" and summary["status"] == "idle"
    assert [t["tool"] for t in summary["tasks"]] == ["lookup"]

    missing = await trio.to_thread.run_sync(run_cli, "show", "nope", "--log", pg_url)
    assert missing.returncode == 2
    assert "no session 'nope'" in missing.stderr
    assert "password" not in missing.stderr.lower()

    checked = await trio.to_thread.run_sync(run_cli, "check", "--log", pg_url, "--settled")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "OK" in checked.stdout
