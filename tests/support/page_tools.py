"""The ledger tools plus one slow NEVER tool, so a test can kill the daemon while an
effect that must not happen twice is in flight (its outcome becomes unknown)."""

from __future__ import annotations

import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from tests.support.ledger_tools import ALL_TOOLS, _effect


@perdure.tool(replay=ReplayPolicy.NEVER)
async def slow_announce(ctx: ToolContext, text: str, seconds: float = 3.0) -> str:
    """Announce something, slowly (an effect that must not happen twice)."""
    await trio.sleep(seconds)
    await _effect(ctx, "slow_announce", text=text)
    return f"announced: {text}"


TOOLS = [*ALL_TOOLS, slow_announce]
