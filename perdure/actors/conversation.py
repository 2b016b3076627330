"""The model's view of a session: messages built from the folded state (pure).

Every tool call the model made is answered by exactly one tool result, in call
order, right after the assistant message that made it. An assistant message
starts with the reply's reasoning blocks (extended thinking), as stored. Revisions and cancelled
requests are told to the model in plain words, including the fate of every
action that was unfinished when the request changed.

After a context compaction the model is sent the system prompt, then one user
message with the summary (``ContextCompacted``) in place of the items it covers,
followed, whatever their age, by the calls it must never lose: those whose outcome
is unknown and those a compensation is undoing now (a call still waiting for
approval or for a person is never inside a summary: its item is not settled). Then
the recent items verbatim, a tool use always with its result (they are one item).
The summary's own request (``summary_request``) is the covered items as plain text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from perdure.actors.entities import AssistantTurn, ConversationItem, Note, Revision, Task, UserTurn
from perdure.actors.state import SessionState
from perdure.providers.base import (
    Block,
    FailedAttempt,
    Message,
    ModelRequest,
    Role,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from perdure.storage.records import ToolCompleted
from perdure.tools.contract import Tool


class MessageCache:
    """The messages of the longest *settled* prefix of one state's conversation.

    A prefix is settled when nothing can change how it renders any more: user turns
    and notes never change; an assistant turn once every call it made has a result;
    a revision once every call it lists is terminal. ``messages`` renders only what
    follows the cached prefix, so a model call costs the new turns, not the whole
    history. The cache belongs to one state object (the session actor's); any other
    state, e.g. one re-folded after a failed commit, starts it afresh.

    It also keeps the tool definitions of the last request, by the identity of the
    tools they were made from (a session's tools rarely change, and an MCP server
    can bring dozens, each an object per definition per model call otherwise).
    """

    __slots__ = ("definitions", "head", "items", "messages", "state", "tools")

    def __init__(self) -> None:
        self.state: SessionState | None = None
        self.head = ""  # the summary message the cached messages start with ("" none)
        self.items = 0  # conversation items rendered into ``messages``
        self.messages: tuple[Message, ...] = ()
        self.tools: tuple[Tool, ...] = ()  # what ``definitions`` were made from
        self.definitions: tuple[ToolDefinition, ...] = ()

    def clear(self) -> None:
        """Forget what was rendered (an idle session's cache is memory nobody uses)."""
        self.state, self.items, self.messages, self.head = None, 0, (), ""
        self.tools, self.definitions = (), ()


def _settled(s: SessionState, item: ConversationItem) -> bool:
    if isinstance(item, AssistantTurn):
        reply = s.generations[item.generation_id].reply
        assert reply is not None
        return all(s.tasks[c.call_id].result is not None for c in reply.tool_calls)
    if isinstance(item, Revision):
        listed = [s.tasks[c] for c in (*item.call_ids, *item.earlier)]
        reruns = [s.tasks[t.reruns[item.goal_rev]] for t in listed if item.goal_rev in t.reruns]
        # Re-runs may still be added until a turn of this revision has started.
        gen = s.current_generation()
        rerunning = gen is not None and gen.goal_rev < item.goal_rev
        return not rerunning and all(t.terminal for t in (*listed, *reruns))
    return True


def messages(
    s: SessionState,
    *,
    include_pending: bool = False,
    cache: MessageCache | None = None,
    history: bool = False,
) -> tuple[Message, ...]:
    """The conversation so far. Unfinished tool calls are left out unless asked for.

    With a ``cache`` (ignored with ``include_pending`` or ``history``) the settled prefix
    of the conversation is rendered once; the result is the same as without it.
    ``history``: every item, as if no summary had been made (what the log keeps).
    """
    out: list[Message] = []
    head = "" if history else summary_text(s)
    start = 0 if history else s.compacted_end
    if include_pending or history:
        cache = None
    if cache is not None:
        if (
            cache.state is s
            and cache.head == head
            and start <= cache.items <= len(s.conversation)
            and cache.messages
        ):
            start = cache.items
            out = list(cache.messages)
        else:
            cache.state, cache.items, cache.messages, cache.head = s, start, (), head
    if head and not out:
        out.append(Message("user", (TextBlock(head),)))
    settled = cache is not None
    mark: tuple[int, int, Message | None] | None = None

    def add(role: Role, blocks: list[Block]) -> None:
        if not blocks:
            return
        if out and out[-1].role == role:
            out[-1] = Message(out[-1].role, out[-1].content + tuple(blocks))
        else:
            out.append(Message(role, tuple(blocks)))

    for index in range(start, len(s.conversation)):
        item = s.conversation[index]
        _render(s, item, add, include_pending)
        if settled:
            if _settled(s, item):
                # The last message may still grow by merging with the next item: keep it
                # as it is now.
                mark = (index + 1, len(out), out[-1] if out else None)
            else:
                settled = False
    if cache is not None and mark is not None:
        items, count, last = mark
        cache.items = items
        cache.messages = (*out[: count - 1], last) if last is not None else ()
    return tuple(out)


def _render(
    s: SessionState,
    item: ConversationItem,
    add: Callable[[Role, list[Block]], None],
    include_pending: bool,
) -> None:
    """Add one conversation item's blocks (``add`` merges a role's consecutive blocks)."""
    if isinstance(item, UserTurn):
        add("user", [TextBlock(s.submissions[item.submission_id].text)])
    elif isinstance(item, AssistantTurn):
        reply = s.generations[item.generation_id].reply
        assert reply is not None
        blocks: list[Block] = [TextBlock(reply.text)] if reply.text else []
        blocks += [ToolUseBlock(c.call_id, c.name, c.input) for c in reply.tool_calls]
        # The reasoning goes back verbatim and first: with extended thinking on, the
        # API rejects a tool-use turn whose thinking blocks are missing or moved.
        add("assistant", [*reply.thinking, *(blocks or [TextBlock("(empty reply)")])])
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


def summary_text(s: SessionState) -> str:
    """The message that stands for the summarised items ("" before any compaction):
    the summary, then every call inside it the model must never lose."""
    summary = s.summary
    if summary is None:
        return ""
    lines = [
        f"[perdure compacted the earlier conversation ({summary.end} items) into this "
        "summary; the full history is kept in the session's log.]",
        summary.summary,
    ]
    kept = pinned_calls(s)
    if kept:
        lines.append(
            "[Calls from the summarised part whose effect may have happened, stated "
            "verbatim whatever their age:]"
        )
        lines += kept
    return "\n\n".join(lines)


def pinned_calls(s: SessionState) -> list[str]:
    """One line per summarised call whose outcome is unknown or that a compensation is
    undoing now: what a summary may never drop."""
    lines: list[str] = []
    for call_id in s.summary_unknown:
        task = s.tasks[call_id]
        output = task.result.output if task.result is not None else ""
        lines.append(f"- {_call_words(task.tool_name, call_id, task.input)}: {output}")
    end = s.compacted_end
    summarised = (
        {
            call_id
            for item in s.conversation[:end]
            if isinstance(item, AssistantTurn)
            for call_id in s.generations[item.generation_id].call_ids
        }
        if s.compensations
        else set()
    )
    for comp in s.compensations.values():
        if comp.call_id in summarised:
            task = s.tasks[comp.call_id]
            undo = s.tasks[comp.compensation_id]
            lines.append(
                f"- {_call_words(task.tool_name, comp.call_id, task.input)}: completed; its "
                f"compensation {comp.compensation_id} is in flight ({undo.phase}), so its "
                "effect may or may not be undone yet"
            )
    return lines


def _call_words(name: str, call_id: str, args: Mapping[str, object]) -> str:
    return f"{name} ({call_id}) with arguments {_json(args)}"


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


SUMMARY_SYSTEM = (
    "You summarise the conversation of an AI agent so that the agent can continue its "
    "work from the summary alone. Keep the user's requests and constraints, decisions "
    "made, facts learned, what each tool call did and returned in short, what remains "
    "to be done, and every identifier, path and number the agent may need. State "
    "plainly any action whose outcome is unknown or that is still pending. Answer with "
    "the summary only."
)


def summary_request(s: SessionState, compaction_id: str, attempt: int) -> ModelRequest:
    """The summary's model call: the previous summary and the items ``[start, end)`` of
    the compaction in progress, as plain text (no tool blocks: nothing to pair)."""
    pending = s.compacting
    assert pending is not None and pending.started.compaction_id == compaction_id
    started = pending.started
    parts = ["Summarise this conversation of an agent with its user and tools.\n"]
    if s.summary is not None:
        parts.append("The summary of what came before:\n" + summary_text(s) + "\n")
    parts.append("The conversation:")
    parts += [transcript_text(s, item) for item in s.conversation[started.start : started.end]]
    return ModelRequest(
        system=SUMMARY_SYSTEM,
        messages=(Message("user", (TextBlock("\n\n".join(parts)),)),),
        tools=(),
        attempt=attempt,
        session_id=s.session_id,
        generation_id=compaction_id,
        submission_id=s.run.submission_id if s.run is not None else "",
        failed=tuple(
            FailedAttempt(attempt=r.attempt, provider=r.provider, fallback=r.fallback)
            for r in pending.failures
        ),
    )


def transcript_text(s: SessionState, item: ConversationItem) -> str:
    """One conversation item as plain text (the summary's request, transcripts)."""
    if isinstance(item, UserTurn):
        return "User: " + s.submissions[item.submission_id].text
    if isinstance(item, AssistantTurn):
        reply = s.generations[item.generation_id].reply
        assert reply is not None
        lines = ["Assistant: " + (reply.text or "(no text)")]
        for call in reply.tool_calls:
            task = s.tasks[call.call_id]
            result = task.result
            outcome = result.output if result is not None else f"({task.phase})"
            lines.append(f"Tool call {_call_words(call.name, call.call_id, call.input)}")
            lines.append(f"Tool result ({task.phase}): {outcome}")
        return "\n".join(lines)
    if isinstance(item, Note):
        return item.text
    return revision_text(s, item)


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
            fate = _fate(task.phase, task.stale) + _rerun_words(s, task, rev.goal_rev)
            lines.append(f"- {task.tool_name} ({call_id}): {fate}")
    if rev.earlier:
        lines.append(
            "Results already given above, and the revision of the request each one "
            "answered (one of an earlier revision may not fit the request as it reads now):"
        )
        for call_id in rev.earlier:
            task = s.tasks[call_id]
            rerun = _rerun_words(s, task, rev.goal_rev)
            lines.append(f"- {task.tool_name} ({call_id}): revision {task.result_rev}{rerun}")
    return "\n".join(lines) + "]"


def _rerun_words(s: SessionState, task: Task, goal_rev: int) -> str:
    """What became of ``task``'s re-run under ``goal_rev``, if its tool asked for one."""
    rerun_id = task.reruns.get(goal_rev)
    if rerun_id is None:
        return ""
    # By its id, never by a default: a provider may name a call "" (the core keeps it).
    rerun = s.tasks[rerun_id]
    said = f"; its result depends on the request, so it was run again under revision {goal_rev}"
    result = rerun.result
    if result is None:
        return said + " (still running)"
    if isinstance(result, ToolCompleted) and not result.is_error:
        return f"{said}, and the new result ({rerun.call_id}) is: {result.output}"
    return f"{said}, and that failed ({rerun.call_id}): {result.output}"


def _fate(phase: str, stale: bool) -> str:
    if phase == "cancelled":
        return "cancelled; it did not complete"
    if phase == "completed":
        return "completed" + (" after the change; its result is above" if stale else "")
    if phase == "outcome_unknown":
        return "outcome unknown; it may or may not have taken effect"
    return f"still {phase}"


def tool_definitions(
    tools: Mapping[str, Tool], cache: MessageCache | None = None
) -> tuple[ToolDefinition, ...]:
    """What the model is told of ``tools``; with a ``cache``, made again only when the
    tools are not the very objects of the last request."""
    if cache is not None:
        known = cache.tools
        if len(known) == len(tools) and all(
            a is b for a, b in zip(known, tools.values(), strict=True)
        ):
            return cache.definitions
    made = tuple(ToolDefinition(t.name, t.description, t.input_schema) for t in tools.values())
    if cache is not None:
        cache.tools, cache.definitions = tuple(tools.values()), made
    return made


def request(
    s: SessionState,
    tools: Mapping[str, Tool],
    generation_id: str,
    attempt: int,
    cache: MessageCache | None = None,
) -> ModelRequest:
    gen = s.generations[generation_id]
    return ModelRequest(
        system=s.system,
        messages=messages(s, cache=cache),
        tools=tool_definitions(tools, cache),
        attempt=attempt,
        session_id=s.session_id,
        generation_id=generation_id,
        submission_id=gen.submission_id,
        failed=tuple(
            FailedAttempt(attempt=r.attempt, provider=r.provider, fallback=r.fallback)
            for r in gen.failures
        ),
        answered_by=_answered_by(s, gen.submission_id, generation_id),
    )


def _answered_by(s: SessionState, submission_id: str, generation_id: str) -> str:
    """The provider that answered the input's latest turn before ``generation_id``."""
    submission = s.submissions.get(submission_id)
    earlier = submission.generations if submission is not None else []
    for other in reversed(earlier):
        reply = s.generations[other].reply
        if other != generation_id and reply is not None:
            return reply.provider
    return ""
