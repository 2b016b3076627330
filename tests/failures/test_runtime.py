"""Tool failures by policy through ``open_runtime``: the trio shell around the core's rows.

Retries after their back-offs, heartbeats relayed to the session and committed
throttled, a hung tool stopped by its heartbeat watchdog, calls that wait for
``rt.resolve``. Each test reads what the log holds afterwards.

Every test runs twice (``tests/support/deterministic.py``): on a ``MemoryLog`` under
an autojumping MockClock, where back-offs and watchdogs take virtual time only and
the times in the records are exact, and on a real LMDB log in real time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

import perdure
from perdure import NeedsHuman, ReplayPolicy, RetryableError, RetryPolicy, ToolContext, tool
from perdure.providers.scripted import ToolUse
from perdure.storage.records import (
    Committed,
    RecoveryDecision,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    ToolRetryPending,
)
from tests.support.deterministic import Where
from tests.tools._inproc import SESSION, call_id, provider

SEEN: list[ToolContext] = []
QUICK = RetryPolicy(max_attempts=3, initial=0.05, max_interval=0.2)


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()


def of(kind: type, log: list[Committed]) -> list[Any]:
    return [c.record for c in log if isinstance(c.record, kind)]


async def wait_for_record(rt: perdure.Runtime, kind: type) -> Any:
    """The first record of ``kind`` in the session (from the log, then live)."""
    with trio.fail_after(30):
        async with aclosing(rt.events(SESSION)) as events:
            async for event in events:
                if isinstance(event.record, kind):
                    return event.record
    raise AssertionError(f"no {kind.__name__}")


async def run(
    where: Where,
    tools: list[perdure.Tool],
    uses: list[ToolUse],
    *,
    during: Callable[[perdure.Runtime], Any] | None = None,
    **options: Any,
) -> tuple[list[Committed], perdure.RunFinished | None]:
    """One input whose first turn makes ``uses``; ``during(rt)`` acts while it runs."""
    async with perdure.open_runtime(
        where.open(), provider=provider(uses), tools=tools, **where.options(**options)
    ) as rt:
        await rt.create_session(SESSION)
        await rt.submit(SESSION, "go", request_id="r1")
        if during is not None:
            await during(rt)
        with trio.fail_after(60):
            outcome = await rt.wait_idle(SESSION)
        return list(await rt._journal.read_session(SESSION)), outcome


# -- retries --------------------------------------------------------------------------------


@tool(replay=ReplayPolicy.KEYED, retry=QUICK)
async def flaky(ctx: ToolContext, fails: int) -> str:
    """Fails ``fails`` times with a 503, then works."""
    SEEN.append(ctx)
    if ctx.attempt <= fails:
        raise RetryableError(f"503 on attempt {ctx.attempt}")
    return f"done on attempt {ctx.attempt}"


class Blip(ConnectionError):
    pass


@tool(replay=ReplayPolicy.SAFE, retry=RetryPolicy(initial=0.05, retry_on=(ConnectionError,)))
async def reader(ctx: ToolContext) -> str:
    """Reads through a flaky connection."""
    SEEN.append(ctx)
    if ctx.attempt == 1:
        raise Blip("connection reset")
    return "read"


async def test_a_transient_failure_is_retried_after_its_back_off_with_the_same_key(
    where: Where, clock: MockClock
) -> None:
    log, outcome = await run(where, [flaky], [ToolUse("flaky", {"fails": 2})])
    assert outcome is not None and outcome.status == "completed"
    assert [c.attempt for c in SEEN] == [1, 2, 3]
    assert len({c.idempotency_key for c in SEEN}) == 1
    pending = of(ToolRetryPending, log)
    executing = of(ToolExecuting, log)
    assert [p.attempt for p in pending] == [1, 2]
    assert [e.attempt for e in executing] == [1, 2, 3]
    for p, nxt in zip(pending, executing[1:], strict=True):
        assert nxt.at >= p.not_before, "never before the recorded time"
        if where.virtual:  # and, on a clock nothing else moves, not a moment later
            assert nxt.at == p.not_before
    (done,) = of(ToolCompleted, log)
    assert (done.attempt, done.output, done.is_error) == (3, "done on attempt 3", False)


async def test_attempts_run_out_and_the_model_reads_the_last_error(
    where: Where, clock: MockClock
) -> None:
    log, outcome = await run(where, [flaky], [ToolUse("flaky", {"fails": 5})])
    assert outcome is not None and outcome.status == "completed", "the run goes on"
    assert len(SEEN) == 3
    (done,) = of(ToolCompleted, log)
    assert done.is_error and "failed 3 times" in done.output
    assert "RetryableError: 503 on attempt 3" in done.output


async def test_an_exception_the_policy_lists_is_retried(where: Where, clock: MockClock) -> None:
    log, _ = await run(where, [reader], [ToolUse("reader")])
    assert [c.attempt for c in SEEN] == [1, 2]
    assert "Blip: connection reset" in of(ToolRetryPending, log)[0].error
    assert of(ToolCompleted, log)[0].output == "read"


async def test_cancel_during_a_long_back_off_ends_the_run_without_waiting(
    where: Where, clock: MockClock
) -> None:
    @tool(replay=ReplayPolicy.KEYED, retry=QUICK)
    async def busy(ctx: ToolContext) -> str:
        """Always asks to come back in ten minutes."""
        raise RetryableError("busy", retry_after=600)

    async def cancel_in_back_off(rt: perdure.Runtime) -> None:
        await wait_for_record(rt, ToolRetryPending)
        await rt.cancel(SESSION, request_id="k1")

    with trio.fail_after(30):  # a back-off still waited for would take ten minutes
        log, outcome = await run(
            where, [busy], [ToolUse("busy")], during=cancel_in_back_off, idle_timeout=0.2
        )
    assert outcome is not None and outcome.status == "cancelled"
    assert len(of(ToolExecuting, log)) == 1


async def test_a_cancelled_back_off_does_not_keep_the_session_in_memory(
    where: Where, clock: MockClock
) -> None:
    @tool(replay=ReplayPolicy.KEYED, retry=QUICK)
    async def busy(ctx: ToolContext) -> str:
        """Always asks to come back in ten minutes."""
        raise RetryableError("busy", retry_after=600)

    async with perdure.open_runtime(
        where.open(),
        provider=provider([ToolUse("busy")]),
        tools=[busy],
        **where.options(idle_timeout=0.2),
    ) as rt:
        await rt.create_session(SESSION)
        await rt.submit(SESSION, "go", request_id="r1")
        await wait_for_record(rt, ToolRetryPending)
        await rt.cancel(SESSION, request_id="k1")
        with trio.fail_after(30):
            while rt.evictions == 0:  # noqa: ASYNC110 (the supervisor's counter, no event)
                await trio.sleep(0.05)
        assert SESSION not in rt.resident_sessions


# -- heartbeats -----------------------------------------------------------------------------


@tool(replay=ReplayPolicy.SAFE, retry=QUICK)
async def crawl(ctx: ToolContext, pages: int) -> str:
    """Crawls ``pages`` pages, heartbeating after each; the first attempt fails at the end."""
    SEEN.append(ctx)
    start = ctx.last_heartbeat["page"] if ctx.last_heartbeat else 0
    for page in range(start + 1, pages + 1):
        await trio.sleep(0.01)
        ctx.heartbeat({"page": page})
    if ctx.attempt == 1:
        raise RetryableError("the last page timed out")
    return f"crawled from page {start + 1}"


async def test_heartbeats_are_committed_throttled_latest_wins_and_the_last_is_kept(
    where: Where, clock: MockClock
) -> None:
    log, _ = await run(where, [crawl], [ToolUse("crawl", {"pages": 150})])
    beats = [b for b in of(ToolHeartbeat, log) if b.attempt == 1]
    assert 2 <= len(beats) < 150 / 10, f"{len(beats)} heartbeats committed for 150 reported"
    pages = [b.details["page"] for b in beats]
    assert pages == sorted(pages) and len(set(pages)) == len(pages)
    assert pages[-1] == 150, "the heartbeat just before the failure was not lost"
    for earlier, later in itertools.pairwise(beats[:-1]):
        assert later.at - earlier.at >= 0.9, "at most about one commit a second"
    if where.virtual:
        # 150 pages of 10 ms: the first report committed at once, the next one a second
        # after it (the latest report by then), the last flushed when the attempt failed.
        start = of(ToolExecuting, log)[0].at
        assert [b.at - start for b in beats] == pytest.approx([0.01, 1.01, 1.5])
    # The retry resumed from the last committed heartbeat, not from scratch.
    assert [c.attempt for c in SEEN] == [1, 2]
    assert SEEN[1].last_heartbeat == {"page": 150}
    assert of(ToolCompleted, log)[0].output == "crawled from page 151"


async def test_heartbeats_reach_the_event_stream(where: Where, clock: MockClock) -> None:
    @tool(replay=ReplayPolicy.SAFE)
    async def one_beat(ctx: ToolContext) -> str:
        """Reports once."""
        ctx.heartbeat({"stage": "indexing"})
        return "ok"

    seen: list[Any] = []

    async def watch(rt: perdure.Runtime) -> None:
        seen.append(await wait_for_record(rt, ToolHeartbeat))

    await run(where, [one_beat], [ToolUse("one_beat")], during=watch)
    assert seen[0].details == {"stage": "indexing"}


async def test_a_heartbeat_from_a_worker_thread_and_a_bad_one(tmp_path: Path) -> None:
    @tool(replay=ReplayPolicy.SAFE)
    async def threaded(ctx: ToolContext, bad: bool) -> str:
        """Heartbeats from a worker thread."""
        if bad:
            ctx.heartbeat({"when": object()})
        await trio.to_thread.run_sync(lambda: ctx.heartbeat({"from": "thread"}))
        return "ok"

    uses = [ToolUse("threaded", {"bad": False}), ToolUse("threaded", {"bad": True})]
    log, _ = await run(Where.real(tmp_path), [threaded], uses)  # a thread: real time only
    beats = of(ToolHeartbeat, log)
    assert [(b.call_id, b.details) for b in beats] == [(call_id(1), {"from": "thread"})]
    bad = next(r for r in of(ToolCompleted, log) if r.call_id == call_id(2))
    assert bad.is_error and "ctx.heartbeat(details)" in bad.output and "JSON" in bad.output


# -- a hung tool ----------------------------------------------------------------------------


@tool(replay=ReplayPolicy.KEYED, retry=QUICK, heartbeat_timeout=0.5)
async def sync_mirror(ctx: ToolContext) -> str:
    """Hangs after one heartbeat on its first attempt."""
    SEEN.append(ctx)
    ctx.heartbeat({"step": 1})
    if ctx.attempt == 1:
        await trio.sleep_forever()
    return "mirrored"


@tool(replay=ReplayPolicy.NEVER, heartbeat_timeout=0.5)
async def push(ctx: ToolContext) -> str:
    """A NEVER tool that hangs."""
    SEEN.append(ctx)
    await trio.sleep_forever()
    return "never"


async def test_a_hung_keyed_tool_is_stopped_and_retried(where: Where, clock: MockClock) -> None:
    log, _ = await run(where, [sync_mirror], [ToolUse("sync_mirror")])
    (pending,) = of(ToolRetryPending, log)
    assert "sent no heartbeat for 0.5s" in pending.error
    if where.virtual:  # stopped exactly one watchdog period after its last heartbeat
        first_beat = of(ToolHeartbeat, log)[0]
        assert pending.at - first_beat.at == pytest.approx(0.5)
    assert [c.attempt for c in SEEN] == [1, 2]
    assert SEEN[1].last_heartbeat == {"step": 1}
    assert of(ToolCompleted, log)[0].output == "mirrored"


async def test_a_hung_never_tool_is_stopped_and_reported_unknown_never_retried(
    where: Where, clock: MockClock
) -> None:
    log, outcome = await run(where, [push], [ToolUse("push")])
    assert outcome is not None and outcome.status == "completed"
    assert len(SEEN) == 1 and len(of(ToolExecuting, log)) == 1
    (unknown,) = of(ToolOutcomeUnknown, log)
    assert "UNKNOWN" in unknown.output and "sent no heartbeat" in unknown.output


# -- a person decides -----------------------------------------------------------------------


@tool(replay=ReplayPolicy.NEVER, needs_human_on=(PermissionError,))
async def pay(ctx: ToolContext, cents: int) -> str:
    """Pays; asks a person when the bank wants a second factor."""
    SEEN.append(ctx)
    if ctx.attempt == 1:
        if cents > 100:
            raise PermissionError("the bank asks for a second factor")
        raise NeedsHuman("the card was declined; ask the customer for another one")
    return f"paid {cents}"


@pytest.mark.parametrize(
    ("action", "result", "expected", "is_error"),
    [
        ("retry", None, "paid 5", False),
        ("skip", {"paid": "by phone"}, '{"paid": "by phone"}', False),
        ("fail", None, "they chose to fail it", True),
    ],
)
async def test_a_call_that_needs_a_person_waits_for_rt_resolve(
    where: Where, clock: MockClock, action: Any, result: Any, expected: str, is_error: bool
) -> None:
    async def resolve(rt: perdure.Runtime) -> None:
        waiting = await wait_for_record(rt, ToolAwaitingHuman)
        assert waiting.reason == "the card was declined; ask the customer for another one"
        await rt.resolve(SESSION, waiting.call_id, action=action, result=result, request_id="h1")
        again = await rt.resolve(
            SESSION, waiting.call_id, action=action, result=result, request_id="h1"
        )
        assert again.duplicate

    log, outcome = await run(where, [pay], [ToolUse("pay", {"cents": 5})], during=resolve)
    assert outcome is not None and outcome.status == "completed"
    (done,) = of(ToolCompleted, log)
    assert expected in done.output and done.is_error is is_error
    assert len(SEEN) == (2 if action == "retry" else 1)
    if action == "retry":
        assert SEEN[0].idempotency_key == SEEN[1].idempotency_key


async def test_an_exception_the_tool_lists_waits_for_a_person_too(
    where: Where, clock: MockClock
) -> None:
    async def skip(rt: perdure.Runtime) -> None:
        waiting = await wait_for_record(rt, ToolAwaitingHuman)
        assert waiting.reason == "PermissionError: the bank asks for a second factor"
        await rt.resolve(SESSION, waiting.call_id, action="skip", result="paid by the customer")

    log, _ = await run(where, [pay], [ToolUse("pay", {"cents": 500})], during=skip)
    assert of(ToolCompleted, log)[0].output == "paid by the customer"


async def test_rt_resolve_refuses_bad_input_and_a_call_that_does_not_wait(
    where: Where, clock: MockClock
) -> None:
    async def misuse(rt: perdure.Runtime) -> None:
        waiting = await wait_for_record(rt, ToolAwaitingHuman)
        call = waiting.call_id
        with pytest.raises(ValueError, match="action must be one of retry, skip, fail"):
            await rt.resolve(SESSION, call, action="ignore")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="result= goes with action='skip' or 'fail'"):
            await rt.resolve(SESSION, call, action="retry", result="x")
        with pytest.raises(ValueError, match="result must be a JSON value"):
            await rt.resolve(SESSION, call, action="skip", result={1, 2})
        with pytest.raises(perdure.Refused) as info:
            await rt.resolve(SESSION, "nope", action="skip")
        assert info.value.code == "not_found"
        await rt.resolve(SESSION, call, action="skip", result="ok", request_id="h1")
        with pytest.raises(perdure.Refused) as info:
            await rt.resolve(SESSION, call, action="retry", request_id="h2")
        assert info.value.code == "invalid_state"

    log, _ = await run(where, [pay], [ToolUse("pay", {"cents": 5})], during=misuse)
    assert len(SEEN) == 1, "nothing the refused calls asked for happened"
    assert of(ToolCompleted, log)[0].output == "ok"


async def test_a_call_waiting_for_a_person_is_still_waiting_after_a_restart(
    where: Where, clock: MockClock
) -> None:
    uses = [ToolUse("pay", {"cents": 5})]
    async with perdure.open_runtime(
        where.open(), provider=provider(uses), tools=[pay], **where.options()
    ) as rt:
        await rt.create_session(SESSION)
        await rt.submit(SESSION, "go", request_id="r1")
        waiting = await wait_for_record(rt, ToolAwaitingHuman)
    async with perdure.open_runtime(
        where.open(), provider=provider(uses), tools=[pay], **where.options()
    ) as rt:
        assert rt.recovered_sessions == [SESSION]
        await rt.resolve(SESSION, waiting.call_id, action="retry")
        with trio.fail_after(30):
            outcome = await rt.wait_idle(SESSION)
        log = list(await rt._journal.read_session(SESSION))
    assert outcome is not None and outcome.status == "completed"
    decisions = [d for d in of(RecoveryDecision, log) if "awaiting a person" in d.found]
    assert decisions and decisions[0].action == "keep waiting"
    assert [e.attempt for e in of(ToolExecuting, log)] == [1, 2]


async def test_a_running_tool_stopped_by_a_cancel_keeps_its_last_heartbeat(
    where: Where, clock: MockClock
) -> None:
    @tool(replay=ReplayPolicy.SAFE)  # SAFE: cancellable while it runs
    async def scan(ctx: ToolContext) -> str:
        """Scans forever, reporting its progress."""
        for n in itertools.count(1):
            ctx.heartbeat({"scanned": n})
            await trio.lowlevel.checkpoint()  # it keeps reporting until it is stopped
        return "unreachable"

    async def cancel_while_running(rt: perdure.Runtime) -> None:
        await wait_for_record(rt, ToolHeartbeat)
        await rt.cancel(SESSION, request_id="k1")

    log, outcome = await run(where, [scan], [ToolUse("scan")], during=cancel_while_running)
    assert outcome is not None and outcome.status == "cancelled"
    (cancelled,) = of(ToolCancelled, log)
    assert cancelled.while_executing
    beats = of(ToolHeartbeat, log)
    assert len(beats) >= 2, "the heartbeat held back when it was stopped was committed"
    assert beats[-1].details["scanned"] > beats[0].details["scanned"]
    assert log.index(next(c for c in log if c.record is beats[-1])) < log.index(
        next(c for c in log if c.record is cancelled)
    )
