"""Crash tests for an unknown outcome sent to a person, and for results tied to the
goal revision, with real processes killed by ``PERDURE_FAULT``.

A ``transfer`` (NEVER, ``unknown_outcome="ask_person"``) is killed around its effect;
the next process asks a person instead of telling the model; a third process still
waits (the wait is durable), and a person's answer settles it: applied (the stated
result, nothing runs again), not applied (one more run, the same key), or failed.
One test loops over the three answers, a fresh log each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perdure.storage.records import (
    RecoveryDecision,
    ResolutionDecided,
    ToolAwaitingHuman,
    ToolCompleted,
    ToolOutcomeUnknown,
)
from tests.support.checker import assert_sound, read_log
from tests.support.ledger_tools import effects
from tests.support.procs import run_child

EXTRA = ["tests.support.outcome_tools:TOOLS"]


def records(plan: dict[str, Any], kind: type) -> list[Any]:
    return [c.record for c in read_log(Path(plan["log"])) if isinstance(c.record, kind)]


def plan_in(root: Path, script: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    (root / "ws").mkdir(parents=True)
    plan: dict[str, Any] = {
        "log": str(root / "log"),
        "workspace": str(root / "ws"),
        "script": script,
        "sessions": {"s1": [{"text": "pay the invoice", "request_id": "r0"}]},
        "extra_tools": EXTRA,
    }
    plan.update(extra)
    return plan


# answer -> (where the first process dies, the result the person states, effects in the end)
ANSWERS = {
    "skip": ("tool.after:transfer", {"transferred": 40, "ref": "B-7"}, 1),  # applied
    "retry": ("tool.before:transfer", None, 1),  # not applied: it runs once, after the answer
    "fail": ("tool.before:transfer", "the bank refused it", 0),  # failed
}


def test_an_interrupted_never_call_waits_for_a_person_across_restarts_then_each_answer(
    tmp_path: Path,
) -> None:
    script = [
        {"text": "paying", "tool_uses": [{"name": "transfer", "input": {"amount": 40}}]},
        {"text": "done"},
    ]
    for action, (fault, result, effects_in_the_end) in ANSWERS.items():
        plan = plan_in(tmp_path / action, script)
        first = run_child(plan, fault=fault)
        assert first.killed, f"{action}: the fault {fault} never fired:\n{first.stderr}"
        # The next process asks a person and stops waiting for nothing else (wait=False).
        plan["actions"] = [{"kind": "wait_for", "session": "s1", "record": "ToolAwaitingHuman"}]
        plan["wait"] = False
        run_child(plan)
        (waiting,) = records(plan, ToolAwaitingHuman)
        assert waiting.unknown_outcome and waiting.reason.startswith("its outcome is unknown")
        assert not records(plan, ToolOutcomeUnknown), "the model was not told: a person is asked"
        asked = [d for d in records(plan, RecoveryDecision) if d.subject == waiting.call_id]
        assert [d.action.split(":")[0] for d in asked] == ["ask a person"]
        # A third process finds the call still waiting; the person answers there.
        plan["actions"] = [
            {"kind": "state", "session": "s1"},
            {
                "kind": "resolve",
                "session": "s1",
                "call_id": waiting.call_id,
                "action": action,
                "result": result,
                "request_id": f"person-{action}",
            },
        ]
        plan["wait"] = True
        third = run_child(plan)
        (seen,) = [line for line in third.lines if "state" in line]
        assert seen["tasks"] == {waiting.call_id: "awaiting_human"}, action
        assert third.outcome("s1")["status"] == "completed", action
        (decided,) = records(plan, ResolutionDecided)
        assert decided.action == action
        (done,) = records(plan, ToolCompleted)
        ledger = [e for e in effects(Path(plan["workspace"])) if e["tool"] == "transfer"]
        assert len(ledger) == effects_in_the_end, (action, ledger)
        if action == "skip":
            assert (done.kind, done.is_error) == ("resolved", False)
            assert done.output == '{"transferred": 40, "ref": "B-7"}'
        elif action == "retry":
            assert (done.kind, done.output) == ("ok", "transferred 40")
            assert ledger[0]["attempt"] == 2 and ledger[0]["key"] == waiting_key(plan)
        else:
            assert done.is_error and "a person checked and said it failed" in done.output
        assert_sound(plan)


def waiting_key(plan: dict[str, Any]) -> str:
    from perdure.storage.records import ToolExecuting

    keys = {e.idempotency_key for e in records(plan, ToolExecuting)}
    assert len(keys) == 1, "every attempt of the call has the same key"
    return keys.pop()


def test_a_revision_during_a_run_names_earlier_results_and_reruns_a_goal_dependent_read_once(
    tmp_path: Path,
) -> None:
    """The request is revised while the model thinks over two results; the process is
    killed as the goal-dependent search is about to run again; the next process runs
    it again (SAFE) and the model's next request says which results came under which
    revision, with the new search result."""
    from perdure.actors.conversation import messages
    from perdure.actors.state import SessionState
    from perdure.providers.base import TextBlock
    from perdure.storage.records import GenerationStarted, ToolTaskCreated

    script = [
        {
            "text": "searching",
            "tool_uses": [
                {"name": "search_flights", "input": {"route": "LHR-OSL"}},
                {"name": "weather", "input": {"city": "Oslo"}},
            ],
        },
        {"text": "done", "delay": 1.5},
    ]
    plan = plan_in(
        tmp_path,
        script,
        actions=[
            {"kind": "wait_for", "session": "s1", "record": "ToolCompleted"},
            {"kind": "sleep", "seconds": 0.3},
            {"kind": "revise", "session": "s1", "text": "fly to Bergen", "request_id": "v1"},
        ],
    )
    first = run_child(plan, fault="tool.before:search_flights@2")
    assert first.killed, f"the re-run never started:\n{first.stderr}"
    assert run_child(plan).outcome("s1")["status"] == "completed"

    reruns = [t for t in records(plan, ToolTaskCreated) if t.rerun_of is not None]
    assert [(t.call_id, t.rerun_of, t.goal_rev) for t in reruns] == [
        ("toolu_001_1@rev1", "toolu_001_1", 1)
    ], "run again once"
    searched = [e for e in effects(Path(plan["workspace"])) if e["tool"] == "search_flights"]
    assert [(e["call_id"], e["attempt"]) for e in searched] == [
        ("toolu_001_1", 1),
        ("toolu_001_1@rev1", 2),  # attempt 1 was killed before it ran; recovery re-ran it
    ]
    assert len([e for e in effects(Path(plan["workspace"])) if e["tool"] == "weather"]) == 1

    # The model's request of the first turn under revision 1, rebuilt from the log as
    # the runtime built it: the state up to that turn's start.
    log = read_log(Path(plan["log"]))
    upto = next(
        i
        for i, c in enumerate(log)
        if isinstance(c.record, GenerationStarted) and c.record.goal_rev == 1
    )
    state = SessionState.fold("s1", [c for c in log[: upto + 1] if c.record.session_id == "s1"])
    last = messages(state)[-1]
    said = "\n".join(b.text for b in last.content if isinstance(b, TextBlock))
    assert "The user revised the request (revision 1)" in said
    assert "- weather (toolu_001_2): revision 0]" in said
    assert (
        "- search_flights (toolu_001_1): revision 0; its result depends on the request, so "
        "it was run again under revision 1, and the new result (toolu_001_1@rev1) is: "
        "flights for LHR-OSL, searched by toolu_001_1@rev1"
    ) in said
    assert_sound(plan)
