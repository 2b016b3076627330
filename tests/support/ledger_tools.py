"""Test tools that leave a ledger of their side effects, so a checker can count them.

Each tool appends JSON lines to ``<workspace>/ledger.jsonl`` (fsynced): ``start``
when it begins, ``effect`` when its side effect has happened, with the call id, the
idempotency key and the attempt. Whatever the crash point, the ledger tells how
many times each call's effect really happened.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import trio

import perdure
from perdure import ReplayPolicy, ToolContext

LEDGER = "ledger.jsonl"


def _write(ctx: ToolContext, event: str, tool: str, **extra: Any) -> None:
    assert ctx.workspace is not None
    line = {
        "event": event,
        "tool": tool,
        "call_id": ctx.call_id,
        "key": ctx.idempotency_key,
        "attempt": ctx.attempt,
        "session_id": ctx.session_id,
        "pid": os.getpid(),
        "t": time.time(),
        **extra,
    }
    fd = os.open(ctx.workspace / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def _effect(ctx: ToolContext, tool: str, **extra: Any) -> None:
    await trio.to_thread.run_sync(lambda: _write(ctx, "start", tool))
    await trio.to_thread.run_sync(lambda: _write(ctx, "effect", tool, **extra))


@perdure.tool(replay=ReplayPolicy.NEVER)
async def send_note(ctx: ToolContext, text: str) -> str:
    """Send a note (an effect that must not happen twice)."""
    await _effect(ctx, "send_note", text=text)
    return f"note sent: {text}"


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up (read-only)."""
    await _effect(ctx, "lookup", query=query)
    return f"found: {query}"


@perdure.tool(replay=ReplayPolicy.KEYED)
async def book(ctx: ToolContext, item: str) -> str:
    """Book an item; the downstream service deduplicates by idempotency key."""
    await _effect(ctx, "book", item=item)
    return f"booked {item} with key {ctx.idempotency_key}"


@perdure.tool(replay=ReplayPolicy.SAFE)
async def slow_lookup(ctx: ToolContext, query: str, seconds: float = 0.3) -> str:
    """A read-only lookup that takes a while."""
    await trio.sleep(seconds)
    await _effect(ctx, "slow_lookup", query=query)
    return f"slowly found: {query}"


async def _confirm_from_ledger(ctx: ToolContext, text: str) -> perdure.Reconciled:
    assert ctx.workspace is not None
    for entry in read_ledger(ctx.workspace):
        if entry["event"] == "effect" and entry["key"] == ctx.idempotency_key:
            return perdure.Reconciled.applied(f"note sent: {text} (confirmed after restart)")
    return perdure.Reconciled.not_applied()


@perdure.tool(replay=ReplayPolicy.NEVER, reconcile=_confirm_from_ledger)
async def send_note_reconciled(ctx: ToolContext, text: str) -> str:
    """Send a note; after a crash, the ledger tells whether it was sent."""
    await _effect(ctx, "send_note_reconciled", text=text)
    return f"note sent: {text}"


@perdure.tool(replay=ReplayPolicy.NEVER, requires_approval=True)
async def deploy(ctx: ToolContext, target: str) -> str:
    """Deploy to a target (needs a human's approval)."""
    await _effect(ctx, "deploy", target=target)
    return f"deployed {target}"


@perdure.tool(replay=ReplayPolicy.KEYED)
async def slow_book(ctx: ToolContext, item: str, seconds: float = 0.8) -> str:
    """Book an item slowly (KEYED, not cancellable: it is left to finish)."""
    await trio.sleep(seconds)
    await _effect(ctx, "slow_book", item=item)
    return f"booked {item}"


@perdure.tool(replay=ReplayPolicy.SAFE, terminates=True)
async def finish(ctx: ToolContext, answer: str) -> str:
    """Finish the run with this answer."""
    await _effect(ctx, "finish", answer=answer)
    return answer


@perdure.tool(replay=ReplayPolicy.KEYED, requires_approval=True)
async def close_ticket(ctx: ToolContext, result: str, title: str) -> str:
    """Close the ticket that open_ticket created (needs approval)."""
    await _effect(ctx, "close_ticket", ticket=result)
    return f"closed {result}"


@perdure.tool(replay=ReplayPolicy.KEYED, compensate=close_ticket)
async def open_ticket(ctx: ToolContext, title: str) -> str:
    """Open a ticket; its compensation closes it."""
    await _effect(ctx, "open_ticket", title=title)
    return f"ticket for {title}"


ALL_TOOLS = [
    send_note,
    lookup,
    book,
    slow_lookup,
    send_note_reconciled,
    deploy,
    slow_book,
    finish,
    open_ticket,
]


def read_ledger(workspace: Path) -> list[dict[str, Any]]:
    path = Path(workspace) / LEDGER
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def effects(workspace: Path) -> list[dict[str, Any]]:
    return [e for e in read_ledger(workspace) if e["event"] == "effect"]
