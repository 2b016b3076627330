"""One tool per replay policy for the ``perdure run`` identity tests.

Each leaves lines in the workspace's fsynced ledger (``tests.support.ledger_tools``):
``effect`` when its effect happened. ``place_order`` plays a service that deduplicates
by idempotency key, as a KEYED tool's service does: a repeated key is only
acknowledged (``deduplicated``).
"""

from __future__ import annotations

import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from tests.support.ledger_tools import _write, read_ledger


@perdure.tool(replay=ReplayPolicy.SAFE)
async def count_stock(ctx: ToolContext, item: str) -> str:
    """Count an item's stock (read-only: repeating it changes nothing)."""
    await trio.to_thread.run_sync(lambda: _write(ctx, "effect", "count_stock", item=item))
    return f"7 of {item} in stock"


@perdure.tool(replay=ReplayPolicy.KEYED)
async def place_order(ctx: ToolContext, item: str) -> str:
    """Order an item; the service applies one order per idempotency key."""
    assert ctx.workspace is not None
    workspace = ctx.workspace

    def apply() -> None:
        seen = any(
            e["event"] == "effect" and e["key"] == ctx.idempotency_key
            for e in read_ledger(workspace)
        )
        _write(ctx, "deduplicated" if seen else "effect", "place_order", item=item)

    await trio.to_thread.run_sync(apply)
    return f"ordered {item}"


@perdure.tool(replay=ReplayPolicy.NEVER)
async def send_invoice(ctx: ToolContext, item: str) -> str:
    """Send an invoice (must not happen twice; no service deduplicates it)."""
    await trio.to_thread.run_sync(lambda: _write(ctx, "effect", "send_invoice", item=item))
    return f"invoice sent for {item}"


TOOLS = [count_stock, place_order, send_invoice]
