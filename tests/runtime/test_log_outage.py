"""A log that cannot be reached for a while is waited out, never a reason to park.

An in-process simulation at the storage boundary (the real outage, a PostgreSQL
database refusing connections, is in ``tests/postgres/test_outage.py``): the
commit of a tool's result fails with ``CommitUnknown`` (the connection broke
during COMMIT), and the log then refuses every read for more restarts than the
parking limit allows. The session restarts from the log when it answers again,
finishes its run, and is not parked. A session whose actor really keeps crashing
is still parked.

The first three tests run on a ``MemoryLog`` under an autojumping MockClock (the
restart back-offs take virtual time only) and on a real LMDB log in real time
(``tests/support/deterministic.py``); the boot test patches the LMDB class itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.actors.session import RELOAD_TRIES
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage import CommitUnknown, LogUnavailable
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import ToolCompleted
from tests.support.deterministic import Where
from tests.support.fold import fold_of

FAILED_READS = RELOAD_TRIES + 4


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up."""
    return f"found {query}"


async def test_an_unreachable_log_is_waited_out(where: Where, clock: MockClock) -> None:
    script = ScriptedProvider(
        [Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "a"})]), Reply(text="done")]
    )
    async with perdure.open_runtime(
        where.open(), provider=script, tools=[lookup], **where.options()
    ) as rt:
        log: Any = rt._journal.log
        real_commit, real_read = log.commit, log.read_session
        failed_reads = 0
        broke = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def commit(batches: Any) -> Any:
            if not broke.is_set() and any(
                isinstance(r, ToolCompleted) for records, _ in batches for r in records
            ):
                token.run_sync_soon(broke.set)
                raise CommitUnknown("the connection broke during COMMIT (simulated)")
            return real_commit(batches)

        def read_session(*args: Any, **kw: Any) -> Any:
            nonlocal failed_reads
            # More than the actor's own re-reads (RELOAD_TRIES) plus max_restarts (3).
            if broke.is_set() and failed_reads < FAILED_READS:
                failed_reads += 1
                raise LogUnavailable("the database refuses connections (simulated)")
            return real_read(*args, **kw)

        log.commit, log.read_session = commit, read_session
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(60):
            await broke.wait()
            while "s" not in rt._sup.unreachable:  # noqa: ASYNC110 (the actor gave up)
                await trio.sleep(0.01)
        # While its actor waits to restart, a command is refused at once.
        with trio.fail_after(5), pytest.raises(perdure.LogUnavailable):
            await rt.submit("s", "meanwhile", request_id="r2")
        with trio.fail_after(60):
            while True:  # as a client would on 503: retry until the log answers
                try:
                    outcome = await rt.wait_idle("s")
                    break
                except perdure.LogUnavailable:
                    await trio.sleep(0.1)
        assert failed_reads == FAILED_READS
        assert outcome is not None
        assert (outcome.status, outcome.final_text) == ("completed", "done")
        state = await fold_of(rt, "s")
        assert state.parked is None
        assert [t.phase for t in state.tasks.values()] == ["completed"]


async def test_an_actor_that_keeps_crashing_is_still_parked(where: Where, clock: MockClock) -> None:
    script = ScriptedProvider([Reply(text="never used")])
    async with perdure.open_runtime(
        where.open(), provider=script, tools=[lookup], **where.options()
    ) as rt:
        await rt.create_session("s")
        log: Any = rt._journal.log
        real_read = log.read_session

        def read_session(session_id: str, *args: Any, **kw: Any) -> Any:
            if session_id == "s":
                raise ValueError("a bug in the fold (simulated)")
            return real_read(session_id, *args, **kw)

        log.read_session = read_session
        rt._sup.mailboxes.clear()  # make the next command start the actor again
        with trio.fail_after(30), pytest.raises(perdure.Refused, match="a bug in the fold") as e:
            await rt.submit("s", "go", request_id="r1")
        assert e.value.code == "parked"


async def test_callers_hear_of_an_outage_at_once(where: Where, clock: MockClock) -> None:
    """Nobody waits through an outage: a command for a session that must start first
    fails with LogUnavailable right away, and records nothing."""
    script = ScriptedProvider([Reply(text="one"), Reply(text="two"), Reply(text="three")])
    async with perdure.open_runtime(
        where.open(), provider=script, tools=[lookup], **where.options(idle_timeout=0.05)
    ) as rt:
        await rt.create_session("evicted")
        await rt.submit("evicted", "go", request_id="r1")
        with trio.fail_after(10):
            await rt.wait_idle("evicted")
        log: Any = rt._journal.log
        real_read = log.read_session
        down = True

        def read_session(*args: Any, **kw: Any) -> Any:
            if down:
                raise LogUnavailable("the database refuses connections (simulated)")
            return real_read(*args, **kw)

        with trio.fail_after(10):
            while rt.resident_sessions:  # noqa: ASYNC110
                await trio.sleep(0.01)
        log.read_session = read_session
        with trio.fail_after(5), pytest.raises(perdure.LogUnavailable):
            await rt.submit("evicted", "during", request_id="r2")
        down = False
        with trio.fail_after(10):
            await rt.submit("evicted", "after", request_id="r3")
            assert (await rt.wait_idle("evicted")).final_text == "two"
        assert "r2" not in (await fold_of(rt, "evicted")).requests


async def test_a_session_that_cannot_start_at_boot_starts_when_the_log_answers(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = trio.Event()

    @perdure.tool(replay=ReplayPolicy.SAFE)
    async def wait(ctx: ToolContext) -> str:
        """Wait (the first time, until the runtime is shut down)."""
        if ctx.attempt == 1:
            blocked.set()
            await trio.sleep_forever()
        return "waited"

    script = ScriptedProvider(
        [Reply(text="waiting", tool_uses=[ToolUse("wait")]), Reply(text="ok")]
    )
    async with perdure.open_runtime(
        log_dir, provider=script, tools=[wait], shutdown_grace=0.1
    ) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(10):
            await blocked.wait()
    # The run is unfinished in the log. The next start cannot read it at first.
    failures = 0
    real_read = LmdbLog.read_session

    def read_session(self: LmdbLog, session_id: str, *args: Any, **kw: Any) -> Any:
        nonlocal failures
        if session_id == "s" and failures < 4:
            failures += 1
            raise LogUnavailable("the disk is not mounted yet (simulated)")
        return real_read(self, session_id, *args, **kw)

    monkeypatch.setattr(LmdbLog, "read_session", read_session)
    with trio.fail_after(30):
        async with perdure.open_runtime(log_dir, provider=script, tools=[wait]) as rt:
            assert failures == 1  # the runtime is up although "s" could not start yet
            while True:
                try:
                    outcome = await rt.wait_idle("s")
                    break
                except perdure.LogUnavailable:
                    await trio.sleep(0.05)
    assert failures == 4
    assert outcome is not None
    assert (outcome.status, outcome.final_text) == ("completed", "ok")
