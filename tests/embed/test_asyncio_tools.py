"""Tools written for asyncio, inside an asyncio application (``perdure.embed``).

A tool whose module does not import trio is awaited on the host's asyncio loop:
asyncio primitives work, its heartbeats are committed, a tool timeout cancels its
asyncio task (and a NEVER call that timed out is an unknown outcome), and a cancel
of its task on the host's side ends the call as cancelled. On a plain trio runtime
the same tool fails with an error that names it and says to use ``perdure.embed``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

import perdure
import perdure.embed
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import (
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
)
from tests.embed import asyncio_tools
from tests.embed.asyncio_tools import SEEN, brew, wait_forever, wait_until_stopped
from tests.support.fold import fold_in_asyncio, fold_of

MODES = ["thread", "guest"]


def _provider(name: str, args: dict[str, Any]) -> ScriptedProvider:
    return ScriptedProvider([Reply(tool_uses=[ToolUse(name, args)]), Reply(text="done")])


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()


def test_the_tools_are_classified_by_what_their_module_imports() -> None:
    assert "trio" not in vars(asyncio_tools)
    assert brew.runs_on == "asyncio"

    @perdure.tool
    async def trio_code(x: int) -> int:  # this test module imports trio
        await trio.lowlevel.checkpoint()
        return x

    assert trio_code.runs_on == "trio"
    assert perdure.tool(runs_on="asyncio")(trio_code.fn).runs_on == "asyncio"
    with pytest.raises(ValueError, match="runs_on must be"):
        perdure.tool(runs_on="curio")(trio_code.fn)  # type: ignore[call-overload]


@pytest.mark.parametrize("mode", MODES)
def test_an_asyncio_tool_runs_on_the_host_loop_and_heartbeats(mode: str, tmp_path: Path) -> None:
    async def main() -> tuple[Any, Any]:
        async with perdure.embed.open_runtime(
            tmp_path / "log", mode=mode, provider=_provider("brew", {"cups": 3}), tools=[brew]
        ) as rt:
            sid = await rt.create_session()
            await rt.submit(sid, "coffee")
            outcome = await rt.wait_idle(sid)
            state = await fold_in_asyncio(rt, sid)
            return outcome, state

    outcome, state = asyncio.run(main())
    assert outcome.status == "completed"
    (task,) = state.tasks.values()
    assert isinstance(task.result, ToolCompleted) and task.result.output == "3 cups"
    assert SEEN["key"] == task.executing.idempotency_key  # the ToolContext crossed over
    assert task.last_heartbeat is not None and task.last_heartbeat.details == {"cups": 3}
    assert isinstance(SEEN["loop"], asyncio.AbstractEventLoop)


@pytest.mark.parametrize("mode", MODES)
def test_a_timeout_cancels_the_asyncio_task_and_a_never_call_is_unknown(
    mode: str, tmp_path: Path
) -> None:
    async def main() -> Any:
        async with perdure.embed.open_runtime(
            tmp_path / "log",
            mode=mode,
            provider=_provider("wait_forever", {}),
            tools=[wait_forever],
        ) as rt:
            sid = await rt.create_session()
            await rt.submit(sid, "wait")
            await rt.wait_idle(sid)
            return await fold_in_asyncio(rt, sid)

    state = asyncio.run(main())
    (task,) = state.tasks.values()
    assert isinstance(task.result, ToolOutcomeUnknown) and task.result.reason == "timeout"
    assert SEEN.get("cancelled") is True  # the asyncio side was cancelled, not left running


@pytest.mark.parametrize("mode", MODES)
def test_cancelling_the_tools_asyncio_task_ends_the_call_as_cancelled(
    mode: str, tmp_path: Path
) -> None:
    async def main() -> Any:
        async with perdure.embed.open_runtime(
            tmp_path / "log",
            mode=mode,
            provider=_provider("wait_until_stopped", {}),
            tools=[wait_until_stopped],
        ) as rt:
            sid = await rt.create_session()
            await rt.submit(sid, "wait")
            while "task" not in SEEN:  # noqa: ASYNC110 (set by the tool on this loop)
                await asyncio.sleep(0.01)
            SEEN["task"].cancel()  # the application cancels the tool's await
            outcome = await asyncio.wait_for(rt.wait_idle(sid), 10)
            return outcome, await fold_in_asyncio(rt, sid)

    outcome, state = asyncio.run(main())
    (task,) = state.tasks.values()
    assert isinstance(task.result, ToolCancelled) and task.result.while_executing
    assert "Its effect may have partly happened" in task.result.output  # NEVER
    assert outcome.status == "completed"  # the model was told, and the run went on


async def test_on_a_plain_trio_runtime_the_error_names_the_tool_and_perdure_embed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="perdure.tool")
    async with perdure.open_runtime(
        tmp_path / "log", provider=_provider("brew", {"cups": 1}), tools=[brew]
    ) as rt:
        sid = await rt.create_session()
        await rt.submit(sid, "coffee")
        await rt.wait_idle(sid)
        state = await fold_of(rt, sid)
    (task,) = state.tasks.values()
    assert isinstance(task.result, ToolCompleted) and task.result.is_error
    said = task.result.output
    assert said.startswith("perdure could not run this tool here: tool 'brew' needs a running")
    assert "perdure.embed.open_runtime" in said and "The tool raised" not in said
    assert any("tool 'brew' needs a running asyncio loop" in r.message for r in caplog.records)
