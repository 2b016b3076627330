"""The model's view of a session: messages built from the folded state (pure).

Every tool call the model made is answered by exactly one tool result, in call
order, right after the assistant message that made it. Revisions and cancelled
requests are told to the model in plain words, including the fate of every
action that was unfinished when the request changed.
"""

from __future__ import annotations

from collections.abc import Mapping

from perdure.actors.state import AssistantTurn, Note, Revision, SessionState, UserTurn
from perdure.providers.base import (
    Block,
    Message,
    ModelRequest,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.storage.records import ToolCompleted
from perdure.tools.contract import Tool


def messages(s: SessionState, *, include_pending: bool = False) -> tuple[Message, ...]:
    """The conversation so far. Unfinished tool calls are left out unless asked for."""
    out: list[Message] = []

    def add(role: str, blocks: list[Block]) -> None:
        if not blocks:
            return
        if out and out[-1].role == role:
            out[-1] = Message(out[-1].role, out[-1].content + tuple(blocks))
        else:
            out.append(Message(role, tuple(blocks)))  # type: ignore[arg-type]

    for item in s.conversation:
        if isinstance(item, UserTurn):
            add("user", [TextBlock(s.submissions[item.submission_id].text)])
        elif isinstance(item, AssistantTurn):
            reply = s.generations[item.generation_id].reply
            assert reply is not None
            blocks: list[Block] = [TextBlock(reply.text)] if reply.text else []
            blocks += [ToolUseBlock(c.call_id, c.name, c.input) for c in reply.tool_calls]
            add("assistant", blocks or [TextBlock("(empty reply)")])
            results: list[Block] = []
            for call in reply.tool_calls:
                task = s.tasks[call.call_id]
                result = task.result
                if result is not None:
                    failed = not isinstance(result, ToolCompleted) or result.is_error
                    output = result.output or "(no output)"
                    results.append(ToolResultBlock(call.call_id, output, is_error=failed))
                elif include_pending:
                    results.append(ToolResultBlock(call.call_id, f"({task.phase})"))
            add("user", results)
        elif isinstance(item, Note):
            add("user", [TextBlock(item.text)])
        elif isinstance(item, Revision):
            add("user", [TextBlock(revision_text(s, item))])
    return tuple(out)


def revision_text(s: SessionState, rev: Revision) -> str:
    lines = [
        f"[The user revised the request (revision {rev.goal_rev}). It now reads: {rev.text}",
        "Follow the revised request from here on; earlier instructions that conflict with "
        "it no longer apply.",
    ]
    if rev.call_ids:
        lines.append("Actions that were unfinished when the request changed:")
        for call_id in rev.call_ids:
            task = s.tasks[call_id]
            lines.append(f"- {task.tool_name} ({call_id}): {_fate(task.phase, task.stale)}")
    return "\n".join(lines) + "]"


def _fate(phase: str, stale: bool) -> str:
    if phase == "cancelled":
        return "cancelled; it did not complete"
    if phase == "completed":
        return "completed" + (" after the change; its result is above" if stale else "")
    if phase == "outcome_unknown":
        return "outcome unknown; it may or may not have taken effect"
    return f"still {phase}"


def tool_definitions(tools: Mapping[str, Tool]) -> tuple[ToolDefinition, ...]:
    return tuple(ToolDefinition(t.name, t.description, t.input_schema) for t in tools.values())


def request(
    s: SessionState, tools: Mapping[str, Tool], generation_id: str, attempt: int
) -> ModelRequest:
    return ModelRequest(
        system=s.system,
        messages=messages(s),
        tools=tool_definitions(tools),
        attempt=attempt,
        session_id=s.session_id,
        generation_id=generation_id,
    )
