"""A session actor asked to hand over (the shell's side of rebalancing), on a clock the test
controls.

The supervisor of a multi-node log sends ``HandOver`` when it sheds a session; here the
test sends it straight to the actor, on a ``MemoryLog`` in virtual time and on LMDB
in real time (``tests/support/deterministic.py``), where the lease part is trivial:

* the step in hand finishes (its tool runs to the end), a command that arrives
  meanwhile is served and committed, then the actor stops at the safe point without
  starting the next turn; the session's next use recovers it with nothing in flight;
* a back-off being waited out (a tool call's retry or a model call's) does not hold
  the hand-over up: it stops at once, and the next actor waits out the rest (the
  back-off's end is in the log);
* a hand-over that finds no safe point before its deadline gives up: the session
  stays, and its run goes on where it was.
"""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

import perdure
from perdure import ReplayPolicy, RetryableError, RetryPolicy, ToolContext
from perdure.actors.mailbox import HandOver
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import (
    GenerationCompleted,
    GenerationStarted,
    InputAccepted,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    ToolCompleted,
    ToolExecuting,
    ToolRetryPending,
)
from tests.support.deterministic import Where
from tests.support.fold import fold_of

SID = "s"
attempts: dict[str, int] = {}


@perdure.tool(replay=ReplayPolicy.SAFE)
async def work(ctx: ToolContext, seconds: float) -> str:
    """Work for a while."""
    await trio.sleep(seconds)
    return "worked"


@perdure.tool(
    replay=ReplayPolicy.SAFE, retry=RetryPolicy(max_attempts=2, initial=1.0, max_interval=600)
)
async def flaky(ctx: ToolContext, key: str, wait: float) -> str:
    """Fail the first attempt, asking for a back-off of ``wait`` seconds."""
    attempts[key] = attempts.get(key, 0) + 1
    if attempts[key] == 1:
        raise RetryableError("busy upstream", retry_after=wait)
    return "fetched"


def script(*uses: ToolUse) -> ScriptedProvider:
    replies = [Reply(text="on it", tool_uses=list(uses)), Reply(text="done")]
    return ScriptedProvider([*replies, Reply(text="done again")])


async def record_kinds(rt: perdure.Runtime) -> list[str]:
    return [type(c.record).__name__ for c in await rt._journal.read_session(SID)]


async def wait_for(rt: perdure.Runtime, kind: type, count: int = 1) -> None:
    with trio.fail_after(900):
        while sum(isinstance(c.record, kind) for c in await rt._journal.read_session(SID)) < count:  # noqa: ASYNC110
            await trio.sleep(0.05)


async def hand_over(rt: perdure.Runtime, deadline: float) -> HandOver:
    message = HandOver("elsewhere", trio.current_time() + deadline)
    await rt._sup.mailboxes[SID].send.send(message)
    return message


async def test_the_step_finishes_then_the_actor_stops_and_the_next_one_starts_clean(
    where: Where, clock: MockClock
) -> None:
    prov = script(ToolUse("work", {"seconds": 3.0}))
    async with perdure.open_runtime(
        where.open(), provider=prov, tools=[work], **where.options()
    ) as rt:
        await rt.create_session(SID)
        await rt.submit(SID, "go", request_id="r1")
        await wait_for(rt, ToolExecuting)
        message = await hand_over(rt, deadline=60)
        queued = await rt.submit(SID, "and then this", request_id="r2")  # served meanwhile
        with trio.fail_after(30):
            await message.reply.wait()
        assert SID not in rt.resident_sessions
        kinds = await record_kinds(rt)
        assert kinds[-2:] == ["InputAccepted", "ToolCompleted"], "no next turn here"
        assert not queued.duplicate
        # Its next use (here: the same node, as the lease is trivial) recovers it.
        with trio.fail_after(60):
            await rt.wait_idle(SID)
        records = [c.record for c in await rt._journal.read_session(SID)]
        (decision,) = [r for r in records if isinstance(r, RecoveryDecision)]
        assert decision.reason == "nothing was in flight"
        finished = [r for r in records if isinstance(r, RunFinished)]
        assert [r.status for r in finished] == ["completed", "completed"]
        assert sum(isinstance(r, InputAccepted) for r in records) == 2


async def test_a_back_off_stops_at_once_and_the_next_actor_waits_out_the_rest(
    where: Where, clock: MockClock
) -> None:
    wait = 600.0 if where.virtual else 2.0  # ten minutes take no time on the MockClock
    attempts.clear()
    prov = script(ToolUse("flaky", {"key": where.kind, "wait": wait}))
    async with perdure.open_runtime(
        where.open(), provider=prov, tools=[flaky], **where.options(retry_base=0.05)
    ) as rt:
        await rt.create_session(SID)
        await rt.submit(SID, "go", request_id="r1")
        await wait_for(rt, ToolRetryPending)
        asked_at = trio.current_time()
        message = await hand_over(rt, deadline=60)
        with trio.fail_after(wait / 2):
            await message.reply.wait()
        assert trio.current_time() - asked_at < wait / 2, "the back-off did not hold it up"
        state = await fold_of(rt, SID)
        not_before = state.tasks["toolu_001_1"].not_before
        assert not_before is not None
        with trio.fail_after(900):
            await rt.wait_idle(SID)
        records = [c for c in await rt._journal.read_session(SID)]
        second = [
            c.record
            for c in records
            if isinstance(c.record, ToolExecuting) and c.record.attempt == 2
        ]
        assert len(second) == 1 and second[0].at >= not_before, "the rest was waited out"
        assert attempts[where.kind] == 2


async def test_a_model_back_off_stops_at_once_and_the_next_actor_waits_out_the_rest(
    where: Where, clock: MockClock
) -> None:
    wait = 600.0 if where.virtual else 2.0
    prov = ScriptedProvider([Reply(text="done", fail_attempts=1, retry_after=wait)])
    async with perdure.open_runtime(
        where.open(), provider=prov, tools=[], **where.options(retry_cap=wait)
    ) as rt:
        await rt.create_session(SID)
        await rt.submit(SID, "go", request_id="r1")
        await wait_for(rt, RetryPending)
        actor = rt._sup.actors[SID]
        assert not actor.calling_model(), "a call waiting out its back-off moves at once"
        assert not actor.at_rest()
        asked_at = trio.current_time()
        message = await hand_over(rt, deadline=60)
        with trio.fail_after(wait / 2):
            await message.reply.wait()
        assert trio.current_time() - asked_at < wait / 2, "the back-off did not hold it up"
        assert SID not in rt.resident_sessions
        assert prov.calls == 1, "no model call started on the way out"
        with trio.fail_after(900):
            outcome = await rt.wait_idle(SID)
        assert outcome is not None and outcome.status == "completed"
        records = [c.record for c in await rt._journal.read_session(SID)]
        (pending,) = [r for r in records if isinstance(r, RetryPending)]
        assert pending.not_before - pending.at >= wait
        (completed,) = [r for r in records if isinstance(r, GenerationCompleted)]
        assert completed.at >= pending.not_before, "the rest was waited out"
        assert prov.calls == 2


async def test_no_safe_point_before_the_deadline_the_session_stays_and_goes_on(
    where: Where, clock: MockClock
) -> None:
    prov = script(ToolUse("work", {"seconds": 3.0}))
    async with perdure.open_runtime(
        where.open(), provider=prov, tools=[work], **where.options()
    ) as rt:
        await rt.create_session(SID)
        await rt.submit(SID, "go", request_id="r1")
        await wait_for(rt, ToolExecuting)
        message = await hand_over(rt, deadline=1.0)
        with pytest.raises(perdure.Refused, match="stays: no safe point") as caught:
            await message.reply.wait()
        assert caught.value.code == "busy"
        assert SID in rt.resident_sessions
        with trio.fail_after(30):
            outcome = await rt.wait_idle(SID)
        assert outcome is not None and outcome.status == "completed"
        records = [c.record for c in await rt._journal.read_session(SID)]
        assert not [r for r in records if isinstance(r, RecoveryDecision)], "it never stopped"
        done = next(i for i, r in enumerate(records) if isinstance(r, ToolCompleted))
        assert isinstance(records[done + 1], GenerationStarted), "its next turn began here"
