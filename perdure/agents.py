"""Sub-agents: a tool that runs a child session and returns its final answer.

``agent_tool(...)`` declares such a tool; any tool can do the same with
``ctx.run_agent(task, ...)``. The child is an ordinary durable session (its own log,
recovery and events) whose id derives from the calling tool call's idempotency key,
so a restart re-runs the KEYED call, finds the same child, and waits for its outcome:
a child is never started twice. The work happens in the supervisor, which owns the
sessions (``perdure.actors.supervisor.agents``); this module only declares the tool,
from the public tool contract.
"""

from __future__ import annotations

from collections.abc import Iterable

from perdure.tools.contract import ReplayPolicy, Tool, ToolContext, tool


def agent_tool(
    name: str,
    description: str,
    *,
    system: str | None = None,
    tools: Iterable[str] | None = None,
    requires_approval: bool = False,
    timeout: float | None = None,
) -> Tool:
    """A tool ``name(task: str)`` that runs a sub-agent on ``task`` and returns its answer.

    The sub-agent's session has the system prompt ``system`` and the runtime's tools,
    or only those named in ``tools``. The tool is KEYED (re-run after a crash: it
    finds the child it started) and cancellable (a cancel or a revision of the
    parent's run cancels the child).
    """
    allowed = None if tools is None else list(tools)

    async def run(ctx: ToolContext, task: str) -> str:
        return await ctx.run_agent(task, system=system, tools=allowed)

    return tool(
        name=name,
        description=description,
        replay=ReplayPolicy.KEYED,
        cancellable=True,
        requires_approval=requires_approval,
        timeout=timeout,
        runs_on="trio",  # ctx.run_agent is trio code
    )(run)
