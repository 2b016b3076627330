"""Changes of course in the pure core: revisions, cancellation, compensation."""

from __future__ import annotations

import pytest

from perdure import errors
from perdure.actors import protocol
from perdure.storage.records import (
    CompensationRequested,
    GoalRevised,
    RecoveryDecision,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolTaskCreated,
)
from tests.core.sim import COURSE_TOOLS, Session, kinds, only


def ticket_opened() -> Session:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "open a ticket"))
    s.reply("x", ("c1", "create_ticket", {"title": "risk"}))
    s.finish_tool("c1", output="T-7")
    return s


def test_revision_lists_completed_actions_that_can_be_undone() -> None:
    s = ticket_opened()
    step, _ = s.command(protocol.Revise("v1", "just give me the report"))
    revised = only(step.records, GoalRevised)[0]
    assert revised.compensable == ["c1"]
    assert not only(step.records, CompensationRequested), "never automatic unless declared"


def test_compensation_is_its_own_task_with_its_own_key_and_approval() -> None:
    s = ticket_opened()
    s.command(protocol.Revise("v1", "just the report"))
    step, answer = s.command(protocol.Compensate("c1", "undo-1"))
    assert answer.ref == "comp-c1"
    assert kinds(step) == ["CompensationRequested", "ToolTaskCreated", "ToolAwaitingApproval"]
    created = only(step.records, ToolTaskCreated)[0]
    assert created.compensates == "c1"
    assert created.input == {"title": "risk", "result": "T-7"}
    step, _ = s.command(protocol.Approve("comp-c1", True, "ok"))
    executing = only(step.records, ToolExecuting)[0]
    original = s.state.tasks["c1"].executing
    assert original is not None
    assert executing.idempotency_key != original.idempotency_key
    assert executing.replay == "keyed"
    step = s.finish_tool("comp-c1", output="closed T-7")
    assert kinds(step) == ["ToolCompleted", "CompensationFinished"]
    assert "compensation of create_ticket" in s.state.conversation[-1].text  # type: ignore[union-attr]


def test_compensation_refusals() -> None:
    s = ticket_opened()
    s.reply("y", ("c2", "lookup", {"query": "q"}))
    s.finish_tool("c2")
    with pytest.raises(errors.Refused, match="declares no compensation"):
        s.command(protocol.Compensate("c2", "u2"))
    s.command(protocol.Compensate("c1", "u1"))
    with pytest.raises(errors.Refused, match="already compensated"):
        s.command(protocol.Compensate("c1", "u3"))
    with pytest.raises(errors.Refused, match="no tool call"):
        s.command(protocol.Compensate("nope", "u4"))


def test_same_compensate_request_id_is_deduplicated() -> None:
    s = ticket_opened()
    first, _ = s.command(protocol.Compensate("c1", "u1"))
    again, answer2 = s.command(protocol.Compensate("c1", "u1"))
    assert first
    assert not again
    assert answer2.duplicate


def test_automatic_compensation_runs_when_the_tool_says_it_is_safe() -> None:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "hold a seat"))
    s.reply("x", ("c1", "hold_seat", {"seat": "12A"}))
    s.finish_tool("c1")
    step, _ = s.command(protocol.Revise("v1", "no travel after all"))
    requested = only(step.records, CompensationRequested)
    assert [(r.call_id, r.automatic) for r in requested] == [("c1", True)]
    assert only(step.records, ToolExecuting), "dispatched at once (no approval declared)"


def test_cancel_lists_compensable_calls_of_the_run() -> None:
    s = ticket_opened()
    s.reply("next", ("c2", "lookup", {"query": "x"}))
    step, _ = s.command(protocol.Cancel("stop"))
    cancel = step.records[0]
    assert cancel.compensable == ["c1"]  # type: ignore[union-attr]


def test_compensation_interrupted_by_a_crash_is_recovered_by_policy() -> None:
    s = ticket_opened()
    s.command(protocol.Compensate("c1", "u1"))
    s.command(protocol.Approve("comp-c1", True, "ok"))
    step = s.restart()
    decisions = only(step.records, RecoveryDecision)
    assert any(d.subject == "comp-c1" for d in decisions)
    again = only(step.records, ToolExecuting)
    assert again
    assert again[0].attempt == 2, "the KEYED compensation re-runs with the same key"


def test_old_revision_safe_task_interrupted_is_not_re_run_after_restart() -> None:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "old"}))
    s.command(protocol.Revise("v1", "new"))
    step = s.restart()
    cancelled = only(step.records, ToolCancelled)
    assert [c.call_id for c in cancelled] == ["c1"]
    assert not only(step.records, ToolExecuting)
    assert not only(step.records, ToolCompleted)
