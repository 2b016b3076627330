"""A caller's commands in the pure core: what each answers, refuses, and remembers.

Every refusal carries a code the daemon maps to an HTTP status and a message a
person reads; every command a request id already used answers as it did the first
time, also after a restart (the fold rebuilds the request ids from the records).
Mutation testing (docs/RELIABILITY.md) found these answers unguarded.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import perdure
from perdure import errors
from perdure.actors import decide, protocol
from perdure.storage.records import (
    CompensationRequested,
    RecoveryDecision,
    RunFinished,
    ToolCancelled,
    ToolOutcomeUnknown,
    ToolTaskCreated,
)
from tests.core.sim import COURSE_TOOLS, Session, kinds, only


def refusal(s: Session, cmd: protocol.Command) -> tuple[str, str]:
    """The code and message of the refusal of ``cmd``; nothing may be decided."""
    before = list(s.log)
    with pytest.raises(errors.Refused) as info:
        s.command(cmd)
    assert s.log == before, "a refused command records nothing"
    return info.value.code, info.value.message


def awaiting_approval() -> Session:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "deploy", {"target": "prod"}), ("c2", "lookup", {"query": "q"}))
    assert s.state.tasks["c1"].phase == "awaiting_approval"
    return s


def test_approving_an_unknown_call_or_one_not_waiting_is_refused_with_its_code() -> None:
    s = awaiting_approval()
    assert refusal(s, protocol.Approve("c9", True, "a1")) == (
        "not_found",
        "no tool call 'c9' in session s1",
    )
    assert refusal(s, protocol.Approve("c2", True, "a1")) == (
        "invalid_state",
        "tool call c2 is executing, not awaiting approval",
    )


def test_an_approval_answers_with_its_call_and_keeps_its_note() -> None:
    s = awaiting_approval()
    step, answer = s.command(protocol.Approve("c1", True, "a1", note="looks fine"))
    assert answer == protocol.Done("c1")
    decided = step.records[0]
    assert (type(decided).__name__, decided.note, decided.approved) == (  # type: ignore[attr-defined]
        "ApprovalDecided",
        "looks fine",
        True,
    )


def test_an_approval_repeated_after_a_restart_is_a_duplicate_and_a_changed_one_a_conflict() -> None:
    s = awaiting_approval()
    s.command(protocol.Approve("c1", False, "a1"))
    s.restart()
    seq = next(i for i, r in enumerate(s.log, start=1) if type(r).__name__ == "ApprovalDecided")
    step, answer = s.command(protocol.Approve("c1", False, "a1"))
    assert not step and answer == protocol.Done("c1", seq, duplicate=True)
    code, message = refusal(s, protocol.Approve("c1", True, "a1"))
    assert code == "conflict"
    assert message == "request id 'a1' was already used for a different approve request"
    code, _ = refusal(s, protocol.Revise("a1", "x"))
    assert code == "conflict", "the same id for another kind of command"


def test_a_resolution_repeated_after_a_restart_is_a_duplicate() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    s.finish_tool("c1", output="ask", outcome="needs_human")
    s.command(protocol.Resolve("c1", "skip", "h1", result="fine"))
    s.restart()
    step, answer = s.command(protocol.Resolve("c1", "skip", "h1", result="fine"))
    assert not step and answer.duplicate and answer.ref == "c1"  # type: ignore[union-attr]
    assert refusal(s, protocol.Resolve("c1", "fail", "h1"))[0] == "conflict"


def test_pause_resume_and_cancel_repeated_after_a_restart_are_duplicates() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.command(protocol.Pause("p1"))
    s.command(protocol.Resume("u1"))
    s.command(protocol.Cancel("x1"))
    s.restart()
    for cmd, ref in (
        (protocol.Pause("p1"), ""),
        (protocol.Resume("u1"), ""),
        (protocol.Cancel("x1"), "in1.r0"),
    ):
        step, answer = s.command(cmd)
        assert not step and answer.duplicate and answer.ref == ref, cmd  # type: ignore[union-attr]
    assert refusal(s, protocol.Resume("p1"))[0] == "conflict"
    assert refusal(s, protocol.Pause("x1"))[0] == "conflict"


def test_pausing_twice_or_resuming_a_running_session_records_nothing() -> None:
    s = Session()
    step, answer = s.command(protocol.Resume("u1"))
    assert not step and answer == protocol.Done("")
    step, answer = s.command(protocol.Pause("p1"))
    assert kinds(step) == ["SessionPaused"] and answer == protocol.Done("")
    step, answer = s.command(protocol.Pause("p2"))
    assert not step and answer == protocol.Done("")


def test_cancelling_twice_answers_with_the_run_and_records_once() -> None:
    s = Session()
    step, answer = s.command(protocol.Cancel("x0"))
    assert not step and answer == protocol.Done(""), "no run: nothing to cancel"
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send", {"text": "t"}))
    step, answer = s.command(protocol.Cancel("x1"))
    assert kinds(step) == ["CancelRequested"] and answer == protocol.Done("in1.r0")
    step, answer = s.command(protocol.Cancel("x2"))
    assert not step and answer == protocol.Done("in1.r0")


def test_revising_without_a_run_is_refused_with_advice() -> None:
    s = Session()
    assert refusal(s, protocol.Revise("v1", "x")) == (
        "invalid_state",
        "no run is in progress to revise; submit a new message instead",
    )


def completed_ticket() -> Session:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "create_ticket", {"title": "t"}), ("c2", "lookup", {"query": "q"}))
    s.finish_tool("c1", output="T-1")
    s.finish_tool("c2")
    s.reply("done")
    return s


def test_a_compensation_asked_for_is_not_automatic_and_answers_with_its_id() -> None:
    s = completed_ticket()
    step, answer = s.command(protocol.Compensate("c1", "k1"))
    assert answer == protocol.Done(decide.compensation_id("c1")) == protocol.Done("comp-c1")
    requested = only(step.records, CompensationRequested)
    assert [(r.call_id, r.automatic, r.request_id) for r in requested] == [("c1", False, "k1")]
    created = only(step.records, ToolTaskCreated)
    assert [(c.call_id, c.generation_id, c.compensates) for c in created] == [
        ("comp-c1", "", "c1")
    ], "a compensation belongs to no model turn"


def test_what_cannot_be_compensated_is_refused_with_the_reason() -> None:
    s = completed_ticket()
    assert refusal(s, protocol.Compensate("c9", "k1")) == (
        "not_found",
        "no tool call 'c9' in session s1",
    )
    assert refusal(s, protocol.Compensate("c2", "k1")) == (
        "invalid_state",
        "the tool 'lookup' declares no compensation",
    )
    s.command(protocol.Compensate("c1", "k1"))
    assert refusal(s, protocol.Compensate("c1", "k2")) == (
        "invalid_state",
        "c1 is already compensated by comp-c1",
    )
    assert refusal(s, protocol.Compensate("comp-c1", "k3")) == (
        "invalid_state",
        "comp-c1 is awaiting_approval; only a completed call can be undone",
    )


# -- what a restart decides when the run gave up or was being cancelled --------------------------


def test_a_run_that_keeps_dying_gives_up_and_settles_every_open_call() -> None:
    s = Session(resume_budget=1)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}), ("c2", "deploy", {"target": "d"}))
    assert s.state.tasks["c2"].phase == "awaiting_approval"
    step = s.restart()  # resume 1 of 1: c1 (SAFE) runs again
    assert "RunStarted" in kinds(step)
    step = s.restart()  # no progress since: the budget is spent
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "in1.r1")
    assert (decision.found, decision.action) == ("run in progress", "fail the run")
    assert decision.reason == (
        "the run was interrupted 2 times in a row without progress (resume budget 1); "
        "giving up instead of looping"
    )
    unknown = only(step.records, ToolOutcomeUnknown)
    cancelled = only(step.records, ToolCancelled)
    assert [(u.call_id, u.reason) for u in unknown] == [("c1", "interrupted; the run was given up")]
    assert [(c.call_id, c.reason) for c in cancelled] == [("c2", "the run was given up")]
    finished = only(step.records, RunFinished)
    assert [(f.status, f.reason) for f in finished] == [("failed", decision.reason)]


def test_a_restart_during_a_cancellation_finishes_it_as_cancelled_by_request() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send", {"text": "t"}))
    s.command(protocol.Cancel("x1"))  # c1 (NEVER) is left to finish; then the crash
    step = s.restart()
    assert [u.call_id for u in only(step.records, ToolOutcomeUnknown)] == ["c1"]
    finished = only(step.records, RunFinished)
    assert [(f.status, f.reason) for f in finished] == [("cancelled", "cancelled by request")]


def test_only_a_completed_original_call_can_be_compensated() -> None:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "create_ticket", {"title": "t"}))
    assert refusal(s, protocol.Compensate("c1", "k1")) == (
        "invalid_state",
        "c1 is executing; only a completed call can be undone",
    )
    s.finish_tool("c1", output="T-1")
    s.command(protocol.Compensate("c1", "k1"))
    s.command(protocol.Approve("comp-c1", True, "a1"))
    s.finish_tool("comp-c1", output="closed")
    assert s.state.tasks["comp-c1"].phase == "completed"
    assert refusal(s, protocol.Compensate("comp-c1", "k2")) == (
        "invalid_state",
        "comp-c1 is completed; only a completed call can be undone",
    ), "a compensation is not itself undone"


def test_a_compensation_repeated_after_a_restart_is_a_duplicate() -> None:
    s = completed_ticket()
    s.command(protocol.Compensate("c1", "k1"))
    s.restart()
    step, answer = s.command(protocol.Compensate("c1", "k1"))
    assert not step and answer.duplicate and answer.ref == "comp-c1"  # type: ignore[union-attr]


@perdure.tool(name="release_room", replay=perdure.ReplayPolicy.KEYED)
async def release_room(ctx: perdure.ToolContext, result: str, room: str) -> str:
    """Release a held room (safe to repeat with its key)."""
    return "released"


@perdure.tool(
    replay=perdure.ReplayPolicy.KEYED, compensate=release_room, compensate_automatically=True
)
async def hold_room(ctx: perdure.ToolContext, room: str) -> str:
    """Hold a room (released automatically when the plan changes)."""
    return f"held {room}"


def test_an_automatic_compensation_interrupted_by_a_crash_is_re_run_not_superseded() -> None:
    s = Session(tools={**COURSE_TOOLS, "hold_room": hold_room})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "hold_room", {"room": "1A"}))
    s.finish_tool("c1", output="held 1A")
    s.command(protocol.Revise("v1", "another flight"))  # releases the seat unasked
    assert s.state.tasks["comp-c1"].goal_rev == 1, "it serves the new revision"
    step = s.restart()
    assert [r.call_id for r in step.records if type(r).__name__ == "ToolExecuting"] == ["comp-c1"]
    assert not only(step.records, ToolCancelled), "a compensation is not superseded by its revision"


def test_a_resume_answers_like_a_pause() -> None:
    s = Session()
    s.command(protocol.Pause("p1"))
    step, answer = s.command(protocol.Resume("u1"))
    assert kinds(step) == ["SessionResumed"] and answer == protocol.Done("")


def test_keys_and_fingerprints_of_old_logs_are_recomputed_identically() -> None:
    """An idempotency key reaches external services and a fingerprint is stored with every
    executing record: a build that derived either differently would, after an upgrade,
    repeat a KEYED effect under a new key or call every recorded call "changed"."""
    assert decide.idempotency_key("s1", "in1", "c1") == "pdk_c25a18cb6d4d2736c33560b334602ec1"
    tool = SimpleNamespace(name="lookup", definition_hash="0123456789abcdef")
    args = {"query": "café", "limit": 3}
    assert decide.fingerprint(tool, args) == "7e800b3b4f4261b45cbdb11d94f16362"  # type: ignore[arg-type]


def test_a_compensation_outside_any_run_executes_for_no_run() -> None:
    s = completed_ticket()
    assert s.state.run is None
    s.command(protocol.Compensate("c1", "k1"))
    step, _ = s.command(protocol.Approve("comp-c1", True, "a1"))
    executing = [r for r in step.records if type(r).__name__ == "ToolExecuting"]
    assert [(r.call_id, r.run_id) for r in executing] == [("comp-c1", "")]  # type: ignore[attr-defined]


def test_automatic_compensations_take_their_request_ids_from_the_command() -> None:
    for cmd in (protocol.Revise("v1", "another flight"), protocol.Cancel("x1")):
        s = Session(tools={**COURSE_TOOLS, "hold_room": hold_room})
        s.command(protocol.Submit("r1", "go"))
        s.reply("x", ("c1", "hold_room", {"room": "1A"}), ("c2", "send", {"text": "t"}))
        s.finish_tool("c1", output="held 1A")
        step, _ = s.command(cmd)
        requested = only(step.records, CompensationRequested)
        assert [(r.request_id, r.automatic) for r in requested] == [
            (f"{cmd.request_id}/auto/c1", True)
        ], cmd


def test_a_revision_while_the_model_is_asked_stops_that_call_and_asks_again() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    step, _ = s.command(protocol.Revise("v1", "something else"))
    assert protocol.CancelModel("in1.g1") in step.effects
    assert protocol.CallModel("in1.g2", 1) in step.effects


def test_a_revision_while_paused_only_stops_the_model_call() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.command(protocol.Pause("p1"))  # the call in flight goes on; nothing new starts
    step, _ = s.command(protocol.Revise("v1", "something else"))
    assert kinds(step) == ["GoalRevised"]
    assert step.effects == (protocol.CancelModel("in1.g1"),)


def test_a_revision_cancels_what_has_not_started_and_stops_what_runs_and_can_stop() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply(
        "x",
        ("c1", "lookup", {"query": "a"}),
        ("c2", "deploy", {"target": "d"}),
        ("c3", "lookup", {"query": "b"}),
        ("c4", "send", {"text": "t"}),
    )
    s.finish_tool("c1")
    step, _ = s.command(protocol.Revise("v1", "something else"))
    assert [(c.call_id, c.reason) for c in only(step.records, ToolCancelled)] == [
        ("c2", "the request was revised before it ran")
    ]
    # c3 is SAFE (cancellable) and runs: told to stop once; c4 is NEVER: left to finish.
    assert step.effects == (protocol.CancelTool("c3"),)


def test_a_cancel_offers_to_undo_only_completed_calls_not_undone_yet() -> None:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply(
        "x",
        ("c1", "create_ticket", {"title": "a"}),
        ("c2", "create_ticket", {"title": "b"}),
        ("c3", "lookup", {"query": "q"}),
        ("c4", "create_ticket", {"title": "d"}),
    )
    for call in ("c1", "c3", "c4"):
        s.finish_tool(call, output="done")
    s.command(protocol.Compensate("c4", "k4"))
    step, _ = s.command(protocol.Cancel("x1"))
    requested = [r for r in step.records if type(r).__name__ == "CancelRequested"]
    assert [r.compensable for r in requested] == [["c1"]]  # type: ignore[attr-defined]


def test_every_automatic_compensation_of_a_revision_is_requested() -> None:
    s = Session(tools={**COURSE_TOOLS, "hold_room": hold_room})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "hold_room", {"room": "1A"}), ("c2", "hold_room", {"room": "1B"}))
    s.finish_tool("c1", output="held 1A")
    s.finish_tool("c2", output="held 1B")
    step, _ = s.command(protocol.Revise("v1", "another hotel"))
    assert [r.call_id for r in only(step.records, CompensationRequested)] == ["c1", "c2"]


def two_rooms_held() -> Session:
    """A finished run that held two rooms (KEYED calls with a compensation each)."""
    s = Session(tools={**COURSE_TOOLS, "hold_room": hold_room})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "hold_room", {"room": "1A"}), ("c2", "hold_room", {"room": "1B"}))
    s.finish_tool("c1", output="held 1A")
    s.finish_tool("c2", output="held 1B")
    s.reply("held both")
    return s


def test_what_a_restart_decides_for_compensations_left_open() -> None:
    s = two_rooms_held()
    s.command(protocol.Compensate("c2", "k2"))  # runs: KEYED, executing when the crash comes
    s.command(protocol.Pause("p1"))
    s.command(protocol.Compensate("c1", "k1"))  # created while paused: not started
    step = s.restart()
    found = [
        (d.run_id, d.subject, d.found, d.action, d.reason)
        for d in step.records
        if isinstance(d, RecoveryDecision)
    ]
    assert found == [
        (
            "",
            "comp-c2",
            "executing",
            "re-run with the same idempotency key (policy keyed)",
            "recorded policy keyed, registered policy keyed",
        ),
        ("", "comp-c1", "compensation created", "run it", "not started"),
    ]
    executing = [r for r in step.records if type(r).__name__ == "ToolExecuting"]
    assert [(r.call_id, r.run_id) for r in executing] == [("comp-c2", "")]  # type: ignore[attr-defined]


def test_a_session_is_idle_once_its_compensations_finish_in_any_order() -> None:
    s = two_rooms_held()
    assert s.state.idle
    s.command(protocol.Compensate("c1", "k1"))
    s.command(protocol.Compensate("c2", "k2"))
    assert not s.state.idle
    assert [t.call_id for t in s.state.open_compensations()] == ["comp-c1", "comp-c2"]
    s.finish_tool("comp-c2", output="released 1B")
    assert not s.state.idle
    assert [t.call_id for t in s.state.open_compensations()] == ["comp-c1"]
    assert [t.compensated_by for t in (s.state.tasks["c1"], s.state.tasks["c2"])] == [
        "comp-c1",
        "comp-c2",
    ], "a finished compensation stays recorded on its call"
    s.finish_tool("comp-c1", output="released 1A")
    assert s.state.idle and s.state.open_compensations() == []
    notes = [item.text for item in s.state.conversation if type(item).__name__ == "Note"]
    assert [n.split("(")[1].split(")")[0] for n in notes[-2:]] == ["c2", "c1"]
    # The same from the log: a restart sees no compensation left to finish.
    s.restart()
    assert s.state.idle and s.state.open_compensations() == []


def test_a_run_finished_without_words_has_none() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "q"}))
    step = s.finish_tool("c1", output="the end", terminate=True)
    (done,) = only(step.records, RunFinished)
    assert (done.final_text, done.reason) == ("the end", "")
    s.command(protocol.Submit("r2", "again"))
    step, _ = s.command(protocol.Cancel("x1"))
    (cancelled,) = only(step.records, RunFinished)
    assert (cancelled.final_text, cancelled.reason) == ("", "cancelled by request")
