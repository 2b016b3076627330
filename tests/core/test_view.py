"""The read model (``perdure.view``): what the edges read of a session, made from the fold.

Each answer must say what the fold holds (a wrong field here is a wrong span, metric
label or stream position at an edge), be frozen, and not move when later records are
folded: a snapshot taken before a commit still says what was true then.
"""

from __future__ import annotations

import attrs
import pytest

import perdure
from perdure.actors import decide, protocol
from perdure.actors.readmodel import StateLookup, session_view
from perdure.actors.state import SessionState
from perdure.storage.records import (
    AgentStarted,
    GenerationCompleted,
    InputAccepted,
    RunStarted,
    SessionCreated,
    SessionForked,
    SessionParked,
    Usage,
)
from tests.core.sim import Session, decide_committed


def refold(s: Session) -> SessionState:
    return SessionState.fold("s1", [decide_committed(i, r) for i, r in enumerate(s.log, 1)])


def seq_of(s: Session, kind: type) -> int:
    return next(i for i, r in enumerate(s.log, 1) if isinstance(r, kind))


def test_each_item_of_a_running_turn_is_answered_as_the_fold_holds_it() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.fail_model(model="m-asked")
    s.reply("looking", ("c1", "lookup", {"query": "q"}))
    state = refold(s)
    ask = StateLookup(state)
    run = state.run
    assert run is not None
    gen = state.current_generation()
    assert gen is not None

    sub = ask.submission_view(run.submission_id)
    assert sub is not None
    assert (sub.request_id, sub.text, sub.outcome) == ("r1", "go", None)
    assert sub.seq == seq_of(s, InputAccepted) > 0
    assert sub.runs == (run.run_id,)
    assert sub.generations == (gen.generation_id,)
    assert ask.open_submission() == sub

    run_view = ask.run_view(run.run_id)
    assert run_view is not None
    assert run_view.submission_id == run.submission_id
    assert run_view.finished is None and not run_view.cancel_requested
    assert run_view.started_at == next(r for r in s.log if isinstance(r, RunStarted)).at

    gen_view = ask.generation_view(gen.generation_id)
    assert gen_view is not None
    assert (gen_view.run_id, gen_view.phase, gen_view.attempt) == (run.run_id, "completed", 2)
    assert [f.model for f in gen_view.failures] == ["m-asked"]
    assert ask.model_failures(gen.generation_id) == gen_view.failures
    assert isinstance(gen_view.reply, GenerationCompleted) and gen_view.reply.text == "looking"
    assert gen_view.call_ids == ("c1",)

    task = ask.task_view("c1")
    assert task is not None
    assert (task.tool_name, task.phase, task.terminal, task.attempt) == (
        "lookup",
        "executing",
        False,
        1,
    )
    assert task.generation_id == gen.generation_id
    assert task.executing is not None and task.executing.replay == "safe"
    assert ask.tool_attempt("c1") is task.executing
    assert task.result is None and task.children == ()
    state.apply(AgentStarted(session_id="s1", call_id="c1", attempt=1, child="s1.agent-a", at=2.0))
    after = ask.task_view("c1")
    assert after is not None and after.children == ("s1.agent-a",)
    assert task.children == ()  # the answer given before did not move

    view = ask.view()
    assert view.current_run == run.run_id
    assert not view.idle and view.created and view.queued == ()
    assert view.last_seq == len(s.log)


def test_unknown_ids_are_none_and_a_finished_request_is_no_longer_open() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    s.finish_tool("c1", output="found")
    s.reply("done")
    state = refold(s)
    ask = StateLookup(state)
    for answer in (ask.submission_view, ask.run_view, ask.generation_view, ask.task_view):
        assert answer("nope") is None
    assert ask.tool_attempt("nope") is None and ask.model_failures("nope") == ()
    assert ask.open_submission() is None
    task = ask.task_view("c1")
    assert task is not None and task.terminal and task.phase == "completed"
    view = ask.view()
    assert view.idle and view.current_run is None
    assert view.last_outcome is not None and view.last_outcome.status == "completed"
    assert view.usage == state.usage


def test_a_snapshot_is_frozen_and_keeps_what_was_true_when_it_was_taken() -> None:
    s = Session(tools=None)
    s.command(protocol.Submit("r1", "ship it"))
    s.reply("deploying", ("c1", "deploy", {"target": "prod"}))
    before = session_view(s.state)
    assert before.awaiting_approval == ("c1",) and before.queued == ()
    assert not before.paused

    s.command(protocol.Submit("r2", "then this"))
    s.command(protocol.Pause("p1"))
    after = session_view(s.state)
    assert len(after.queued) == 1 and after.paused
    assert before.queued == () and not before.paused  # the old snapshot did not move
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        before.paused = True  # type: ignore[misc]


def test_the_lineage_and_parking_of_a_session_are_in_its_snapshot() -> None:
    records = [
        SessionCreated(session_id="s2", parent="s1/c7", at=1.0),
        SessionForked(session_id="s2", source="s0", position=4, request_id="f1", at=1.0),
        SessionParked(session_id="s2", reason="crashed 5 times", at=2.0),
    ]
    view = session_view(
        SessionState.fold("s2", [decide_committed(i, r) for i, r in enumerate(records, 1)])
    )
    assert (view.parent, view.forked_from, view.parked) == ("s1/c7", "s0", "crashed 5 times")
    assert view.last_seq == 3


def test_a_new_state_is_looked_up_and_the_read_model_is_exported() -> None:
    ask: perdure.SessionLookup = StateLookup(SessionState("s1"))
    assert ask.session_id == "s1"
    assert ask.view() == perdure.SessionView(
        session_id="s1",
        created=False,
        parent=None,
        forked_from=None,
        goal_rev=0,
        paused=False,
        parked=None,
        idle=True,
        current_run=None,
        queued=(),
        awaiting_approval=(),
        awaiting_human=(),
        usage=Usage(),
        spend=(),
        last_outcome=None,
        last_seq=0,
    )
    assert {"RunView", "GenerationView", "SubmissionView", "TaskView"} <= set(perdure.__all__)


_TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_every_view_field_is_the_fold_s_own_value() -> None:
    """Each field of a run, turn, call and input view is the value the fold holds (none
    is left out or defaulted): a session driven through a model retry, a restart, a
    tool retry with a heartbeat, a finished run and a compensation."""
    from tests.core.sim import COURSE_TOOLS

    retrying = perdure.tool(
        name="fetch", replay=perdure.ReplayPolicy.SAFE, retry=perdure.RetryPolicy(initial=5.0)
    )(lambda_fetch)
    s = Session(tools={**COURSE_TOOLS, "fetch": retrying})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "fetch", {"url": "u"}))
    beat = protocol.HeartbeatReported(call_id="c1", attempt=1, details={"page": 3})
    s._commit(decide.on_result(s.state, s.env(), beat))  # the attempt still runs
    s.finish_tool("c1", outcome="retryable", output="503", is_error=True)
    mid = refold(s)
    waiting = StateLookup(mid).task_view("c1")
    assert waiting is not None and waiting.phase == "retry_pending"
    held = mid.tasks["c1"]
    for name in ("call_id", "last_error", "not_before", "last_heartbeat"):
        assert getattr(waiting, name) == getattr(held, name) is not None, name
    s.now = held.not_before + 1  # type: ignore[operator]
    s.result(protocol.BackOffOver(call_id="c1", attempt=1))
    s.finish_tool("c1", output="fetched")
    s.reply("done")
    s.command(protocol.Submit("r2", "again", traceparent=_TRACE))
    s.fail_model(model="m-asked")
    s.restart()  # the run resumes: resumed_from and resume_attempt are set
    s.reply("done again")
    state = refold(s)
    ask = StateLookup(state)

    (run_id,) = [r for r in state.runs if state.runs[r].resumed_from]
    run, run_view = state.runs[run_id], ask.run_view(run_id)
    assert run_view is not None
    for name in (
        "run_id",
        "goal_rev",
        "resume_attempt",
        "resumed_from",
        "finished",
        "usage",
        "traceparent",
    ):
        assert getattr(run_view, name) == getattr(run, name) is not None, name
    assert run_view.resume_attempt == 1  # (a run's own trace context is the shell's: "" here)

    gen = list(state.generations.values())[-1]  # the resumed input's turn
    gen_view = ask.generation_view(gen.generation_id)
    assert gen_view is not None
    for name in ("generation_id", "submission_id", "model", "usage"):
        assert getattr(gen_view, name) == getattr(gen, name) is not None, name

    sub = state.submissions[run.submission_id]
    sub_view = ask.submission_view(sub.submission_id)
    assert sub_view is not None
    assert sub_view.outcome == sub.outcome is not None
    assert sub_view.traceparent == sub.traceparent == _TRACE

    done = ask.task_view("c1")
    assert done is not None and done.result == state.tasks["c1"].result is not None

    ticket = Session(tools=COURSE_TOOLS)
    ticket.command(protocol.Submit("r1", "go"))
    ticket.reply("x", ("c2", "create_ticket", {"title": "t"}))
    ticket.finish_tool("c2", output="T-1")
    ticket.reply("done")
    ticket.command(protocol.Compensate("c2", "k1"))
    undo = StateLookup(refold(ticket)).task_view("comp-c2")
    assert undo is not None and undo.compensates == "c2"


async def lambda_fetch(url: str) -> str:
    """Fetch."""
    return url


def test_the_open_input_is_the_earliest_unanswered_one() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "first"))
    s.command(protocol.Submit("r2", "second"))  # queued behind the first
    s.command(protocol.Submit("r3", "third"))
    state = refold(s)
    ask = StateLookup(state)
    subs = sorted(state.submissions.values(), key=lambda sub: sub.seq)
    # Answered by seq, not by id or insertion: reorder the dict to be sure.
    state.submissions = dict(reversed(list(state.submissions.items())))
    assert ask.open_submission() == ask.submission_view(subs[0].submission_id)


def test_every_run_and_call_in_order_with_its_input_masked_and_the_recoveries() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}), ("c2", "lookup", {"query": "p"}))
    s.restart()  # a new process finds both calls executing: recovery decides about each
    s.finish_tool("c1", output="one")
    s.finish_tool("c2", output="two")
    s.reply("done")
    s.command(protocol.Submit("r2", "again"))
    state = refold(s)
    ask = StateLookup(state)

    assert ask.task_views() == (ask.task_view("c1"), ask.task_view("c2"))
    assert len(state.runs) == 3  # the run, its resumption, and the second input's
    assert ask.run_views() == tuple(ask.run_view(r) for r in state.runs)
    assert ask.recovery_decisions() == tuple(state.decisions) != ()

    call = ask.task_views()[0]
    assert dict(call.input) == {"query": "q"}
    assert call.goal_rev == state.tasks["c1"].goal_rev == state.goal_rev
    with pytest.raises(TypeError):  # a view of the fold's input, not a handle on it
        call.input["query"] = "changed"  # type: ignore[index]
    state.tasks["c1"].secret = ["query"]
    masked_call = ask.task_view("c1")
    assert masked_call is not None and masked_call.input["query"] != "q"
    assert state.tasks["c1"].input == {"query": "q"}  # the fold's own is untouched

    state.spend = {"m2": Usage(input_tokens=3), "m1": Usage(output_tokens=1)}
    assert ask.view().spend == (("m2", Usage(input_tokens=3)), ("m1", Usage(output_tokens=1)))
