"""Tools for the conformance test: one honest about its policy, one lying about it."""

from __future__ import annotations

import trio

import perdure
from perdure import ReplayPolicy, ToolContext


@perdure.tool(replay=ReplayPolicy.SAFE)
async def append_line_claims_safe(ctx: ToolContext, line: str) -> str:
    """Append a line — but declared SAFE, which it is not: a re-run appends twice."""
    assert ctx.workspace is not None
    async with await trio.Path(ctx.workspace / "log.txt").open("a") as f:
        await f.write(line + "\n")
    return "appended"


@perdure.tool(replay=ReplayPolicy.SAFE)
async def write_status(ctx: ToolContext, status: str) -> str:
    """Overwrite status.txt: naturally idempotent, so SAFE is true."""
    assert ctx.workspace is not None
    await trio.Path(ctx.workspace / "status.txt").write_text(status)
    return "written"


HONEST = [write_status]
LYING = [append_line_claims_safe]
