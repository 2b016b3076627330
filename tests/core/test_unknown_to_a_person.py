"""The rows for a tool that sends an unknown outcome to a person (``unknown_outcome=
"ask_person"``), proven as data in, data out.

An interrupted NEVER call, a NEVER timeout, a tool that cannot tell, and a reconcile
answering unknown each become a durable wait for a person (``ToolAwaitingHuman`` with
``unknown_outcome``) instead of ``ToolOutcomeUnknown``; the person's three answers
(applied: ``skip`` with the result; not applied: ``retry``, same key; failed: ``fail``)
settle it; a restart keeps waiting; a cancel or a revision that calls the call off
keeps its outcome unknown for the model. A tool without the option is unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest

import perdure
from perdure.actors import protocol
from perdure.actors.decide.verbs import ASK_A_PERSON
from perdure.actors.protocol import Step
from perdure.actors.readmodel import session_view
from perdure.storage.records import (
    RecoveryDecision,
    ToolAwaitingHuman,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
)
from tests.core.sim import TOOLS, Session, kinds, only, reconciles, runs


@perdure.tool(replay=perdure.ReplayPolicy.NEVER, unknown_outcome="ask_person")
async def wire(amount: int) -> str:
    """Wire money (a person says what happened when perdure cannot know)."""
    return str(amount)


async def _cannot_tell(ctx: perdure.ToolContext, amount: int) -> perdure.Reconciled:
    return perdure.Reconciled.unknown("the bank's status page is down")


@perdure.tool(
    name="wire_checked",
    replay=perdure.ReplayPolicy.NEVER,
    reconcile=_cannot_tell,
    unknown_outcome="ask_person",
)
async def wire_checked(amount: int) -> str:
    """Wire money, asking the bank first after a crash."""
    return str(amount)


@perdure.tool(replay=perdure.ReplayPolicy.NEVER)
async def wire_plain(amount: int) -> str:
    """Wire money (an unknown outcome is told to the model)."""
    return str(amount)


ASKING = {**TOOLS, **{t.name: t for t in (wire, wire_checked, wire_plain)}}


def interrupted(tool: str = "wire") -> tuple[Session, Step]:
    """A call of ``tool`` was executing when the process died; the next one recovers."""
    s = Session(ASKING)
    s.command(protocol.Submit("r1", "pay the invoice"))
    s.reply("paying", ("c1", tool, {"amount": 5}))
    assert s.state.tasks["c1"].phase == "executing"
    return s, s.restart()


def decision_for(step: Step, subject: str) -> RecoveryDecision:
    return next(d for d in only(step.records, RecoveryDecision) if d.subject == subject)


def test_an_interrupted_never_call_waits_for_a_person_instead_of_telling_the_model() -> None:
    s, step = interrupted()
    assert not only(step.records, ToolOutcomeUnknown)
    waiting = only(step.records, ToolAwaitingHuman)
    assert [(w.call_id, w.attempt, w.unknown_outcome) for w in waiting] == [("c1", 1, True)]
    assert waiting[0].reason == (
        "its outcome is unknown: interrupted before its result was saved; not re-run"
    )
    decision = decision_for(step, "c1")
    assert (decision.found, decision.action) == ("executing", ASK_A_PERSON)
    assert "no reconcile" in decision.reason
    assert not runs(step), "nothing runs while the person decides"
    task = s.state.tasks["c1"]
    assert (task.phase, task.unknown_outcome) == ("awaiting_human", True)
    assert session_view(s.state).awaiting_human == ("c1",)


def test_a_tool_without_the_option_still_tells_the_model() -> None:
    _, step = interrupted("wire_plain")
    assert not only(step.records, ToolAwaitingHuman)
    assert [u.call_id for u in only(step.records, ToolOutcomeUnknown)] == ["c1"]
    assert decision_for(step, "c1").action == "report outcome unknown"


def test_a_restart_keeps_waiting_and_says_for_what() -> None:
    s, _ = interrupted()
    step = s.restart()
    decision = only(step.records, RecoveryDecision)[0]
    assert (decision.found, decision.action) == (
        "awaiting a person to say whether c1 took effect",
        "keep waiting",
    )
    assert not runs(step) and not only(step.records, ToolOutcomeUnknown)
    assert s.state.tasks["c1"].phase == "awaiting_human"


def test_a_restart_with_other_work_in_flight_names_the_wait_on_the_call() -> None:
    s = Session(ASKING)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}), ("c2", "lookup", {"query": "q"}))
    s.finish_tool("c1", output="no answer", outcome="timeout")
    step = s.restart()  # c2 was in flight: the run resumes, c1 keeps waiting
    decision = decision_for(step, "c1")
    assert (decision.found, decision.action, decision.reason) == (
        "awaiting a person (outcome unknown)",
        "keep waiting to " + ASK_A_PERSON,
        "its outcome is unknown: timeout (no answer)",
    )
    assert runs(step) == [("c2", 2)]


def test_not_applied_runs_the_call_once_more_with_the_same_key() -> None:
    s, _ = interrupted()
    key = s.state.tasks["c1"].executing.idempotency_key  # type: ignore[union-attr]
    step, answer = s.command(protocol.Resolve("c1", "retry", "h1"))
    assert answer == protocol.Done("c1")
    assert kinds(step)[:2] == ["ResolutionDecided", "ToolExecuting"]
    assert runs(step) == [("c1", 2)]
    assert only(step.records, ToolExecuting)[0].idempotency_key == key
    done = s.finish_tool("c1", output="wired 5")
    assert only(done.records, ToolCompleted)[0].output == "wired 5"


def test_applied_records_the_result_the_person_states_and_the_run_goes_on() -> None:
    s, _ = interrupted()
    step, _ = s.command(protocol.Resolve("c1", "skip", "h1", result={"wired": 5, "ref": "B-7"}))
    done = only(step.records, ToolCompleted)
    assert [(d.call_id, d.kind, d.is_error) for d in done] == [("c1", "resolved", False)]
    assert done[0].output == '{"wired": 5, "ref": "B-7"}'
    assert not runs(step), "applied: nothing runs again"
    assert "GenerationStarted" in kinds(step), "the model continues with the stated result"


def test_failed_tells_the_model_the_person_checked_and_it_failed() -> None:
    s, _ = interrupted()
    step, _ = s.command(protocol.Resolve("c1", "fail", "h1", result="the bank rejected it"))
    done = only(step.records, ToolCompleted)[0]
    assert done.is_error and done.kind == "resolved"
    assert done.output == (
        "perdure: this call's outcome was unknown (its outcome is unknown: interrupted "
        "before its result was saved; not re-run); a person checked and said it failed. "
        "They said: the bank rejected it"
    )
    assert not runs(step)


def test_a_never_timeout_waits_for_a_person() -> None:
    s = Session(ASKING)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}))
    step = s.finish_tool("c1", output="no answer in 30s", outcome="timeout")
    waiting = only(step.records, ToolAwaitingHuman)
    assert [(w.reason, w.unknown_outcome) for w in waiting] == [
        ("its outcome is unknown: timeout (no answer in 30s)", True)
    ]
    assert not only(step.records, ToolOutcomeUnknown)
    assert "GenerationStarted" not in kinds(step), "the run waits for the person"


def test_a_tool_that_cannot_tell_waits_for_a_person() -> None:
    s = Session(ASKING)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}))
    step = s.finish_tool("c1", output="the bank timed out mid-transfer", outcome="unknown")
    waiting = only(step.records, ToolAwaitingHuman)
    assert [w.reason for w in waiting] == [
        "its outcome is unknown: the tool could not tell: the bank timed out mid-transfer"
    ]


def test_a_reconcile_answering_unknown_waits_for_a_person_after_it_was_asked() -> None:
    s, step = interrupted("wire_checked")
    assert reconciles(step) == ["c1"], "the tool's own check comes first"
    assert not only(step.records, ToolAwaitingHuman)
    report = protocol.ReconcileFinished(
        call_id="c1", status="unknown", reason="the bank's status page is down"
    )
    step = s.result(report)
    waiting = only(step.records, ToolAwaitingHuman)
    assert [w.reason for w in waiting] == [
        "its outcome is unknown: reconcile: the bank's status page is down"
    ]
    decision = only(step.records, RecoveryDecision)[0]
    assert (decision.found, decision.action) == ("reconcile answered unknown", ASK_A_PERSON)


def test_a_reconcile_that_knows_is_believed_and_nobody_is_asked() -> None:
    s, _ = interrupted("wire_checked")
    step = s.result(protocol.ReconcileFinished(call_id="c1", status="applied", output="wired"))
    assert not only(step.records, ToolAwaitingHuman)
    assert only(step.records, ToolCompleted)[0].kind == "reconciled"


@pytest.mark.parametrize(
    "change",
    [protocol.Cancel("x1"), protocol.Revise("v1", "pay half the invoice")],
    ids=["cancel", "revision"],
)
def test_a_call_off_keeps_the_outcome_unknown_for_the_model(change: Any) -> None:
    s, _ = interrupted()
    step, _ = s.command(change)
    assert not only(step.records, ToolCancelled), "never 'it did not run': it may have"
    unknown = only(step.records, ToolOutcomeUnknown)
    assert [u.call_id for u in unknown] == ["c1"]
    assert "UNKNOWN" in unknown[0].output
    assert "waiting for a person to say whether it took effect" in unknown[0].output
    assert unknown[0].reason.startswith("called off while waiting for a person: ")
    assert s.state.tasks["c1"].phase == "outcome_unknown"


def test_a_timeout_while_the_run_is_cancelled_is_told_to_the_model_not_held() -> None:
    s = Session(ASKING)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}))
    s.command(protocol.Cancel("x1"))
    step = s.finish_tool("c1", output="no answer", outcome="timeout")
    assert not only(step.records, ToolAwaitingHuman)
    assert [u.reason for u in only(step.records, ToolOutcomeUnknown)] == ["timeout"]


def test_a_run_given_up_at_a_restart_keeps_a_waiting_outcome_unknown() -> None:
    s = Session(ASKING)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}), ("c2", "lookup", {"query": "q"}))
    s.finish_tool("c1", output="no answer", outcome="timeout")
    assert s.state.tasks["c1"].phase == "awaiting_human"
    step = s.restart(resume_budget=0)  # c2 was in flight: the run is given up
    unknown = only(step.records, ToolOutcomeUnknown)
    assert [u.call_id for u in unknown] == ["c1", "c2"]
    assert unknown[0].reason == "called off while waiting for a person: the run was given up"
    assert s.state.last_outcome is not None and s.state.last_outcome.status == "failed"


def test_a_tool_gone_at_the_restart_is_unknown_nobody_can_run_it_again() -> None:
    s = Session(ASKING)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}))
    s.tools = TOOLS
    step = s.restart()
    assert not only(step.records, ToolAwaitingHuman)
    assert [u.call_id for u in only(step.records, ToolOutcomeUnknown)] == ["c1"]


def test_the_options_are_checked_when_the_tool_is_declared() -> None:
    with pytest.raises(ValueError, match="unknown_outcome must be one of tell_model, ask_person"):
        perdure.tool(unknown_outcome="ask_someone")(wire_plain.fn)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="depends_on_goal=True needs replay=SAFE"):
        perdure.tool(replay=perdure.ReplayPolicy.KEYED, depends_on_goal=True)(wire_plain.fn)
    assert perdure.tool(wire_plain.fn).unknown_outcome == "tell_model", "the default"


def test_a_timeout_of_a_call_the_request_was_revised_past_is_told_to_the_model() -> None:
    s = Session(ASKING)
    s.command(protocol.Submit("r1", "pay"))
    s.reply("paying", ("c1", "wire", {"amount": 5}))
    s.command(protocol.Revise("v1", "pay half"))  # the NEVER call is left to finish
    step = s.finish_tool("c1", output="no answer", outcome="timeout")
    assert not only(step.records, ToolAwaitingHuman), "a revision would call the wait off"
    assert [u.reason for u in only(step.records, ToolOutcomeUnknown)] == ["timeout"]
