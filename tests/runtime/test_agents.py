"""Sub-agents on a real log: a tool runs a child session and returns its answer.

* the child is an ordinary session (``SessionCreated.parent`` names the call), limited
  to the tools it was given; its answer is the parent call's result; the parent's
  stream references it (the call's heartbeat);
* the child is created with its task in one commit;
* cancelling the parent's run cancels the running child; pausing the parent pauses it.
"""

from __future__ import annotations

from pathlib import Path

import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.check import check_log
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import AgentStarted, InputAccepted, SessionCreated, ToolCompleted
from tests.support.fold import fold_of

RESEARCHER = "You research one question and answer in one line."


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up."""
    return f"found {query}"


@perdure.tool(replay=ReplayPolicy.NEVER)
async def send(ctx: ToolContext, text: str) -> str:
    """Send (never given to the researcher)."""
    return text


research = perdure.agent_tool(
    "research", "Research a question with a sub-agent.", system=RESEARCHER, tools=["lookup"]
)


def sound(log_dir: Path) -> None:
    report = check_log(log_dir)
    assert report.violations == [], "\n".join(report.violations)


async def test_a_sub_agent_answers_the_parent_call(log_dir: Path) -> None:
    script = ScriptedProvider(
        [
            Reply(text="asking", tool_uses=[ToolUse("research", {"task": "capital of PT"})]),
            Reply(text="the parent's answer"),
        ],
        by_system={
            RESEARCHER: [
                Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "PT"})]),
                Reply(text="Lisbon"),
            ]
        },
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup, send, research]) as rt:
        await rt.create_session("p")
        await rt.submit("p", "what is the capital of Portugal?", request_id="r1")
        with trio.fail_after(20):
            outcome = await rt.wait_idle("p")
        assert outcome is not None and outcome.final_text == "the parent's answer"
        parent = await rt._journal.read_session("p")
        (result,) = [c.record for c in parent if isinstance(c.record, ToolCompleted)]
        assert result.output == "Lisbon"
        # The parent's log links its call to the child (a typed record, not a heartbeat).
        (link,) = [c.record for c in parent if isinstance(c.record, AgentStarted)]
        assert link.call_id == result.call_id
        child = link.child
        assert child.startswith("p.agent-")
        first, task = (await rt._journal.read_session(child))[:2]
        created = first.record
        assert isinstance(created, SessionCreated)
        # Created with its task in one commit: a child never exists without it, so a
        # crash or a cancel right after its creation still leaves it with an outcome.
        assert isinstance(task.record, InputAccepted) and task.record.text == "capital of PT"
        assert task.seq == first.seq + 1
        assert rt.stats().largest_transaction >= 2
        assert created.parent == f"p/{result.call_id}" and created.tools == ["lookup"]
        assert created.system == RESEARCHER
        transcript = await rt.transcript(child)
        assert transcript[0].role == "user"
        request_tools = sorted((await fold_of(rt, child)).allowed_tools or ())
        assert request_tools == ["lookup"]
    sound(log_dir)


async def test_cancelling_the_parent_cancels_its_running_child(log_dir: Path) -> None:
    script = ScriptedProvider(
        [Reply(text="asking", tool_uses=[ToolUse("research", {"task": "slow"})])],
        by_system={RESEARCHER: [Reply(text="thinking...", delay=30)]},
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup, research]) as rt:
        await rt.create_session("p")
        await rt.submit("p", "go", request_id="r1")
        with trio.fail_after(20):
            while not await rt.children("p"):  # noqa: ASYNC110
                await trio.sleep(0.02)
        (child,) = await rt.children("p")
        await rt.pause("p", request_id="pz")
        assert await rt.state(child, lambda s: s.view().paused), "the pause reached the child"
        await rt.resume("p", request_id="rz")
        assert not await rt.state(child, lambda s: s.view().paused)
        await rt.cancel("p", request_id="c1")
        with trio.fail_after(20):
            outcome = await rt.wait_idle("p")
            child_outcome = await rt.wait_idle(child)
        assert outcome is not None and outcome.status == "cancelled"
        assert child_outcome is not None and child_outcome.status == "cancelled"
    sound(log_dir)


async def test_watch_nests_the_sub_agents_events(log_dir: Path) -> None:
    script = ScriptedProvider(
        [
            Reply(text="asking", tool_uses=[ToolUse("research", {"task": "capital of PT"})]),
            Reply(text="the parent's answer"),
        ],
        by_system={RESEARCHER: [Reply(text="Lisbon")]},
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup, research]) as rt:
        await rt.create_session("p")
        seen: list[tuple[str, str]] = []
        seqs: dict[tuple[str, str], int] = {}
        async with rt.watch("p") as events:
            await rt.submit("p", "what is the capital?", request_id="r1")
            with trio.fail_after(20):
                async for event in events:
                    if event.seq is not None:
                        seen.append((event.session_id, event.kind))
                        seqs.setdefault((event.session_id, event.kind), event.seq)
                    if event.session_id == "p" and event.kind == "RunFinished":
                        break
        records = [c.record for c in await rt._journal.read_session("p")]
        (link,) = [r for r in records if isinstance(r, AgentStarted)]
        child = link.child
        assert (child, "SessionCreated") in seen and (child, "RunFinished") in seen
        parent_kinds = [k for s, k in seen if s == "p"]
        assert parent_kinds.index("AgentStarted") < parent_kinds.index("ToolCompleted")
        # Committed first (the two sessions' streams interleave in arrival order, which a
        # loaded machine may swap: compare their sequence numbers).
        child_end = seqs[(child, "RunFinished")]
        assert child_end < seqs[("p", "ToolCompleted")], "the child finished first"


async def test_a_sub_agent_cannot_use_a_tool_it_was_not_given(log_dir: Path) -> None:
    script = ScriptedProvider(
        [
            Reply(text="asking", tool_uses=[ToolUse("research", {"task": "send a message"})]),
            Reply(text="the parent's answer"),
        ],
        by_system={
            RESEARCHER: [
                Reply(text="sending", tool_uses=[ToolUse("send", {"text": "hi"})]),
                Reply(text="could not send"),
            ]
        },
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup, send, research]) as rt:
        await rt.create_session("p")
        await rt.submit("p", "go", request_id="r1")
        with trio.fail_after(20):
            await rt.wait_idle("p")
        children = [i.session_id for i in await rt.sessions() if i.session_id != "p"]
        (child,) = children
        (refused,) = [
            c.record
            for c in await rt._journal.read_session(child)
            if isinstance(c.record, ToolCompleted)
        ]
        assert refused.kind == "not_granted" and "(granted: lookup)" in refused.output
    sound(log_dir)
