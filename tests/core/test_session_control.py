"""Session control in the pure core: input while a run is busy (``if_busy``) and forks.

Data in, data out, through the same tiny shell as ``test_decide`` (``tests.core.sim``):
each ``if_busy`` policy is a row of ``decide.IF_BUSY``, and a fork is a settled prefix
of a history (``decide.fork_points`` / ``fork_position`` / ``fork_records``) that the
fork's own recovery takes up.
"""

from __future__ import annotations

import pytest
from attrs import evolve

from perdure import errors
from perdure.actors import decide, protocol
from perdure.actors.protocol import View
from perdure.actors.state import SessionState
from perdure.storage.records import (
    Budget,
    CancelRequested,
    Committed,
    GoalRevised,
    InputAccepted,
    RecoveryDecision,
    RunFinished,
    RunStarted,
    SessionCreated,
    SessionForked,
    SessionParked,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
)
from tests.core.sim import Session, kinds, only


def busy(**env: object) -> Session:
    """A session whose run is executing the NEVER tool ``send`` (not cancellable)."""
    s = Session(**env)
    s.command(protocol.Submit("r1", "send it"))
    s.reply("sending", ("c1", "send", {"text": "hi"}))
    assert s.state.tasks["c1"].phase == "executing"
    return s


def acc(answer: protocol.Answer) -> protocol.Accepted:
    assert isinstance(answer, protocol.Accepted)
    return answer


def committed(s: Session) -> list[Committed]:
    return [Committed(i, r) for i, r in enumerate(s.log, start=1)]


# -- if_busy ---------------------------------------------------------------------------------


def test_queue_is_the_default_and_waits_its_turn() -> None:
    s = busy()
    step, answer = s.command(protocol.Submit("r2", "next"))
    assert kinds(step) == ["InputAccepted"]
    assert answer == protocol.Accepted("in2", 0, disposition="queued")
    assert s.state.queue == ["in2"] and s.state.run is not None


def test_interrupt_cancels_the_run_reports_the_running_call_and_runs_the_input_next() -> None:
    s = busy()
    s.command(protocol.Submit("r2", "queued before"))
    step, answer = s.command(protocol.Submit("r3", "stop, do this", if_busy="interrupt"))
    assert kinds(step) == ["InputAccepted", "CancelRequested"]
    accepted, cancel = step.records
    assert isinstance(accepted, InputAccepted) and accepted.interrupts == "in1.r0"
    assert isinstance(cancel, CancelRequested) and cancel.request_id == "r3/interrupt"
    assert answer == protocol.Accepted("in3", 0, disposition="interrupted")
    assert s.state.queue == ["in3", "in2"], "the interrupting input runs next"
    assert not step.effects, "a NEVER tool is not cancellable: it is left to finish"
    # The NEVER call finishes: its real result is recorded, then the run is cancelled
    # and the interrupting input starts, all in one commit.
    step = s.finish_tool("c1", "sent")
    assert kinds(step) == ["ToolCompleted", "RunFinished", "RunStarted", "GenerationStarted"]
    assert only(step.records, RunFinished)[0].status == "cancelled"
    assert s.state.run is not None and s.state.run.submission_id == "in3"


def test_interrupt_then_a_crash_reports_the_never_call_unknown_and_never_reruns_it() -> None:
    s = busy()
    s.command(protocol.Submit("r2", "stop", if_busy="interrupt"))
    step = s.restart()
    assert not only(step.records, ToolExecuting), "the NEVER call is not run again"
    (unknown,) = only(step.records, ToolOutcomeUnknown)
    assert unknown.call_id == "c1" and "UNKNOWN" in unknown.output
    finished = only(step.records, RunFinished)
    assert [f.status for f in finished] == ["cancelled"]
    assert s.state.run is not None and s.state.run.submission_id == "in2"


def test_a_duplicate_interrupt_answers_the_same_and_cancels_nothing_more() -> None:
    s = busy()
    s.command(protocol.Submit("r2", "stop", if_busy="interrupt"))
    s.state.requests["r2"].seq = 9
    s.finish_tool("c1")
    assert s.state.run is not None and s.state.run.submission_id == "in2"
    step, answer = s.command(protocol.Submit("r2", "stop", if_busy="interrupt"))
    assert not step
    assert answer == protocol.Accepted("in2", 9, duplicate=True, disposition="interrupted")
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Submit("r2", "another text", if_busy="interrupt"))
    assert info.value.code == "conflict"


def test_interrupt_with_nothing_running_is_plain_input() -> None:
    s = Session()
    step, answer = s.command(protocol.Submit("r1", "go", if_busy="interrupt"))
    assert kinds(step) == ["InputAccepted", "RunStarted", "GenerationStarted"]
    assert acc(answer).disposition == "queued"


def test_reject_refuses_while_busy_and_records_nothing() -> None:
    s = busy()
    before = list(s.log)
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Submit("r2", "now?", if_busy="reject"))
    assert info.value.code == "busy" and "in1.r0" in str(info.value)
    assert s.log == before and "r2" not in s.state.requests
    s.finish_tool("c1")
    s.reply("done")
    assert s.state.idle
    # Nothing was recorded: the same request is accepted once the session is idle.
    step, answer = s.command(protocol.Submit("r2", "now?", if_busy="reject"))
    assert kinds(step)[0] == "InputAccepted" and acc(answer).submission_id == "in2"


def test_a_duplicate_is_answered_before_any_policy_applies() -> None:
    s = busy()
    s.state.requests["r1"].seq = 3
    for policy in protocol.IF_BUSY:
        step, answer = s.command(protocol.Submit("r1", "send it", if_busy=policy))  # type: ignore[arg-type]
        assert not step, f"{policy}: nothing recorded for a duplicate"
        assert answer == protocol.Accepted("in1", 3, duplicate=True), policy
    queued, first = s.command(protocol.Submit("r2", "next", if_busy="queue"))
    again, second = s.command(protocol.Submit("r2", "next", if_busy="queue"))
    assert kinds(queued) == ["InputAccepted"] and not again
    assert acc(second).duplicate and acc(second).submission_id == acc(first).submission_id


def test_reject_also_refuses_while_input_waits() -> None:
    s = Session()
    s.command(protocol.Pause("p1"))
    s.command(protocol.Submit("r1", "held"))
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Submit("r2", "too", if_busy="reject"))
    assert "1 input(s) wait" in str(info.value)


def test_steer_revises_the_running_request_and_deduplicates_as_a_submit() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "find flights"))
    step, answer = s.command(protocol.Submit("r2", "to Lisbon instead", if_busy="steer"))
    assert kinds(step) == ["GoalRevised", "GenerationStarted"]
    (revised,) = only(step.records, GoalRevised)
    assert revised.steered and revised.text == "to Lisbon instead" and s.state.goal_rev == 1
    assert answer == protocol.Accepted("in1", 0, disposition="steered")
    assert not only(step.records, InputAccepted), "no new input: the request changed"
    s.state.requests["r2"].seq = 5
    again, dup = s.command(protocol.Submit("r2", "to Lisbon instead", if_busy="steer"))
    assert not again and dup == protocol.Accepted("in1", 5, duplicate=True, disposition="steered")
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Revise("r2", "to Lisbon instead"))
    assert info.value.code == "conflict", "a request id names one kind of request"
    # A restart rebuilds the same dedup answer from the log.
    s.restart()
    _, after = s.command(protocol.Submit("r2", "to Lisbon instead", if_busy="steer"))
    assert acc(after).duplicate and acc(after).disposition == "steered"


def test_steer_while_the_run_is_being_cancelled_waits_its_turn() -> None:
    s = busy()
    s.command(protocol.Cancel("c"))
    step, answer = s.command(protocol.Submit("r2", "then this", if_busy="steer"))
    assert kinds(step) == ["InputAccepted"] and acc(answer).disposition == "queued"


def test_the_session_default_applies_unless_the_submit_says_otherwise() -> None:
    s = Session()
    created = SessionCreated(session_id="s1", if_busy="reject", at=s.now)
    s.state = SessionState.fold("s1", [Committed(1, created)])
    s.log = [created]
    s.command(protocol.Submit("r1", "go"))
    with pytest.raises(errors.Refused):
        s.command(protocol.Submit("r2", "more"))
    step, _ = s.command(protocol.Submit("r3", "more", if_busy="queue"))
    assert kinds(step) == ["InputAccepted"]


def test_if_busy_must_name_a_policy() -> None:
    with pytest.raises(ValueError, match="if_busy must be one of"):
        protocol.check_if_busy("later")


# -- fork ------------------------------------------------------------------------------------


def two_runs() -> Session:
    """Run 1: a lookup turn then an answer; run 2 finished too."""
    s = Session()
    s.command(protocol.Submit("r1", "look"))
    s.reply("looking", ("c1", "lookup", {"query": "a"}))
    s.finish_tool("c1", "found a")
    s.reply("answer one")
    s.command(protocol.Submit("r2", "again"))
    s.reply("answer two")
    return s


def test_fork_points_are_the_ends_of_runs_and_turns() -> None:
    s = two_runs()
    history = committed(s)
    points = decide.fork_points(history)
    at = {c.seq: c.record for c in history}
    assert [type(at[p]).__name__ for p in points] == ["ToolCompleted", "RunFinished", "RunFinished"]
    assert decide.fork_position(history, None) == points[-1]
    assert decide.fork_position(history, "in1.r0") == points[1]


def test_a_fork_elsewhere_is_refused_with_the_nearest_points() -> None:
    s = two_runs()
    history = committed(s)
    points = decide.fork_points(history)
    with pytest.raises(errors.Refused) as info:
        decide.fork_position(history, points[0] - 1)
    assert info.value.code == "invalid_state"
    assert f"{points[0]} (after)" in str(info.value)
    with pytest.raises(errors.Refused) as info:
        decide.fork_position(history, points[1] + 1)
    assert f"{points[1]} (before)" in str(info.value) and f"{points[2]} (after)" in str(info.value)
    with pytest.raises(errors.Refused) as info:
        decide.fork_position(history, "in9.r0")
    assert info.value.code == "not_found"


def test_a_session_in_the_middle_of_a_call_has_no_point_after_its_last_settled_one() -> None:
    s = busy()
    with pytest.raises(errors.Refused, match="no settled point"):
        decide.fork_position(committed(s), None)


def test_a_fork_of_a_sub_agent_keeps_its_tools_but_not_its_parent() -> None:
    s = two_runs()
    created = SessionCreated(session_id="s1", parent="p/c1", tools=["lookup"], at=s.now)
    history = [Committed(1, created), *committed(s)[1:]]
    records = decide.fork_records(history, "f1", decide.fork_position(history, None), "k", 1.0)
    own = records[0]
    assert isinstance(own, SessionCreated) and own.tools == ["lookup"] and own.parent is None


def test_a_fork_at_the_end_of_a_run_copies_the_history_and_is_idle() -> None:
    s = two_runs()
    history = committed(s)
    position = decide.fork_position(history, "in1.r0")
    records = decide.fork_records(history, "f1", position, "fork-1", 2000.0)
    assert kinds_of(records[:2]) == ["SessionCreated", "SessionForked"]
    forked = records[1]
    assert isinstance(forked, SessionForked) and forked.source == "s1"
    assert forked.position == position and forked.records == len(records) - 2
    assert all(r.session_id == "f1" for r in records)
    state = SessionState.fold("f1", [Committed(i, r) for i, r in enumerate(records, start=1)])
    assert state.idle and state.forked == forked
    assert list(state.submissions) == ["in1"], "run 2 is after the fork point"
    assert state.tasks["c1"].phase == "completed", "the copied call keeps its result"
    assert decide.recover(state, s.env()) == protocol.NOTHING


def test_a_fork_at_the_end_of_a_turn_continues_the_run_without_rerunning_the_call() -> None:
    s = two_runs()
    history = committed(s)
    turn_end = decide.fork_points(history)[0]
    records = decide.fork_records(history, "f1", turn_end, "fork-1", 2000.0)
    assert isinstance(records[-1], ToolCompleted)
    state = SessionState.fold("f1", [Committed(i, r) for i, r in enumerate(records, start=1)])
    step = decide.settle(state, s.env(), View(), decide.recover(state, s.env()), recovering=True)
    (decision,) = only(step.records, RecoveryDecision)
    assert decision.action == "start the next turn"
    assert kinds(step)[-1] == "GenerationStarted" and not only(step.records, ToolExecuting)
    assert step.effects == (protocol.CallModel("in1.g2", 1),)


def kinds_of(records: tuple[object, ...]) -> list[str]:
    return [type(r).__name__ for r in records]


# -- the words and edges of if_busy and fork (found unguarded by mutation testing) ----------


def test_a_refusal_names_what_keeps_the_session_busy() -> None:
    s = busy()
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Submit("r2", "now?", if_busy="reject"))
    assert str(info.value) == (
        "session s1 is busy (run in1.r0 is in progress); "
        "the input was not recorded (if_busy='reject')"
    )
    s.command(protocol.Submit("r3", "later"))  # waits its turn
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Submit("r4", "now?", if_busy="reject"))
    assert "(run in1.r0 is in progress; 1 input(s) wait their turn)" in str(info.value)
    held = Session()
    held.command(protocol.Pause("p1"))
    held.command(protocol.Submit("r1", "held"))
    with pytest.raises(errors.Refused) as info:
        held.command(protocol.Submit("r2", "too", if_busy="reject"))
    assert "is busy (1 input(s) wait their turn);" in str(info.value)


def test_interrupt_while_the_run_is_being_cancelled_waits_its_turn() -> None:
    s = busy()
    s.command(protocol.Cancel("c"))
    step, answer = s.command(protocol.Submit("r2", "then this", if_busy="interrupt"))
    assert kinds(step) == ["InputAccepted"] and acc(answer).disposition == "queued"
    assert not only(step.records, CancelRequested), "one cancellation is enough"


def test_a_steer_carries_its_budget_into_the_revision() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "find flights"))
    budget = Budget(run_tokens=500)
    step, _ = s.command(protocol.Submit("r2", "cheaper", if_busy="steer", budget=budget))
    (revised,) = only(step.records, GoalRevised)
    assert revised.budget == budget and s.state.budget == budget


def test_the_callers_trace_context_is_kept_with_the_input_and_its_run() -> None:
    s = Session()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    step, _ = s.command(protocol.Submit("r1", "go", traceparent=parent))
    (accepted,) = only(step.records, InputAccepted)
    assert accepted.traceparent == parent
    assert s.state.submissions["in1"].traceparent == parent
    # The observer stamps the run's own context on its RunStarted; the fold keeps it.
    started = next(r for r in s.log if isinstance(r, RunStarted))
    own = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
    state = SessionState.fold(
        "s1",
        [
            Committed(i, evolve(r, traceparent=own) if r is started else r)
            for i, r in enumerate(s.log, start=1)
        ],
    )
    assert state.runs[started.run_id].traceparent == own


def test_no_settled_point_is_refused_in_words_that_name_the_session() -> None:
    with pytest.raises(errors.Refused) as info:
        decide.fork_position(committed(busy()), None)
    assert (info.value.code, str(info.value)) == (
        "invalid_state",
        "session s1 has no settled point to fork at yet",
    )
    with pytest.raises(errors.Refused) as info:
        decide.fork_position([], None)
    assert str(info.value) == "session ? has no settled point to fork at yet"
    with pytest.raises(errors.Refused) as info:
        decide.fork_position(committed(two_runs()), "in9.r0")
    assert str(info.value) == "session s1 has no finished run 'in9.r0'"


def three_runs() -> Session:
    s = two_runs()
    s.command(protocol.Submit("r3", "once more"))
    s.reply("answer three")
    return s


def test_the_nearest_points_are_the_one_before_and_the_one_after() -> None:
    history = committed(three_runs())
    points = decide.fork_points(history)
    assert len(points) == 4
    between = points[1] + 1
    assert between not in points
    with pytest.raises(errors.Refused) as info:
        decide.fork_position(history, between)
    assert str(info.value) == (
        f"cannot fork there: {between} is not a settled point of session s1 (the end of a "
        f"run or of a turn); the nearest valid points are {points[1]} (before), "
        f"{points[2]} (after)"
    )


def interrupted_and_resumed(*, finish: bool) -> Session:
    """Run in1.r0 completes; run in2.r0 dies in the middle of a lookup, and recovery
    resumes it as in2.r1."""
    s = Session()
    s.command(protocol.Submit("r0", "hello"))
    s.reply("hi")
    s.command(protocol.Submit("r1", "look"))
    s.reply("looking", ("c1", "lookup", {"query": "a"}))
    s.restart()  # SAFE: re-run; the interrupted run is continued by a resumed one
    ends = [r for r in s.log if isinstance(r, RunFinished)]
    assert [(r.run_id, r.status) for r in ends] == [
        ("in1.r0", "completed"),
        ("in2.r0", "interrupted"),
    ]
    if finish:
        s.finish_tool("c1", "found a")
        s.reply("answer")
        s.command(protocol.Submit("r3", "and then"))  # a later run ends after it
        s.reply("later")
    return s


def test_a_fork_at_an_interrupted_run_is_taken_at_the_end_of_the_run_that_resumed_it() -> None:
    s = interrupted_and_resumed(finish=True)
    history = committed(s)
    ends = [c for c in history if isinstance(c.record, RunFinished)]
    final = ends[2]
    assert (final.record.run_id, final.record.status) == ("in2.r1", "completed")
    assert decide.fork_position(history, "in2.r0") == final.seq
    assert decide.fork_position(history, "in1.r0") == ends[0].seq
    assert ends[1].seq not in decide.fork_points(history), "nothing is settled there"


def test_a_fork_at_an_interrupted_run_still_resuming_is_refused_with_what_it_was() -> None:
    s = interrupted_and_resumed(finish=False)
    history = committed(s)
    first_end = next(c.seq for c in history if isinstance(c.record, RunFinished))
    with pytest.raises(errors.Refused) as info:
        decide.fork_position(history, "in2.r0")
    assert str(info.value) == (
        "cannot fork there: run in2.r0 did not finish (it was interrupted) (the end of a "
        f"run or of a turn); the nearest valid points are {first_end} (before)"
    )


def test_the_end_of_an_idle_history_is_a_point_and_a_parked_one_is_not() -> None:
    s = two_runs()
    s.command(protocol.Pause("p1"))
    s.command(protocol.Resume("p2"))
    history = committed(s)
    assert not isinstance(history[-1].record, RunFinished)
    points = decide.fork_points(history)
    assert points[-1] == history[-1].seq and len(points) == 4
    parked = SessionParked(session_id="s1", reason="a damaged record", at=s.now)
    assert decide.fork_points([*history, Committed(len(history) + 1, parked)]) == points[:3]


def test_the_end_of_a_turn_is_a_point_only_once_its_last_call_is_done() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "look twice"))
    s.reply("looking", ("c1", "lookup", {"query": "a"}), ("c2", "lookup", {"query": "b"}))
    s.finish_tool("c1", "found a")
    first = len(s.log)
    s.finish_tool("c2", "found b")
    second = next(
        i for i, r in enumerate(s.log, start=1) if i > first and type(r).__name__ == "ToolCompleted"
    )
    assert decide.fork_points(committed(s)) == [second]


def test_a_result_after_a_cancel_or_a_revision_is_no_point() -> None:
    s = busy()
    s.command(protocol.Cancel("x"))
    s.finish_tool("c1", "sent")
    cancelled = committed(s)
    assert [type(cancelled[p - 1].record).__name__ for p in decide.fork_points(cancelled)] == [
        "RunFinished"
    ]
    s = busy()
    s.command(protocol.Revise("v1", "send something else"))
    s.finish_tool("c1", "sent")
    revised = committed(s)
    assert not [
        p for p in decide.fork_points(revised) if isinstance(revised[p - 1].record, ToolCompleted)
    ]


def test_no_point_while_a_compensation_is_unfinished() -> None:
    from tests.core.sim import COURSE_TOOLS

    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "open one"))
    s.reply("opening", ("c1", "create_ticket", {"title": "t"}))
    s.finish_tool("c1", "T-1")
    s.reply("opened")
    points = decide.fork_points(committed(s))
    s.command(protocol.Compensate("c1", "k1"))  # close_ticket needs approval: it waits
    assert decide.fork_points(committed(s)) == points


def test_a_fork_keeps_the_sources_settings_and_is_stamped_with_its_own_request() -> None:
    s = two_runs()
    budget = Budget(session_tokens=9000)
    created = SessionCreated(
        session_id="s1", system="be brief", budget=budget, if_busy="steer", at=s.now
    )
    history = [Committed(1, created), *committed(s)[1:]]
    position = decide.fork_position(history, None)
    own, forked, *_ = decide.fork_records(history, "f1", position, "fork-7", 2024.5)
    assert isinstance(own, SessionCreated) and isinstance(forked, SessionForked)
    assert (own.system, own.budget, own.if_busy) == ("be brief", budget, "steer")
    assert (own.request_id, own.at) == ("fork-7", 2024.5)
    assert (forked.request_id, forked.at, forked.position) == ("fork-7", 2024.5, position)


def test_a_session_just_created_can_be_forked_at_its_creation() -> None:
    history = [Committed(1, SessionCreated(session_id="s1", at=1.0))]
    assert decide.fork_points(history) == [1]
    assert decide.fork_position(history, None) == 1
