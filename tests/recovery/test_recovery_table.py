"""Every row of the recovery table (docs/DESIGN.md), with a real process killed at that point.

Each test runs the runtime in a child process with a PERDURE_FAULT that SIGKILLs
it in one crash window, starts a fresh child on the same log (which re-submits the
same inputs with the same request ids, as a retrying caller would), and then
checks what recovery decided and every invariant of docs/DESIGN.md via the checker.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from perdure.storage.records import (
    GenerationCompleted,
    InputAccepted,
    RecoveryDecision,
    RetryPending,
    RunFinished,
    RunStarted,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
)
from tests.support.checker import assert_sound, read_log
from tests.support.ledger_tools import effects
from tests.support.procs import run_child


def records(plan: dict[str, Any], kind: type) -> list[Any]:
    return [c.record for c in read_log(Path(plan["log"])) if isinstance(c.record, kind)]


def note_then_done(tool: str = "send_note", **tool_input: Any) -> list[dict[str, Any]]:
    args = tool_input or {"text": "hello"}
    return [
        {"text": "working", "tool_uses": [{"name": tool, "input": args}]},
        {"text": "all done"},
    ]


def crash_and_restart(plan: dict[str, Any], fault: str) -> dict[str, Any]:
    first = run_child(plan, fault=fault)
    assert first.killed, f"the fault {fault} never fired:\n{first.stderr}"
    second = run_child(plan)
    return second.outcome("s1")


def test_crash_before_input_accepted_caller_retries(make_plan: Any) -> None:
    plan = make_plan(note_then_done())
    # commit 1 is the session's creation; the input was never accepted.
    outcome = crash_and_restart(plan, "commit@1")
    assert outcome["status"] == "completed"
    assert len(records(plan, InputAccepted)) == 1
    assert len(effects(Path(plan["workspace"]))) == 1
    assert_sound(plan)


def test_crash_after_input_accepted_before_the_model_is_called(make_plan: Any) -> None:
    plan = make_plan(note_then_done())
    # commit 2: input accepted, run started, first model request marked in flight.
    outcome = crash_and_restart(plan, "commit@2")
    assert outcome["status"] == "completed"
    assert len(records(plan, InputAccepted)) == 1, "the retried request was accepted twice"
    decisions = records(plan, RecoveryDecision)
    assert any(d.found == "model request in flight" for d in decisions)
    assert_sound(plan)


def test_model_reply_received_but_not_committed(make_plan: Any) -> None:
    plan = make_plan(note_then_done())
    outcome = crash_and_restart(plan, "model.after")
    assert outcome["status"] == "completed"
    assert len(records(plan, GenerationCompleted)) == 2
    assert len(effects(Path(plan["workspace"]))) == 1
    assert_sound(plan)


def test_crash_during_retry_back_off_still_retries(make_plan: Any) -> None:
    script = note_then_done()
    script[0].update(fail_attempts=1, retry_after=4.0)
    plan = make_plan(script)
    # commit 3 is the RetryPending record, persisted before the back-off sleep.
    first = run_child(plan, fault="commit@3")
    assert first.killed, first.stderr
    # The restart comes a while after the crash, as a deploy would: long enough that a
    # back-off restarted from scratch, or ignored, would be told apart from one resumed.
    time.sleep(1.5)
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "completed"
    pending = records(plan, RetryPending)
    assert len(pending) == 1 and pending[0].attempt == 1
    first_reply = records(plan, GenerationCompleted)[0]
    assert first_reply.attempt == 2, "the retry after restart is attempt 2"
    resumed = next(d for d in records(plan, RecoveryDecision) if d.found == "retry back-off")
    gap = resumed.at - pending[0].at  # how long the process was down (>= 1.5 s)
    assert gap >= 1.5
    # The retry waits for the recorded time: not earlier (the back-off was honoured) ...
    assert first_reply.at >= pending[0].not_before
    # ... and not a whole back-off after the restart (the time already waited counts).
    assert first_reply.at - pending[0].not_before < gap / 2
    assert_sound(plan)


def test_awaiting_approval_survives_and_runs_once_after_approval(make_plan: Any) -> None:
    plan = make_plan(note_then_done("deploy", target="prod"))
    # commit 3: the reply with a task that waits for approval. Then the process dies.
    first = run_child(plan, fault="commit@3")
    assert first.killed
    plan["actions"] = [
        {"kind": "approve", "session": "s1", "call_id": "toolu_001_1", "request_id": "ok-1"}
    ]
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "completed"
    assert [e["tool"] for e in effects(Path(plan["workspace"]))] == ["deploy"]
    assert any("awaiting approval" in d.found for d in records(plan, RecoveryDecision))
    assert_sound(plan)


def test_safe_tool_executing_is_re_run(make_plan: Any) -> None:
    plan = make_plan(note_then_done("lookup", query="weather"))
    outcome = crash_and_restart(plan, "tool.after:lookup")
    assert outcome["status"] == "completed"
    runs = effects(Path(plan["workspace"]))
    assert len(runs) == 2 and runs[0]["key"] == runs[1]["key"]
    assert [r.attempt for r in records(plan, ToolExecuting)] == [1, 2]
    assert records(plan, ToolCompleted)[0].output == "found: weather"
    assert_sound(plan)


def test_keyed_tool_is_re_run_with_the_same_key(make_plan: Any) -> None:
    plan = make_plan(note_then_done("book", item="room"))
    crash_and_restart(plan, "tool.after:book")
    keys = {e["key"] for e in effects(Path(plan["workspace"]))}
    assert len(keys) == 1
    executing = records(plan, ToolExecuting)
    assert {e.idempotency_key for e in executing} == keys
    assert_sound(plan)


def test_never_tool_executing_reports_unknown_and_is_not_re_run(make_plan: Any) -> None:
    plan = make_plan(note_then_done())
    outcome = crash_and_restart(plan, "tool.after:send_note")
    assert outcome["status"] == "completed"
    assert len(effects(Path(plan["workspace"]))) == 1
    unknown = records(plan, ToolOutcomeUnknown)
    assert len(unknown) == 1 and "UNKNOWN" in unknown[0].output
    report = assert_sound(plan)
    assert report.counts["unknown_stated"] == 1


def test_never_tool_killed_before_its_effect_is_still_unknown(make_plan: Any) -> None:
    # The executing record is durable, so the runtime cannot know the effect did not
    # happen; without a reconcile it must say "unknown" rather than guess.
    plan = make_plan(note_then_done())
    crash_and_restart(plan, "tool.before:send_note")
    assert effects(Path(plan["workspace"])) == []
    assert len(records(plan, ToolOutcomeUnknown)) == 1
    assert_sound(plan)


def test_reconcile_confirms_an_applied_effect(make_plan: Any) -> None:
    plan = make_plan(note_then_done("send_note_reconciled"))
    crash_and_restart(plan, "tool.after:send_note_reconciled")
    assert len(effects(Path(plan["workspace"]))) == 1
    done = records(plan, ToolCompleted)
    assert len(done) == 1 and done[0].kind == "reconciled"
    assert_sound(plan)


def test_reconcile_not_applied_runs_exactly_once_more(make_plan: Any) -> None:
    plan = make_plan(note_then_done("send_note_reconciled"))
    crash_and_restart(plan, "tool.before:send_note_reconciled")
    runs = effects(Path(plan["workspace"]))
    assert len(runs) == 1 and runs[0]["attempt"] == 2
    assert_sound(plan)


def test_finished_run_is_never_resumed(make_plan: Any) -> None:
    plan = make_plan(note_then_done())
    run_child(plan)
    before = len(read_log(Path(plan["log"])))
    second = run_child(plan)
    assert second.lines[0]["recovered"] == []
    after = read_log(Path(plan["log"]))
    # Only the new owner's LogOpened record was added: no run, no decision.
    assert len(after) == before + 1
    assert len(records(plan, RunStarted)) == 1
    assert_sound(plan)


def test_same_request_id_twice_is_one_run(make_plan: Any) -> None:
    plan = make_plan(note_then_done())
    plan["sessions"]["s1"].append(dict(plan["sessions"]["s1"][0]))
    run_child(plan)
    assert len(records(plan, InputAccepted)) == 1
    assert len(records(plan, RunStarted)) == 1
    assert_sound(plan)


def test_queued_input_survives_a_crash(make_plan: Any) -> None:
    script = [
        {"text": "one", "tool_uses": [{"name": "slow_lookup", "input": {"query": "a"}}]},
        {"text": "first done"},
        {"text": "second done"},
    ]
    plan = make_plan(script, inputs=["first", "second"])
    first = run_child(plan, fault="tool.after:slow_lookup")
    assert first.killed, first.stderr
    accepted = records(plan, InputAccepted)
    assert [a.text for a in accepted] == ["first", "second"], "both inputs were durable"
    # The restarted process submits NOTHING: the queued input must come from the log.
    plan["sessions"] = {"s1": []}
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "completed"
    assert outcome["final_text"] == "second done"
    assert records(plan, InputAccepted) == accepted, "no input was re-created"
    finished = [r for r in records(plan, RunFinished) if r.status == "completed"]
    assert [r.submission_id for r in finished] == ["in1", "in2"]
    assert_sound(plan)


def test_three_parallel_tools_crash_while_the_third_runs(make_plan: Any) -> None:
    script = [
        {
            "text": "three at once",
            "tool_uses": [
                {"name": "lookup", "input": {"query": "a"}},
                {"name": "book", "input": {"item": "b"}},
                {"name": "slow_lookup", "input": {"query": "c", "seconds": 0.5}},
            ],
        },
        {"text": "all three done"},
    ]
    plan = make_plan(script)
    outcome = crash_and_restart(plan, "tool.after:slow_lookup")
    assert outcome["status"] == "completed"
    by_tool: dict[str, int] = {}
    for e in effects(Path(plan["workspace"])):
        by_tool[e["tool"]] = by_tool.get(e["tool"], 0) + 1
    # The two that completed before the crash are reused, never re-run.
    assert by_tool == {"lookup": 1, "book": 1, "slow_lookup": 2}
    assert_sound(plan)


def test_crash_in_a_later_turn(make_plan: Any) -> None:
    script = [
        {"text": "t1", "tool_uses": [{"name": "send_note", "input": {"text": "one"}}]},
        {"text": "t2", "tool_uses": [{"name": "lookup", "input": {"query": "x"}}]},
        {"text": "t3", "tool_uses": [{"name": "send_note", "input": {"text": "two"}}]},
        {"text": "done"},
    ]
    plan = make_plan(script)
    outcome = crash_and_restart(plan, "tool.after:send_note@2")
    assert outcome["status"] == "completed"
    notes = [e for e in effects(Path(plan["workspace"])) if e["tool"] == "send_note"]
    assert [n["text"] for n in notes] == ["one", "two"]
    assert len(records(plan, ToolOutcomeUnknown)) == 1
    assert_sound(plan)


def test_crash_during_recovery_converges_without_duplicate_repairs(make_plan: Any) -> None:
    plan = make_plan(note_then_done())
    assert run_child(plan, fault="tool.after:send_note").killed
    # The restart dies right after its first commit: the recovery commit itself.
    assert run_child(plan, fault="commit@1").killed
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "completed"
    assert len(records(plan, ToolOutcomeUnknown)) == 1
    assert len(effects(Path(plan["workspace"]))) == 1
    assert_sound(plan)


def test_a_run_that_keeps_dying_stops_at_the_resume_budget(make_plan: Any) -> None:
    plan = make_plan(note_then_done())
    plan["options"] = {"resume_budget": 3}
    # The model's reply never gets committed: each process dies on receiving it.
    for _ in range(4):
        assert run_child(plan, fault="model.after").killed
    outcome = run_child(plan, fault="model.after").outcome("s1")
    assert outcome["status"] == "failed"
    assert "resume budget 3" in outcome["reason"]
    attempts = [r.resume_attempt for r in records(plan, RunStarted)]
    assert attempts == [0, 1, 2, 3]
    assert_sound(plan)


def test_recorded_safe_call_of_a_tool_now_never_is_not_re_run(make_plan: Any) -> None:
    plan = make_plan(note_then_done("lookup", query="q"))
    assert run_child(plan, fault="tool.after:lookup").killed
    plan["policy_override"] = {"lookup": "never"}
    run_child(plan)
    assert len(effects(Path(plan["workspace"]))) == 1
    assert len(records(plan, ToolOutcomeUnknown)) == 1
    assert_sound(plan)


def test_tool_removed_after_crash_gets_unknown_outcome(make_plan: Any) -> None:
    plan = make_plan(note_then_done("lookup", query="q"))
    assert run_child(plan, fault="tool.after:lookup").killed
    plan["tools"] = ["send_note"]
    run_child(plan)
    unknown = records(plan, ToolOutcomeUnknown)
    assert len(unknown) == 1 and "no longer registered" in unknown[0].reason
    assert_sound(plan)
