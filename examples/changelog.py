"""The CHANGELOG scenario as plain library code you can copy.

Run it twice to see recovery at work:

    PERDURE_FAULT=tool.after:append_note python examples/changelog.py   # dies after the append
    python examples/changelog.py                                         # recovers and finishes

Each run opens the same log (./changelog-demo/log). The second one finds the
append in flight, tells the model its outcome is unknown (append_note is a NEVER
tool: it is not re-run blindly), then lets the model check the file and finish.
Swap ScriptedProvider for perdure.providers.AnthropicProvider(model=...) to use
Claude.
"""

from __future__ import annotations

from pathlib import Path

import trio

import perdure
from perdure.providers import Reply, ScriptedProvider, ToolUse

ROOT = Path("changelog-demo")


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)
async def append_note(ctx: perdure.ToolContext, line: str) -> str:
    """Append one line to CHANGELOG.md."""
    assert ctx.workspace is not None
    async with await trio.Path(ctx.workspace / "CHANGELOG.md").open("a") as f:
        await f.write(line + "\n")
    return "appended"


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def check_changelog(ctx: perdure.ToolContext) -> str:
    """Count the entries of CHANGELOG.md (read-only, safe to re-run)."""
    assert ctx.workspace is not None
    text = await trio.Path(ctx.workspace / "CHANGELOG.md").read_text()
    return f"{sum(line.startswith('- ') for line in text.splitlines())} entries"


provider = ScriptedProvider(
    [
        Reply(text="Appending.", tool_uses=[ToolUse("append_note", {"line": "- Fixed retries."})]),
        Reply(text="Checking.", tool_uses=[ToolUse("check_changelog", {})]),
        Reply(text="Appended one entry and checked the file."),
    ]
)


async def main() -> None:
    workspace = ROOT / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "CHANGELOG.md").touch()
    async with perdure.open_runtime(
        ROOT / "log", provider=provider, tools=[append_note, check_changelog], workspace=workspace
    ) as rt:
        if rt.recovered_sessions:
            print("recovered unfinished work in:", rt.recovered_sessions)
        session = await rt.create_session("changelog")
        # The request id makes the submission idempotent: re-running this script
        # after a crash does not queue the task twice.
        await rt.submit(session, "Append a changelog entry and check it.", request_id="task-1")
        outcome = await rt.wait_idle(session)
        assert outcome is not None
        print(f"{outcome.status}: {outcome.final_text}")
        for message in await rt.transcript(session):
            print(f"  {message.role}: {message.content}")


if __name__ == "__main__":
    trio.run(main)
