"""A model reply in the pure core: what is recorded of it, and what it starts.

The ``GenerationCompleted`` record is all a restarted process knows of a reply (the
conversation sent back to the model is rebuilt from it, reasoning blocks included),
so every field the provider gave must be recorded. Mutation testing
(docs/RELIABILITY.md) found several of them unguarded.
"""

from __future__ import annotations

import perdure
from perdure.actors import decide, protocol
from perdure.providers.base import ModelReply
from perdure.storage.records import (
    GenerationCompleted,
    ThinkingBlock,
    ToolAwaitingApproval,
    ToolCall,
    ToolExecuting,
    Usage,
)
from tests.core.sim import COURSE_TOOLS, TOOLS, Session, kinds, only


def test_every_field_of_a_reply_is_recorded_and_folded() -> None:
    s = Session(max_model_attempts=3)
    s.command(protocol.Submit("r1", "go"))
    s.result(protocol.ModelFailed(generation_id="in1.g1", attempt=1, error="e", retryable=True))
    usage = Usage(input_tokens=10, output_tokens=5)
    reply = ModelReply(
        text="done",
        thinking=(ThinkingBlock(thinking="hmm", signature="sig"),),
        stop_reason="end_turn",
        usage=usage,
        provider="anthropic",
        model="m1",
        response_id="resp_1",
    )
    step = s.result(protocol.ModelReplied("in1.g1", 2, reply))
    (done,) = only(step.records, GenerationCompleted)
    assert (done.submission_id, done.attempt, done.stop_reason) == ("in1", 2, "end_turn")
    assert (done.provider, done.model, done.response_id) == ("anthropic", "m1", "resp_1")
    assert done.thinking == [ThinkingBlock(thinking="hmm", signature="sig")]
    gen = s.state.generations["in1.g1"]
    assert (gen.attempt, gen.usage, gen.model) == (2, usage, "m1")
    assert s.state.usage == usage and s.state.spend["m1"] == usage


def test_a_paused_turn_of_the_model_is_continued_with_a_new_call() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    reply = ModelReply(text="working", stop_reason="pause_turn")
    step = s.result(protocol.ModelReplied("in1.g1", 1, reply))
    assert kinds(step) == ["GenerationCompleted", "GenerationStarted"]
    assert step.effects == (protocol.CallModel("in1.g2", 1),)


def test_a_paused_turn_waits_while_the_session_is_paused_and_goes_on_after() -> None:
    """A reply the model paused (``pause_turn``) arriving while the session is paused
    used to finish the run as completed with the half-done text; it must wait."""
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    s.command(protocol.Pause("p1"))
    reply = ModelReply(text="working", stop_reason="pause_turn")
    step = s.result(protocol.ModelReplied("in1.g1", 1, reply))
    assert kinds(step) == ["GenerationCompleted"], "not finished"
    assert s.state.run is not None
    step, _ = s.command(protocol.Resume("u1"))
    assert kinds(step) == ["SessionResumed", "GenerationStarted"]


def test_a_paused_turn_left_by_a_draining_process_goes_on_after_the_restart() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    reply = ModelReply(text="working", stop_reason="pause_turn")
    first = decide.on_result(s.state, s.env(), protocol.ModelReplied("in1.g1", 1, reply))
    step = decide.settle(s.state, s.env(), protocol.View(draining=True), first)
    assert kinds(step) == ["GenerationCompleted"], "draining: the run is not finished"
    s.log += step.records
    step = s.restart()
    assert "GenerationStarted" in kinds(step) and "RunFinished" not in kinds(step)


def test_ids_the_provider_repeats_within_one_reply_are_made_unique() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    calls = tuple(ToolCall(call_id="c1", name="lookup", input={"query": q}) for q in "abc")
    step = s.result(protocol.ModelReplied("in1.g1", 1, ModelReply(text="x", tool_calls=calls)))
    assert [e.call_id for e in only(step.records, ToolExecuting)] == ["c1", "c1_", "c1__"]


@perdure.tool(
    replay=perdure.ReplayPolicy.KEYED, requires_approval=lambda args: args["amount"] > 100
)
async def pay(amount: int) -> str:
    """Pay; a large amount needs approval."""
    return "paid"


def test_approval_can_depend_on_the_arguments_of_the_call() -> None:
    s = Session(tools={**TOOLS, "pay": pay})
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("x", ("c1", "pay", {"amount": 5}), ("c2", "pay", {"amount": 500}))
    assert [e.call_id for e in only(step.records, ToolExecuting)] == ["c1"]
    waiting = only(step.records, ToolAwaitingApproval)
    assert [(w.call_id, w.reason) for w in waiting] == [("c2", "'pay' requires approval")]


def test_a_compensation_has_a_key_of_its_own_lineage() -> None:
    s = Session(tools=COURSE_TOOLS)
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "hold_seat", {"seat": "1A"}))
    s.finish_tool("c1", output="held")
    s.command(protocol.Revise("v1", "other"))
    key = s.state.tasks["comp-c1"].executing.idempotency_key  # type: ignore[union-attr]
    assert key == decide.idempotency_key("s1", "compensation", "comp-c1")
    assert s.state.tasks["comp-c1"].generation_id == ""


def test_a_final_reply_cut_off_or_refused_finishes_the_run_saying_so() -> None:
    from perdure.storage.records import RunFinished

    for stop, reason in [
        ("max_tokens", "the reply was cut off at the model's output limit (max_tokens)"),
        ("refusal", "the model declined to continue (refusal)"),
        ("end_turn", ""),
    ]:
        s = Session()
        s.command(protocol.Submit("r1", "go"))
        step = s.result(
            protocol.ModelReplied("in1.g1", 1, ModelReply(text="partial", stop_reason=stop))
        )
        (done,) = only(step.records, RunFinished)
        assert (done.status, done.final_text, done.reason) == ("completed", "partial", reason)


def test_what_inspection_reads_of_runs_and_the_session_is_folded() -> None:
    from perdure.actors.state import SessionState
    from perdure.inspect import summarize
    from perdure.storage.records import SessionCreated
    from tests.core.sim import decide_committed

    s = Session()
    s.log[0] = SessionCreated(session_id="s1", system="be brief", at=s.now)
    s.command(protocol.Submit("r1", "go"))
    s.command(protocol.Revise("v1", "other"))
    s.now += 5
    s.restart()
    state = SessionState.fold("s1", [decide_committed(i, r) for i, r in enumerate(s.log, 1)])
    summary = summarize(state)
    assert summary["system"] == "be brief"
    runs = [
        (r["run_id"], r["goal_rev"], r["resumed_from"], r["started_at"]) for r in summary["runs"]
    ]
    assert runs == [("in1.r0", 0, None, 1000.0), ("in1.r1", 1, "in1.r0", 1005.0)]
    assert state.submissions["in1"].runs == ["in1.r0", "in1.r1"]


def test_a_reply_repeated_for_a_completed_turn_is_discarded() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    reply = ModelReply(
        text="x", tool_calls=(ToolCall(call_id="c1", name="send", input={"text": "t"}),)
    )
    s.result(protocol.ModelReplied("in1.g1", 1, reply))
    again = protocol.ModelReplied("in1.g1", 1, reply)
    assert not decide.on_result(s.state, s.env(), again), "the turn is completed already"


def test_a_compensation_whose_original_tool_is_gone_is_unknown_after_a_restart() -> None:
    from perdure.storage.records import ToolOutcomeUnknown
    from tests.core.test_commands import hold_room

    s = Session(tools={**COURSE_TOOLS, "hold_room": hold_room})
    s.command(protocol.Submit("r1", "go"))
    s.reply("x", ("c1", "hold_room", {"room": "1A"}))
    s.finish_tool("c1", output="held")
    s.reply("held")
    s.command(protocol.Compensate("c1", "k1"))
    s.tools = dict(COURSE_TOOLS)
    step = s.restart()
    unknown = only(step.records, ToolOutcomeUnknown)
    assert [(u.call_id, u.reason) for u in unknown] == [
        ("comp-c1", "interrupted; its tool is no longer registered")
    ]
