"""A log that cannot be reached for a while is waited out, never a reason to park.

An in-process simulation at the storage boundary (the real outage, a PostgreSQL
database refusing connections, is in ``tests/postgres/test_outage.py``): the
commit of a tool's result fails with ``CommitUnknown`` (the connection broke
during COMMIT), and the log then refuses every read for more restarts than the
parking limit allows. The session restarts from the log when it answers again,
finishes its run, and is not parked. A session whose actor really keeps crashing
is still parked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.backend import CommitUnknown, LogUnavailable
from perdure.storage.records import ToolCompleted


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up."""
    return f"found {query}"


async def test_an_unreachable_log_is_waited_out(log_dir: Path) -> None:
    script = ScriptedProvider(
        [Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "a"})]), Reply(text="done")]
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup]) as rt:
        log: Any = rt.journal.log
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
            if broke.is_set() and failed_reads < 6:  # more than max_restarts (3)
                failed_reads += 1
                raise LogUnavailable("the database refuses connections (simulated)")
            return real_read(*args, **kw)

        log.commit, log.read_session = commit, read_session
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        with trio.fail_after(60):
            await broke.wait()
            outcome = await rt.wait_idle("s")
        assert failed_reads == 6
        assert outcome is not None
        assert (outcome.status, outcome.final_text) == ("completed", "done")
        state = await rt.load_state("s")
        assert state.parked is None
        assert [t.phase for t in state.tasks.values()] == ["completed"]


async def test_an_actor_that_keeps_crashing_is_still_parked(log_dir: Path) -> None:
    script = ScriptedProvider([Reply(text="never used")])
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup]) as rt:
        await rt.create_session("s")
        log: Any = rt.journal.log
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
