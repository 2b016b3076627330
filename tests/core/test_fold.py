"""What the fold keeps from the records, read back by what depends on it.

The fold (``SessionState.apply``) is the only way a restarted process learns what
happened; a field it forgets or mis-sets is a state the dead process never had.
Each test reads the folded state through a promise that depends on it: the notes
the model reads, the model retry history, a parked session that takes no more
commands. Mutation testing (docs/RELIABILITY.md) found these unguarded.
"""

from __future__ import annotations

import attrs
import pytest

from perdure import errors
from perdure.actors import decide, protocol
from perdure.actors.entities import Note
from perdure.actors.readmodel import StateLookup
from perdure.actors.state import SessionState
from perdure.storage.records import CompensationFinished, RetryPending, RunStarted, SessionParked
from tests.core.sim import COURSE_TOOLS, Session, decide_committed, only


def refold(s: Session) -> SessionState:
    return SessionState.fold("s1", [decide_committed(i, r) for i, r in enumerate(s.log, 1)])


def notes(state: SessionState) -> list[str]:
    return [item.text for item in state.conversation if isinstance(item, Note)]


def test_the_model_reads_which_compensation_ran_how_and_with_what_result() -> None:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply(
        "x",
        ("c1", "hold_seat", {"seat": "1A"}),
        ("c2", "create_ticket", {"title": "t"}),
    )
    s.finish_tool("c1", output="held 1A")
    s.finish_tool("c2", output="T-1")
    s.command(protocol.Revise("v1", "another flight"))  # releases the seat unasked
    s.finish_tool("comp-c1", output="released 1A")
    s.reply("ok")
    s.command(protocol.Compensate("c2", "k1"))
    s.command(protocol.Approve("comp-c2", True, "a1"))  # close_ticket requires approval
    s.finish_tool("comp-c2", output="closed T-1")
    expected = [
        "[perdure ran the compensation of hold_seat (c1) automatically; completed: released 1A]",
        "[perdure ran the compensation of create_ticket (c2) at the user request; "
        "completed: closed T-1]",
    ]
    assert notes(s.state) == expected
    assert notes(refold(s)) == expected


def test_a_failed_model_attempt_is_kept_with_its_error_for_the_next_attempt() -> None:
    s = Session(max_model_attempts=3)
    s.command(protocol.Submit("r1", "go"))
    s.result(
        protocol.ModelFailed(
            generation_id="in1.g1", attempt=1, error="overloaded", retryable=True, model="m1"
        )
    )
    for state in (s.state, refold(s)):
        gen = state.generations["in1.g1"]
        assert (gen.phase, gen.attempt, gen.last_error, gen.model) == (
            "retry_pending",
            2,
            "overloaded",
            "m1",
        )
        assert [type(f) for f in gen.failures] == [RetryPending]
        assert [f.error for f in gen.failures] == ["overloaded"]


def test_a_parked_session_takes_no_command_and_decides_nothing() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.log.append(SessionParked(session_id="s1", reason="its actor crashed 3 times", at=s.now))
    state = refold(s)
    assert state.parked == "its actor crashed 3 times"
    with pytest.raises(errors.SessionParkedError) as info:
        decide.command(state, s.env(), protocol.Submit("r2", "more"))
    assert info.value.code == "parked"
    assert info.value.message == "session s1 is parked: its actor crashed 3 times"
    assert not decide.recover(state, s.env())
    assert not decide.advance(state, s.env(), protocol.View())


def test_a_revision_is_folded_with_its_number_and_repeats_as_a_duplicate_after_a_restart() -> None:
    from perdure.actors.conversation import revision_text
    from perdure.actors.entities import Revision
    from perdure.storage.records import Budget

    s = Session()
    s.command(protocol.Submit("r1", "go"))
    budget = Budget(run_tokens=1000)
    s.command(protocol.Revise("v1", "something else", budget=budget))
    s.restart()
    (rev,) = [item for item in s.state.conversation if isinstance(item, Revision)]
    assert revision_text(s.state, rev).startswith(
        "[The user revised the request (revision 1). It now reads: something else\n"
    )
    step, answer = s.command(protocol.Revise("v1", "something else", budget=budget))
    assert not step and answer.ref == "1" and answer.duplicate  # type: ignore[union-attr]
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Revise("v1", "something else"))  # the same words, another budget
    assert info.value.code == "conflict"
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Submit("v1", "something else"))
    assert info.value.code == "conflict"


def test_what_a_restart_folds_is_what_inspection_and_duplicates_read() -> None:
    from perdure.inspect import summarize

    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.restart()  # the model call was in flight: in1.r0 is interrupted, in1.r1 goes on
    state = refold(s)
    assert state.last_seq == len(s.log)
    summary = summarize(state)
    assert summary["last_seq"] == len(s.log)
    assert [(r["run_id"], r["status"]) for r in summary["runs"]] == [
        ("in1.r0", "interrupted"),
        ("in1.r1", "running"),
    ]
    seq = next(i for i, r in enumerate(s.log, 1) if type(r).__name__ == "InputAccepted")
    step, answer = s.command(protocol.Submit("r1", "go"))
    assert not step and answer == protocol.Accepted("in1", seq, duplicate=True)


def test_the_model_reads_how_each_earlier_request_ended_and_an_interruption_is_no_ending() -> None:
    from perdure.storage.records import Budget

    s = Session(max_model_attempts=1)
    s.command(protocol.Submit("r1", "one"))
    s.command(protocol.Cancel("x1"))
    s.command(protocol.Submit("r2", "two"))
    s.restart()  # in2's model call was in flight: its run is interrupted and resumed
    assert s.state.submissions["in2"].outcome is None, "an interrupted run has not ended"
    s.result(protocol.ModelFailed(generation_id="in2.g1", attempt=1, error="bad", retryable=False))
    s.command(protocol.Submit("r3", "three", budget=Budget(run_tokens=0)))
    expected = [
        "[The user cancelled the request above.]",
        "[The request above failed: the model call failed after a non-retryable error: bad]",
        "[The request above was stopped: ",
    ]
    for state in (s.state, refold(s)):
        got = notes(state)
        assert got[:2] == expected[:2] and got[2].startswith(expected[2]), got
        outcomes = {k: v.outcome.status for k, v in state.submissions.items() if v.outcome}
        assert outcomes == {"in1": "cancelled", "in2": "failed", "in3": "stopped"}
        assert state.last_outcome is not None and state.last_outcome.status == "stopped"


def test_a_resumed_session_reads_as_not_paused() -> None:
    from perdure.inspect import summarize

    s = Session()
    s.command(protocol.Pause("p1"))
    s.command(protocol.Resume("u1"))
    assert summarize(refold(s))["paused"] is False


def test_a_tool_result_is_progress_so_a_run_that_keeps_making_some_is_not_given_up() -> None:
    s = Session(resume_budget=1)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    s.restart()  # progress (the reply): resume 1 of 1, c1 runs again
    s.finish_tool("c1")  # a result in the resumed run: progress again
    assert not s.state.tasks["c1"].stale, "a result of the revision in force is not stale"
    step = s.restart()
    assert "RunStarted" in [type(r).__name__ for r in step.records], "resumed, not given up"


# -- what the fold keeps that the runtime shows (found unguarded by mutation testing) ----------


def test_a_turns_usage_adds_its_failed_attempts_to_its_reply() -> None:
    from perdure.providers.base import ModelReply
    from perdure.storage.records import Usage

    s = Session()
    s.command(protocol.Submit("r1", "go"))
    gen = s.state.current_generation()
    assert gen is not None
    s.fail_model(usage=Usage(input_tokens=10, output_tokens=1))
    s.now += 60
    reply = ModelReply(text="done", usage=Usage(input_tokens=20, output_tokens=5))
    s.result(protocol.ModelReplied(gen.generation_id, 2, reply))
    total = Usage(input_tokens=30, output_tokens=6)
    run = s.state.runs["in1.r0"]
    assert (s.state.generations[gen.generation_id].usage, run.usage, s.state.usage) == (
        total,
        total,
        total,
    )


def test_a_sub_agents_parent_and_tools_are_folded_from_its_creation() -> None:
    from perdure.storage.records import Committed, SessionCreated

    created = SessionCreated(session_id="s1", parent="p1/c7", tools=["lookup", "send"], at=1.0)
    state = SessionState.fold("s1", [Committed(1, created)])
    assert (state.parent, state.allowed_tools) == ("p1/c7", frozenset({"lookup", "send"}))


def test_a_calls_executing_record_keeps_why_its_tool_has_its_policy() -> None:
    import attrs

    from perdure.storage.records import ToolExecuting
    from tests.core.sim import TOOLS

    explained = attrs.evolve(TOOLS["lookup"], policy_reason="MCP docs/search: read-only")
    s = Session(tools={**TOOLS, "lookup": explained})
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("x", ("c1", "lookup", {"query": "q"}))
    (executing,) = [r for r in step.records if isinstance(r, ToolExecuting)]
    assert executing.policy_reason == "MCP docs/search: read-only"


def test_a_restart_of_a_paused_session_still_asks_the_reconcile_of_a_call_in_doubt() -> None:
    from tests.core.sim import reconciles

    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    s.command(protocol.Pause("p1"))
    assert reconciles(s.restart()) == ["c1"], "asking is no side effect: paused or not"


def test_a_run_stamped_by_an_observer_reads_as_the_log_holds_it() -> None:
    """An observer stamps a run's trace context on its RunStarted after the fold took the
    unstamped record; the commit's bookkeeping must give the live state the stamped one,
    or the read model disagrees with a fold of the log."""
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    (started,) = only(s.log, RunStarted)
    run = s.state.runs[started.run_id]
    assert run.traceparent == ""
    stamped = attrs.evolve(started, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    s.state.note_committed(decide_committed(99, stamped))
    assert s.state.runs[started.run_id].traceparent == stamped.traceparent
    assert StateLookup(s.state).run_views()[0].traceparent == stamped.traceparent
    unstamped = attrs.evolve(started, traceparent="")
    s.state.note_committed(decide_committed(100, unstamped))  # never erases a stamp
    assert s.state.runs[started.run_id].traceparent == stamped.traceparent


def test_compensations_finished_together_close_in_the_order_they_were_asked() -> None:
    """Two compensations whose results are durable and whose ends are not (a crash
    between) are both closed by one recovery, in the order they were requested: the
    log's order of CompensationFinished is decided, not left to the passes of settle."""
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "hold_seat", {"seat": "1A"}), ("c2", "hold_seat", {"seat": "2B"}))
    s.finish_tool("c1", output="held 1A")
    s.finish_tool("c2", output="held 2B")
    s.reply("done")
    s.command(protocol.Compensate("c1", "k1"))
    s.command(protocol.Compensate("c2", "k2"))
    s.finish_tool("comp-c1", output="released 1A")
    s.finish_tool("comp-c2", output="released 2B")
    s.log = [r for r in s.log if not isinstance(r, CompensationFinished)]  # the crash
    step = s.restart()
    finished = [r.compensation_id for r in step.records if isinstance(r, CompensationFinished)]
    assert finished == ["comp-c1", "comp-c2"]
    assert not s.state.compensations
