"""Helpers of the in-process tests: one model turn through ``open_runtime``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import trio
from attrs import frozen

import perdure
from perdure.actors.state import SessionState
from perdure.providers.base import ToolResultBlock
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import RunFinished
from perdure.view import SessionLookup
from tests.support.fold import fold_of

SESSION = "s"


def call_id(n: int) -> str:
    """The scripted provider's id for the n-th call (from 1) of the first turn."""
    return f"toolu_001_{n}"


@frozen
class Turn:
    state: SessionState
    results: dict[str, tuple[str, bool]]  # call id -> (content, is_error) as the model reads it
    outcome: RunFinished | None

    def kind(self, n: int) -> str | None:
        return getattr(self.state.tasks[call_id(n)].result, "kind", None)


def provider(uses: Iterable[ToolUse], final: str = "all done") -> ScriptedProvider:
    return ScriptedProvider([Reply(tool_uses=list(uses)), Reply(text=final)])


async def read_turn(rt: perdure.Runtime, outcome: RunFinished | None = None) -> Turn:
    state = await fold_of(rt, SESSION)
    results: dict[str, tuple[str, bool]] = {}
    for message in await rt.transcript(SESSION):
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                results[block.tool_use_id] = (block.content, block.is_error)
    return Turn(state, results, outcome)


async def one_turn(
    log: Path,
    tools: Iterable[perdure.Tool],
    uses: Iterable[ToolUse],
    *,
    workspace: Path | None = None,
) -> Turn:
    """Submit one input whose first model turn makes ``uses``; wait for the run to end."""
    async with perdure.open_runtime(
        log, provider=provider(uses), tools=list(tools), workspace=workspace
    ) as rt:
        await rt.create_session(SESSION)
        await rt.submit(SESSION, "go", request_id="r1")
        with trio.fail_after(30):
            outcome = await rt.wait_idle(SESSION)
        return await read_turn(rt, outcome)


async def wait_phase(rt: perdure.Runtime, call: str, phase: str) -> None:
    def get(state: SessionLookup) -> str | None:
        task = state.task_view(call)
        return None if task is None else task.phase

    with trio.fail_after(10):
        while await rt.state(SESSION, get) != phase:  # noqa: ASYNC110 (a query, not an event)
            await trio.sleep(0.01)
