"""The fold refuses a tool call or a model turn moved out of its lifecycle, by name.

A replayed log whose records do not follow a call's or a turn's lifecycle (a call
created twice, a result for a finished call, a turn finished twice) is corrupt or
foreign: the fold stops with an error naming the session, the call or turn, the
phase it found and the record, so that an operator can find the damage. The fold also
keeps what a call's creation says of it, such as which of its parameters are secret.
"""

from __future__ import annotations

import attrs
import pytest

from perdure.actors import protocol
from perdure.actors.lifecycle import ImpossibleTransition
from perdure.actors.state import SessionState
from perdure.storage.records import (
    CompactionPolicy,
    GenerationCompleted,
    GenerationStarted,
    SessionCreated,
    ToolCompleted,
    ToolTaskCreated,
)
from tests.core.sim import COURSE_TOOLS, Session, only


def _one_call_done() -> tuple[Session, ToolTaskCreated, ToolCompleted, GenerationCompleted]:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("looking", ("c1", "lookup", {"q": "x"}))
    created = only(step.records, ToolTaskCreated)[0]
    done = only(step.records, ToolCompleted)[0]  # a read-only lookup answers at once
    turn = only(s.reply("the answer").records, GenerationCompleted)[0]
    return s, created, done, turn


def _refusal(s: Session, record: object) -> ImpossibleTransition:
    with pytest.raises(ImpossibleTransition) as refused:
        s.state.apply(record)  # type: ignore[arg-type]
    return refused.value


def test_a_call_created_twice_is_refused_naming_it_and_its_phase() -> None:
    s, created, _, _ = _one_call_done()
    err = _refusal(s, created)
    assert (err.session_id, err.subject, err.phase, err.event) == (
        s.state.session_id,
        "tool call c1",
        "completed",
        "ToolTaskCreated",
    )
    assert f"session {s.state.session_id}:" in str(err)


def test_a_second_result_for_a_finished_call_is_refused_naming_the_session() -> None:
    s, _, done, _ = _one_call_done()
    err = _refusal(s, done)
    assert (err.session_id, err.subject, err.event) == (
        s.state.session_id,
        "tool call c1",
        "ToolCompleted",
    )


def test_a_turn_finished_twice_is_refused_naming_the_session() -> None:
    s, _, _, turn = _one_call_done()
    err = _refusal(s, turn)
    assert (err.session_id, err.subject) == (
        s.state.session_id,
        f"model turn {turn.generation_id}",
    )
    assert err.event == "GenerationCompleted"


def test_a_calls_secret_parameters_are_kept_by_the_fold() -> None:
    s, created, _, _ = _one_call_done()
    s.state.apply(attrs.evolve(created, call_id="c2", secret=["q"]))
    assert s.state.tasks["c2"].secret == ["q"], "what every view masks"
    assert s.state.tasks["c1"].secret == []


def test_a_turn_started_twice_is_refused_naming_it_and_its_phase() -> None:
    s = Session(tools=COURSE_TOOLS)
    step, _ = s.command(protocol.Submit("r1", "go"))
    started = only(step.records, GenerationStarted)[0]
    err = _refusal(s, started)
    assert (err.session_id, err.subject, err.phase, err.event) == (
        s.state.session_id,
        f"model turn {started.generation_id}",
        s.state.generations[started.generation_id].phase,
        "GenerationStarted",
    )
    assert err.phase is not None


def test_a_sessions_compaction_policy_is_kept_by_the_fold() -> None:
    policy = CompactionPolicy(window=1000, keep_recent=3, threshold=0.5)
    state = SessionState("s9")
    state.apply(SessionCreated(session_id="s9", compaction=policy, at=1.0))
    assert state.compaction == policy, "the session's own policy, not the runtime's"
