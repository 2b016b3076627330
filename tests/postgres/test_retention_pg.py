"""Retention on PostgreSQL: a deleted session's rows go in the marker's transaction."""

from __future__ import annotations

import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.check import check_log
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

GATE: dict[str, trio.Event] = {}


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up (waits for the test's gate, if any)."""
    gate = GATE.get("lookup")
    if gate is not None:
        await gate.wait()
    return f"found {query}"


async def test_delete_a_finished_session_on_postgres(pg_url: str) -> None:
    GATE.clear()
    script = ScriptedProvider(
        [Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "q"})]), Reply(text="ok")]
    )
    async with perdure.open_runtime(pg_url, provider=script, tools=[lookup]) as rt:
        await rt.create_session("old")
        await rt.submit("old", "go", request_id="r1")
        with trio.fail_after(20):
            await rt.wait_idle("old")
        records = len(await rt.journal.read_session("old"))
        GATE["lookup"] = trio.Event()
        await rt.create_session("busy")
        await rt.submit("busy", "go", request_id="r1")
        with pytest.raises(perdure.Refused) as info:
            await rt.delete_session("busy")
        assert info.value.code == "busy"
        assert await rt.delete_session("old") == records
        assert await rt.session_info("old") is None
        assert await rt.journal.read_session("old") == []
        GATE["lookup"].set()
        with trio.fail_after(20):
            await rt.wait_idle("busy")
    report = check_log(pg_url)
    assert report.violations == [], "\n".join(report.violations)
