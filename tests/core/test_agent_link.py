"""The parent -> child link of a sub-agent is a typed record of the parent's call.

A running call that starts a sub-agent reports it (``AgentLinked``); the core
records ``AgentStarted`` while that attempt runs, once per child, and the fold keeps
the call's children, which the runtime pauses, resumes and watches through. Logs
written before the record named children in a heartbeat (``{"agents": [...]}``):
they still fold to the same children.
"""

from __future__ import annotations

import pytest

from perdure.actors import decide, protocol
from perdure.actors.lifecycle import ImpossibleTransition
from perdure.actors.protocol import Step
from perdure.storage.records import AgentStarted, ToolHeartbeat
from tests.core.sim import Session, only


def link(s: Session, child: str, attempt: int = 1) -> Step:
    """The running call reports a child (it keeps running: the view is unchanged)."""
    msg = protocol.AgentLinked(call_id="c1", attempt=attempt, child=child)
    return s._commit(decide.on_result(s.state, s.env(), msg))


def running_call() -> Session:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    assert s.state.tasks["c1"].phase == "executing"
    return s


def test_a_started_sub_agent_is_recorded_once_on_its_call() -> None:
    s = running_call()
    step = link(s, "s1.agent-a")
    (started,) = only(step.records, AgentStarted)
    assert (started.call_id, started.attempt, started.child) == ("c1", 1, "s1.agent-a")
    again = link(s, "s1.agent-a")
    assert not again.records, "a re-run that finds its child links it once"
    assert not link(s, "s1.agent-c", attempt=2).records, "not this attempt's child"
    link(s, "s1.agent-b")
    assert s.state.tasks["c1"].children == ("s1.agent-a", "s1.agent-b")
    assert s.restart() is not None
    assert s.state.tasks["c1"].children == ("s1.agent-a", "s1.agent-b"), "the fold keeps them"


def test_a_link_reported_after_its_attempt_ended_records_nothing() -> None:
    s = running_call()
    s.finish_tool("c1", output="done")
    late = link(s, "s1.agent-a")
    assert not late.records
    assert s.state.tasks["c1"].children == ()
    stale = AgentStarted(session_id="s1", call_id="c1", attempt=1, child="x", at=1.0)
    with pytest.raises(ImpossibleTransition, match="AgentStarted for tool call c1"):
        s.state.apply(stale)


def test_an_old_log_names_the_children_in_a_heartbeat_and_still_folds_to_them() -> None:
    s = running_call()
    old = ToolHeartbeat(
        session_id="s1", call_id="c1", attempt=1, details={"agents": ["s1.agent-a", 7]}, at=1.0
    )
    s.state.apply(old)
    assert s.state.tasks["c1"].children == ("s1.agent-a",)
    s.state.apply(ToolHeartbeat(session_id="s1", call_id="c1", attempt=1, details="p", at=2.0))
    assert s.state.tasks["c1"].children == ("s1.agent-a",)
