"""Stuck runs are found: a real run held at each waiting point is listed, with what it
waits for, once no record has been committed for the threshold (``perdure.stuck``).

Each test runs on a ``MemoryLog`` under an autojumping MockClock (the threshold passes
in virtual time) and on a real LMDB log in real time (``tests/support/deterministic.py``).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

import perdure
from perdure import NeedsHuman, ReplayPolicy, RetryableError, RetryPolicy, ToolContext
from perdure.observability.metrics import RuntimeMetrics
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.stuck import StuckRun
from tests.support.deterministic import Where

SID = "s"
STUCK = 0.5  # seconds: virtual on the MemoryLog, real on LMDB


@perdure.tool(replay=ReplayPolicy.SAFE)
async def hang(ctx: ToolContext) -> str:
    """Never return."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


@perdure.tool(replay=ReplayPolicy.SAFE, requires_approval=True)
async def wire(ctx: ToolContext) -> str:
    """Needs a person's approval first."""
    return "wired"


@perdure.tool(replay=ReplayPolicy.SAFE)
async def charge(ctx: ToolContext) -> str:
    """Needs a person to decide."""
    raise NeedsHuman("the card was declined")


@perdure.tool(replay=ReplayPolicy.SAFE, retry=RetryPolicy(initial=3600, max_interval=3600))
async def flaky(ctx: ToolContext) -> str:
    """Fails, to be retried after a long back-off."""
    raise RetryableError("503", retry_after=3600)


def calling(tool: str) -> list[Reply]:
    return [Reply(text="calling", tool_uses=[ToolUse(tool)]), Reply(text="done")]


CASES: dict[str, tuple[list[Reply], str, str]] = {
    # name: (the script, the waiting kind, its detail)
    "model_call": ([Reply(text="slow", delay=36_000)], "model_call", ""),
    "model_backoff": (
        [Reply(text="later", fail_attempts=1, retry_after=3600)],
        "model_backoff",
        "",
    ),
    "tool_call": (calling("hang"), "tool_call", "hang"),
    "tool_backoff": (calling("flaky"), "tool_backoff", "flaky"),
    "approval": (calling("wire"), "approval", "wire"),
    "person": (calling("charge"), "person", "charge"),
}


def open_rt(where: Where, script: list[Reply], **options: Any) -> Any:
    return perdure.open_runtime(
        where.open(),
        provider=ScriptedProvider(script),
        tools=[hang, wire, charge, flaky],
        # A short grace: the held tool never ends, and the exit need not wait for it.
        **where.options(retry_cap=7200.0, shutdown_grace=0.1, **options),
    )


def stuck_gauge(metrics: RuntimeMetrics) -> dict[str, float]:
    return {
        s.labels["waiting"]: s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == "perdure_stuck_runs"
    }


async def held(rt: perdure.Runtime, kind: str) -> StuckRun:
    """Wait until the session is reported stuck waiting on ``kind``."""
    with trio.fail_after(30):
        while True:
            found = await rt.stuck_runs()
            if found and found[0].waiting.kind == kind:
                return found[0]
            await trio.sleep(STUCK / 5)


@pytest.mark.parametrize("case", list(CASES))
async def test_a_run_held_at_each_waiting_point_is_listed_after_the_threshold(
    where: Where, clock: MockClock, case: str
) -> None:
    script, kind, detail = CASES[case]
    async with open_rt(where, script, stuck_after=STUCK) as rt:
        await rt.create_session(SID)
        await rt.submit(SID, "go", request_id="r1")
        found = await held(rt, kind)
        assert found.session_id == SID
        assert found.run_id is not None
        assert found.waiting.detail == detail
        assert (found.waiting.call_id is not None) == (detail != "")
        assert found.idle_for >= STUCK
        # The same wait under a longer threshold is not stuck (yet).
        assert await rt.stuck_runs(after=3600) == []
        # The metric, through the real prometheus-client registry, read when scraped.
        metrics = RuntimeMetrics()
        metrics.attach(rt)
        await metrics.refresh_stuck(rt)
        gauge = stuck_gauge(metrics)
        assert gauge[kind] == 1
        assert sum(gauge.values()) == 1


async def test_a_paused_session_with_an_input_waiting_is_stuck_as_paused(
    where: Where, clock: MockClock
) -> None:
    async with open_rt(where, [Reply(text="done")], stuck_after=STUCK) as rt:
        await rt.create_session(SID)
        await rt.pause(SID)
        await rt.submit(SID, "go", request_id="r1")
        found = await held(rt, "paused")
        assert found.run_id is None and found.waiting.call_id is None
        await rt.resume(SID)
        with trio.fail_after(10):
            await rt.wait_idle(SID)
        assert await rt.stuck_runs(after=0) == []


async def test_a_finished_run_is_never_stuck(where: Where, clock: MockClock) -> None:
    async with open_rt(where, [Reply(text="done")], stuck_after=0) as rt:
        await rt.create_session(SID)
        await rt.submit(SID, "go", request_id="r1")
        with trio.fail_after(10):
            await rt.wait_idle(SID)
        await trio.sleep(STUCK)
        assert await rt.stuck_runs() == []
        metrics = RuntimeMetrics()
        metrics.attach(rt)
        await metrics.refresh_stuck(rt)
        assert sum(stuck_gauge(metrics).values()) == 0


async def test_a_bad_threshold_is_refused(where: Where, clock: MockClock) -> None:
    with pytest.raises(ValueError, match="stuck_after must be a number of seconds"):
        async with open_rt(where, [], stuck_after=-1):
            pass
