"""The model's view built incrementally (``MessageCache``) equals the view built afresh.

Random walks through the protocol (replies with several calls, results in any order,
approvals, revisions while tools run, cancellations, failures, queued input, pauses,
restarts) check after every step that the cached rendering is the uncached one.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure import errors
from perdure.actors import protocol
from perdure.actors.conversation import MessageCache, messages, tool_definitions
from perdure.providers.base import ModelReply
from perdure.tools.contract import tool
from tests.core.test_decide import Session

ACTIONS = (
    "submit",
    "reply_tools",
    "reply_text",
    "finish",
    "fail_model",
    "approve",
    "revise",
    "cancel",
    "pause",
    "resume",
    "restart",
)


def _check(s: Session, cache: MessageCache) -> None:
    assert messages(s.state, cache=cache) == messages(s.state)
    # A second call from the cache alone gives the same again.
    assert messages(s.state, cache=cache) == messages(s.state)


def _act(s: Session, action: str, draw: Any, n: int) -> None:
    state = s.state
    gen = state.current_generation()
    try:
        if action == "submit":
            s.command(protocol.Submit(f"r{n}", f"task {n}"))
        elif action in ("reply_tools", "reply_text", "fail_model"):
            if gen is None or gen.phase == "completed" or gen.generation_id not in s.view.models:
                return
            if action == "fail_model":
                failed = protocol.ModelFailed(
                    generation_id=gen.generation_id,
                    attempt=gen.attempt,
                    error="boom",
                    retryable=False,
                )
                s.result(failed)
                return
            count = draw(st.integers(1, 3)) if action == "reply_tools" else 0
            tools = ("lookup", "send", "deploy")
            calls = [
                (f"c{n}_{j}", draw(st.sampled_from(tools)), _args(draw, tools))
                for j in range(count)
            ]
            s.reply(f"reply {n}" if draw(st.booleans()) else "", *calls)
        elif action == "finish":
            running = sorted(s.view.tools)
            if running:
                call_id = draw(st.sampled_from(running))
                s.finish_tool(call_id, output=f"out {n}")
        elif action == "approve":
            waiting = sorted(
                t.call_id for t in state.tasks.values() if t.phase == "awaiting_approval"
            )
            if waiting:
                s.command(protocol.Approve(waiting[0], draw(st.booleans()), f"a{n}"))
        elif action == "revise":
            s.command(protocol.Revise(f"v{n}", f"new goal {n}"))
        elif action == "cancel":
            s.command(protocol.Cancel(f"x{n}"))
        elif action == "pause":
            s.command(protocol.Pause(f"p{n}"))
        elif action == "resume":
            s.command(protocol.Resume(f"u{n}"))
        elif action == "restart":
            s.restart()
    except errors.Refused:
        pass


def _args(draw: Any, tools: tuple[str, ...]) -> dict[str, Any]:
    return {"query": "q", "text": "t", "target": "prod"}


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_cached_messages_equal_fresh_messages(data: st.DataObject) -> None:
    s = Session()
    cache = MessageCache()
    for n in range(data.draw(st.integers(5, 40))):
        action = data.draw(st.sampled_from(ACTIONS))
        _act(s, action, data.draw, n)
        _check(s, cache)


def test_a_long_session_renders_only_its_new_turns() -> None:
    s = Session()
    cache = MessageCache()
    s.command(protocol.Submit("r1", "go"))
    for turn in range(1, 30):
        s.reply("", (f"c{turn}", "lookup", {"query": "a"}))
        s.finish_tool(f"c{turn}", output=f"o{turn}")
        _check(s, cache)
    # Everything but the pending model turn is settled and cached.
    assert cache.items == len(s.state.conversation)
    assert cache.messages == messages(s.state), "and kept: the next call renders only new turns"
    gen = s.state.current_generation()
    assert gen is not None
    s.result(protocol.ModelReplied(gen.generation_id, gen.attempt, ModelReply(text="done")))
    _check(s, cache)
    assert messages(s.state, cache=cache)[-1].role == "assistant"


def test_tool_definitions_are_made_once_for_the_same_tools() -> None:
    @tool
    async def first(query: str) -> str:
        """Look something up."""
        return query

    @tool
    async def second(n: int) -> str:
        """Count."""
        return str(n)

    cache = MessageCache()
    tools = {"first": first, "second": second}
    made = tool_definitions(tools, cache)
    assert made == tool_definitions(tools)  # what the uncached call makes
    assert [d.name for d in made] == ["first", "second"]
    # The same tool objects, even in a new mapping: the very same definitions.
    assert tool_definitions(dict(tools), cache) is made
    # A tool replaced by an equal-looking other object, one removed, one added: new ones.
    changed = attrs.evolve(second, description="Count again.")
    remade = tool_definitions({"first": first, "second": changed}, cache)
    assert remade is not made and remade[1].description == "Count again."
    assert [d.name for d in tool_definitions({"first": first}, cache)] == ["first"]
    assert len(tool_definitions(tools, cache)) == 2
    cache.clear()
    assert cache.definitions == () and cache.tools == ()
