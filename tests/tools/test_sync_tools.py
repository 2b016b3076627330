"""Plain ``def`` tools: run in a worker thread, under the usual timeout and replay rules.

In process: the thread does not block the runtime's loop, its heartbeats are
committed, and a NEVER call that times out is reported unknown while its thread is
left to finish, exactly once. In a child process killed with SIGKILL while the
tool's thread runs: a KEYED call is re-run with the same key, a NEVER call is
reported unknown and not re-run.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import trio

from perdure import ReplayPolicy, ToolContext, tool
from perdure.providers.scripted import ToolUse
from perdure.storage.records import ToolHeartbeat, ToolOutcomeUnknown
from tests.tools._harness import Workdir, use
from tests.tools._inproc import SESSION, call_id, one_turn, provider, read_turn

FINISHED: list[str] = []
THREADS: list[str] = []
RELEASE = threading.Event()


@tool(replay=ReplayPolicy.NEVER, timeout=0.3)
def charge(amount: int) -> str:
    """Charge a card (slowly: longer than the timeout)."""
    THREADS.append(threading.current_thread().name)
    RELEASE.wait(10)
    FINISHED.append(f"charged {amount}")
    return f"charged {amount}"


@tool(replay=ReplayPolicy.SAFE)
def count(ctx: ToolContext, up_to: int) -> int:
    """Count, heartbeating from the worker thread."""
    for i in range(1, up_to + 1):
        ctx.heartbeat({"at": i})
    time.sleep(0.05)  # blocking: the runtime's loop keeps running meanwhile
    return up_to


async def test_a_never_def_that_times_out_is_unknown_and_its_thread_finishes_once(
    tmp_path: Path,
) -> None:
    FINISHED.clear()
    THREADS.clear()
    RELEASE.clear()
    turn = await one_turn(tmp_path / "log", [charge], [ToolUse("charge", {"amount": 5})])
    assert turn.outcome is not None and turn.outcome.status == "completed"
    result = turn.state.tasks[call_id(1)].result
    assert isinstance(result, ToolOutcomeUnknown)
    content, is_error = turn.results[call_id(1)]
    assert is_error and "unknown" in content.lower()
    assert THREADS and THREADS[0] != threading.main_thread().name  # it ran in a thread
    assert FINISHED == []  # the call was given up while its thread still ran
    RELEASE.set()
    deadline = time.monotonic() + 5
    while not FINISHED and time.monotonic() < deadline:  # noqa: ASYNC110 (a thread appends)
        await trio.sleep(0.01)
    await trio.sleep(0.2)
    assert FINISHED == ["charged 5"]  # left to finish, never started again
    assert len(THREADS) == 1


async def test_a_def_tool_heartbeats_from_its_thread_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    import perdure

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.005)

    async with perdure.open_runtime(
        tmp_path / "log", provider=provider([ToolUse("count", {"up_to": 3})]), tools=[count]
    ) as rt:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            await rt.create_session(SESSION)
            await rt.submit(SESSION, "go", request_id="r1")
            with trio.fail_after(30):
                outcome = await rt.wait_idle(SESSION)
            nursery.cancel_scope.cancel()
        turn = await read_turn(rt, outcome)
        committed = [c.record for c in await rt._journal.read_session(SESSION)]
    assert turn.results[call_id(1)] == ("3", False)
    beats: list[Any] = [r.details for r in committed if isinstance(r, ToolHeartbeat)]
    assert beats and beats[-1] == {"at": 3}  # the last one, committed before the result
    assert ticks > 5  # the loop ran while the tool's thread slept


# -- SIGKILL while the tool's thread runs (a child process) -----------------------------------


def test_a_keyed_def_killed_mid_call_is_re_run_with_the_same_key(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("sync_keyed", note="x")])
    assert wd.run(kill_when=wd.marker).killed  # killed while the thread sleeps
    (started,) = wd.ledger()
    again = wd.run()
    assert again.returncode == 0, again.stderr
    first, second = wd.ledger()
    assert first == started and first["key"] == second["key"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    task = again.task()
    assert (task["phase"], task["kind"], task["attempt"]) == ("completed", "ok", 2)
    assert again.result() == {"content": "noted x", "is_error": False}


def test_a_never_def_killed_mid_call_is_unknown_and_not_re_run(tmp_path: Path) -> None:
    wd = Workdir(tmp_path, [use("sync_never", note="x")])
    assert wd.run(kill_when=wd.marker).killed
    again = wd.run()
    assert again.returncode == 0, again.stderr
    assert len(wd.ledger()) == 1  # never run a second time
    task = again.task()
    assert task["record"] == "ToolOutcomeUnknown"
    assert again.decisions() == ["report outcome unknown"]
    assert again.summary is not None and again.summary["outcome"] == "completed"
    assert again.result()["is_error"]  # the model is told, not shown a success


class Handle:
    """Something pydantic cannot serialize."""


@tool(replay=ReplayPolicy.NEVER)
def open_handle(ctx: ToolContext, name: str) -> Handle:
    """Open something, and return what the model cannot read."""
    ctx.progress(f"opening {name}")  # from the worker thread: handed to the loop
    OPENED.append(name)
    return Handle()


OPENED: list[str] = []


async def test_a_result_pydantic_cannot_serialize_is_an_error_that_says_the_tool_ran(
    tmp_path: Path,
) -> None:
    OPENED.clear()
    turn = await one_turn(tmp_path / "log", [open_handle], [ToolUse("open_handle", {"name": "a"})])
    content, is_error = turn.results[call_id(1)]
    assert is_error and OPENED == ["a"]
    assert content.startswith("perdure: the tool ran, but tool 'open_handle' returned a Handle")
    assert turn.kind(1) == "ok"  # it ran: not a failure to retry or to report unknown
