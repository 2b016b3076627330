"""Two promises of the core that hold only when several things happen at once.

*Held*: while a session is paused, nothing new starts — not an approved call, not a
retry whose back-off ended, not a model call to re-make — and everything held starts
on resume. *Gathered*: when one step decides for several calls (a resume that
dispatches one and re-checks another, a recovery of several compensations), each
decision is in the step; none overwrites the one before.

The mutation campaign (docs/RELIABILITY.md) left these rows unguarded: mutants that
turned ``paused or draining`` into ``and``, ``+=`` into ``=``, or a ``continue`` into
a ``break`` passed every test. Each test below fails against one of them.
"""

from __future__ import annotations

from perdure.actors import decide, protocol
from perdure.actors.protocol import Step, View
from perdure.storage.records import (
    CompensationFinished,
    RecoveryDecision,
    ToolCancelled,
    ToolCompleted,
    ToolOutcomeUnknown,
)
from tests.core.sim import hold_seat, only, reconciles, runs
from tests.core.test_failure_rows import (
    FAILING,
    Shell,
    backoffs,
    book,
    cancel_booking,
    hold_desk,
    release_desk,
)

TOOLS_HERE = {
    **FAILING,
    **{t.name: t for t in (book, cancel_booking, hold_desk, release_desk, hold_seat)},
}


def shell() -> Shell:
    s = Shell(tools=TOOLS_HERE)
    s.command(protocol.Submit("r1", "go"))
    return s


def model_calls(step: Step) -> list[str]:
    return [e.generation_id for e in step.effects if isinstance(e, protocol.CallModel)]


def reconciled(s: Shell, call_id: str, status: str, **kw: str) -> Step:
    """The shell reports a reconcile it ran."""
    s.view = View(models=s.view.models, tools=s.view.tools - {call_id})
    report = protocol.ReconcileFinished(call_id=call_id, status=status, **kw)  # type: ignore[arg-type]
    return s._commit(decide.on_result(s.state, s.env(), report))


# -- held while paused, started on resume -------------------------------------------------


def test_an_approval_given_while_paused_runs_the_call_only_on_resume() -> None:
    s = shell()
    s.reply("x", ("c1", "deploy", {"target": "prod"}))
    s.command(protocol.Pause("p1"))
    step, _ = s.command(protocol.Approve("c1", True, "a1"))
    assert not runs(step), "paused: the approved call waits"
    assert s.state.tasks["c1"].phase != "executing"
    step, _ = s.command(protocol.Resume("p2"))
    assert runs(step) == [("c1", 1)]


def test_a_model_retry_whose_failure_arrives_while_paused_is_made_only_on_resume() -> None:
    s = shell()
    gen = s.state.current_generation()
    assert gen is not None
    s.command(protocol.Pause("p1"))  # the model call in flight is let finish
    step = s.fail_model()
    assert not model_calls(step), "paused: no new attempt"
    step, _ = s.command(protocol.Resume("p2"))
    assert model_calls(step) == [gen.generation_id]


def test_a_retry_whose_back_off_ends_while_paused_runs_only_on_resume() -> None:
    s = shell()
    s.reply("x", ("c1", "fetch", {"url": "u"}))
    s.finish_tool("c1", output="503", outcome="retryable", jitter=1.0)
    s.command(protocol.Pause("p1"))
    s.now += 100
    step = s.back_off_over("c1")
    assert not runs(step), "paused: the retry waits"
    step, _ = s.command(protocol.Resume("p2"))
    assert runs(step) == [("c1", 2)]


# -- gathered: one step, several calls ----------------------------------------------------


def test_a_resume_dispatches_an_approved_call_and_rechecks_an_unrun_one_together() -> None:
    s = shell()
    s.reply("x", ("c1", "deploy", {"target": "prod"}), ("c2", "send_checked", {"text": "hi"}))
    # c2 was executing: NEVER with a reconcile, so a restart asks it.
    assert reconciles(s.restart()) == ["c2"]
    s.command(protocol.Pause("p1"))
    reconciled(s, "c2", "not_applied")  # kept pending while paused
    s.command(protocol.Approve("c1", True, "a1"))
    step, _ = s.command(protocol.Resume("p2"))
    assert runs(step) == [("c1", 1)]
    assert reconciles(step) == ["c2"], "asked again: the world may have changed"


def test_a_resume_dispatches_an_approved_call_and_a_due_retry_together() -> None:
    s = shell()
    s.reply("x", ("c1", "deploy", {"target": "prod"}), ("c2", "fetch", {"url": "u"}))
    s.finish_tool("c2", output="503", outcome="retryable", jitter=1.0)
    s.command(protocol.Pause("p1"))
    s.now += 100
    s.back_off_over("c2")
    s.command(protocol.Approve("c1", True, "a1"))
    step, _ = s.command(protocol.Resume("p2"))
    assert sorted(runs(step)) == [("c1", 1), ("c2", 2)]


def test_a_recovery_decides_for_every_open_compensation() -> None:
    s = shell()
    s.reply(
        "x",
        ("c1", "book", {"city": "Oslo"}),
        ("c2", "hold_desk", {"desk": "7"}),
        ("c3", "hold_seat", {"seat": "1A"}),
        ("c4", "book", {"city": "Bergen"}),
    )
    for call_id in ("c1", "c2", "c3", "c4"):
        s.finish_tool(call_id, output="done")
    s.reply("all held")
    for n, call_id in enumerate(("c1", "c2", "c3", "c4")):
        s.command(protocol.Compensate(call_id, f"k{n}"))
    s.finish_tool("comp-c2", output="busy", outcome="retryable", jitter=1.0)
    s.finish_tool("comp-c3", output="call the airline", outcome="needs_human")
    phases = [s.state.tasks[f"comp-c{i}"].phase for i in (1, 2, 3, 4)]
    assert phases == ["executing", "retry_pending", "awaiting_human", "executing"]
    step = s.restart()
    decided = [d.subject for d in only(step.records, RecoveryDecision)]
    assert decided == ["comp-c1", "comp-c2", "comp-c3", "comp-c4"]
    assert reconciles(step) == ["comp-c1", "comp-c4"]
    assert [b.call_id for b in backoffs(step)] == ["comp-c2"]


def test_a_revision_cancels_every_unstarted_call_and_stops_every_running_one() -> None:
    s = shell()
    s.reply(
        "x",
        ("c1", "lookup", {"query": "a"}),
        ("c2", "deploy", {"target": "prod"}),
        ("c3", "lookup", {"query": "b"}),
    )
    s.finish_tool("c1", output="found a")
    step, _ = s.command(protocol.Revise("v1", "something else"))
    assert [c.call_id for c in only(step.records, ToolCancelled)] == ["c2"]
    assert [e.call_id for e in step.effects if isinstance(e, protocol.CancelTool)] == ["c3"]
    s = shell()
    s.reply("x", ("c1", "deploy", {"target": "prod"}), ("c2", "lookup", {"query": "b"}))
    step, _ = s.command(protocol.Revise("v1", "something else"))
    assert [c.call_id for c in only(step.records, ToolCancelled)] == ["c1"]
    assert [e.call_id for e in step.effects if isinstance(e, protocol.CancelTool)] == ["c2"]


# -- compensations beside a paused session ------------------------------------------------


def test_a_compensation_that_ends_while_another_is_held_is_closed() -> None:
    s = shell()
    s.reply("x", ("c1", "book", {"city": "Oslo"}), ("c2", "book", {"city": "Bergen"}))
    s.finish_tool("c1", output="B-1")
    s.finish_tool("c2", output="B-2")
    s.reply("booked")
    s.command(protocol.Compensate("c1", "k1"))
    s.command(protocol.Compensate("c2", "k2"))
    s.command(protocol.Pause("p1"))
    step = s.finish_tool("comp-c2", output="cancelled")
    closed = only(step.records, CompensationFinished)
    assert [c.compensation_id for c in closed] == ["comp-c2"]


def test_a_compensation_found_not_applied_while_paused_is_asked_again_on_resume() -> None:
    s = shell()
    s.reply("x", ("c1", "book", {"city": "Oslo"}))
    s.finish_tool("c1", output="B-1")
    s.reply("booked")
    s.command(protocol.Compensate("c1", "k1"))
    assert reconciles(s.restart()) == ["comp-c1"]
    s.command(protocol.Pause("p1"))
    reconciled(s, "comp-c1", "not_applied")
    step, _ = s.command(protocol.Resume("p2"))
    asked = [e for e in step.effects if isinstance(e, protocol.Reconcile)]
    assert [(e.tool, e.executing) for e in asked] == [
        (cancel_booking, s.state.tasks["comp-c1"].executing)
    ]


def test_a_compensations_retry_runs_its_next_attempt_once_its_back_off_is_over() -> None:
    s = shell()
    s.reply("x", ("c1", "hold_desk", {"desk": "7"}))
    s.finish_tool("c1", output="held 7")
    s.reply("held")
    s.command(protocol.Compensate("c1", "k1"))
    s.finish_tool("comp-c1", output="busy", outcome="retryable", jitter=1.0)
    s.now += 100
    step = s.back_off_over("comp-c1")
    assert runs(step) == [("comp-c1", 2)]


# -- what a reconcile's answer records ----------------------------------------------------


def test_a_reconciled_result_keeps_the_attempt_it_settles() -> None:
    s = shell()
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    s.restart()
    step = reconciled(s, "c1", "not_applied")  # run once more: attempt 2, same key
    assert runs(step) == [("c1", 2)]
    s.restart()
    step = reconciled(s, "c1", "applied", output="sent")
    (done,) = only(step.records, ToolCompleted)
    assert (done.kind, done.attempt, done.output) == ("reconciled", 2, "sent")


def test_an_unknown_answer_of_a_reconcile_names_the_tool_to_the_model() -> None:
    s = shell()
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    s.restart()
    step = reconciled(s, "c1", "unknown", reason="the mail server is down")
    (unknown,) = only(step.records, ToolOutcomeUnknown)
    assert unknown.output == (
        decide.interrupted_text("send_checked")
        + " The tool's own check found: the mail server is down"
    )
    assert "'send_checked'" in unknown.output
