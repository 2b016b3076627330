"""Tools for the metrics tests: one that succeeds, one that fails, one whose outcome is unknown."""

from __future__ import annotations

import trio

import perdure


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def probe(ctx: perdure.ToolContext, what: str) -> str:
    """Probe something (read-only)."""
    return f"probed {what}"


@perdure.tool(replay=perdure.ReplayPolicy.KEYED)
async def charge(ctx: perdure.ToolContext, amount: int) -> str:
    """Charge an amount; the service refuses it."""
    raise ValueError(f"card declined for {amount}")


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)
async def transfer(ctx: perdure.ToolContext, amount: int) -> str:
    """Transfer an amount; the bank's answer got lost."""
    raise perdure.OutcomeUnknown("the bank did not answer")


TOOLS = [probe, charge, transfer]


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)
async def slow_send(ctx: perdure.ToolContext, text: str) -> str:
    """Send something slowly (the process is killed while it runs)."""
    await trio.sleep(60)
    return f"sent {text}"


SLOW = [slow_send]
