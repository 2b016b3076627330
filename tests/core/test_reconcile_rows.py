"""The reconcile table: what each answer of a tool's ``reconcile()`` decides, word for word.

A NEVER call found executing after a crash is never re-run blindly: its tool's
``reconcile()`` is asked, and its answer decides (``decide.results._reconciled``). The
decision is recorded (``RecoveryDecision``: what was found, what is done, why) and
is what ``perdure show`` prints, so its words are part of the promise.
"""

from __future__ import annotations

from typing import Any

import pytest

from perdure.actors import decide, protocol
from perdure.actors.protocol import Step, View
from perdure.storage.records import (
    RecoveryDecision,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
)
from tests.core.sim import TOOLS, Session, runs


def reconciling(**env: Any) -> Session:
    """A NEVER call with a reconcile, executing when the process died: recovery asks it."""
    s = Session(**env)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "send_checked", {"text": "hi"}))
    step = s.restart()
    asked = [e for e in step.effects if isinstance(e, protocol.Reconcile)]
    assert [(e.call_id, e.tool) for e in asked] == [("c1", TOOLS["send_checked"])]
    return s


def answer(s: Session, **report: Any) -> Step:
    s.view = View(models=s.view.models, tools=s.view.tools - {"c1"})
    msg = protocol.ReconcileFinished(call_id="c1", **report)
    return s._commit(decide.on_result(s.state, s.env(), msg))


def decided(step: Step) -> tuple[str, str, str, str]:
    (d,) = [r for r in step.records if isinstance(r, RecoveryDecision) and r.subject == "c1"]
    return d.run_id, d.found, d.action, d.reason


def test_applied_records_the_real_result_of_the_attempt() -> None:
    s = reconciling()
    step = answer(s, status="applied", output="sent at 10:02", is_error=False)
    assert decided(step) == (
        "in1.r1",
        "reconcile answered applied",
        "record the real result",
        "the effect had happened",
    )
    done = [r for r in step.records if isinstance(r, ToolCompleted)]
    assert [(d.output, d.kind, d.attempt, d.is_error) for d in done] == [
        ("sent at 10:02", "reconciled", 1, False)
    ]


def test_not_applied_runs_it_once_with_the_same_key() -> None:
    s = reconciling()
    key = s.state.tasks["c1"].executing.idempotency_key  # type: ignore[union-attr]
    step = answer(s, status="not_applied")
    assert decided(step)[1:] == (
        "reconcile answered not_applied",
        "run it once, with the same key",
        "the effect had not happened",
    )
    assert runs(step) == [("c1", 2)]
    assert [e.idempotency_key for e in step.records if isinstance(e, ToolExecuting)] == [key]


def test_not_applied_after_a_revision_is_not_run() -> None:
    s = reconciling()
    s.command(protocol.Revise("v1", "something else"))
    step = answer(s, status="not_applied")
    assert decided(step)[1:] == (
        "reconcile answered not_applied",
        "do not run it",
        "the effect had not happened, and the request was revised since",
    )
    cancelled = [r for r in step.records if isinstance(r, ToolCancelled)]
    assert [(c.call_id, c.reason) for c in cancelled] == [
        ("c1", "the request was revised before it ran")
    ]
    assert not runs(step)


def test_not_applied_while_paused_waits_for_the_resume() -> None:
    s = reconciling()
    s.command(protocol.Pause("p1"))
    step = answer(s, status="not_applied")
    assert decided(step)[1:] == (
        "reconcile answered not_applied",
        "run it once the session is resumed",
        "the effect had not happened; the session is paused",
    )
    assert not runs(step) and s.state.tasks["c1"].phase == "executing"


def test_not_applied_while_its_tool_is_gone_is_unknown() -> None:
    s = reconciling()
    s.tools = {k: v for k, v in TOOLS.items() if k != "send_checked"}
    step = answer(s, status="not_applied")
    why = "the effect had not happened, but its tool is no longer registered"
    assert decided(step)[1:] == ("reconcile answered not_applied", "report outcome unknown", why)
    unknown = [r for r in step.records if isinstance(r, ToolOutcomeUnknown)]
    assert [u.reason for u in unknown] == ["reconcile: " + why]
    assert unknown[0].output.endswith(" The tool's own check found: " + why)


@pytest.mark.parametrize(
    ("reason", "why"),
    [("still running as pid 42", "still running as pid 42"), ("", "reconcile could not tell")],
)
def test_unknown_is_reported_with_what_the_check_found(reason: str, why: str) -> None:
    s = reconciling()
    step = answer(s, status="unknown", reason=reason)
    assert decided(step)[1:] == ("reconcile answered unknown", "report outcome unknown", why)
    unknown = [r for r in step.records if isinstance(r, ToolOutcomeUnknown)]
    assert [u.reason for u in unknown] == ["reconcile: " + why]
    assert "UNKNOWN" in unknown[0].output and not runs(step)
