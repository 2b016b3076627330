"""A parent session whose sub-agent has answered while the parent call still waits.

Used in-process by ``tests/runtime/test_agent_dependency.py`` and, as a real process
(``python -m tests.runtime.agent_parent LOG hold|finish``), by its crash test:

* ``hold``: the parent's ``delegate`` call runs its sub-agent to its answer, then waits
  for ``release``; meanwhile the process tries to delete the child, prints what
  happened as one JSON line, and waits to be killed;
* ``finish``: the same runtime restarted; recovery re-runs the KEYED call, which finds
  the child and returns its answer; it prints the parent's outcome and how many times
  the sub-agent's model was called in this process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.providers.base import Emit, ModelReply, ModelRequest
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse

RESEARCHER = "You research one question and answer in one line."


class Parent:
    """The ``delegate`` tool and the events around its call."""

    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.answered = trio.Event()  # the sub-agent answered the call
        self.release = trio.Event()  # the call may return

        @perdure.tool(replay=ReplayPolicy.KEYED, cancellable=True)
        async def delegate(ctx: ToolContext, task: str) -> str:
            """Hand the task to a sub-agent, then report its answer."""
            answer = await ctx.run_agent(task, system=RESEARCHER)
            self.answered.set()
            if self.hold:
                await self.release.wait()
            return f"the researcher says {answer}"

        self.tool = delegate


class Model(ScriptedProvider):
    """The parent's script and the researcher's; counts the researcher's calls."""

    def __init__(self) -> None:
        super().__init__(
            [
                Reply(text="asking", tool_uses=[ToolUse("delegate", {"task": "capital of PT"})]),
                Reply(text="Lisbon, says the researcher."),
            ],
            by_system={RESEARCHER: [Reply(text="Lisbon")]},
        )
        self.researcher_calls = 0

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        if request.system == RESEARCHER:
            self.researcher_calls += 1
        return await super().complete(request, emit)


def say(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


async def hold(log: Path) -> None:
    parent, model = Parent(hold=True), Model()
    async with perdure.open_runtime(log, provider=model, tools=[parent.tool]) as rt:
        await rt.create_session("p")
        await rt.submit("p", "what is the capital of Portugal?", request_id="r1")
        with trio.fail_after(30):
            await parent.answered.wait()
        (child,) = [i.session_id for i in await rt.sessions() if i.session_id != "p"]
        try:
            await rt.delete_session(child)
            say({"child": child, "deleted": True})
        except perdure.Refused as exc:
            say({"child": child, "deleted": False, "code": exc.code, "why": exc.message})
        await trio.sleep_forever()  # killed here, the parent call still waiting


async def finish(log: Path) -> None:
    parent, model = Parent(hold=False), Model()
    async with perdure.open_runtime(log, provider=model, tools=[parent.tool]) as rt:
        with trio.fail_after(30):
            outcome = await rt.wait_idle("p")
        assert outcome is not None
        sessions = sorted(i.session_id for i in await rt.sessions())
        say(
            {
                "final": outcome.final_text,
                "researcher_calls": model.researcher_calls,
                "sessions": sessions,
            }
        )


if __name__ == "__main__":
    where, what = Path(sys.argv[1]), sys.argv[2]
    trio.run(hold if what == "hold" else finish, where)
