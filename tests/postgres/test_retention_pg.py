"""Session control on PostgreSQL: a deleted session's rows go in the marker's transaction;
a fork and an export/import round trip work as on LMDB."""

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
        records = len(await rt._journal.read_session("old"))
        GATE["lookup"] = trio.Event()
        await rt.create_session("busy")
        await rt.submit("busy", "go", request_id="r1")
        with pytest.raises(perdure.Refused) as info:
            await rt.delete_session("busy")
        assert info.value.code == "busy"
        assert await rt.delete_session("old") == records
        assert await rt.session_info("old") is None
        assert await rt._journal.read_session("old") == []
        GATE["lookup"].set()
        with trio.fail_after(20):
            await rt.wait_idle("busy")
    report = check_log(pg_url)
    assert report.violations == [], "\n".join(report.violations)


async def test_fork_and_export_import_on_postgres(pg_url: str) -> None:
    GATE.clear()
    script = ScriptedProvider(
        [Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "q"})]), Reply(text="ok")]
    )
    async with perdure.open_runtime(pg_url, provider=script, tools=[lookup]) as rt:
        await rt.create_session("src")
        await rt.submit("src", "go", request_id="r1")
        with trio.fail_after(20):
            await rt.wait_idle("src")
        history = await rt._journal.read_session("src")
        turn_end = next(c.seq for c in history if type(c.record).__name__ == "ToolCompleted")
        forked = await rt.fork("src", at=turn_end, session_id="alt", request_id="f1")
        with trio.fail_after(20):
            outcome = await rt.wait_idle("alt")
        assert forked.position == turn_end and outcome is not None and outcome.final_text == "ok"
        lines = await rt.export_session("src")
        await rt.delete_session("src")
        assert await rt.import_session(lines) == "src"
        assert [c.record for c in await rt._journal.read_session("src")] == [
            c.record for c in history
        ]
    report = check_log(pg_url)
    assert report.violations == [], "\n".join(report.violations)
