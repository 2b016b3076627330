"""Start-up's actors, started on the records start-up read, report their own start.

An actor start-up starts on a session's records already read has no task waiting
for it: it reports its start, or why it did not start, itself
(``Supervisor._start_read``). These tests take the two ways it may not start on a
real LMDB log: its actor keeps crashing (parked, the others resume) and its
recovery cannot be committed yet (it starts once the log takes commits again).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.actors import decide
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage import LogUnavailable
from perdure.storage.lmdb_log import LmdbLog
from tests.support.fold import fold_of


async def _interrupt(log_dir: Path, sessions: list[str]) -> None:
    """Leave a run of each of ``sessions`` in the log with its tool call executing."""
    blocked: set[str] = set()
    all_blocked = trio.Event()

    @perdure.tool(replay=ReplayPolicy.SAFE)
    async def wait(ctx: ToolContext) -> str:
        """Wait (the first time, until the runtime is shut down)."""
        if ctx.attempt == 1:
            blocked.add(ctx.session_id)
            if len(blocked) == len(sessions):
                all_blocked.set()
            await trio.sleep_forever()
        return "waited"

    script = ScriptedProvider([Reply(text="waiting", tool_uses=[ToolUse("wait")])])
    async with perdure.open_runtime(
        log_dir, provider=script, tools=[wait], shutdown_grace=0.1
    ) as rt:
        for sid in sessions:
            await rt.create_session(sid)
            await rt.submit(sid, "go", request_id="r1")
        with trio.fail_after(20):
            await all_blocked.wait()


@perdure.tool(replay=ReplayPolicy.SAFE)
async def wait(ctx: ToolContext) -> str:
    """Wait (the tool the interrupted runs called; re-run, it answers at once)."""
    return "waited"


def _script() -> ScriptedProvider:
    return ScriptedProvider([Reply(text="ok")] * 4)


async def test_a_session_whose_actor_keeps_crashing_at_boot_is_parked_and_the_rest_resume(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await _interrupt(log_dir, ["bad", "good"])
    real_recover = decide.recover

    def recover(s: Any, env: Any) -> Any:
        if s.session_id == "bad":
            raise RuntimeError("a bug in recovery (simulated)")
        return real_recover(s, env)

    monkeypatch.setattr(decide, "recover", recover)
    with trio.fail_after(60):
        async with perdure.open_runtime(log_dir, provider=_script(), tools=[wait]) as rt:
            assert sorted(rt.recovered_sessions) == ["bad", "good"]
            assert "bad" in rt._sup.parked and "bad" not in rt._sup.mailboxes
            assert "bad" not in rt._sup._starting and "good" not in rt._sup._starting
            outcome = await rt.wait_idle("good")
            assert outcome is not None and outcome.status == "completed"
            with pytest.raises(perdure.Refused, match="a bug in recovery") as refused:
                await rt.submit("bad", "again", request_id="r2")
            assert refused.value.code == "parked"
    said = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and "not started" in r.getMessage()
    ]
    assert said and all("session bad not started" in line for line in said)


async def test_a_session_whose_recovery_cannot_commit_at_boot_starts_when_the_log_answers(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _interrupt(log_dir, ["s", "t"])
    refused = 0
    real_commit = LmdbLog.commit

    def commit(self: LmdbLog, batches: Any) -> Any:
        nonlocal refused
        if refused < 3 and any(r.session_id == "s" for records, _ in batches for r in records):
            refused += 1
            raise LogUnavailable("the disk is not writable yet (simulated)")
        return real_commit(self, batches)

    monkeypatch.setattr(LmdbLog, "commit", commit)
    with trio.fail_after(60):
        async with perdure.open_runtime(log_dir, provider=_script(), tools=[wait]) as rt:
            # Up, with "t" resumed and "s" not started yet (its recovery was refused).
            assert refused == 1
            assert "s" not in rt._sup.mailboxes and "s" not in rt._sup._starting
            outcome = await rt.wait_idle("t")
            assert outcome is not None and outcome.status == "completed"
            # Started in the background once the log takes its recovery (nobody asks).
            while "s" not in rt._sup.mailboxes:  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert refused == 3
            outcome = await rt.wait_idle("s")
            assert outcome is not None and outcome.status == "completed"
            state = await fold_of(rt, "s")
            assert state.parked is None
            assert [t.phase for t in state.tasks.values()] == ["completed"]
