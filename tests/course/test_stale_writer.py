"""Stale-writer safety: a dispatch decided under an old goal revision is refused at commit.

The session actor passes the goal revision its decision was made under as a guard
on every append; the log checks it inside the write transaction. Here a "zombie"
decision taken on a snapshot from before a revision tries to dispatch the old
goal's queued action: the Journal refuses it and writes nothing.
"""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest
import trio

import perdure
from perdure.actors import decide, protocol
from perdure.actors.mailbox import CommandMsg, Mailbox
from perdure.actors.session import SessionActor
from perdure.providers import Reply, ScriptedProvider, ToolUse
from perdure.storage import Guard, StaleGoal
from perdure.storage.records import ToolExecuting
from tests.support.fold import fold_of


@perdure.tool(replay=perdure.ReplayPolicy.NEVER, requires_approval=True)
async def deploy(target: str) -> str:
    """Deploy."""
    return f"deployed {target}"


async def test_dispatch_prepared_under_an_old_revision_is_refused(log_dir: Path) -> None:
    provider = ScriptedProvider(
        [
            Reply(text="deploying", tool_uses=[ToolUse("deploy", {"target": "prod"})]),
            Reply(text="not deploying, as revised"),
        ]
    )
    async with perdure.open_runtime(log_dir, provider=provider, tools=[deploy]) as rt:
        sid = await rt.create_session("s1")
        await rt.submit(sid, "deploy it", request_id="r1")
        async with aclosing(rt.events(sid)) as events:
            async for event in events:
                if event.kind == "ToolAwaitingApproval":
                    break
        snapshot = await fold_of(rt, sid)  # what a zombie writer still believes
        await rt.revise(sid, "do not deploy", request_id="v1")
        outcome = await rt.wait_idle(sid)
        assert outcome is not None
        assert outcome.final_text == "not deploying, as revised"

        env = protocol.Env(tools={"deploy": deploy}, now=0.0)
        first, _ = decide.command(snapshot, env, protocol.Approve("toolu_001_1", True, "late"))
        step = decide.settle(snapshot, env, protocol.View(), first)
        assert any(isinstance(r, ToolExecuting) for r in step.records)
        before = len(await rt._journal.read_session(sid))
        with pytest.raises(StaleGoal, match="revision 1 is in force"):
            await rt._journal.append(step.records, guard=Guard(sid, 0))
        after = await rt._journal.read_session(sid)
        assert len(after) == before, "a refused append wrote something"
        assert not any(isinstance(c.record, ToolExecuting) for c in after)


DEPLOYED: list[str] = []


@perdure.tool(name="deploy", replay=perdure.ReplayPolicy.NEVER, requires_approval=True)
async def counted_deploy(target: str) -> str:
    """Deploy (and count it)."""
    DEPLOYED.append(target)
    return f"deployed {target}"


async def test_an_actor_holding_an_old_revision_cannot_dispatch(log_dir: Path) -> None:
    """A zombie session actor (its state folded before a revision) decides a dispatch
    from what it believes; its own commit carries that old revision and is refused."""
    DEPLOYED.clear()
    provider = ScriptedProvider(
        [
            Reply(text="deploying", tool_uses=[ToolUse("deploy", {"target": "prod"})]),
            Reply(text="not deploying, as revised"),
        ]
    )
    async with perdure.open_runtime(log_dir, provider=provider, tools=[counted_deploy]) as rt:
        sid = await rt.create_session("s1")
        await rt.submit(sid, "deploy it", request_id="r1")
        async with aclosing(rt.events(sid)) as events:
            async for event in events:
                if event.kind == "ToolAwaitingApproval":
                    break
        zombie = SessionActor(sid, rt._ctx, Mailbox.open())
        async with trio.open_nursery() as nursery:
            await nursery.start(zombie.run)  # folds the log now: revision 0
            assert zombie.state.goal_rev == 0
            await rt.revise(sid, "do not deploy", request_id="v1")
            outcome = await rt.wait_idle(sid)
            assert outcome is not None and outcome.final_text == "not deploying, as revised"

            message = CommandMsg[protocol.Done](protocol.Approve("toolu_001_1", True, "late"))
            await zombie.mailbox.send.send(message)
            with pytest.raises(StaleGoal, match="revision 1 is in force"):
                await message.reply.wait()
            assert zombie.state.goal_rev == 1, "the refused actor re-read the log"
            nursery.cancel_scope.cancel()
        log = await rt._journal.read_session(sid)
        assert not any(isinstance(c.record, ToolExecuting) for c in log)
        assert DEPLOYED == [], "the old goal's action never ran"
