"""Which effects may start while their step's commit is in flight (``decide.overlaps_commit``).

The rule of docs/DESIGN.md, "What must be durable before what": a model call may
overlap the commit that starts it; a SAFE tool's attempt may overlap its
``executing`` record's commit only when the runtime asks for it; everything else
(any other tool, a reconcile, a forget, a cancel, a back-off) waits for the commit.
"""

from __future__ import annotations

from attrs import evolve

from perdure.actors import decide, protocol
from perdure.actors.protocol import Overlap, RunTool
from perdure.storage.records import ContextCompacted, RunStarted, ToolExecuting
from tests.core.sim import Session, only

BOTH = Overlap(model_calls=True, safe_tools=True)
NEITHER = Overlap(model_calls=False, safe_tools=False)


def test_a_model_call_overlaps_its_commit_unless_told_not_to() -> None:
    call = protocol.CallModel("in1.g1", 1)
    assert decide.overlaps_commit(call, Overlap())  # the default
    assert not decide.overlaps_commit(call, NEITHER)
    assert not decide.overlaps_commit(call, Overlap(model_calls=False, safe_tools=True))


def test_only_a_safe_tool_overlaps_and_only_when_asked() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("two", ("c1", "lookup", {"query": "a"}), ("c2", "send", {"text": "b"}))
    safe, never = (e for e in step.effects if isinstance(e, RunTool))
    assert safe.executing.replay == "safe" and never.executing.replay == "never"
    assert not decide.overlaps_commit(safe, Overlap())  # off by default
    assert decide.overlaps_commit(safe, Overlap(model_calls=False, safe_tools=True))
    assert decide.overlaps_commit(safe, BOTH)
    assert not decide.overlaps_commit(never, BOTH)
    (executing,) = [r for r in only(step.records, ToolExecuting) if r.call_id == "c2"]
    keyed = RunTool(executing=_replay(executing, "keyed"), tool=never.tool)
    assert not decide.overlaps_commit(keyed, BOTH)


def test_nothing_else_overlaps_its_commit() -> None:
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("one", ("c1", "lookup", {"query": "a"}))
    (run,) = (e for e in step.effects if isinstance(e, RunTool))
    others: list[protocol.Effect] = [
        protocol.Reconcile(executing=run.executing, tool=run.tool),
        protocol.Forget(executing=run.executing, tool=run.tool),
        protocol.CancelTool("c1"),
        protocol.CancelModel("in1.g1"),
        protocol.BackOff(call_id="c1", attempt=1, not_before=5.0),
        protocol.StopBackOff("c1"),
    ]
    for effect in others:
        assert not decide.overlaps_commit(effect, BOTH), effect


def _replay(executing: ToolExecuting, replay: str) -> ToolExecuting:
    return evolve(executing, replay=replay)


def test_a_step_that_starts_or_resumes_a_run_overlaps_nothing() -> None:
    """The resume budget counts runs that died: a run's start is durable before its
    model call, which might kill the process."""
    call = protocol.CallModel("in1.g3", 1)

    def started(resumed_from: str | None) -> RunStarted:
        return RunStarted(
            session_id="s1",
            run_id="run2",
            submission_id="in1",
            goal_rev=0,
            resumed_from=resumed_from,
            resume_attempt=0 if resumed_from is None else 1,
            at=1.0,
        )

    first = protocol.Step((started(None),), (call,))
    assert decide.overlapping(first, Overlap()) == ()
    assert decide.overlapping(protocol.Step((), (call,)), Overlap()) == (call,)
    assert decide.overlapping(protocol.Step((), (call,)), NEITHER) == ()
    resumed = protocol.Step((started("run1"),), (call,))
    assert decide.overlapping(resumed, Overlap()) == ()
    assert decide.overlapping(resumed, BOTH) == ()
    # Only what overlaps: a forget that comes with the call waits for the commit.
    s = Session()
    s.command(protocol.Submit("r1", "go"))
    step = s.reply("one", ("c1", "lookup", {"query": "a"}))
    (run,) = (e for e in step.effects if isinstance(e, RunTool))
    forget = protocol.Forget(executing=run.executing, tool=run.tool)
    mixed = protocol.Step((), (forget, call, run))
    assert decide.overlapping(mixed, Overlap()) == (call,)
    assert decide.overlapping(mixed, BOTH) == (call, run)


def test_the_turn_after_a_compaction_waits_for_its_summary() -> None:
    call = protocol.CallModel("in1.g4", 1)
    compacted = ContextCompacted(
        session_id="s1", compaction_id="k1", start=0, end=4, summary="so far", at=1.0
    )
    assert decide.overlapping(protocol.Step((compacted,), (call,)), BOTH) == ()
