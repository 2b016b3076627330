"""The history checker's invariants about failed calls, each shown to fail when broken.

Hand-written histories (no runtime): a NEVER call run again with and without a
recorded reason, a retry scheduled for a NEVER call, a retry started early.
"""

from __future__ import annotations

from typing import Any

from perdure.check import RECONCILED_NOT_APPLIED, check_records
from perdure.storage.records import (
    Committed,
    Record,
    RecoveryDecision,
    ReplayName,
    ResolutionDecided,
    ToolExecuting,
    ToolRetryPending,
)


def executing(attempt: int, replay: ReplayName = "never", at: float = 10.0) -> ToolExecuting:
    return ToolExecuting(
        session_id="s",
        call_id="c1",
        run_id="in1.r0",
        tool_name="t",
        args={},
        replay=replay,
        idempotency_key="k",
        fingerprint="f",
        tool_hash="h",
        attempt=attempt,
        at=at,
    )


def violations(*records: Record) -> list[str]:
    committed = [Committed(i, r) for i, r in enumerate(records, start=1)]
    return check_records(committed, settled="none").violations


def decision(found: str) -> RecoveryDecision:
    return RecoveryDecision(
        session_id="s", run_id="in1.r1", subject="c1", found=found, action="x", reason="", at=1
    )


def resolution(action: Any) -> ResolutionDecided:
    return ResolutionDecided(session_id="s", call_id="c1", action=action, request_id="h", at=1)


def pending(not_before: float) -> ToolRetryPending:
    return ToolRetryPending(
        session_id="s", call_id="c1", attempt=1, not_before=not_before, error="503", at=1
    )


def test_a_never_call_run_again_without_a_reason_is_a_violation() -> None:
    (found,) = violations(executing(1), executing(2))
    assert "NEVER call c1 ran again (attempt 2)" in found


def test_a_reconcile_not_applied_or_a_person_justifies_exactly_one_more_run() -> None:
    assert violations(executing(1), decision(RECONCILED_NOT_APPLIED), executing(2)) == []
    assert violations(executing(1), resolution("retry"), executing(2)) == []
    (found,) = violations(executing(1), resolution("retry"), executing(2), executing(3))
    assert "attempt 3" in found
    (found,) = violations(executing(1), resolution("skip"), executing(2))
    assert "ran again" in found


def test_replayable_calls_may_run_again() -> None:
    assert violations(executing(1, "keyed"), executing(2, "keyed"), executing(3, "keyed")) == []


def test_a_retry_scheduled_for_a_never_call_is_a_violation() -> None:
    (found,) = violations(executing(1), pending(5.0))
    assert "NEVER call c1 was scheduled for an automatic retry" in found
    assert violations(executing(1, "safe"), pending(5.0)) == []


def test_a_retry_started_before_its_back_off_was_over_is_a_violation() -> None:
    (found,) = violations(executing(1, "safe", at=1), pending(5.0), executing(2, "safe", at=4.5))
    assert "started 0.500s before its back-off was over" in found
    on_time = violations(executing(1, "safe", at=1), pending(5.0), executing(2, "safe", at=5.0))
    assert on_time == []
