"""The pure decision core, tested as data in, data out: no trio, no threads, no disk.

A tiny driver (``Session``) plays the shell's role: it feeds commands and results
to ``decide``, keeps what would be committed, and folds it into the state.
"""

from __future__ import annotations

from typing import Any

import pytest
from attrs import evolve

import perdure
from perdure import errors
from perdure.actors import decide, protocol
from perdure.actors.state import SessionState
from perdure.providers.base import ModelReply
from perdure.storage.records import (
    ApprovalDecided,
    GenerationStarted,
    InputAccepted,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    RunStarted,
    ToolAwaitingApproval,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
    ToolTaskCreated,
)
from tests.core.sim import (
    TOOLS,
    Session,
    decide_committed,
    kinds,
    lookup,
    only,
    reconciles,
    runs,
    send,
)

# -- the agent loop --------------------------------------------------------------------


def test_submit_starts_the_run_and_asks_the_model_in_one_commit() -> None:
    s = Session()
    step, answer = s.command(protocol.Submit("r1", "hello"))
    assert kinds(step) == ["InputAccepted", "RunStarted", "GenerationStarted"]
    assert step.effects == (protocol.CallModel("in1.g1", 1),)
    assert answer == protocol.Accepted("in1", 0)


def test_same_request_id_same_body_is_a_duplicate_different_body_a_conflict() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "hello"))
    s.state.submissions["in1"].seq = 7  # as note_committed would do
    s.state.requests["r1"].seq = 7
    step, answer = s.command(protocol.Submit("r1", "hello"))
    assert not step and answer == protocol.Accepted("in1", 7, duplicate=True)
    with pytest.raises(errors.Refused) as info:
        s.command(protocol.Submit("r1", "something else"))
    assert info.value.code == "conflict"


def test_reply_tasks_and_dispatch_are_committed_together_before_any_effect() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("two", ("c1", "lookup", {"query": "a"}), ("c2", "send", {"text": "b"}))
    assert kinds(step) == [
        "GenerationCompleted",
        "ToolTaskCreated",
        "ToolTaskCreated",
        "ToolExecuting",
        "ToolExecuting",
    ]
    assert runs(step) == [("c1", 1), ("c2", 1)]
    assert [e.tool for e in step.effects if isinstance(e, protocol.RunTool)] == [lookup, send]
    executing = only(step.records, ToolExecuting)
    assert executing[0].args == {"query": "a", "limit": 3}, "effective args include defaults"
    assert executing[0].replay == "safe" and executing[1].replay == "never"
    assert executing[0].idempotency_key == decide.idempotency_key("s1", "in1", "c1")
    assert executing[0].tool_hash == lookup.definition_hash


def test_last_tool_result_and_next_turn_land_in_one_commit() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("two", ("c1", "lookup", {"query": "a"}), ("c2", "lookup", {"query": "b"}))
    assert kinds(s.finish_tool("c1")) == ["ToolCompleted"]
    step = s.finish_tool("c2")
    assert kinds(step) == ["ToolCompleted", "GenerationStarted"]
    assert step.effects == (protocol.CallModel("in1.g2", 1),)


def test_final_reply_finishes_the_run_and_starts_queued_input() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "first"))
    s.command(protocol.Submit("r2", "second"))
    assert s.state.queue == ["in2"]
    step = s.reply("answer one")
    assert kinds(step) == [
        "GenerationCompleted",
        "RunFinished",
        "RunStarted",
        "GenerationStarted",
    ]
    finished = only(step.records, RunFinished)[0]
    assert finished.status == "completed" and finished.final_text == "answer one"
    assert only(step.records, RunStarted)[0].submission_id == "in2"


def test_unknown_tool_and_invalid_arguments_become_error_results_not_crashes() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("x", ("c1", "nope", {}), ("c2", "lookup", {"query": 5, "extra": 1}))
    done = only(step.records, ToolCompleted)
    assert [d.kind for d in done] == ["unknown_tool", "invalid_args"]
    assert all(d.is_error for d in done)
    assert "no tool named 'nope'" in done[0].output
    assert "query: Input should be a valid string, got 5" in done[1].output
    assert "extra: unexpected field" in done[1].output
    assert not only(step.records, ToolExecuting), "nothing may execute"
    assert "GenerationStarted" in kinds(step), "the run continues"


def test_a_call_outside_the_sessions_grant_is_refused_at_dispatch_and_named() -> None:
    s = Session(tools={"lookup": TOOLS["lookup"]})  # the shell narrows env to the grant
    s.state.allowed_tools = frozenset({"lookup"})
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("x", ("c1", "send", {"text": "hi"}), ("c2", "lookup", {"query": "q"}))
    (refused,) = only(step.records, ToolCompleted)
    assert refused.call_id == "c1" and refused.kind == "not_granted" and refused.is_error
    assert refused.output == (
        "perdure: tool 'send' is not granted to this session (granted: lookup). Nothing was run."
    )
    assert [e.call_id for e in only(step.records, ToolExecuting)] == ["c2"], "granted runs"


def test_a_refusal_outside_the_grant_lists_every_granted_tool_or_none() -> None:
    for granted, said in ((("lookup", "send"), "lookup, send"), ((), "none")):
        s = Session(tools={name: TOOLS[name] for name in granted})  # narrowed to the grant
        s.state.allowed_tools = frozenset(granted)
        s.command(protocol.Submit("r1", "go"))
        step = s.reply("x", ("c1", "deploy", {"target": "prod"}))
        (refused,) = only(step.records, ToolCompleted)
        assert refused.output == (
            f"perdure: tool 'deploy' is not granted to this session (granted: {said}). "
            "Nothing was run."
        )


def test_approval_gate_then_approve_or_deny() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("x", ("c1", "deploy", {"target": "prod"}), ("c2", "deploy", {"target": "qa"}))
    assert len(only(step.records, ToolAwaitingApproval)) == 2
    assert not step.effects
    step, _ = s.command(protocol.Approve("c1", True, "a1"))
    assert kinds(step) == ["ApprovalDecided", "ToolExecuting"]
    step, _ = s.command(protocol.Approve("c2", False, "a2"))
    assert kinds(step) == ["ApprovalDecided", "ToolCompleted"]
    assert only(step.records, ToolCompleted)[0].kind == "denied"
    with pytest.raises(errors.Refused):
        s.command(protocol.Approve("c2", True, "a3"))


def test_retryable_model_error_persists_retry_pending_then_gives_up() -> None:
    s = Session(max_model_attempts=3, retry_base=1.0)
    s.command(protocol.Submit("r1", "go"))
    fail = dict(generation_id="in1.g1", error="overloaded", retryable=True, retry_after=5.0)
    step = s.result(protocol.ModelFailed(attempt=1, **fail))
    pending = only(step.records, RetryPending)[0]
    assert pending.not_before >= s.now + 5.0, "the server's retry-after is honoured"
    assert step.effects == (protocol.CallModel("in1.g1", 2, pending.not_before),)
    s.result(protocol.ModelFailed(attempt=2, **fail))
    step = s.result(protocol.ModelFailed(attempt=3, **fail))
    assert only(step.records, RunFinished)[0].status == "failed"


def test_fatal_model_error_fails_the_run_with_the_reason() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    step = s.result(
        protocol.ModelFailed(
            generation_id="in1.g1", attempt=1, error="bad request: x", retryable=False
        )
    )
    finished = only(step.records, RunFinished)[0]
    assert finished.status == "failed" and "bad request: x" in finished.reason


def test_terminating_tool_result_ends_the_run() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "a"}))
    step = s.finish_tool("c1", output="final answer", terminate=True)
    assert kinds(step) == ["ToolCompleted", "RunFinished"]
    assert only(step.records, RunFinished)[0].final_text == "final answer"


def test_turn_limit_fails_instead_of_looping() -> None:
    s = Session(max_turns=2)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "a"}))
    s.finish_tool("c1")
    s.reply("y", ("c2", "lookup", {"query": "b"}))
    step = s.finish_tool("c2")
    assert "limit of 2 model turns" in only(step.records, RunFinished)[0].reason


def test_duplicate_call_ids_from_a_provider_are_made_unique() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "a"}))
    s.finish_tool("c1")
    step = s.reply("y", ("c1", "lookup", {"query": "b"}))
    assert [t.call_id for t in only(step.records, ToolTaskCreated)] == ["c1_"]


# -- recovery ------------------------------------------------------------------------------


def executing_session(tool: str, args: dict[str, Any]) -> Session:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", tool, args))
    return s


def test_recover_safe_executing_re_runs_with_the_same_key_in_a_new_run() -> None:
    s = executing_session("lookup", {"query": "a"})
    key = s.state.tasks["c1"].executing.idempotency_key  # type: ignore[union-attr]
    step = s.restart()
    assert kinds(step)[:3] == ["RecoveryDecision", "RunFinished", "RunStarted"]
    again = only(step.records, ToolExecuting)[0]
    assert (again.attempt, again.idempotency_key, again.run_id) == (2, key, "in1.r1")
    assert only(step.records, RunFinished)[0].status == "interrupted"
    assert only(step.records, RunStarted)[0].resumed_from == "in1.r0"
    assert ("c1", 2) in runs(step)


def test_recover_never_executing_reports_unknown_and_continues() -> None:
    s = executing_session("send", {"text": "hi"})
    step = s.restart()
    unknown = only(step.records, ToolOutcomeUnknown)[0]
    assert "UNKNOWN" in unknown.output and "not re-run" in unknown.output
    assert not only(step.records, ToolExecuting)
    assert only(step.records, GenerationStarted), "the model is woken with the truth"


def test_recover_never_with_reconcile_asks_it() -> None:
    s = executing_session("send_checked", {"text": "hi"})
    step = s.restart()
    assert "c1" in reconciles(step)
    assert not only(step.records, ToolOutcomeUnknown)
    step = s.result(protocol.ReconcileFinished(call_id="c1", status="not_applied"))
    assert only(step.records, ToolExecuting)[0].attempt == 2


def test_a_reconciled_result_keeps_its_error_flag() -> None:
    s = executing_session("send_checked", {"text": "hi"})
    s.restart()
    step = s.result(
        protocol.ReconcileFinished(call_id="c1", status="applied", output="boom", is_error=True)
    )
    done = only(step.records, ToolCompleted)[0]
    assert (done.kind, done.output, done.is_error, done.terminate) == (
        "reconciled",
        "boom",
        True,
        False,
    )
    assert only(step.records, GenerationStarted), "the model reads the error and goes on"


def test_a_reconciled_result_that_ends_the_run_ends_it() -> None:
    s = executing_session("send_checked", {"text": "hi"})
    s.restart()
    step = s.result(
        protocol.ReconcileFinished(call_id="c1", status="applied", output="final", terminate=True)
    )
    assert kinds(step)[-2:] == ["ToolCompleted", "RunFinished"]
    finished = only(step.records, RunFinished)[0]
    assert (finished.status, finished.final_text) == ("completed", "final")


def test_recover_needs_both_policies_to_allow_a_re_run() -> None:
    s = executing_session("lookup", {"query": "a"})
    now_never = perdure.tool(name="lookup", replay=perdure.ReplayPolicy.NEVER)(lookup.fn)
    s.tools = {**TOOLS, "lookup": now_never}
    step = s.restart()
    assert only(step.records, ToolOutcomeUnknown)
    assert not only(step.records, ToolExecuting)


def test_recovery_is_deterministic_so_a_lost_recovery_commit_is_redone_identically() -> None:
    s = executing_session("send", {"text": "hi"})
    base = list(s.log)
    first = s.restart()
    s.log = list(base)  # the recovery commit never reached the disk
    second = s.restart()
    assert first.records == second.records


def test_resume_budget_counts_resumes_without_progress() -> None:
    s = Session(resume_budget=2)
    s.command(protocol.Submit("r1", "go"))  # model request in flight, never answered
    attempts = []
    for _ in range(2):
        step = s.restart()
        attempts += [r.resume_attempt for r in only(step.records, RunStarted)]
    assert attempts == [1, 2]
    step = s.restart()
    finished = only(step.records, RunFinished)
    assert finished[-1].status == "failed" and "resume budget 2" in finished[-1].reason


def test_progress_restarts_the_resume_count() -> None:
    s = Session(resume_budget=1)
    s.command(protocol.Submit("r1", "go"))
    s.restart()  # attempt 1
    s.reply("x", ("c1", "lookup", {"query": "a"}))  # progress within in1.r1
    step = s.restart()
    assert only(step.records, RunStarted)[0].resume_attempt == 1


def test_quiescent_run_waiting_for_approval_is_not_resumed() -> None:
    s = executing_session("deploy", {"target": "prod"})
    step = s.restart()
    assert kinds(step) == ["RecoveryDecision"]
    assert "awaiting approval" in only(step.records, RecoveryDecision)[0].found


def test_finished_session_recovers_to_nothing() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("done")
    assert not s.restart()


# -- changes of course ------------------------------------------------------------------------


def test_cancel_stops_pending_work_and_finishes_cancelled() -> None:
    s = executing_session("deploy", {"target": "prod"})
    step, _ = s.command(protocol.Cancel("c"))
    assert kinds(step) == ["CancelRequested", "ToolCancelled", "RunFinished"]
    assert only(step.records, RunFinished)[0].status == "cancelled"


def test_cancel_waits_for_a_non_cancellable_executing_tool() -> None:
    s = executing_session("send", {"text": "hi"})
    step, _ = s.command(protocol.Cancel("c"))
    assert kinds(step) == ["CancelRequested"] and not step.effects
    step = s.finish_tool("c1")
    assert kinds(step) == ["ToolCompleted", "RunFinished"]


def test_revision_cancels_old_tasks_before_dispatch_and_restarts_the_turn() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.command(protocol.Pause("p"))
    s.reply("x", ("c1", "send", {"text": "old plan"}))  # created, not dispatched: paused
    step, answer = s.command(protocol.Revise("v", "new plan"))
    assert answer.ref == "1"
    assert kinds(step) == ["GoalRevised", "ToolCancelled"]
    step, _ = s.command(protocol.Resume("u"))
    started = only(step.records, GenerationStarted)
    assert started and started[0].goal_rev == 1


def test_stale_model_reply_of_an_old_revision_is_discarded() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.command(protocol.Revise("v", "new"))
    assert s.state.current_generation().generation_id == "in1.g2"  # type: ignore[union-attr]
    stale = protocol.ModelReplied("in1.g1", 1, ModelReply(text="old"))
    assert not decide.on_result(s.state, s.env(), stale)


def test_late_result_of_an_old_revision_is_recorded_as_stale() -> None:
    s = executing_session("send", {"text": "hi"})
    s.command(protocol.Revise("v", "new"))
    step = s.finish_tool("c1")
    assert kinds(step)[0] == "ToolCompleted"
    assert s.state.tasks["c1"].stale
    started = only(step.records, GenerationStarted)
    assert started and started[0].goal_rev == 1


def test_pause_dispatches_nothing_new_and_resume_continues() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.command(protocol.Pause("p"))
    step = s.reply("x", ("c1", "lookup", {"query": "a"}))
    assert kinds(step) == ["GenerationCompleted", "ToolTaskCreated"]
    step, _ = s.command(protocol.Resume("u"))
    assert kinds(step) == ["SessionResumed", "ToolExecuting"]


def test_revise_without_a_run_is_refused() -> None:
    s = Session()
    with pytest.raises(errors.Refused):
        s.command(protocol.Revise("v", "x"))


def test_records_of_one_decision_fold_to_the_same_state_as_a_replay() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "lookup", {"query": "a"}), ("c2", "deploy", {"target": "p"}))
    s.command(protocol.Approve("c2", True, "a"))
    s.finish_tool("c1")
    live = s.state
    replayed = SessionState.fold("s1", [decide_committed(i, r) for i, r in enumerate(s.log, 1)])
    assert replayed.tasks.keys() == live.tasks.keys()
    assert [t.phase for t in replayed.tasks.values()] == [t.phase for t in live.tasks.values()]
    assert replayed.conversation == live.conversation
    assert only(s.log, ApprovalDecided) and only(s.log, InputAccepted)


def test_usage_of_a_final_failed_attempt_is_kept() -> None:
    from perdure.storage.records import Usage

    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.result(
        protocol.ModelFailed(
            generation_id="in1.g1",
            attempt=1,
            error="cut",
            retryable=False,
            usage=Usage(input_tokens=7, output_tokens=2),
        )
    )
    assert s.state.usage == Usage(input_tokens=7, output_tokens=2)
    assert s.state.runs["in1.r0"].usage.output_tokens == 2


def test_paused_session_does_not_start_queued_input() -> None:
    s = Session()
    s.command(protocol.Pause("p"))
    step, _ = s.command(protocol.Submit("r1", "go"))
    assert kinds(step) == ["InputAccepted"], "no run, no model call while paused"
    step, _ = s.command(protocol.Resume("u"))
    assert kinds(step) == ["SessionResumed", "RunStarted", "GenerationStarted"]


@pytest.mark.parametrize("tool", ["lookup", "send"])
def test_a_tool_that_cannot_tell_is_recorded_as_unknown_whatever_its_policy(tool: str) -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    args = {"query": "a"} if tool == "lookup" else {"text": "b"}
    s.reply("one", ("c1", tool, args))
    step = s.finish_tool("c1", output="the connection broke mid-call", outcome="unknown")
    assert kinds(step)[0] == "ToolOutcomeUnknown"
    unknown = only(step.records, ToolOutcomeUnknown)[0]
    assert "the connection broke mid-call" in unknown.reason
    assert "UNKNOWN" in unknown.output
    assert not only(step.records, ToolCompleted)


# -- the audit's promises: each test fails if its promise is broken ---------------------------


def test_recover_never_re_runs_a_call_recorded_never_even_if_its_tool_is_safe_now() -> None:
    s = executing_session("send", {"text": "hi"})
    now_safe = perdure.tool(name="send", replay=perdure.ReplayPolicy.SAFE)(send.fn)
    s.tools = {**TOOLS, "send": now_safe}
    step = s.restart()
    assert not only(step.records, ToolExecuting), "recorded NEVER: never re-run blindly"
    assert not runs(step)
    assert only(step.records, ToolOutcomeUnknown)
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1")
    assert "recorded policy never, registered policy safe" in decision.reason


@pytest.mark.parametrize(
    ("tool", "args", "recorded"),
    [("send", {"text": "hi"}, ToolOutcomeUnknown), ("lookup", {"query": "a"}, ToolCompleted)],
)
def test_a_timeout_is_an_unknown_outcome_only_for_a_never_tool(
    tool: str, args: dict[str, Any], recorded: type
) -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.reply("one", ("c1", tool, args))
    step = s.finish_tool("c1", output="timed out after 5s", outcome="timeout")
    assert kinds(step)[0] == recorded.__name__
    if recorded is ToolOutcomeUnknown:
        assert only(step.records, ToolOutcomeUnknown)[0].reason == "timeout"
    else:
        done = only(step.records, ToolCompleted)[0]
        assert (done.kind, done.is_error) == ("timeout", True)


def test_the_fingerprint_names_the_tool_its_definition_and_the_arguments() -> None:
    base = decide.fingerprint(lookup, {"query": "a", "limit": 3})
    assert base == decide.fingerprint(lookup, {"limit": 3, "query": "a"}), "canonical"
    assert base != decide.fingerprint(lookup, {"query": "b", "limit": 3})
    assert base != decide.fingerprint(send, {"query": "a", "limit": 3})
    changed = perdure.tool(name="lookup", replay=perdure.ReplayPolicy.SAFE, version="2")(lookup.fn)
    assert base != decide.fingerprint(changed, {"query": "a", "limit": 3})


def test_a_safe_call_whose_tool_changed_is_re_run_only_if_its_arguments_still_fit() -> None:
    s = executing_session("lookup", {"query": "a"})
    executing = s.state.tasks["c1"].executing
    assert executing is not None
    assert executing.fingerprint == decide.fingerprint(lookup, executing.args)
    v2 = perdure.tool(name="lookup", replay=perdure.ReplayPolicy.SAFE, version="2")(lookup.fn)
    s.tools = {**TOOLS, "lookup": v2}
    step = s.restart()
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1")
    assert "definition changed" in decision.reason and "still fit" in decision.reason
    assert f"{lookup.definition_hash} -> {v2.definition_hash}" in decision.reason
    assert runs(step) == [("c1", 2)]
    assert only(step.records, ToolExecuting)[0].tool_hash == v2.definition_hash


def test_a_call_whose_tool_changed_and_no_longer_fits_is_not_re_run() -> None:
    s = executing_session("lookup", {"query": "a"})

    async def lookup_v2(topic: str) -> str:
        """Look up by topic."""
        return topic

    v2 = perdure.tool(name="lookup", replay=perdure.ReplayPolicy.SAFE)(lookup_v2)
    s.tools = {**TOOLS, "lookup": v2}
    step = s.restart()
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1")
    assert "definition changed" in decision.reason and "no longer fit" in decision.reason
    assert not runs(step) and not only(step.records, ToolExecuting)
    assert only(step.records, ToolOutcomeUnknown)


def test_an_unchanged_tool_is_re_run_without_mention_of_a_change() -> None:
    s = executing_session("lookup", {"query": "a"})
    step = s.restart()
    decision = next(d for d in only(step.records, RecoveryDecision) if d.subject == "c1")
    assert "definition" not in decision.reason
    assert runs(step) == [("c1", 2)]


# -- forget: a settled call's reconcile state goes, once, and never for what recovery settles ------


async def _reconcile_unknown(ctx: perdure.ToolContext, text: str) -> perdure.Reconciled:
    return perdure.Reconciled.unknown()


async def _forget_nothing(ctx: perdure.ToolContext) -> None:
    return None


@perdure.tool(
    replay=perdure.ReplayPolicy.NEVER, reconcile=_reconcile_unknown, forget=_forget_nothing
)
async def note(text: str) -> str:
    """Write a note (keeps reconcile state until settled)."""
    return text


def forgets(step: protocol.Step) -> list[str]:
    return [e.executing.call_id for e in step.effects if isinstance(e, protocol.Forget)]


def test_a_settled_call_is_forgotten_once_its_result_is_committed() -> None:
    s = Session(tools={**TOOLS, "note": note}, forget_settled=True)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "note", {"text": "a"}), ("c2", "lookup", {"query": "b"}))
    step = s.finish_tool("c1")
    assert forgets(step) == ["c1"], "the terminal record and its Forget go in one step"
    assert forgets(s.finish_tool("c2")) == [], "lookup keeps no state"


def test_nothing_is_forgotten_without_full_durability() -> None:
    s = Session(tools={**TOOLS, "note": note}, forget_settled=False)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "note", {"text": "a"}))
    assert forgets(s.finish_tool("c1")) == []


def test_what_recovery_settles_is_not_forgotten_but_a_reconciled_result_is() -> None:
    s = Session(tools={**TOOLS, "note": note}, forget_settled=True)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "note", {"text": "a"}))
    step = s.restart()
    assert reconciles(step) == ["c1"] and forgets(step) == []
    step = s.result(protocol.ReconcileFinished(call_id="c1", status="applied", output="a"))
    assert forgets(step) == ["c1"]
    s2 = Session(tools={"note": evolve(note, reconcile=None)}, forget_settled=True)
    s2.command(protocol.Submit("r1", "go"))
    s2.reply("x", ("c1", "note", {"text": "a"}))
    step = s2.restart()
    assert only(step.records, ToolOutcomeUnknown) and forgets(step) == []
