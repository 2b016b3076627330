"""Ledger tools for the session-control crash tests (``tests.recovery.test_session_crash``)."""

from __future__ import annotations

import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from tests.support.ledger_tools import _write


@perdure.tool(replay=ReplayPolicy.NEVER)
async def slow_send(ctx: ToolContext, text: str, seconds: float = 1.0) -> str:
    """Send a message (NEVER), slowly: its effect happens, then it takes a while to answer."""
    await trio.to_thread.run_sync(lambda: _write(ctx, "start", "slow_send"))
    await trio.to_thread.run_sync(lambda: _write(ctx, "effect", "slow_send", text=text))
    await trio.sleep(seconds)
    return f"sent {text}"


TOOLS = [slow_send]


RESEARCHER = "researcher"

# A sub-agent that may only send notes (a NEVER ledger tool).
research = perdure.agent_tool(
    "research", "Delegate a question to a sub-agent.", system=RESEARCHER, tools=["send_note"]
)

AGENT_TOOLS = [research]
