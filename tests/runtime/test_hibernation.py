"""Idle actors hibernate: their task goes, their state stays, and nothing is lost.

* an idle session's actor stops after ``hibernate_after``; the session stays
  resident (its folded state), and its next input runs in a new actor on that state
  without reading the log, seeing the whole history and the requests already seen;
* a hibernated session is evicted once ``idle_timeout`` has passed; its next input
  then reads the log, as after any eviction;
* a hibernated state the log has moved past is not used: the log is read instead;
* a session asleep for ``FREEZE_AFTER`` times ``hibernate_after`` has its state frozen
  into one blob; queries and the next input thaw it (still no log read), and a frozen
  session is evicted like any other; a session that woke meanwhile waits a whole
  round again (``freeze_round``, pure);
* messages racing the hibernation: ``tests/runtime/test_eviction.py``;
* a deleted session's hibernated state goes with it.

Each test runs on a ``MemoryLog`` under an autojumping MockClock and on a real LMDB
log in real time (``tests/support/deterministic.py``).
"""

from __future__ import annotations

import pickle
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

import perdure
from perdure import ReplayPolicy, ToolContext, _libc
from perdure.actors import dormant
from perdure.actors.readmodel import StateLookup
from perdure.actors.state import SessionState
from perdure.actors.supervisor import FREEZE_AFTER, _Dormant, freeze_round
from perdure.observability.metrics import RuntimeMetrics
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from tests.runtime.test_eviction import _actor_tasks, final_texts
from tests.support.deterministic import Where
from tests.support.fold import fold_of

SID = "s"


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up."""
    return f"found {query}"


def count_reads(rt: perdure.Runtime) -> list[str]:
    """Record every session whose records the runtime reads from the log from now on."""
    reads: list[str] = []
    real = rt._journal.read_session

    async def reading(session_id: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(session_id)
        return await real(session_id, *args, **kwargs)

    rt._journal.read_session = reading  # type: ignore[method-assign]
    real_start = rt._journal.session_with_records  # an actor's start reads in one call

    async def reading_at_start(session_id: str) -> Any:
        info, records = await real_start(session_id)
        if info is not None:
            reads.append(session_id)
        return info, records

    rt._journal.session_with_records = reading_at_start  # type: ignore[method-assign]
    return reads


async def hibernated(rt: perdure.Runtime, count: int) -> None:
    with trio.fail_after(10):
        while SID not in rt.hibernated_sessions or rt.hibernations < count:  # noqa: ASYNC110
            await trio.sleep(0.01)


async def run_once_and_sleep(rt: perdure.Runtime, text: str = "one") -> perdure.Accepted:
    """Create the session, run one input to the end, and wait until its actor hibernates."""
    await rt.create_session(SID)
    accepted = await rt.submit(SID, text, request_id="r1")
    with trio.fail_after(10):
        await rt.wait_idle(SID)
    await hibernated(rt, 1)
    return accepted


def sleepy_runtime(
    where: Where, model: ScriptedProvider, tools: list[Any] | None = None, **options: Any
) -> Any:
    """A runtime on ``where`` whose idle actors hibernate as ``options`` say."""
    return perdure.open_runtime(
        where.open(),
        provider=model,
        tools=[lookup] if tools is None else tools,
        **where.options(**options),
    )


def gauges(metrics: RuntimeMetrics) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


async def evicted(rt: perdure.Runtime) -> None:
    with trio.fail_after(10):
        while SID in rt.resident_sessions:  # noqa: ASYNC110 (waiting out the idle timeout)
            await trio.sleep(0.01)


async def second_input(rt: perdure.Runtime) -> None:
    """Send the second input and check the model saw the first run's history."""
    await rt.submit(SID, "two", request_id="r2")
    with trio.fail_after(10):
        outcome = await rt.wait_idle(SID)
    assert outcome is not None and outcome.final_text == "second done"


def script() -> ScriptedProvider:
    return ScriptedProvider(
        [
            Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "a"})]),
            Reply(text="first done"),
            Reply(text="second done"),  # chosen only if the model sees the two turns before
        ]
    )


async def test_an_idle_actor_hibernates_and_wakes_on_its_state(
    where: Where, clock: MockClock
) -> None:
    model = script()
    async with sleepy_runtime(where, model, hibernate_after=0.05, idle_timeout=None) as rt:
        first = await run_once_and_sleep(rt)
        assert SID in rt.resident_sessions and _actor_tasks(SID) == 0
        assert rt.evictions == 0
        metrics = RuntimeMetrics()
        metrics.attach(rt)
        now = gauges(metrics)
        assert now["perdure_resident_sessions"] == now["perdure_hibernated_sessions"] == 1
        assert now["perdure_frozen_sessions"] == 0
        reads = count_reads(rt)

        again = await rt.submit(SID, "one", request_id="r1")  # wakes it: a request seen
        assert (again.submission_id, again.seq, again.duplicate) == (
            first.submission_id,
            first.seq,
            True,
        )
        await second_input(rt)
        assert reads == []  # woken on the state it left, the log not read
        assert _actor_tasks(SID) == 1
        assert final_texts(StateLookup(await fold_of(rt, SID))) == ["first done", "second done"]
        assert model.calls == 3


async def test_queries_of_a_hibernated_session_wake_no_actor(
    where: Where, clock: MockClock
) -> None:
    model = script()
    async with sleepy_runtime(where, model, hibernate_after=0.05, idle_timeout=None) as rt:
        await run_once_and_sleep(rt)
        outcome = await rt.wait_idle(SID)
        assert outcome is not None and outcome.final_text == "first done"
        assert await rt.state(SID, lambda s: len(s.run_views())) == 1
        with pytest.raises(ZeroDivisionError):  # fn's error is the caller's, as before
            await rt.state(SID, lambda s: 1 / 0)
        assert _actor_tasks(SID) == 0 and rt.hibernated_sessions == [SID]
        await second_input(rt)  # a command does wake it


async def test_a_hibernated_session_is_evicted_after_the_idle_timeout(
    where: Where, clock: MockClock
) -> None:
    model = script()
    async with sleepy_runtime(where, model, hibernate_after=0.05, idle_timeout=0.5) as rt:
        await run_once_and_sleep(rt)
        hibernated_at = trio.current_time()
        await evicted(rt)
        # Idle for idle_timeout in all (0.05 awake, then asleep), give or take a sweep.
        assert trio.current_time() - hibernated_at >= 0.45 - 0.01
        assert rt.evictions == 1 and rt.hibernated_sessions == []
        reads = count_reads(rt)
        await second_input(rt)
        assert reads == [SID]  # evicted: the state came back from the log


async def test_a_state_the_log_has_moved_past_is_not_used(where: Where, clock: MockClock) -> None:
    model = script()
    async with sleepy_runtime(where, model, hibernate_after=0.05, idle_timeout=None) as rt:
        await run_once_and_sleep(rt)
        # As if something but the session's own actor had written to its log since.
        rt._sup.dormant[SID].state.last_seq -= 1
        reads = count_reads(rt)
        await second_input(rt)
        assert reads == [SID]


async def test_a_deleted_session_leaves_no_hibernated_state(where: Where, clock: MockClock) -> None:
    model = ScriptedProvider([Reply(text="hello")])
    async with sleepy_runtime(
        where, model, tools=[], hibernate_after=0.05, idle_timeout=None
    ) as rt:
        await run_once_and_sleep(rt, "hi")
        await rt.delete_session(SID)
        assert SID not in rt.resident_sessions
        await rt.create_session(SID)  # the same id, a new session
        fresh = await rt.submit(SID, "hi", request_id="r1")
        assert not fresh.duplicate  # the old session's requests went with it
        with trio.fail_after(10):
            outcome = await rt.wait_idle(SID)
        assert outcome is not None and outcome.final_text == "hello"  # turn 1 again


async def test_a_negative_hibernate_after_is_refused(log_dir: Path) -> None:
    with pytest.raises(ValueError, match="hibernate_after must be a number of seconds"):
        async with perdure.open_runtime(log_dir, provider=ScriptedProvider([]), hibernate_after=-1):
            pass


async def frozen(rt: perdure.Runtime) -> None:
    with trio.fail_after(30):
        while SID not in rt.frozen_sessions:  # noqa: ASYNC110 (the freezing round's period)
            await trio.sleep(0.01)


async def test_a_long_asleep_session_is_frozen_and_wakes_on_its_thawed_state(
    where: Where, clock: MockClock
) -> None:
    model = script()
    hibernate_after = 0.02
    async with sleepy_runtime(
        where, model, hibernate_after=hibernate_after, idle_timeout=None
    ) as rt:
        await run_once_and_sleep(rt)
        # The fold's own state, through the runtime's private read (the face hands a lookup).
        awake_state = await rt._read(SID, lambda s: s)
        asleep_at = trio.current_time()
        await frozen(rt)
        # Found asleep at two rounds in a row: one to two periods after it hibernated.
        period = FREEZE_AFTER * hibernate_after
        assert trio.current_time() - asleep_at >= period - 0.01
        assert isinstance(rt._sup.dormant[SID], bytes) and rt._sup.freezes == 1
        assert SID in rt.hibernated_sessions and SID in rt.resident_sessions
        metrics = RuntimeMetrics()
        metrics.attach(rt)
        assert gauges(metrics)["perdure_frozen_sessions"] == 1
        reads = count_reads(rt)
        # Queries thaw it where it sleeps: an equal state, no actor, no log read.
        thawed = await rt._read(SID, lambda s: s)
        assert thawed == awake_state and thawed is not awake_state
        outcome = await rt.wait_idle(SID)
        assert outcome is not None and outcome.final_text == "first done"
        assert _actor_tasks(SID) == 0 and rt.frozen_sessions == [SID]

        again = await rt.submit(SID, "one", request_id="r1")  # a request it has seen
        assert again.duplicate
        await second_input(rt)  # saw the history
        assert reads == []  # woken on the thawed state, the log not read
        assert rt.frozen_sessions == []
        assert final_texts(StateLookup(await fold_of(rt, SID))) == ["first done", "second done"]


async def test_a_frozen_session_is_evicted_after_the_idle_timeout(
    where: Where, clock: MockClock
) -> None:
    model = script()
    async with sleepy_runtime(where, model, hibernate_after=0.01, idle_timeout=1.0) as rt:
        await run_once_and_sleep(rt)
        await frozen(rt)
        await evicted(rt)
        assert rt.evictions == 1 and rt._sup.dormant == {}
        reads = count_reads(rt)
        await second_input(rt)
        assert reads == [SID]


def test_a_freezing_round_takes_only_sessions_asleep_since_the_last_one() -> None:
    asleep = _Dormant(SessionState("a"), 10.0)
    woke_and_slept_again = _Dormant(SessionState("b"), 12.0)
    new = _Dormant(SessionState("c"), 13.0)
    entries: dict[str, _Dormant | bytes] = {
        "a": asleep,
        "b": woke_and_slept_again,
        "c": new,
        "d": dormant.freeze(SessionState("d"), 9.0),
    }
    due, later = freeze_round(entries, {"a": 10.0, "b": 11.0, "gone": 5.0})
    assert due == ["a"]  # b's eviction time changed: it woke; c was not seen; d is frozen
    assert later == {"b": 12.0, "c": 13.0}
    assert freeze_round(entries, later) == (["b", "c"], {"a": 10.0})


def test_a_frozen_state_thaws_equal_and_keeps_its_eviction_time() -> None:
    state = SessionState("s", system="be brief", allowed_tools=frozenset({"lookup"}))
    state.queue.append("in1")
    blob = dormant.freeze(state, float("inf"))
    assert dormant.until(blob) == float("inf")
    assert dormant.until(dormant.freeze(state, 12.5)) == 12.5
    thawed = dormant.thaw(blob)
    assert thawed == state and thawed is not state
    assert dormant.thaw(blob) == state  # a blob thaws any number of times
    with pytest.raises(TypeError, match="thawed into a dict"):
        dormant.thaw(blob[:8] + zlib.compress(pickle.dumps({"not": "a state"})))


async def test_a_state_that_cannot_be_frozen_stays_as_it_is(
    where: Where, clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    model = script()
    async with sleepy_runtime(where, model, hibernate_after=0.01, idle_timeout=None) as rt:
        await run_once_and_sleep(rt)
        entry = rt._sup.dormant[SID]
        assert isinstance(entry, _Dormant)
        entry.state.spend["a bug"] = lambda: None  # type: ignore[assignment]
        with trio.fail_after(30):
            while not entry.unfrozen:  # noqa: ASYNC110 (the freezing round's period)
                await trio.sleep(0.01)
        await trio.sleep(FREEZE_AFTER * 0.01 * 3)  # more rounds: no retry, no second line
        assert rt._sup.dormant[SID] is entry and rt._sup.freezes == 0
        lines = [r for r in caplog.records if "stays unfrozen" in r.getMessage()]
        assert len(lines) == 1 and SID in lines[0].getMessage()
        del entry.state.spend["a bug"]
        await second_input(rt)  # the runtime goes on; it wakes


def _in_threads(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, int]]) -> threading.Event:
    """Freeze and thaw every state in a worker thread, noting where each ran; the
    returned event, once cleared, holds a freeze until it is set again."""
    monkeypatch.setattr(dormant, "OFF_LOOP_ITEMS", 0)
    monkeypatch.setattr(dormant, "OFF_LOOP_BYTES", 0)
    real_freeze, real_thaw = dormant.freeze, dormant.thaw
    go = threading.Event()
    go.set()

    def freeze(state: SessionState, until: float) -> bytes:
        calls.append(("freeze", threading.get_ident()))
        go.wait(10)
        return real_freeze(state, until)

    def thaw(blob: bytes) -> SessionState:
        calls.append(("thaw", threading.get_ident()))
        return real_thaw(blob)

    monkeypatch.setattr(dormant, "freeze", freeze)
    monkeypatch.setattr(dormant, "thaw", thaw)
    return go


async def test_a_large_state_freezes_and_thaws_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int]] = []
    _in_threads(monkeypatch, calls)
    where = Where.real(tmp_path)  # real time: an autojumping clock jumps while threads work
    async with sleepy_runtime(where, script(), hibernate_after=0.01, idle_timeout=None) as rt:
        await run_once_and_sleep(rt)
        await frozen(rt)
        reads = count_reads(rt)
        assert await rt.state(SID, lambda s: len(s.run_views())) == 1
        await second_input(rt)
        assert reads == []  # woken on the state thawed in a thread
        loop = threading.get_ident()
        kinds = [kind for kind, _ in calls]
        assert kinds == ["freeze", "thaw", "thaw"]  # frozen, queried, woken
        assert all(ident != loop for _, ident in calls)


async def test_a_session_woken_while_a_thread_freezes_it_keeps_its_new_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[str, int]] = []
    go = _in_threads(monkeypatch, calls)
    go.clear()  # the first freeze waits in its thread until the session has woken
    where = Where.real(tmp_path)
    async with sleepy_runtime(where, script(), hibernate_after=0.01, idle_timeout=None) as rt:
        await run_once_and_sleep(rt)
        with trio.fail_after(10):
            while not calls:  # noqa: ASYNC110 (until a thread is freezing it)
                await trio.sleep(0.01)
        reads = count_reads(rt)
        await second_input(rt)  # wakes it on its objects, while the thread holds them
        await hibernated(rt, 2)  # and asleep again, before the old freeze ends
        go.set()
        with trio.fail_after(10):
            while rt._sup.freezes == 0 or len(calls) < 2:  # noqa: ASYNC110
                await trio.sleep(0.01)  # frozen by a later round, from the new state
        # The blob of the old state was dropped: the frozen one has both runs.
        assert isinstance(rt._sup.dormant[SID], bytes)
        assert await rt.state(SID, lambda s: len(s.run_views())) == 2
        assert reads == [] and rt._sup.freezes == 1
        assert not [r for r in caplog.records if "unfrozen" in r.getMessage()]


async def trimmed(rt: perdure.Runtime, clock: MockClock) -> None:
    """Wait for the round's heap trim, which runs in a worker thread. The clock stands
    still meanwhile: autojumping, the loop would spin through its timers without ever
    sleeping, the thread would wait for the GIL (a spinning loop keeps taking it back),
    and the virtual deadline would pass first."""
    clock.autojump_threshold = 0.005  # real seconds all tasks must be blocked to jump
    try:
        with trio.fail_after(10):
            while rt._sup.heap_trims == 0:  # noqa: ASYNC110 (the round's trim, in a thread)
                await trio.sleep(0.01)
    finally:
        clock.autojump_threshold = 0


async def test_a_round_that_froze_states_gives_the_free_heap_back_off_the_loop(
    where: Where, clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[int] = []

    def trim_heap() -> bool:
        trims.append(threading.get_ident())
        return True

    monkeypatch.setattr(_libc, "trim_heap", trim_heap)
    hibernate_after = 0.02
    async with sleepy_runtime(
        where, script(), hibernate_after=hibernate_after, idle_timeout=None
    ) as rt:
        loop = threading.get_ident()
        await run_once_and_sleep(rt)
        # Rounds that freeze nothing trim nothing: the session is asleep, not frozen yet.
        assert trims == [] and rt._sup.heap_trims == 0
        await frozen(rt)
        await trimmed(rt, clock)
        assert len(trims) == 1 and trims[0] != loop
        # Frozen already: later rounds find nothing to freeze, and trim nothing more.
        await trio.sleep(3 * FREEZE_AFTER * hibernate_after)
        assert len(trims) == 1 and rt._sup.heap_trims == 1


async def test_an_eviction_round_gives_the_free_heap_back_too(
    where: Where, clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    trims: list[int] = []

    def trim_heap() -> bool:
        trims.append(rt._sup.evictions)
        return True

    monkeypatch.setattr(_libc, "trim_heap", trim_heap)
    # Evicted long before it would be frozen: only the eviction can have trimmed.
    async with sleepy_runtime(where, script(), hibernate_after=1.0, idle_timeout=1.5) as rt:
        await run_once_and_sleep(rt)
        assert trims == []
        await evicted(rt)
        await trimmed(rt, clock)
        assert trims == [1] and rt._sup.freezes == 0
