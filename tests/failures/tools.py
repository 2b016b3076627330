"""Ledger tools that fail the ways ``tests/failures`` needs, for the crash tests' children.

They write the same fsynced ledger as ``tests.support.ledger_tools`` (so the history
checker counts their side effects). A KEYED effect goes through ``keyed_effect``,
which plays a downstream service that deduplicates by idempotency key: the first
request with a key takes effect (``effect``), a repeat is only acknowledged
(``deduplicated``).
"""

from __future__ import annotations

from typing import Any

import trio

import perdure
from perdure import NeedsHuman, ReplayPolicy, RetryableError, RetryPolicy, ToolContext
from tests.support.ledger_tools import _write, read_ledger

BACK_OFF = 3.0  # seconds a failed booking asks to wait (RetryableError.retry_after)


async def note(ctx: ToolContext, tool: str, event: str, **extra: Any) -> None:
    await trio.to_thread.run_sync(lambda: _write(ctx, event, tool, **extra))


async def keyed_effect(ctx: ToolContext, tool: str, **extra: Any) -> bool:
    """Apply the effect once per idempotency key; True if this request applied it."""
    assert ctx.workspace is not None
    workspace = ctx.workspace
    done = await trio.to_thread.run_sync(
        lambda: any(
            e["event"] == "effect" and e["key"] == ctx.idempotency_key
            for e in read_ledger(workspace)
        )
    )
    await note(ctx, tool, "deduplicated" if done else "effect", **extra)
    return not done


@perdure.tool(replay=ReplayPolicy.KEYED, retry=RetryPolicy(max_attempts=3, initial=0.05))
async def flaky_book(ctx: ToolContext, item: str, back_off: float = BACK_OFF) -> str:
    """Book an item; the service answers 503 (retry after ``back_off`` seconds, 3 unless
    told) to the first attempt."""
    await note(ctx, "flaky_book", "start")
    if ctx.attempt == 1:
        raise RetryableError("503 Service Unavailable", retry_after=back_off)
    await keyed_effect(ctx, "flaky_book", item=item)
    return f"booked {item}"


@perdure.tool(replay=ReplayPolicy.SAFE)
async def process_items(ctx: ToolContext, total: int) -> str:
    """Process ``total`` items, resuming after the last one a heartbeat reported."""
    start = int(ctx.last_heartbeat["done"]) if ctx.last_heartbeat else 0
    await note(ctx, "process_items", "start", resumed_from=ctx.last_heartbeat)
    for done in range(start + 1, total + 1):
        await trio.sleep(0.05)
        ctx.heartbeat({"done": done})
    await note(ctx, "process_items", "effect", first=start + 1)
    return f"processed items {start + 1}..{total}"


@perdure.tool(
    replay=ReplayPolicy.KEYED,
    retry=RetryPolicy(max_attempts=3, initial=0.05),
    heartbeat_timeout=1.0,
)
async def mirror(ctx: ToolContext, repo: str) -> str:
    """Mirror a repository; the first attempt pushes, then hangs without a heartbeat."""
    ctx.heartbeat({"stage": "pushing"})
    await keyed_effect(ctx, "mirror", repo=repo)
    if ctx.attempt == 1:
        await trio.sleep_forever()
    return f"mirrored {repo}"


@perdure.tool(replay=ReplayPolicy.NEVER, heartbeat_timeout=1.0)
async def announce(ctx: ToolContext, text: str) -> str:
    """Announce something (NEVER); it hangs after its effect."""
    ctx.heartbeat({"stage": "posting"})
    await note(ctx, "announce", "effect", text=text)
    await trio.sleep_forever()
    return "announced"


@perdure.tool(replay=ReplayPolicy.NEVER)
async def flaky_notify(ctx: ToolContext, text: str) -> str:
    """Notify (NEVER); the service answers 503 after the notification may have gone out."""
    await note(ctx, "flaky_notify", "effect", text=text)
    raise RetryableError("503 after sending")


@perdure.tool(replay=ReplayPolicy.NEVER)
async def charge_card(ctx: ToolContext, cents: int) -> str:
    """Charge a card (NEVER); a declined card needs the customer, i.e. a person."""
    await note(ctx, "charge_card", "start")
    if ctx.attempt == 1:
        raise NeedsHuman("the card was declined; ask the customer for another card")
    await note(ctx, "charge_card", "effect", cents=cents)
    return f"charged {cents}"


@perdure.tool(replay=ReplayPolicy.NEVER, unknown_outcome="ask_person")
async def wire_money(ctx: ToolContext, cents: int) -> str:
    """Wire money (NEVER); when the bank's answer is lost, a person says what happened."""
    await note(ctx, "wire_money", "start")
    if ctx.attempt == 1:
        raise perdure.OutcomeUnknown("the bank's answer was lost")
    await note(ctx, "wire_money", "effect", cents=cents)
    return f"wired {cents}"


TOOLS = [flaky_book, process_items, mirror, announce, flaky_notify, charge_card, wire_money]
