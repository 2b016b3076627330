"""perdure.inspect: the four restart questions, answered from a folded state (pure)."""

from __future__ import annotations

import json
from typing import Any

from perdure.actors.state import SessionState
from perdure.inspect import render, summarize
from perdure.storage.records import (
    Committed,
    GenerationCompleted,
    GenerationStarted,
    GoalRevised,
    InputAccepted,
    Record,
    RecoveryDecision,
    RunStarted,
    SessionCreated,
    ToolAwaitingApproval,
    ToolCall,
    ToolCancelled,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
    ToolTaskCreated,
)

S = "s1"


def executing(call_id: str, tool: str, replay: Any) -> ToolExecuting:
    return ToolExecuting(
        session_id=S,
        call_id=call_id,
        run_id="in1.r0",
        tool_name=tool,
        args={},
        replay=replay,
        idempotency_key="pdk_" + call_id,
        fingerprint="f",
        tool_hash="h",
        at=3,
    )


def history() -> list[Record]:
    calls = [
        ToolCall(call_id="c1", name="lookup", input={"q": 1}),
        ToolCall(call_id="c2", name="send", input={}),
        ToolCall(call_id="c3", name="deploy", input={"target": "prod"}),
        ToolCall(call_id="c4", name="charge", input={}),
    ]
    return [
        SessionCreated(session_id=S, system="be brief", at=1),
        InputAccepted(
            session_id=S, submission_id="in1", request_id="r", text="ship it", body_hash="b", at=1
        ),
        RunStarted(session_id=S, run_id="in1.r0", submission_id="in1", goal_rev=0, at=1),
        GenerationStarted(session_id=S, run_id="in1.r0", generation_id="in1.g1", goal_rev=0, at=2),
        GenerationCompleted(
            session_id=S, run_id="in1.r0", generation_id="in1.g1", text="ok", tool_calls=calls, at=2
        ),
        *[
            ToolTaskCreated(
                session_id=S,
                generation_id="in1.g1",
                call_id=c.call_id,
                tool_name=c.name,
                input=c.input,
                goal_rev=0,
                at=2,
            )
            for c in calls
        ],
        executing("c1", "lookup", "safe"),
        ToolCompleted(session_id=S, call_id="c1", output="found", at=4),
        executing("c2", "send", "never"),
        ToolAwaitingApproval(session_id=S, call_id="c3", reason="needs a human", at=3),
        executing("c4", "charge", "never"),
        ToolCancelled(
            session_id=S, call_id="c4", output="x", reason="stopped", while_executing=True, at=5
        ),
    ]


def fold(records: list[Record]) -> SessionState:
    return SessionState.fold(S, [Committed(i, r) for i, r in enumerate(records, start=1)])


def test_a_run_in_flight_answers_the_four_questions() -> None:
    summary = summarize(fold(history()))
    json.dumps(summary)  # JSON values only
    assert summary["status"] == "awaiting_approval"
    assert summary["request"]["text"] == "ship it" and summary["request"]["goal_rev"] == 0
    assert summary["done"]["tool_calls_this_request"] == [
        {"call_id": "c1", "tool": "lookup", "kind": "ok"}
    ]
    next_steps = " | ".join(summary["next"])
    assert "wait for a human to approve or deny deploy [c3]" in next_steps
    assert "send [c2] is executing (never)" in next_steps
    assert "reconcile() if it has one, otherwise report the outcome unknown" in next_steps
    unconfirmed = {u["call_id"]: u for u in summary["unconfirmed"]}
    assert set(unconfirmed) == {"c2", "c4"}  # the SAFE call and the gated one are not
    assert unconfirmed["c2"]["phase"] == "executing"
    assert "partly happened" in unconfirmed["c4"]["why"]
    assert [a["call_id"] for a in summary["pending_approvals"]] == ["c3"]
    phases = {t["call_id"]: t["phase"] for t in summary["tasks"]}
    assert phases == {
        "c1": "completed",
        "c2": "executing",
        "c3": "awaiting_approval",
        "c4": "cancelled",
    }
    assert summary["runs"][0]["status"] == "running"
    assert summary["usage"]["input_tokens"] == 0


def test_revision_unknown_outcome_and_recovery_are_reported() -> None:
    records = [
        *history(),
        RecoveryDecision(
            session_id=S,
            run_id="in1.r0",
            subject="c2",
            found="executing",
            action="report outcome unknown",
            reason="policy never",
            at=6,
        ),
        ToolOutcomeUnknown(
            session_id=S, call_id="c2", output="UNKNOWN", reason="interrupted", at=6
        ),
        GoalRevised(session_id=S, goal_rev=1, text="ship it to staging", request_id="v", at=7),
    ]
    summary = summarize(fold(records))
    assert summary["request"] == {
        "goal_rev": 1,
        "submission_id": "in1",
        "text": "ship it to staging",
        "revised": True,
        "revision_of": "ship it",
    }
    [decision] = summary["decisions"]
    assert decision["action"] == "report outcome unknown" and "session_id" not in decision
    c2 = next(u for u in summary["unconfirmed"] if u["call_id"] == "c2")
    assert c2["phase"] == "outcome_unknown" and "interrupted" in c2["why"]
    assert any("apply revision 1" in step for step in summary["next"])
    lines = [text for _, text in render(summary)]
    assert any("request in force (revision 1): 'ship it to staging'" in x for x in lines)
    assert any("unconfirmed side effects:" in x for x in lines)


def test_an_empty_session_is_idle() -> None:
    summary = summarize(fold([SessionCreated(session_id=S, at=1)]))
    assert summary["status"] == "idle"
    assert summary["next"] == ["nothing: the session is idle and waits for input"]
    assert summary["request"]["text"] is None and summary["unconfirmed"] == []


def test_cost_per_run_and_session_at_the_given_prices() -> None:
    from perdure.budget import Price
    from perdure.storage.records import Budget, Usage

    records = history()
    reply = records[4]
    assert isinstance(reply, GenerationCompleted)
    used = Usage(input_tokens=2_000_000, output_tokens=1_000_000)
    records[4] = GenerationCompleted(
        session_id=S,
        run_id="in1.r0",
        generation_id="in1.g1",
        text="ok",
        tool_calls=reply.tool_calls,
        usage=used,
        model="model-a-2026",
        at=2,
    )
    records[0] = SessionCreated(session_id=S, system="x", budget=Budget(run_cost=9.5), at=1)
    summary = summarize(fold(records), {"model-a": Price(input=1.0, output=3.0)})
    json.dumps(summary)
    assert summary["cost"] == {"usd": 5.0, "unpriced_models": []}
    assert summary["runs"][0]["cost"] == {"usd": 5.0, "unpriced_models": []}
    assert summary["budget"]["run_cost"] == 9.5
    assert ("plain", "  cost: $5.0000") in render(summary)
    unpriced = summarize(fold(records), {})
    assert unpriced["cost"] == {"usd": 0.0, "unpriced_models": ["model-a-2026"]}
