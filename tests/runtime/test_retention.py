"""Retention on a real LMDB log: delete, prune, export/import, compact.

* a finished session is deleted whole (one transaction with its ``SessionDeleted``
  marker), one with work pending is refused, its event stream ends with a clear event,
  and ``perdure check`` still passes (the missing sequence numbers are accounted for);
* ``prune`` deletes the old finished sessions and keeps the others;
* an export imported into another log gives the same records and the same transcript;
* compaction after a prune shrinks the file and the log still checks.
"""

from __future__ import annotations

import time
from contextlib import aclosing
from pathlib import Path

import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext, retention
from perdure.check import check_log
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import SessionDeleted

GATE: dict[str, trio.Event] = {}


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up (waits for the test's gate, if any)."""
    gate = GATE.get("lookup")
    if gate is not None:
        await gate.wait()
    return f"found {query} " + "x" * 2000


def script() -> ScriptedProvider:
    return ScriptedProvider(
        [Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "q"})]), Reply(text="done")]
    )


def sound(log_dir: Path) -> None:
    report = check_log(log_dir)
    assert report.violations == [], "\n".join(report.violations)


async def finished(rt: perdure.Runtime, sid: str) -> None:
    await rt.create_session(sid)
    await rt.submit(sid, "go", request_id="r1")
    with trio.fail_after(10):
        await rt.wait_idle(sid)


async def test_delete_a_finished_session_and_refuse_a_busy_one(log_dir: Path) -> None:
    GATE.clear()
    async with perdure.open_runtime(log_dir, provider=script(), tools=[lookup]) as rt:
        await finished(rt, "old")
        before = len(await rt._journal.read_session("old"))
        GATE["lookup"] = trio.Event()
        await rt.create_session("busy")
        await rt.submit("busy", "go", request_id="r1")
        with pytest.raises(perdure.Refused) as info:
            await rt.delete_session("busy")
        assert info.value.code == "busy"

        got: list[str] = []

        async def follow(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with aclosing(rt.events("old")) as events:
                task_status.started()
                async for event in events:
                    got.append(event.kind)

        async with trio.open_nursery() as nursery:
            await nursery.start(follow)
            assert await rt.delete_session("old", reason="test") == before
        assert got[-1] == "session_deleted", "the stream ended with a clear event"
        assert await rt.session_info("old") is None
        with pytest.raises(perdure.UnknownSession):
            await rt.submit("old", "again", request_id="r9")
        with pytest.raises(perdure.UnknownSession):
            await rt.delete_session("old")
        GATE["lookup"].set()
        with trio.fail_after(10):
            await rt.wait_idle("busy")
        markers = [c.record for c in await rt.restarts()]
        assert markers  # system records are still readable
        system = await trio.to_thread.run_sync(rt._journal.log.read_system)
        deleted = [c.record for c in system if isinstance(c.record, SessionDeleted)]
        assert [(d.deleted, d.records) for d in deleted] == [("old", before)]
    sound(log_dir)


async def test_prune_export_import_and_compact(tmp_path: Path) -> None:
    GATE.clear()
    log_dir, other = tmp_path / "log", tmp_path / "other"
    async with perdure.open_runtime(log_dir, provider=script(), tools=[lookup]) as rt:
        for sid in ("a", "b", "c"):
            await finished(rt, sid)
        exported = await rt.export_session("b")
        transcript = await rt.transcript("b")
        original = [c.record for c in await rt._journal.read_session("b")]
        cutoff = time.time() + 1
        dry, kept = await rt.prune(cutoff, dry_run=True)
        assert sorted(p.session_id for p in dry) == ["a", "b", "c"] and not kept
        assert await rt.session_info("a") is not None, "a dry run deletes nothing"
        deleted, kept = await rt.prune(cutoff)
        assert sorted(p.session_id for p in deleted) == ["a", "b", "c"]
        assert await rt.sessions() == []
    sound(log_dir)

    before, after = await trio.to_thread.run_sync(retention.compact, log_dir)
    assert after < before
    sound(log_dir)

    async with perdure.open_runtime(other, provider=script(), tools=[lookup]) as rt:
        assert await rt.import_session(exported) == "b"
        assert [c.record for c in await rt._journal.read_session("b")] == original
        assert await rt.transcript("b") == transcript
        with pytest.raises(perdure.Refused) as info:
            await rt.import_session(exported)
        assert info.value.code == "conflict"
        with pytest.raises(ValueError, match="line 1"):
            await rt.import_session(["{}"])
    sound(other)
