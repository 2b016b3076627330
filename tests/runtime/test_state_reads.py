"""Reads that never wake a session: ``Runtime.state(fn, wake=False)`` and its users.

* a session in memory is read in place, through its actor (no log read), the same
  answer as a fold of its log;
* a hibernated one where it sleeps;
* an evicted one from the log, and no actor starts for it (no lease, no recovery);
  ``wake=True`` (the default) starts one, as before;
* an unknown session is a clear error;
* ``transcript`` and ``summary`` (the daemon's ``GET /v1/sessions/{id}``) read this
  way: on a long session they used to fold its whole log per call.
"""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

import perdure
from perdure.actors.readmodel import session_view
from perdure.errors import UnknownSession
from perdure.inspect import summarize
from tests.runtime.test_eviction import _actor_tasks, final_texts
from tests.runtime.test_hibernation import (
    SID,
    count_reads,
    evicted,
    run_once_and_sleep,
    script,
    sleepy_runtime,
)
from tests.support.deterministic import Where
from tests.support.fold import fold_of


async def test_a_session_in_memory_is_read_in_place(where: Where, clock: MockClock) -> None:
    async with sleepy_runtime(where, script(), hibernate_after=None, idle_timeout=None) as rt:
        await rt.create_session(SID)
        await rt.submit(SID, "one", request_id="r1")
        await rt.wait_idle(SID)
        reads = count_reads(rt)
        live = await rt.summary(SID, wake=False)
        transcript = await rt.transcript(SID)
        assert reads == []  # neither folded the log
        folded = await fold_of(rt, SID)
        assert live == summarize(folded)
        assert transcript == await rt.transcript(SID)
        assert [m.role for m in transcript] == ["user", "assistant", "user", "assistant"]
        with pytest.raises(ZeroDivisionError):  # fn's error is the caller's
            await rt.state(SID, lambda s: 1 / 0, wake=False)


async def test_a_hibernated_session_is_read_where_it_sleeps(where: Where, clock: MockClock) -> None:
    async with sleepy_runtime(where, script(), hibernate_after=0.05, idle_timeout=None) as rt:
        await run_once_and_sleep(rt)
        reads = count_reads(rt)
        assert await rt.state(SID, final_texts, wake=False) == ["first done"]
        assert reads == [] and _actor_tasks(SID) == 0


async def test_an_evicted_session_is_read_from_the_log_and_stays_asleep(
    where: Where, clock: MockClock
) -> None:
    async with sleepy_runtime(where, script(), hibernate_after=None, idle_timeout=0.2) as rt:
        await run_once_and_sleep_awake(rt)
        await evicted(rt)
        reads = count_reads(rt)
        assert await rt.state(SID, final_texts, wake=False) == ["first done"]
        assert len(await rt.transcript(SID)) == 4
        assert reads == [SID, SID]  # from the log, each time
        assert rt.resident_sessions == [] and _actor_tasks(SID) == 0
        # The default wakes it: an actor starts and recovers it.
        assert await rt.state(SID, final_texts) == ["first done"]
        assert rt.resident_sessions == [SID] and _actor_tasks(SID) == 1


async def test_a_view_is_a_frozen_snapshot_read_in_place_or_from_the_log(
    where: Where, clock: MockClock
) -> None:
    async with sleepy_runtime(where, script(), hibernate_after=None, idle_timeout=0.2) as rt:
        await run_once_and_sleep_awake(rt)
        live = await rt.view(SID, wake=False)
        assert isinstance(live, perdure.SessionView)
        assert live.idle and live.created and live.current_run is None
        assert live.last_outcome is not None and live.last_outcome.final_text == "first done"
        assert live == session_view(await fold_of(rt, SID))
        await evicted(rt)
        reads = count_reads(rt)
        assert await rt.view(SID, wake=False) == live  # the same facts, from the log
        assert reads == [SID] and rt.resident_sessions == []
        with pytest.raises(UnknownSession):
            await rt.view("nobody", wake=False)


async def test_an_unknown_session_is_a_clear_error(where: Where, clock: MockClock) -> None:
    async with sleepy_runtime(where, script(), hibernate_after=None, idle_timeout=None) as rt:
        with pytest.raises(UnknownSession):
            await rt.state("nobody", final_texts, wake=False)
        with pytest.raises(UnknownSession):
            await rt.summary("nobody", wake=False)
        with pytest.raises(UnknownSession):
            await rt.transcript("nobody")


async def run_once_and_sleep_awake(rt: perdure.Runtime) -> None:
    await rt.create_session(SID)
    await rt.submit(SID, "one", request_id="r1")
    with trio.fail_after(10):
        await rt.wait_idle(SID)
