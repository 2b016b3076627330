"""Session control through the Python API, on a real LMDB log: forks and ``if_busy``.

* ``rt.fork`` copies a settled prefix into a new session in one commit, leaves the
  source untouched, refuses unsettled points, is idempotent by request id, and a fork
  taken at the end of a turn continues that run by itself (no call run again);
* ``rt.submit(if_busy=...)``: ``interrupt`` cancels the busy run (a running NEVER tool
  finishes and its result is kept) and runs the input next; ``reject`` refuses with
  ``busy``; ``steer`` revises the running request.

Every test ends with ``perdure check`` on the log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.check import check_log
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import (
    CancelRequested,
    GoalRevised,
    RunFinished,
    SessionForked,
    ToolCompleted,
    ToolExecuting,
)
from tests.support.fold import fold_of

GATE: dict[str, trio.Event] = {}
SENT: list[str] = []


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look something up."""
    return f"found {query}"


@perdure.tool(replay=ReplayPolicy.NEVER)
async def send(ctx: ToolContext, text: str) -> str:
    """Send a message (waits for the test's gate, to stay busy)."""
    SENT.append(ctx.session_id)
    gate = GATE.get("send")
    if gate is not None:
        await gate.wait()
    return f"sent {text}"


def sound(log_dir: Path) -> None:
    report = check_log(log_dir)
    assert report.violations == [], "\n".join(report.violations)


async def records(rt: perdure.Runtime, sid: str, kind: type) -> list[object]:
    return [c.record for c in await rt._journal.read_session(sid) if isinstance(c.record, kind)]


async def test_a_fork_copies_a_settled_prefix_and_leaves_the_source_alone(log_dir: Path) -> None:
    script = ScriptedProvider(
        [
            Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "a"})]),
            Reply(text="answer one"),
            Reply(text="answer two"),
        ]
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup]) as rt:
        await rt.create_session("src", system="be brief")
        await rt.submit("src", "one", request_id="r1")
        with trio.fail_after(10):
            await rt.wait_idle("src")
        await rt.submit("src", "two", request_id="r2")
        with trio.fail_after(10):
            await rt.wait_idle("src")
        before = await rt._journal.read_session("src")

        forked = await rt.fork("src", at="in1.r0", session_id="alt", request_id="f1")
        assert forked == perdure.Forked("alt", "src", forked.position)
        assert await rt._journal.read_session("src") == before, "the source is untouched"
        again = await rt.fork("src", at="in1.r0", session_id="alt", request_id="f1")
        assert again.duplicate and again.position == forked.position
        with pytest.raises(perdure.Refused) as info:
            await rt.fork("src", session_id="alt", request_id="f2")
        assert info.value.code == "conflict"

        source_transcript = await rt.transcript("src")
        fork_transcript = await rt.transcript("alt")
        assert fork_transcript == source_transcript[: len(fork_transcript)]
        assert [m.role for m in fork_transcript] == ["user", "assistant", "user", "assistant"]
        (lineage,) = await records(rt, "alt", SessionForked)
        assert isinstance(lineage, SessionForked) and lineage.source == "src"
        state = await fold_of(rt, "alt")
        assert state.system == "be brief"
        assert [t.phase for t in state.tasks.values()] == ["completed"]

        # The fork goes its own way: its next input is its own second run.
        await rt.submit("alt", "something else", request_id="r2")
        with trio.fail_after(10):
            outcome = await rt.wait_idle("alt")
        assert outcome is not None and outcome.status == "completed"
        executing = await records(rt, "alt", ToolExecuting)
        assert len(executing) == 1, "the copied lookup was not run again"

        with pytest.raises(perdure.Refused) as info:
            await rt.fork("src", at=3, request_id="f3")
        assert info.value.code == "invalid_state" and "nearest valid points" in str(info.value)
        with pytest.raises(perdure.UnknownSession):
            await rt.fork("nope", request_id="f4")
        derived = await rt.fork("src", request_id="f5")
        assert derived.session_id.startswith("fork-")
        assert (await rt.fork("src", request_id="f5")).session_id == derived.session_id
    sound(log_dir)


async def test_a_fork_at_the_end_of_a_turn_continues_that_run(log_dir: Path) -> None:
    GATE.clear()
    script = ScriptedProvider(
        [
            Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "a"})]),
            Reply(text="answer"),
        ]
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup]) as rt:
        await rt.create_session("src")
        await rt.submit("src", "one", request_id="r1")
        with trio.fail_after(10):
            await rt.wait_idle("src")
        history = await rt._journal.read_session("src")
        turn_end = next(c.seq for c in history if isinstance(c.record, ToolCompleted))
        forked = await rt.fork("src", at=turn_end, session_id="alt", request_id="f1")
        assert forked.position == turn_end
        with trio.fail_after(10):
            outcome = await rt.wait_idle("alt")
        assert outcome is not None and outcome.final_text == "answer"
        assert len(await records(rt, "alt", ToolExecuting)) == 1, "copied, not run again"
    sound(log_dir)


async def test_interrupt_cancels_the_busy_run_and_keeps_the_never_result(log_dir: Path) -> None:
    GATE.clear()
    GATE["send"] = trio.Event()
    SENT.clear()
    script = ScriptedProvider(
        [
            Reply(text="sending", tool_uses=[ToolUse("send", {"text": "hi"})]),
            Reply(text="the second request's answer"),
        ]
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[send]) as rt:
        await rt.create_session("s")
        await rt.submit("s", "send hi", request_id="r1")
        with trio.fail_after(10):
            while not SENT:  # noqa: ASYNC110
                await trio.sleep(0.01)
        with pytest.raises(perdure.Refused) as info:
            await rt.submit("s", "later", request_id="r2", if_busy="reject")
        assert info.value.code == "busy"
        accepted = await rt.submit("s", "stop; do this", request_id="r3", if_busy="interrupt")
        assert accepted.disposition == "interrupted"
        assert await records(rt, "s", CancelRequested)
        GATE["send"].set()  # the NEVER tool finishes: its result is kept, not re-run
        with trio.fail_after(10):
            outcome = await rt.wait_idle("s")
        assert outcome is not None and outcome.final_text == "the second request's answer"
        finished = await records(rt, "s", RunFinished)
        assert [f.status for f in finished] == ["cancelled", "completed"]  # type: ignore[attr-defined]
        (done,) = await records(rt, "s", ToolCompleted)
        assert done.output == "sent hi"  # type: ignore[attr-defined]
        assert SENT == ["s"]
        dup = await rt.submit("s", "stop; do this", request_id="r3", if_busy="interrupt")
        assert dup.duplicate and dup.disposition == "interrupted"
    sound(log_dir)


async def test_steer_revises_the_running_request(log_dir: Path) -> None:
    script = ScriptedProvider(
        [Reply(text="first", delay=0.5), Reply(text="steered answer")],
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[]) as rt:
        await rt.create_session("s", if_busy="steer")
        await rt.submit("s", "find flights", request_id="r1")
        steered = await rt.submit("s", "to Lisbon", request_id="r2")
        assert steered.disposition == "steered" and steered.submission_id == "in1"
        with trio.fail_after(10):
            outcome = await rt.wait_idle("s")
        assert outcome is not None and outcome.status == "completed"
        (revised,) = await records(rt, "s", GoalRevised)
        assert revised.steered and revised.text == "to Lisbon"  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="if_busy"):
            await rt.submit("s", "x", if_busy="later")  # type: ignore[arg-type]
    sound(log_dir)
