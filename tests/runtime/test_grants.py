"""A session created with a grant of tools: the model is offered only those, a call to
any other is refused without running (before and after a restart, in a real child
process), and a sub-agent never gets more than its parent's grant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import perdure
from perdure.providers.base import Emit, ModelReply, ModelRequest
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import SessionCreated, ToolCompleted
from tests.runtime.test_agents import RESEARCHER, lookup, send, sound
from tests.support.checker import read_log
from tests.support.ledger_tools import effects
from tests.support.procs import run_child

research = perdure.agent_tool(
    "research", "Research a question with a sub-agent.", system=RESEARCHER
)


class Offered(ScriptedProvider):
    """A scripted model that notes which tools each request offered it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offered: list[list[str]] = []

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        self.offered.append(sorted(t.name for t in request.tools))
        return await super().complete(request, emit)


def completed(log: Path, session_id: str) -> list[ToolCompleted]:
    return [
        c.record
        for c in read_log(log)
        if isinstance(c.record, ToolCompleted) and c.record.session_id == session_id
    ]


async def records_of(rt: perdure.Runtime, session_id: str) -> list[Any]:
    return [c.record for c in await rt._journal.read_session(session_id)]


def test_a_call_outside_the_grant_is_refused_before_and_after_a_restart(make_plan: Any) -> None:
    calls = [
        {"name": "send_note", "input": {"text": "leak"}},
        {"name": "lookup", "input": {"query": "q"}},
    ]
    plan = make_plan(
        [{"text": "trying", "tool_uses": calls}, {"text": "done"}],
        tools=["lookup", "send_note"],
        grants={"s1": ["lookup"]},
    )
    run_child(plan)
    log = Path(plan["log"])
    (created,) = [c.record for c in read_log(log) if isinstance(c.record, SessionCreated)]
    assert created.tools == ["lookup"], "the grant is in the session's created record"
    refused, looked = completed(log, "s1")
    assert refused.kind == "not_granted" and "'send_note' is not granted" in refused.output
    assert looked.kind == "ok"

    # A new process, told nothing of the grant: the log's record keeps it.
    again = dict(plan, grants={})
    again["sessions"] = {"s1": [*plan["sessions"]["s1"], {"text": "again", "request_id": "r9"}]}
    again["script"] = [  # the model's turns are counted over the session's whole history
        *plan["script"],
        {"text": "trying again", "tool_uses": calls[:1]},
        {"text": "done again"},
    ]
    run_child(again)
    after = completed(log, "s1")[2:]
    assert [r.kind for r in after] == ["not_granted"]
    assert "(granted: lookup)" in after[0].output
    assert not [e for e in effects(Path(plan["workspace"])) if e["tool"] == "send_note"]


async def test_the_model_is_offered_only_the_granted_tools(log_dir: Path) -> None:
    script = Offered(
        [Reply(text="sending", tool_uses=[ToolUse("send", {"text": "x"})]), Reply(text="ok")]
    )
    async with perdure.open_runtime(log_dir, provider=script, tools=[lookup, send]) as rt:
        await rt.create_session("narrow", tools=["lookup"])
        await rt.submit("narrow", "go", request_id="r1")
        with trio.fail_after(20):
            await rt.wait_idle("narrow")
        assert script.offered == [["lookup"], ["lookup"]]
        (refused,) = [r for r in await records_of(rt, "narrow") if isinstance(r, ToolCompleted)]
        assert refused.kind == "not_granted"
        # The same id with another grant is a conflict; with none, it is the same session.
        with pytest.raises(perdure.Refused, match="different grant of tools"):
            await rt.create_session("narrow", tools=["lookup", "send"])
        assert await rt.ensure_session("narrow") is False
        with pytest.raises(ValueError, match="no tool named 'nope' is registered"):
            await rt.create_session("other", tools=["lookup", "nope"])
        with pytest.raises(ValueError, match="not the string 'lookup'"):
            await rt.create_session("other", tools="lookup")
        assert await rt.session_info("other") is None, "a refused grant records nothing"
    sound(log_dir)


async def test_a_sub_agent_gets_at_most_its_parents_grant(log_dir: Path) -> None:
    script = Offered(
        [
            Reply(text="asking", tool_uses=[ToolUse("research", {"task": "send it"})]),
            Reply(text="the parent's answer"),
        ],
        by_system={
            RESEARCHER: [
                Reply(text="sending", tool_uses=[ToolUse("send", {"text": "hi"})]),
                Reply(text="could not send"),
            ]
        },
    )
    tools = [lookup, send, research]
    async with perdure.open_runtime(log_dir, provider=script, tools=tools) as rt:
        await rt.create_session("p", tools=["lookup", "research"])
        await rt.submit("p", "go", request_id="r1")
        with trio.fail_after(20):
            await rt.wait_idle("p")
        (child,) = [i.session_id for i in await rt.sessions() if i.session_id != "p"]
        records = await records_of(rt, child)
        assert isinstance(records[0], SessionCreated)
        assert records[0].tools == ["lookup", "research"]
        (refused,) = [r for r in records if isinstance(r, ToolCompleted)]
        assert refused.kind == "not_granted" and "'send' is not granted" in refused.output
        assert all("send" not in offered for offered in script.offered)
    sound(log_dir)
