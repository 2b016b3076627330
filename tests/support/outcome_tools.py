"""Ledger tools for the crash tests of an unknown outcome sent to a person and of
results tied to the goal revision (``tests/recovery/test_person_and_revision.py``)."""

from __future__ import annotations

import perdure
from perdure import ReplayPolicy, ToolContext
from tests.support.ledger_tools import _effect


@perdure.tool(replay=ReplayPolicy.NEVER, unknown_outcome="ask_person")
async def transfer(ctx: ToolContext, amount: int) -> str:
    """Transfer money; an outcome perdure cannot know is sent to a person."""
    await _effect(ctx, "transfer", amount=amount)
    return f"transferred {amount}"


@perdure.tool(replay=ReplayPolicy.SAFE, depends_on_goal=True)
async def search_flights(ctx: ToolContext, route: str) -> str:
    """Search flights for the request (its result depends on what was asked)."""
    await _effect(ctx, "search_flights", route=route)
    return f"flights for {route}, searched by {ctx.call_id}"


@perdure.tool(replay=ReplayPolicy.SAFE)
async def weather(ctx: ToolContext, city: str) -> str:
    """The weather in a city (the same whatever was asked)."""
    await _effect(ctx, "weather", city=city)
    return f"sunny in {city}"


TOOLS = [transfer, search_flights, weather]
