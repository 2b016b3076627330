"""One way to wait: every retry's back-off is waited out on the session actor's timer.

A tool call's retry (``BackOff``), a model call's and a context summary's (``CallModel``,
``Summarize`` with a later ``not_before``) are all held by the session's timer
(``Performer._wake_at``); the generation actor and the tool actor are started only when
the wait is over. The tests watch which tasks trio spawns and when (a trio instrument),
on a ``MemoryLog`` under an autojumping ``MockClock``: virtual time alone decides, so
the times are exact. A cancel or a revision during a model call's back-off stops its
timer: the waiting call never starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

import perdure
from perdure import ReplayPolicy, RetryableError, RetryPolicy, ToolContext, tool
from perdure.observability import logs
from perdure.providers.base import Emit, ModelReply, ModelRequest, ProviderError
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import (
    Committed,
    CompactionRetryPending,
    ContextCompacted,
    RetryPending,
    RunFinished,
    ToolExecuting,
    ToolRetryPending,
    Usage,
)
from tests.support.deterministic import Where

SESSION = "s"
MODEL_RETRY_AFTER = 30.0
TOOL_RETRY_AFTER = 60.0


@pytest.fixture
def clock() -> MockClock:
    return MockClock(autojump_threshold=0)


@pytest.fixture
def where(clock: MockClock, tmp_path: Path) -> Where:
    return Where("memory", clock, tmp_path)


class Spawns(trio.abc.Instrument):
    """The tasks trio starts: (the last part of the task's name, the trio time)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.seen.append((task.name.rsplit(".", 1)[-1], trio.current_time()))

    def times(self, name: str) -> list[float]:
        return [t for n, t in self.seen if n == name]


@contextmanager
def watching_spawns() -> Iterator[Spawns]:
    spawns = Spawns()
    trio.lowlevel.add_instrument(spawns)
    try:
        yield spawns
    finally:
        trio.lowlevel.remove_instrument(spawns)


@tool(replay=ReplayPolicy.KEYED, retry=RetryPolicy(max_attempts=2, initial=0.05))
async def booked(ctx: ToolContext) -> str:
    """Busy on the first attempt (come back in a minute), booked on the second."""
    if ctx.attempt == 1:
        raise RetryableError("busy", retry_after=TOOL_RETRY_AFTER)
    return "booked"


def of(kind: type, log: list[Committed]) -> list[Any]:
    return [c.record for c in log if isinstance(c.record, kind)]


async def wait_for_record(rt: perdure.Runtime, kind: type) -> Any:
    with trio.fail_after(3600):  # virtual seconds
        async with aclosing(rt.events(SESSION)) as events:
            async for event in events:
                if isinstance(event.record, kind):
                    return event.record
    raise AssertionError(f"no {kind.__name__}")


class NotingIds(ScriptedProvider):
    """The scripted provider, noting the log ids bound in each call's task."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(replies)
        self.ids: list[dict[str, str]] = []

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        self.ids.append(logs.current_ids())
        return await super().complete(request, emit)


async def test_a_model_retry_and_a_tool_retry_wait_on_the_same_timer(
    where: Where, clock: MockClock
) -> None:
    provider = NotingIds(
        [
            Reply(tool_uses=[ToolUse("booked")], fail_attempts=1, retry_after=MODEL_RETRY_AFTER),
            Reply(text="done"),
        ]
    )
    with watching_spawns() as spawns:
        async with perdure.open_runtime(
            where.open(), provider=provider, tools=[booked], **where.options()
        ) as rt:
            await rt.create_session(SESSION)
            await rt.submit(SESSION, "book it", request_id="r1")
            with trio.fail_after(3600):
                outcome = await rt.wait_idle(SESSION)
            log = list(await rt._journal.read_session(SESSION))
    assert outcome is not None and outcome.status == "completed"
    (model_retry,) = of(RetryPending, log)
    (tool_retry,) = of(ToolRetryPending, log)
    executing = of(ToolExecuting, log)
    assert model_retry.not_before - model_retry.at >= MODEL_RETRY_AFTER
    assert tool_retry.not_before - tool_retry.at >= TOOL_RETRY_AFTER

    def trio_time(wall: float) -> float:
        return wall - (where.wall() - trio.current_time())

    # Both back-offs started the one timer when their records were committed ...
    assert spawns.times("_wake_at") == [trio_time(model_retry.at), trio_time(tool_retry.at)]
    # ... and the calls they held started only when it was due, not a moment earlier:
    # the model's second attempt is a new generation actor, spawned at its not_before
    # (three model calls: the failed attempt, its retry, the turn after the tool).
    model_calls = spawns.times("call_model")
    assert len(model_calls) == 3 and provider.calls == 3
    assert model_calls[1] == trio_time(model_retry.not_before)
    assert model_calls[0] == trio_time(model_retry.at)  # the first attempt did not wait
    # The retry, started from the timer, still logs under its run's and turn's ids.
    assert provider.ids[1]["generation_id"] == model_retry.generation_id
    assert provider.ids[1]["run_id"] == provider.ids[0]["run_id"]
    assert spawns.times("run_tool") == [
        trio_time(executing[0].at),
        trio_time(tool_retry.not_before),
    ]
    assert [e.attempt for e in executing] == [1, 2]
    assert executing[1].at == tool_retry.not_before


class FirstCallOverloaded(ScriptedProvider):
    """The scripted provider, except that its very first call is overloaded (retry in ten
    minutes); it notes each call's (generation, attempt)."""

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(replies)
        self.asked: list[tuple[str, int]] = []

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        self.asked.append((request.generation_id, request.attempt))
        if len(self.asked) == 1:
            raise ProviderError("overloaded", retryable=True, retry_after=600, status=529)
        return await super().complete(request, emit)


@pytest.mark.parametrize("how", ["cancel", "revise"])
async def test_a_cancel_or_a_revision_during_a_model_back_off_starts_no_model_call(
    where: Where, clock: MockClock, how: str
) -> None:
    provider = FirstCallOverloaded([Reply(text="answered")])
    with watching_spawns() as spawns:
        async with perdure.open_runtime(
            where.open(), provider=provider, tools=[], **where.options()
        ) as rt:
            await rt.create_session(SESSION)
            await rt.submit(SESSION, "go", request_id="r1")
            pending = await wait_for_record(rt, RetryPending)
            if how == "cancel":
                await rt.cancel(SESSION, request_id="k1")
            else:
                await rt.revise(SESSION, "go, but differently", request_id="v1")
            with trio.fail_after(60):  # the back-off, still waited for, would take 600
                outcome = await rt.wait_idle(SESSION)
            await trio.sleep(1200)  # well past the back-off's end
            log = list(await rt._journal.read_session(SESSION))
    assert len(spawns.times("_wake_at")) == 1, "the retry waited on the session's timer"
    assert (pending.generation_id, 2) not in provider.asked, "the waiting retry never started"
    (finished,) = of(RunFinished, log)
    assert finished.at < pending.not_before
    assert outcome is not None
    if how == "cancel":
        assert outcome.status == "cancelled"
        assert provider.asked == [(pending.generation_id, 1)]
        assert len(spawns.times("call_model")) == 1
    else:  # the revised request is answered by a new turn, at once
        assert outcome.status == "completed"
        assert [attempt for _, attempt in provider.asked] == [1, 1]
        assert provider.asked[1][0] != pending.generation_id


async def test_a_summary_retry_waits_on_the_same_timer(where: Where, clock: MockClock) -> None:
    provider = ScriptedProvider(
        [
            Reply(text="Paris.", usage=Usage(input_tokens=900)),
            Reply(text="About 2.1 million."),
        ]
    )
    summarizer = FirstCallOverloaded([Reply(text="Asked: the capital of France.")])
    policy = perdure.CompactionPolicy(window=1000, keep_recent=2)
    with watching_spawns() as spawns:
        async with perdure.open_runtime(
            where.open(),
            provider=provider,
            compaction=policy,
            compaction_provider=summarizer,
            tools=[],
            **where.options(),
        ) as rt:
            await rt.create_session(SESSION)
            await rt.submit(SESSION, "What is the capital of France?", request_id="r1")
            with trio.fail_after(3600):
                await rt.wait_idle(SESSION)
            await rt.submit(SESSION, "How many live there?", request_id="r2")
            with trio.fail_after(3600):
                outcome = await rt.wait_idle(SESSION)
            log = list(await rt._journal.read_session(SESSION))

    def trio_time(wall: float) -> float:
        return wall - (where.wall() - trio.current_time())

    assert outcome is not None and outcome.final_text == "About 2.1 million."
    (retry,) = of(CompactionRetryPending, log)
    (compacted,) = of(ContextCompacted, log)
    assert [attempt for _, attempt in summarizer.asked] == [1, 2]
    assert spawns.times("_wake_at") == [trio_time(retry.at)]
    # Four generation actors: the first turn, the failed summary, the summary's retry
    # (spawned when its back-off was over), then the turn after it.
    calls = spawns.times("call_model")
    assert len(calls) == 4
    assert calls[2] == trio_time(retry.not_before)
    assert compacted.at >= retry.not_before


async def test_a_call_waiting_out_its_back_off_is_not_a_model_call_in_flight(
    where: Where, clock: MockClock
) -> None:
    provider = FirstCallOverloaded([Reply(text="answered", delay=5.0)])
    async with perdure.open_runtime(
        where.open(), provider=provider, tools=[], **where.options()
    ) as rt:
        await rt.create_session(SESSION)
        await rt.submit(SESSION, "go", request_id="r1")
        pending = await wait_for_record(rt, RetryPending)
        actor = rt._sup.actors[SESSION]
        # Rebalancing moves it as one at rest but for a timer (a hand-over stops that).
        assert not actor.calling_model() and not actor.at_rest()
        offset = where.wall() - trio.current_time()
        await trio.sleep_until(pending.not_before - offset + 1.0)  # the retry takes 5 s
        assert actor.calling_model(), "the retry is a model call in flight"
        with trio.fail_after(60):
            outcome = await rt.wait_idle(SESSION)
    assert outcome is not None and outcome.final_text == "answered"
    assert [attempt for _, attempt in provider.asked] == [1, 2]
