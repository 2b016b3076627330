"""Core proofs of a hand-over to another node (``View.handing_over``), as data in, data out.

While a session is being handed over, its current step finishes on this node (the
tool calls of the reply in hand run), and nothing new starts: no model call, no
retry, no run, no next turn. The point it stops at is one where the next owner's
recovery finds nothing in flight, so the move leaves no interrupted run behind.
"""

from __future__ import annotations

from typing import Any

import perdure
from perdure.actors import decide, protocol
from perdure.actors.protocol import Step, View
from perdure.providers.base import ModelReply
from perdure.storage.records import RecoveryDecision, ToolCall
from tests.core.sim import TOOLS, Session, kinds, only, runs

FLAKY_POLICY = perdure.RetryPolicy(max_attempts=3, initial=2.0, multiplier=2.0, max_interval=10.0)


@perdure.tool(replay=perdure.ReplayPolicy.SAFE, retry=FLAKY_POLICY)
async def flaky(query: str) -> str:
    """A lookup whose upstream sometimes fails for a moment."""
    return query


HANDING = View(handing_over=True)


def settle(s: Session, first: Step, view: View = HANDING) -> Step:
    """What the session commits while handing over (kept in its log, as the shell would)."""
    step = decide.settle(s.state, s.env(), view, first)
    s.log.extend(step.records)
    return step


def replied(s: Session, *calls: tuple[str, str, dict[str, Any]], text: str = "t") -> Step:
    gen = s.state.current_generation()
    assert gen is not None
    tool_calls = tuple(ToolCall(call_id=c, name=n, input=i) for c, n, i in calls)
    reply = ModelReply(text=text, tool_calls=tool_calls)
    return decide.on_result(
        s.state, s.env(), protocol.ModelReplied(gen.generation_id, gen.attempt, reply)
    )


def finished(s: Session, call_id: str, **kw: Any) -> Step:
    fields: dict[str, Any] = {"outcome": "ok", "output": "found", **kw}
    task = s.state.tasks[call_id]
    return decide.on_result(
        s.state,
        s.env(),
        protocol.ToolFinished(call_id=call_id, attempt=task.attempt, **fields),
    )


def running() -> Session:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    return s


def test_the_reply_in_hand_still_runs_its_tools_and_then_nothing_starts() -> None:
    s = running()
    step = settle(s, replied(s, ("c1", "lookup", {"query": "a"}), ("c2", "send", {"text": "b"})))
    assert runs(step) == [("c1", 1), ("c2", 1)], "the step's calls run where it began"
    step = settle(s, finished(s, "c1"), View(tools=frozenset({"c2"}), handing_over=True))
    assert kinds(step) == ["ToolCompleted"]
    step = settle(s, finished(s, "c2"))
    assert kinds(step) == ["ToolCompleted"], "no next turn: the next owner starts it"
    assert step.effects == ()


def test_a_shutdown_drain_by_contrast_runs_no_tool_of_the_reply() -> None:
    s = running()
    step = settle(s, replied(s, ("c1", "lookup", {"query": "a"})), View(draining=True))
    assert runs(step) == []


def test_the_next_owner_finds_nothing_in_flight_and_starts_the_next_turn() -> None:
    s = running()
    settle(s, replied(s, ("c1", "lookup", {"query": "a"})))
    settle(s, finished(s, "c1"))
    step = s.restart()  # the next owner: the log folded from scratch, then recovery
    decisions = only(step.records, RecoveryDecision)
    assert [(d.found, d.action, d.reason) for d in decisions] == [
        (
            "all tool results saved, next turn not started",
            "start the next turn",
            "nothing was in flight",
        )
    ]
    assert "RunFinished" not in kinds(step), "no run was interrupted by the move"
    assert [type(e) for e in step.effects] == [protocol.CallModel]


def test_no_model_call_starts_nor_a_failed_one_again() -> None:
    s = running()
    gen = s.state.current_generation()
    assert gen is not None
    # The call failed for a moment: its retry is the next owner's.
    failed = decide.on_result(
        s.state,
        s.env(),
        protocol.ModelFailed(
            generation_id=gen.generation_id,
            attempt=gen.attempt,
            error="overloaded",
            retryable=True,
            fallback=True,  # even with no back-off to wait out
        ),
    )
    step = settle(s, failed)
    assert kinds(step) == ["RetryPending"]
    assert step.effects == ()
    step = s.restart()
    assert [type(e) for e in step.effects] == [protocol.CallModel]


def test_no_retry_of_a_tool_is_dispatched() -> None:
    s = Session(tools={**TOOLS, "flaky": flaky})
    s.command(protocol.Submit("r1", "go"))
    settle(s, replied(s, ("c1", "flaky", {"query": "a"})))
    step = settle(s, finished(s, "c1", outcome="retryable", output="503"))
    assert kinds(step) == ["ToolRetryPending"]
    assert step.effects == (), "no back-off timer and no attempt 2 here"
    s.now += 60  # the back-off is long over: still nothing, the next owner retries
    assert settle(s, protocol.NOTHING) == protocol.NOTHING
    step = s.restart()
    assert runs(step) == [("c1", 2)]


def test_a_queued_input_does_not_start_its_run() -> None:
    s = running()
    settle(s, replied(s, text="done"))  # the run finishes (no tools)
    first, _ = decide.command(s.state, s.env(), protocol.Submit("r2", "more"))
    step = settle(s, first)
    assert kinds(step) == ["InputAccepted"], "queued, for the next owner to start"


def test_a_revision_while_the_model_is_asked_starts_no_new_turn_while_holding() -> None:
    # The revision's first pass stops the call in flight (an effect); the pass after it
    # must still see the hand-over or the drain, or it would ask the model again here.
    for holding in (
        {"handing_over": True},
        {"draining": True},
    ):
        s = running()
        first, _ = decide.command(s.state, s.env(), protocol.Revise("v1", "something else"))
        in_flight = View(models=frozenset({"in1.g1"}), **holding)
        step = settle(s, first, in_flight)
        assert kinds(step) == ["GoalRevised"], holding
        assert step.effects == (protocol.CancelModel("in1.g1"),), holding
