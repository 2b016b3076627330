"""Cancelling an asyncio await of ``perdure.embed`` cancels the trio task behind it.

Each call of an ``AsyncioRuntime`` is a trio task in the runtime's nursery. When the
asyncio side gives up (``asyncio.wait_for`` times out, a request handler is cancelled),
that task must be cancelled too, not left waiting in the runtime until what it waited
for happens. The tests watch the trio side: the awaited trio function notes the
``trio.Cancelled`` it receives, and the asyncio side waits for that note.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

import perdure.embed
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from tests.embed.test_embed import MODES, awaiting_approval
from tests.support import ledger_tools


def watched(
    fn: Any, started: threading.Event, cancelled: threading.Event, finished: threading.Event
) -> Any:
    """``fn`` noting, on the trio side, that it started and how it ended."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        started.set()
        try:
            return await fn(*args, **kwargs)
        except trio.Cancelled:
            cancelled.set()
            raise
        finally:
            finished.set()

    return call


WAIT = 10.0  # seconds for the trio side's note (tests/mutation waits less)


async def noted(event: threading.Event) -> bool:
    """Wait (without blocking the asyncio loop, which may host trio) for ``event``."""
    return await asyncio.to_thread(event.wait, WAIT)


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_call_cancels_its_trio_task(mode: str, tmp_path: Path) -> None:
    async def main() -> None:
        model = ScriptedProvider([Reply(text="hi")])
        async with perdure.embed.open_runtime(tmp_path / "log", mode=mode, provider=model) as rt:
            started, cancelled, finished = threading.Event(), threading.Event(), threading.Event()
            forever = watched(trio.sleep_forever, started, cancelled, finished)
            call = asyncio.ensure_future(rt.run(forever))
            assert await noted(started)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert await noted(cancelled), "the trio task went on after its await was cancelled"
            assert finished.is_set()
            # The runtime is as it was: the next call works.
            assert await rt.create_session("after") == "after"

    asyncio.run(main())


@pytest.mark.parametrize("mode", MODES)
def test_a_timed_out_wait_idle_stops_waiting_in_the_runtime(
    mode: str, tmp_path: Path, workspace: Path
) -> None:
    async def main() -> None:
        model = ScriptedProvider(
            [Reply(tool_uses=[ToolUse("deploy", {"target": "prod"})]), Reply(text="deployed")]
        )
        async with perdure.embed.open_runtime(
            tmp_path / "log",
            mode=mode,
            provider=model,
            tools=ledger_tools.ALL_TOOLS,
            workspace=workspace,
        ) as rt:
            sid = await rt.create_session("a")
            await rt.submit(sid, "deploy it")
            call_id = await awaiting_approval(rt, sid)  # the run waits for a person
            started, cancelled, finished = threading.Event(), threading.Event(), threading.Event()
            runtime: Any = rt.trio_runtime
            runtime.wait_idle = watched(runtime.wait_idle, started, cancelled, finished)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(rt.wait_idle(sid), timeout=0.2)
            assert started.is_set()
            assert await noted(cancelled), "wait_idle still waits in the runtime"
            del runtime.wait_idle
            await rt.approve(sid, call_id)
            outcome = await rt.wait_idle(sid)
            assert outcome is not None and outcome.final_text == "deployed"

    asyncio.run(main())
