"""A change of mind mid-run: a revision cancels queued work of the old goal.

The agent plans to check two endpoints and open a team ticket. While the first
check is running and the ticket waits for approval, the user revises the request:
"don't open the team ticket, just give me the report, and only check /orders".
The revision is a durable record (``GoalRevised``), not a chat message: the queued
ticket is cancelled before it can run, the running check of the old goal is
stopped, and the next model turn reads the revised request together with the
fate of every earlier action. The timeline from the log shows it all.

    python examples/revise_midway.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio

import perdure
from perdure.providers import Reply, ScriptedProvider, ToolUse
from perdure.providers.base import TextBlock, ToolResultBlock
from perdure.storage.lmdb_log import LmdbLog
from perdure.timeline import render


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def check_endpoint(path: str) -> str:
    """Probe an endpoint of the staging API (read-only; takes a moment)."""
    await trio.sleep(2.0)
    return f"{path}: 200 OK, schema matches"


@perdure.tool(replay=perdure.ReplayPolicy.KEYED, requires_approval=True)
async def open_team_ticket(ctx: perdure.ToolContext, title: str) -> str:
    """Open a ticket for the whole team (needs approval)."""
    return f"opened '{title}' with key {ctx.idempotency_key}"


SCRIPT = [
    Reply(
        text="Plan: check /users and /orders, then open a team ticket.",
        tool_uses=[
            ToolUse("check_endpoint", {"path": "/users"}),
            ToolUse("open_team_ticket", {"title": "staging API drift"}),
        ],
    ),
    Reply(
        text="Understood: only /orders, and no ticket.",
        tool_uses=[ToolUse("check_endpoint", {"path": "/orders"})],
    ),
    Reply(text="Report: /orders answers 200 and its schema matches. No ticket was opened."),
]


async def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="perdure-revise-"))
    async with perdure.open_runtime(
        root / "log",
        provider=ScriptedProvider(SCRIPT),
        tools=[check_endpoint, open_team_ticket],
    ) as rt:
        sid = await rt.create_session("revise")
        await rt.submit(sid, "Check /users and /orders on staging and open a team ticket.")
        await trio.sleep(0.5)  # the check is running, the ticket awaits approval
        done = await rt.revise(
            sid, "Don't open the team ticket, just give me the report, and only check /orders."
        )
        print(f"revision {done.ref} recorded at seq {done.seq}")
        outcome = await rt.wait_idle(sid)
        assert outcome is not None
        tasks = await rt.state(sid, lambda s: s.task_views())
        transcript = await rt.transcript(sid)
    log = LmdbLog(root / "log", readonly=True)
    try:
        records = log.read_session(sid)
    finally:
        log.close()
    print("\nTimeline:")
    for seq, _, text in render(records):
        print(f"  #{seq:<3} {text}")
    print("\nFate of each call:")
    for task in tasks:
        print(
            f"  {task.tool_name}({dict(task.input)}) under revision {task.goal_rev}: {task.phase}"
        )
    revised = [m for m in transcript if m.role == "user"][-2]
    print("\nWhat the model read after the revision:")
    for block in revised.content:
        if isinstance(block, ToolResultBlock):
            print(f"  (result of {block.tool_use_id}) {block.content}")
        elif isinstance(block, TextBlock):
            print("  " + block.text.replace("\n", "\n  "))
    print(f"\nfinal answer: {outcome.final_text}")
    ticket = next(t for t in tasks if t.tool_name == "open_team_ticket")
    assert ticket.phase == "cancelled" and ticket.executing is None, "the ticket never ran"
    assert outcome.status == "completed"


if __name__ == "__main__":
    trio.run(main)
