"""``perdure.embed`` under plain asyncio: the whole API, cancellation, errors.

The tests are sync functions that call ``asyncio.run`` (the suite's default mode
is trio), once per ``mode``: trio in its own thread, and trio as a guest of the
asyncio loop.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import trio

import perdure
import perdure.embed
from perdure.providers.base import TextBlock
from perdure.providers.scripted import Reply, ScriptedProvider, _converter
from perdure.storage.records import LogOpened, ToolCompleted
from perdure.view import SessionLookup
from tests.server.conftest import APPROVAL_SCRIPT, WORK_SCRIPT
from tests.support import ledger_tools
from tests.support.checker import check
from tests.support.fold import fold_in_asyncio

MODES = ["thread", "guest"]


def provider(script: list[dict[str, Any]]) -> ScriptedProvider:
    return ScriptedProvider(_converter.structure(script, list[Reply]))


async def awaiting_approval(rt: perdure.embed.AsyncioRuntime, sid: str) -> str:
    """Follow the events until a call waits for approval; its call id."""

    def pending(state: SessionLookup) -> list[str]:
        return [t.call_id for t in state.task_views() if t.phase == "awaiting_approval"]

    stream = rt.events(sid)
    try:
        async for event in stream:
            if event.seq is not None:
                found = await rt.state(sid, pending)
                if found:
                    return found[0]
    finally:
        await stream.aclose()
    raise AssertionError("the stream ended before an approval was asked")


@pytest.mark.parametrize("mode", MODES)
def test_the_whole_api_from_asyncio(mode: str, tmp_path: Path, workspace: Path) -> None:
    async def main() -> None:
        async with perdure.embed.open_runtime(
            tmp_path / "log",
            mode=mode,
            provider=provider(APPROVAL_SCRIPT),
            tools=ledger_tools.ALL_TOOLS,
            workspace=workspace,
        ) as rt:
            assert rt.mode == mode and rt.recovered_sessions == []
            sid = await rt.create_session("a", system="be brief")
            assert sid == "a" and not await rt.ensure_session("a", system="be brief")
            first = await rt.submit(sid, "deploy it", request_id="r1")
            assert first == perdure.Accepted(first.submission_id, first.seq)
            again = await rt.submit(sid, "deploy it", request_id="r1")
            assert again.duplicate and again.submission_id == first.submission_id

            call_id = await awaiting_approval(rt, sid)
            [stuck] = await rt.stuck_runs(after=0)  # held at the approval
            assert stuck.session_id == sid and stuck.waiting.kind == "approval"
            assert stuck.waiting.call_id == call_id
            assert await rt.stuck_runs(after=3600) == []
            # A wait that is cancelled on the asyncio side cancels its trio task, and
            # leaves the runtime as it was.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(rt.wait_idle(sid), timeout=0.2)
            done = await rt.approve(sid, call_id, request_id="ok")
            assert done.seq > 0 and not done.duplicate
            outcome = await rt.wait_idle(sid)
            assert outcome is not None and outcome.status == "completed"
            assert outcome.final_text == "Deployed: all done."

            transcript = await rt.transcript(sid)
            last = transcript[-1].content[0]
            assert isinstance(last, TextBlock) and last.text == "Deployed: all done."
            state = await fold_in_asyncio(rt, sid)
            assert state.session_id == sid and state.run is None
            replay = rt.events(sid, live=False, restarts=True)
            seqs = [e.seq async for e in replay]
            assert seqs == sorted(set(seqs)) and seqs[-1] == state.last_seq
            assert (await rt.session_info(sid)) is not None and await rt.session_info("x") is None
            assert [i.session_id for i in await rt.sessions()] == [sid]
            assert len(await rt.restarts()) == 1
            assert isinstance((await rt.restarts())[0].record, LogOpened)
            assert (await rt.stats()).appends > 0 and await rt.resident_sessions() == [sid]
            assert await rt.evictions() == 0 and await rt.taken_over_sessions() == []
            assert await rt.hibernations() == len(await rt.hibernated_sessions())
            assert set(await rt.frozen_sessions()) <= set(await rt.hibernated_sessions())
            assert rt.log_path == tmp_path / "log" and rt.epoch == 1 and rt.node_id

            assert (await rt.pause(sid)).seq > 0
            assert await rt.state(sid, lambda s: s.view().paused)
            assert (await rt.view(sid)).paused and (await rt.view(sid, wake=False)).paused
            assert (await rt.resume(sid)).seq > 0
            assert (await rt.cancel(sid)).seq == 0  # no run: nothing to record
            with pytest.raises(perdure.Refused) as refused:
                await rt.revise(sid, "too late")
            assert refused.value.code == "invalid_state"
            lookup = next(t.call_id for t in state.tasks.values() if t.tool_name == "lookup")
            with pytest.raises(perdure.Refused, match="declares no compensation"):
                await rt.compensate(sid, lookup)
            with pytest.raises(perdure.Refused) as missing:
                await rt.resolve(sid, "no-such-call", action="skip", result="x")
            assert missing.value.code == "not_found"
            with pytest.raises(perdure.UnknownSession):
                await rt.wait_idle("no-such-session")
            with pytest.raises(perdure.UnknownSession):
                await rt.events("no-such-session").__anext__()

            # Another session: a revision while the approval is pending.
            await rt.create_session("b")
            await rt.submit("b", "deploy it")
            await awaiting_approval(rt, "b")
            revised = await rt.revise("b", "deploy to staging instead")
            assert revised.ref == "1"
            finished = await rt.wait_idle("b")
            assert finished is not None and finished.status == "completed"

        assert check(tmp_path / "log", workspace).ok

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_anext_loses_no_event(mode: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with perdure.embed.open_runtime(
            tmp_path / "log",
            mode=mode,
            provider=provider(WORK_SCRIPT),
            tools=ledger_tools.ALL_TOOLS,
            workspace=tmp_path,
        ) as rt:
            await rt.create_session("s1")
            info = await rt.session_info("s1")
            assert info is not None
            stream = rt.events("s1", after=info.last_seq)
            seqs: list[int] = []
            # Nothing happens yet: the wait times out, and the event that comes later
            # is delivered to the next __anext__.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(stream.__anext__(), timeout=0.1)
            await rt.submit("s1", "go", request_id="r1")
            async for event in stream:
                if event.seq is not None:
                    seqs.append(event.seq)
                if event.kind == "RunFinished":
                    break
            await stream.aclose()
            with pytest.raises(StopAsyncIteration):
                await stream.__anext__()
            replay = rt.events("s1", after=info.last_seq, live=False)
            logged = [e.seq async for e in replay if e.seq is not None]
            assert seqs == logged[: len(seqs)] and seqs[0] == info.last_seq + 1

    asyncio.run(main())


def test_a_runtime_that_cannot_open_raises_in_asyncio(tmp_path: Path) -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="idle_timeout"):
            async with perdure.embed.open_runtime(
                tmp_path / "log", provider=provider([]), idle_timeout=-1
            ):
                raise AssertionError("not reached")
        wrong: Any = "x"
        with pytest.raises(ValueError, match="mode"):
            async with perdure.embed.open_runtime(tmp_path, mode=wrong, provider=provider([])):
                raise AssertionError("not reached")

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES)
def test_what_is_pending_when_the_runtime_closes_ends_cleanly(mode: str, tmp_path: Path) -> None:
    async def main() -> None:
        async with perdure.embed.open_runtime(
            tmp_path / "log",
            mode=mode,
            provider=provider(APPROVAL_SCRIPT),
            tools=ledger_tools.ALL_TOOLS,
            workspace=tmp_path,
        ) as rt:
            await rt.create_session("a")
            await rt.submit("a", "deploy it", request_id="r1")
            await awaiting_approval(rt, "a")
            info = await rt.session_info("a")
            assert info is not None
            stream = rt.events("a", after=info.last_seq)
            waiting_event = asyncio.create_task(stream.__anext__())
            waiting_idle = asyncio.create_task(rt.wait_idle("a"))  # never: it awaits a person
            await asyncio.sleep(0.05)
            assert not waiting_event.done() and not waiting_idle.done()
        # Leaving the block stops the runtime: the stream ends, the call is told why.
        with pytest.raises(StopAsyncIteration):
            await waiting_event
        with pytest.raises(perdure.embed.RuntimeClosed):
            await waiting_idle
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        with pytest.raises(perdure.embed.RuntimeClosed):
            await rt.sessions()
        with pytest.raises(StopAsyncIteration):
            await rt.events("a").__anext__()

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES)
def test_a_host_task_cancelled_mid_run_still_closes_the_runtime_in_order(
    mode: str, tmp_path: Path, workspace: Path
) -> None:
    async def host(executing: asyncio.Event) -> None:
        async with perdure.embed.open_runtime(
            tmp_path / "log",
            mode=mode,
            provider=provider(WORK_SCRIPT),
            tools=ledger_tools.ALL_TOOLS,
            workspace=workspace,
        ) as rt:
            await rt.create_session("s1")
            await rt.submit("s1", "do the work", request_id="task-1")
            stream = rt.events("s1")
            async for event in stream:
                if event.kind == "ToolExecuting":
                    executing.set()
            raise AssertionError("a live stream does not end by itself")

    async def main() -> None:
        executing = asyncio.Event()
        task = asyncio.create_task(host(executing))
        await executing.wait()
        task.cancel()  # e.g. the server's lifespan cancelled
        with pytest.raises(asyncio.CancelledError):
            await task
        # The log was closed in order: a new runtime opens it at once and finishes the run.
        async with perdure.embed.open_runtime(
            tmp_path / "log",
            mode=mode,
            provider=provider(WORK_SCRIPT),
            tools=ledger_tools.ALL_TOOLS,
            workspace=workspace,
        ) as rt:
            outcome = await rt.wait_idle("s1")
            assert outcome is not None and outcome.status == "completed"
        assert check(tmp_path / "log", workspace).ok

    asyncio.run(main())


async def on_the_host(x: int) -> dict[str, int]:
    await asyncio.sleep(0)
    return {"loop": id(asyncio.get_running_loop()), "double": 2 * x}


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def ask_host(ctx: perdure.ToolContext, x: int) -> str:
    """A trio tool that uses the host application's asyncio code."""
    return json.dumps(await perdure.embed.run_in_asyncio(on_the_host, x))


@pytest.mark.parametrize("mode", MODES)
def test_a_tool_awaits_asyncio_code_on_the_host_loop(mode: str, tmp_path: Path) -> None:
    script = [
        {"text": "Asking the host.", "tool_uses": [{"name": "ask_host", "input": {"x": 21}}]},
        {"text": "Done."},
    ]

    async def main() -> None:
        async with perdure.embed.open_runtime(
            tmp_path / "log", mode=mode, provider=provider(script), tools=[ask_host]
        ) as rt:
            await rt.create_session("s1")
            await rt.submit("s1", "go")
            outcome = await rt.wait_idle("s1")
            assert outcome is not None and outcome.status == "completed"
            state = await fold_in_asyncio(rt, "s1")
            [task] = state.tasks.values()
            assert isinstance(task.result, ToolCompleted)
            found = json.loads(task.result.output)
            assert found == {"loop": id(asyncio.get_running_loop()), "double": 42}

    asyncio.run(main())


def test_run_in_asyncio_outside_an_embedded_runtime_says_so() -> None:
    with pytest.raises(RuntimeError, match=r"inside perdure\.embed\.open_runtime"):
        trio.run(perdure.embed.run_in_asyncio, on_the_host, 1)
