"""An asyncio host whose tools are asyncio code; the crash tests' child.

    python -m tests.embed.asyncio_tool_host LOG WORKDIR MODE TOOL

It opens ``perdure.embed`` inside ``asyncio.run`` (recovering what a killed host
left), asks for one call of TOOL and prints the call's outcome as JSON. The tools
append to ``WORKDIR/ledger.jsonl`` when they start; on their first attempt they write
``WORKDIR/marker`` and wait on the asyncio loop, where the parent kills the process.
This module does not import trio: its tools run on the host's asyncio loop.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import perdure
import perdure.embed
from perdure import ReplayPolicy, ToolContext
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from tests.support.fold import fold_in_asyncio

WORKDIR = Path(".")


async def _work(ctx: ToolContext, tool_name: str, note: str) -> str:
    entry = {"tool": tool_name, "key": ctx.idempotency_key, "attempt": ctx.attempt}

    def append() -> None:
        with open(WORKDIR / "ledger.jsonl", "a") as ledger:
            ledger.write(json.dumps(entry) + "\n")

    await asyncio.to_thread(append)
    if ctx.attempt == 1:
        (WORKDIR / "marker").write_text("waiting on the asyncio loop")
        await asyncio.sleep(60)
    return f"noted {note}"


@perdure.tool(replay=ReplayPolicy.KEYED)
async def keyed_note(ctx: ToolContext, note: str) -> str:
    """Note something, idempotently by key."""
    return await _work(ctx, "keyed_note", note)


@perdure.tool(replay=ReplayPolicy.NEVER)
async def never_note(ctx: ToolContext, note: str) -> str:
    """Note something; never re-run blindly."""
    return await _work(ctx, "never_note", note)


async def main(log: str, mode: Any, tool_name: str) -> None:
    provider = ScriptedProvider(
        [Reply(tool_uses=[ToolUse(tool_name, {"note": "x"})]), Reply(text="done")]
    )
    async with perdure.embed.open_runtime(
        log, mode=mode, provider=provider, tools=[keyed_note, never_note]
    ) as rt:
        await rt.ensure_session("s1")
        await rt.submit("s1", "note it", request_id="task-1")
        outcome = await rt.wait_idle("s1")
        state = await fold_in_asyncio(rt, "s1")
    (task,) = state.tasks.values()
    print(
        json.dumps(
            {
                "status": outcome.status if outcome is not None else None,
                "record": type(task.result).__name__,
                "output": getattr(task.result, "output", None),
                "attempt": task.attempt,
                "runs_on": keyed_note.runs_on,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    WORKDIR = Path(sys.argv[2])
    asyncio.run(main(sys.argv[1], sys.argv[3], sys.argv[4]))
