"""How a declared tool is called: ``Tool.invoke`` on each loop, and the calls around it.

No runtime: ``invoke`` is handed a ``ToolContext`` as the tool actor hands one. A plain
``def`` runs in a worker thread of the runtime's limiter, with a context whose
heartbeats and progress events go back to the trio loop; a tool written for asyncio is
awaited through the host's runner (here a real asyncio loop in a worker thread, as
``perdure.embed`` awaits it on the application's loop), and on a plain trio runtime it
fails with ``NeedsAsyncio``, which names it. Every tool is declared inside its test, so
the mutation campaign (docs/RELIABILITY.md) can switch a mutant of
``perdure/tools/contract.py`` on under the declaration too.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel

from perdure import Reconciled, ToolContext, tool
from perdure.tools.contract import NeedsAsyncio


def _context(**hooks: Any) -> ToolContext:
    return ToolContext(
        idempotency_key="k-1", call_id="c-1", session_id="s", attempt=1, workspace=None, **hooks
    )


class _Seen:
    """What a context's hooks were handed, and on which thread."""

    def __init__(self) -> None:
        self.beats: list[tuple[Any, int]] = []
        self.events: list[tuple[str, dict[str, Any], int]] = []

    def beat(self, details: Any) -> None:
        self.beats.append((details, threading.get_ident()))

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data, threading.get_ident()))


# -- a plain def: a worker thread ---------------------------------------------------------------


async def test_a_plain_def_runs_in_a_worker_thread_of_the_runtimes_limiter() -> None:
    """Its heartbeats and progress events reach the hooks on the trio thread, in order."""
    seen, threads = _Seen(), trio.CapacityLimiter(1)
    loop_thread = threading.get_ident()

    def count(ctx: ToolContext, up_to: int) -> dict[str, Any]:
        ctx.heartbeat({"at": up_to})
        ctx.progress("counted", n=up_to)
        held = trio.from_thread.run_sync(lambda: threads.borrowed_tokens)
        return {"thread": threading.get_ident(), "held": held, "key": ctx.idempotency_key}

    def double(n: int) -> int:
        return n * 2

    ctx = _context(beat=seen.beat, emit=seen.emit, threads=threads)
    ran = await tool(count).invoke(ctx, {"up_to": 3})
    assert ran["thread"] != loop_thread
    assert ran["held"] == 1  # the thread ran under the runtime's limiter
    assert ran["key"] == "k-1"
    assert seen.beats == [({"at": 3}, loop_thread)]
    assert seen.events == [
        ("tool_progress", {"call_id": "c-1", "message": "counted", "n": 3}, loop_thread)
    ]
    assert await tool(double).invoke(ctx, {"n": 4}) == 8  # no context asked, none given


async def test_a_cancelled_wait_leaves_a_plain_defs_thread_to_finish_on_its_own() -> None:
    """A thread cannot be stopped: a timeout or a cancel ends the wait at once."""
    release, finished = threading.Event(), threading.Event()
    started = trio.Event()

    def stuck(ctx: ToolContext) -> str:
        trio.from_thread.run_sync(started.set)
        release.wait(10)  # reached only if the wait did not end at the cancel
        finished.set()
        return "late"

    declared = tool(stuck)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(declared.invoke, _context(), {})
        await started.wait()
        nursery.cancel_scope.cancel()
    assert not finished.is_set()  # the wait is over, and the thread still runs
    release.set()


# -- a tool written for asyncio ------------------------------------------------------------------


def _host(hosted: list[str]) -> Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any]:
    async def on_an_asyncio_loop(fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        hosted.append("hosted")
        return await trio.to_thread.run_sync(lambda: asyncio.run(fn()))

    return on_an_asyncio_loop


async def test_a_tool_written_for_asyncio_is_awaited_on_the_hosts_loop() -> None:
    """It is handed a context with nothing of trio's: its heartbeats and progress events
    go to the trio loop, sub-agents (trio code) are refused, and no host runner is
    left in it (a tool it runs through ``invoke`` is awaited right there)."""
    seen, hosted, asked = _Seen(), [], []
    loop_thread = threading.get_ident()

    async def agents(task: str, system: str | None, tools: list[str] | None) -> str:
        asked.append(task)
        return "child"

    @tool(runs_on="asyncio")
    async def pour(cups: int) -> int:
        await asyncio.sleep(0)
        return cups

    @tool(runs_on="asyncio")
    async def brew(ctx: ToolContext, cups: int) -> dict[str, Any]:
        await asyncio.sleep(0)  # asyncio code: it needs an asyncio loop
        ctx.heartbeat({"cups": cups})
        ctx.progress("brewing")
        with pytest.raises(RuntimeError) as refused:
            await ctx.run_agent("taste it")
        poured = await pour.invoke(ctx, {"cups": cups})
        return {"key": ctx.idempotency_key, "refused": str(refused.value), "poured": poured}

    ctx = _context(beat=seen.beat, emit=seen.emit, agents=agents, host=_host(hosted))
    assert await brew.invoke(ctx, {"cups": 2}) == {
        "key": "k-1",
        "refused": "ctx.run_agent is trio code: declare the tool runs_on='trio' to start "
        "sub-agents",
        "poured": 2,
    }
    assert hosted == ["hosted"]
    assert asked == []
    assert seen.beats == [({"cups": 2}, loop_thread)]
    assert seen.events == [("tool_progress", {"call_id": "c-1", "message": "brewing"}, loop_thread)]
    assert await pour.invoke(ctx, {"cups": 3}) == 3  # no context asked, none given
    assert hosted == ["hosted", "hosted"]


async def test_trio_code_stays_on_the_trio_loop_under_a_host() -> None:
    hosted: list[str] = []

    @tool(runs_on="trio")
    async def stir(ctx: ToolContext, n: int) -> int:
        await trio.lowlevel.checkpoint()
        return n

    assert await stir.invoke(_context(host=_host(hosted)), {"n": 1}) == 1
    assert hosted == []


async def test_asyncio_code_on_the_trio_loop_fails_naming_the_tool_and_the_way_out() -> None:
    """Both ways asyncio code fails on trio (no loop to find; a yield trio does not
    know) become ``NeedsAsyncio``; any other error of the tool is its own."""

    @tool(runs_on="asyncio")
    async def wait_a_bit(ctx: ToolContext) -> str:
        await asyncio.sleep(0.01)  # looks for the running asyncio loop
        return "waited"

    @tool(runs_on="asyncio")
    async def yield_to_asyncio(ctx: ToolContext) -> str:
        await asyncio.sleep(0)  # yields to the loop, which here is trio's
        return "yielded"

    for declared, cause in ((wait_a_bit, RuntimeError), (yield_to_asyncio, TypeError)):
        with pytest.raises(NeedsAsyncio) as refused:
            await declared.invoke(_context(), {})
        assert refused.value.tool_name == declared.name
        assert isinstance(refused.value.__cause__, cause)
        assert str(refused.value) == (
            f"tool {declared.name!r} needs a running asyncio loop ({refused.value.__cause__}), "
            "and this runtime runs on trio: open it with perdure.embed.open_runtime inside "
            "your asyncio application, which runs such a tool's coroutine on the "
            "application's loop"
        )

    @tool
    async def add(ctx: ToolContext, text: str) -> str:
        return text + 1  # type: ignore[operator]

    @tool
    async def busy(ctx: ToolContext) -> str:
        raise RuntimeError("the printer is busy")

    with pytest.raises(TypeError, match=r"^can only concatenate str"):
        await add.invoke(_context(), {"text": "a"})
    with pytest.raises(RuntimeError, match=r"^the printer is busy$"):
        await busy.invoke(_context(), {})


# -- the calls around invoke --------------------------------------------------------------------


async def test_calling_a_tool_calls_its_function() -> None:
    async def add(ctx: ToolContext, a: int, b: int = 1) -> int:
        return a + b

    def times(a: int, b: int) -> int:
        return a * b

    assert await tool(add)(_context(), 2, b=3) == 5
    assert await tool(times)(2, b=4) == 8


async def test_reconcile_gets_the_context_and_the_converted_arguments() -> None:
    seen: list[tuple[ToolContext, Any]] = []

    async def check(ctx: ToolContext, when: datetime.date) -> Reconciled:
        seen.append((ctx, when))
        return Reconciled.applied("booked")

    async def vague(ctx: ToolContext, when: datetime.date) -> Any:
        return "maybe"

    async def book(ctx: ToolContext, when: datetime.date) -> str:
        return "booked"

    ctx = _context()
    found = await tool(reconcile=check)(book).run_reconcile(ctx, {"when": "2026-12-06"})
    assert found == Reconciled.applied("booked")
    assert seen == [(ctx, datetime.date(2026, 12, 6))]
    with pytest.raises(TypeError) as refused:
        await tool(reconcile=vague)(book).run_reconcile(ctx, {"when": "2026-12-06"})
    assert str(refused.value) == "reconcile of book returned 'maybe', not a Reconciled"


def test_a_tool_without_parameters_receives_the_arguments_as_they_are() -> None:
    async def echo(ctx: ToolContext, text: str) -> str:
        return text

    own = attrs.evolve(tool(echo), parameters=None)  # e.g. an MCP tool: its own schema
    args = {"text": 5, "extra": [1]}
    passed = own.structure_args(args)
    assert passed == args and passed is not args
