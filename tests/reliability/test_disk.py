"""Disk faults under a running runtime: a tiny map that must grow, and a full disk.

* A log opened with a 64 KiB map serves twenty sessions to completion: the map
  grows (MAP_FULL is retried in a bigger map), every record lands exactly once.
* A full filesystem (a real small tmpfs; root only, else skipped with the reason):
  a tool finishes while the disk is full, so its result cannot be committed — it is
  held and retried, never re-run; a submit in that window is refused with
  ``StorageFull`` and leaves no trace; the trio loop keeps ticking; once space is
  freed the run completes on its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import perdure
from perdure.providers import Reply, ScriptedProvider, ToolUse
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import InputAccepted
from tests.support.checker import check, read_log
from tests.support.disk import fill

SCRIPT = [
    Reply(text="one", tool_uses=[ToolUse("lookup", {"query": "x" * 300})]),
    Reply(text="two", tool_uses=[ToolUse("lookup", {"query": "y" * 300})]),
    Reply(text="done " + "z" * 300),
]


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def lookup(query: str) -> str:
    """Look up."""
    return "found " + query


async def test_a_tiny_map_grows_under_load(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    async with perdure.open_runtime(
        log_dir, provider=ScriptedProvider(SCRIPT), tools=[lookup], map_size=64 << 10
    ) as rt:
        sids = [await rt.create_session(f"m{i}") for i in range(20)]
        for sid in sids:
            await rt.submit(sid, "go " + "w" * 500, request_id="r")
        for sid in sids:
            outcome = await rt.wait_idle(sid)
            assert outcome is not None
            assert outcome.status == "completed"
    log = LmdbLog(log_dir, readonly=True)
    try:
        assert log.env.info()["map_size"] > 64 << 10
    finally:
        log.close()
    report = check(log_dir, settled=True)
    assert report.violations == []
    assert report.counts["RunFinished"] == 20


async def test_full_disk_holds_results_refuses_input_and_recovers(small_disk: Path) -> None:
    runs: list[str] = []
    started = trio.Event()
    release = trio.Event()

    @perdure.tool(replay=perdure.ReplayPolicy.NEVER)
    async def gated(ctx: perdure.ToolContext, item: str) -> str:
        """Wait for the test, then report (NEVER: must not run twice)."""
        runs.append(ctx.call_id)
        started.set()
        await release.wait()
        return f"did {item}"

    script = [Reply(text="go", tool_uses=[ToolUse("gated", {"item": "x"})]), Reply(text="done")]
    log_dir = small_disk / "log"
    gaps: list[float] = []

    async def ticker() -> None:
        last = trio.current_time()
        while True:
            await trio.sleep(0.01)
            now = trio.current_time()
            gaps.append(now - last)
            last = now

    async with (
        perdure.open_runtime(
            log_dir, provider=ScriptedProvider(script), tools=[gated], shutdown_grace=1
        ) as rt,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(ticker)
        sid = await rt.create_session("full")
        other = await rt.create_session("other")
        await rt.submit(sid, "do it", request_id="r1")
        await started.wait()
        ballast = small_disk / "ballast"
        await trio.to_thread.run_sync(fill, ballast)
        gaps.clear()
        release.set()  # the tool returns; its result cannot be committed
        await trio.sleep(0.5)
        with pytest.raises(perdure.StorageFull):
            await rt.submit(other, "refused", request_id="r2")
        await trio.sleep(1.5)  # the held result is retried meanwhile, and fails
        assert max(gaps) < 0.5, "the trio loop stalled while the disk was full"
        ballast.unlink()
        with trio.fail_after(30):
            outcome = await rt.wait_idle(sid)
        assert outcome is not None
        assert outcome.status == "completed"
        nursery.cancel_scope.cancel()
    assert runs == ["toolu_001_1"], "the NEVER tool ran again"
    accepted = [c.record for c in read_log(log_dir) if isinstance(c.record, InputAccepted)]
    assert [r.session_id for r in accepted] == ["full"], "a refused submit left a record"
    report = check(log_dir, settled=True)
    assert report.violations == []


async def test_a_slow_disk_slows_commits_not_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every transaction waits 300 ms in the writer thread; the trio loop keeps its pace.

    A loop that waited for a commit would stall for at least the injected 300 ms; the
    bound sits below that, far enough above a 5 ms tick that a loaded machine's
    scheduling (a 0.12 s stall was seen at load 10 with a 50 ms delay) does not fail it.
    """
    from perdure import _faults

    slow = 0.3
    monkeypatch.setattr(_faults, "SLOW_COMMIT", slow)
    gaps: list[float] = []

    async def ticker() -> None:
        last = trio.current_time()
        while True:
            await trio.sleep(0.005)
            now = trio.current_time()
            gaps.append(now - last)
            last = now

    log_dir = tmp_path / "log"
    async with (
        perdure.open_runtime(log_dir, provider=ScriptedProvider(SCRIPT), tools=[lookup]) as rt,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(ticker)
        sids = [await rt.create_session(f"slow{i}") for i in range(5)]
        started = trio.current_time()
        for sid in sids:
            await rt.submit(sid, "go", request_id="r")
        for sid in sids:
            outcome = await rt.wait_idle(sid)
            assert outcome is not None
            assert outcome.status == "completed"
        elapsed = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert elapsed > slow * 5, "the injected delay did not apply"
    assert max(gaps) < slow * 0.8, f"the trio loop stalled for {max(gaps):.3f}s on a slow disk"
    report = check(log_dir, settled=True)
    assert report.violations == []
    assert report.counts["RunFinished"] == 5
