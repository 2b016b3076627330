"""Tools written for an asyncio application: this module does not import trio.

Under ``perdure.embed`` their coroutines are awaited on the host's asyncio loop
(they use asyncio primitives only); on a plain trio runtime they cannot run.
``SEEN`` is what they observed, for the tests to read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import perdure
from perdure import ReplayPolicy, ToolContext

SEEN: dict[str, Any] = {}


@perdure.tool(replay=ReplayPolicy.SAFE)
async def brew(ctx: ToolContext, cups: int) -> str:
    """Brew coffee on the application's loop, heartbeating after each cup."""
    SEEN["loop"] = asyncio.get_running_loop()
    SEEN["key"] = ctx.idempotency_key
    ready = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, ready.set)
    await ready.wait()
    for cup in range(1, cups + 1):
        await asyncio.sleep(0.01)
        ctx.heartbeat({"cups": cup})
    return f"{cups} cups"


@perdure.tool(replay=ReplayPolicy.NEVER, timeout=0.5)
async def wait_forever(ctx: ToolContext) -> str:
    """Wait on the application's loop until cancelled (a timeout, or the host)."""
    SEEN["task"] = asyncio.current_task()
    SEEN["started"] = True
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        SEEN["cancelled"] = True
        raise
    return "never"


@perdure.tool(replay=ReplayPolicy.NEVER)
async def wait_until_stopped(ctx: ToolContext) -> str:
    """Like ``wait_forever``, with no timeout: only the host's cancel stops it."""
    return await wait_forever.fn(ctx)
