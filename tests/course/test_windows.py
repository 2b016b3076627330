"""Changes of course across real crashes: revisions, cancel, pause, terminating tools,
compensation. Each test drives a child runtime process (and kills it where the
window demands), then checks the log and the side-effect ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perdure.storage.records import (
    CompensationRequested,
    GenerationStarted,
    GoalRevised,
    RunFinished,
    RunStarted,
    ToolExecuting,
)
from tests.support.checker import assert_sound, read_log
from tests.support.ledger_tools import effects
from tests.support.procs import run_child


def records(plan: dict[str, Any], kind: type) -> list[Any]:
    return [c.record for c in read_log(Path(plan["log"])) if isinstance(c.record, kind)]


def tools_run(plan: dict[str, Any]) -> list[str]:
    return [e["tool"] for e in effects(Path(plan["workspace"]))]


def act(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "session": "s1", **fields}


def test_revision_racing_dispatch_queued_old_task_never_runs(make_plan: Any) -> None:
    script = [
        {
            "text": "plan",
            "tool_uses": [
                {"name": "slow_book", "input": {"item": "a", "seconds": 1.0}},
                {"name": "deploy", "input": {"target": "prod"}},
            ],
        },
        {"text": "revised answer"},
    ]
    plan = make_plan(
        script,
        actions=[
            act("wait_for", record="ToolAwaitingApproval"),
            act("revise", text="do not deploy", request_id="v1"),
        ],
    )
    outcome = run_child(plan).outcome("s1")
    assert outcome["final_text"] == "revised answer"
    assert "deploy" not in tools_run(plan), "a queued task of the old goal ran"
    assert tools_run(plan) == ["slow_book"], "the executing KEYED call was left to finish"
    revised_at = next(
        c.seq for c in read_log(Path(plan["log"])) if isinstance(c.record, GoalRevised)
    )
    later = [
        c.record
        for c in read_log(Path(plan["log"]))
        if isinstance(c.record, GenerationStarted) and c.seq > revised_at
    ]
    assert later and all(g.goal_rev == 1 for g in later)
    assert_sound(plan)


def test_revision_accepted_then_crash_restart_applies_it(make_plan: Any) -> None:
    script = [
        {"text": "plan", "tool_uses": [{"name": "deploy", "input": {"target": "prod"}}]},
        {"text": "revised answer"},
    ]
    plan = make_plan(
        script,
        actions=[
            act("wait_for", record="ToolAwaitingApproval"),
            act("revise", text="just report", request_id="v1"),
        ],
    )
    # commits: session, input, reply (awaiting approval), the revision -> killed.
    assert run_child(plan, fault="commit@4").killed
    assert len(records(plan, GoalRevised)) == 1
    outcome = run_child(plan).outcome("s1")
    assert outcome["final_text"] == "revised answer"
    assert tools_run(plan) == []
    assert len(records(plan, GoalRevised)) == 1, "the revision was not duplicated"
    assert_sound(plan)


def test_cancelled_run_is_not_resumed_after_a_crash(make_plan: Any) -> None:
    script = [
        {"text": "booking", "tool_uses": [{"name": "slow_book", "input": {"item": "x"}}]},
        {"text": "should never be reached"},
    ]
    plan = make_plan(
        script,
        actions=[act("wait_for", record="ToolExecuting"), act("cancel", request_id="stop")],
    )
    assert run_child(plan, fault="tool.after:slow_book").killed
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "cancelled"
    assert [r.resumed_from for r in records(plan, RunStarted)] == [None]
    assert tools_run(plan) == ["slow_book"], "the cancelled run's call was not re-run"
    assert_sound(plan)


def test_input_submitted_after_a_cancel_still_runs(make_plan: Any) -> None:
    script = [
        {"text": "looking", "tool_uses": [{"name": "slow_lookup", "input": {"query": "q"}}]},
        {"text": "second answer"},
    ]
    plan = make_plan(
        script,
        actions=[
            act("wait_for", record="ToolExecuting"),
            act("cancel", request_id="stop"),
            act("submit", text="something else", request_id="r-next"),
        ],
    )
    outcome = run_child(plan).outcome("s1")
    assert outcome["final_text"] == "second answer"
    statuses = [r.status for r in records(plan, RunFinished)]
    assert statuses == ["cancelled", "completed"]
    assert tools_run(plan) == [], "the SAFE lookup was stopped before its effect"
    assert_sound(plan)


def test_pause_survives_a_restart_and_resume_continues(make_plan: Any) -> None:
    script = [
        {"text": "x", "delay": 0.5, "tool_uses": [{"name": "lookup", "input": {"query": "q"}}]},
        {"text": "done"},
    ]
    plan = make_plan(script, actions=[act("pause", request_id="p1")])
    # commits: session, input, pause, reply (task created but not dispatched) -> killed
    assert run_child(plan, fault="commit@4").killed
    plan["actions"] = [act("state")]
    plan["wait"] = False
    (seen,) = [line for line in run_child(plan).lines if "state" in line]
    # Read once the restarted actor had recovered and handled the inputs sent again:
    # a dispatch would have committed its ToolExecuting before.
    assert seen["paused"] is True and list(seen["tasks"].values()) == ["created"], seen
    assert tools_run(plan) == [], "a paused session dispatched work after a restart"
    assert records(plan, ToolExecuting) == []
    plan["actions"] = [act("resume", request_id="go")]
    plan["wait"] = True
    outcome = run_child(plan).outcome("s1")
    assert outcome["final_text"] == "done"
    assert tools_run(plan) == ["lookup"]
    assert_sound(plan)


def test_terminating_tool_result_then_crash_is_not_continued(make_plan: Any) -> None:
    script = [
        {"text": "finishing", "tool_uses": [{"name": "finish", "input": {"answer": "42"}}]},
        {"text": "must not be asked"},
    ]
    plan = make_plan(script)
    # commits: session, input, reply + executing, result + run finished -> killed
    assert run_child(plan, fault="commit@4").killed
    second = run_child(plan)
    assert second.lines[0]["recovered"] == []
    assert second.outcome("s1")["final_text"] == "42"
    assert len(records(plan, RunStarted)) == 1
    assert len(records(plan, GenerationStarted)) == 1
    assert_sound(plan)


def test_compensation_after_a_revision_runs_once_with_its_own_key(make_plan: Any) -> None:
    script = [
        {"text": "opening", "tool_uses": [{"name": "open_ticket", "input": {"title": "t"}}]},
        {"text": "final", "delay": 1.0},
    ]
    plan = make_plan(
        script,
        actions=[
            act("wait_for", record="ToolCompleted"),
            act("revise", text="no ticket after all", request_id="v1"),
            act("compensate", call_id="toolu_001_1", request_id="undo-1"),
            act("wait_for", record="ToolAwaitingApproval"),
            act("approve", call_id="comp-toolu_001_1", request_id="ok-1"),
        ],
    )
    run_child(plan)
    ledger = effects(Path(plan["workspace"]))
    assert [e["tool"] for e in ledger] == ["open_ticket", "close_ticket"]
    assert ledger[0]["key"] != ledger[1]["key"], "the compensation has its own key"
    assert records(plan, GoalRevised)[0].compensable == ["toolu_001_1"]
    assert len(records(plan, CompensationRequested)) == 1
    # A restart changes nothing: the compensation is finished, never repeated.
    plan["actions"] = []
    run_child(plan)
    assert [e["tool"] for e in effects(Path(plan["workspace"]))] == ["open_ticket", "close_ticket"]
    assert_sound(plan)
