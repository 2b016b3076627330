"""The ledger tools plus one that needs a person on its first attempt, for the tests of
the commands for a person (``perdure approve``, ``resolve``, …)."""

from __future__ import annotations

import perdure
from perdure import NeedsHuman, ReplayPolicy, ToolContext
from tests.support.ledger_tools import ALL_TOOLS, _effect
from tests.support.page_tools import slow_announce


@perdure.tool(replay=ReplayPolicy.NEVER)
async def charge(ctx: ToolContext, amount: int) -> str:
    """Charge a card; the first attempt is declined and asks a person what to do."""
    if ctx.attempt == 1:
        raise NeedsHuman("the card was declined; ask the customer for another one")
    await _effect(ctx, "charge", amount=amount)
    return f"charged {amount}"


TOOLS = [*ALL_TOOLS, slow_announce, charge]
