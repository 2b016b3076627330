"""Tool failures across real crashes: a child runtime SIGKILLed, a new one on the same log.

Each test runs ``tests.support.child`` with the tools of ``tests.failures.tools``, kills
it with ``PERDURE_FAULT`` at a commit of interest, restarts it, and checks what the
log and the side-effect ledger hold. Every test ends with the history checker
(``perdure.check`` + the ledger), which fails on a NEVER call run again without a
reconcile or a person's decision, on a retry scheduled for a NEVER call, and on a
retry that started before its recorded back-off was over.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from perdure.storage.records import (
    RecoveryDecision,
    ResolutionDecided,
    ToolAwaitingHuman,
    ToolCompleted,
    ToolExecuting,
    ToolHeartbeat,
    ToolOutcomeUnknown,
    ToolRetryPending,
)
from tests.failures.tools import BACK_OFF
from tests.support.checker import assert_sound, read_log
from tests.support.ledger_tools import read_ledger
from tests.support.procs import run_child

EXTRA = ["tests.failures.tools:TOOLS"]


def records(plan: dict[str, Any], kind: type) -> list[Any]:
    return [c.record for c in read_log(Path(plan["log"])) if isinstance(c.record, kind)]


def last_record(plan: dict[str, Any]) -> Any:
    return read_log(Path(plan["log"]))[-1].record


def ledger(plan: dict[str, Any], tool: str, event: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in read_ledger(Path(plan["workspace"]))
        if e["tool"] == tool and (event is None or e["event"] == event)
    ]


def one_call(tool: str, **args: Any) -> list[dict[str, Any]]:
    return [{"text": "on it", "tool_uses": [{"name": tool, "input": args}]}, {"text": "done"}]


def test_a_sigkill_during_a_retry_back_off_retries_at_the_recorded_time(make_plan: Any) -> None:
    # The restart must come while the back-off still runs: 1.5 s down plus the new
    # process's start, which on a loaded machine took more than the usual 3 s back-off.
    back_off = 2 * BACK_OFF
    plan = make_plan(one_call("flaky_book", item="room", back_off=back_off), extra_tools=EXTRA)
    # commit 4 is the ToolRetryPending of attempt 1, made before its back-off started.
    first = run_child(plan, fault="commit@4")
    assert first.killed, first.stderr
    assert isinstance(last_record(plan), ToolRetryPending)
    # Down for a while, as in a deploy: long enough to tell a back-off resumed from one
    # started again from scratch or skipped.
    time.sleep(1.5)
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "completed"
    (pending,) = records(plan, ToolRetryPending)
    assert pending.not_before - pending.at >= back_off, "the tool's retry_after was honoured"
    executing = records(plan, ToolExecuting)
    assert [e.attempt for e in executing] == [1, 2], "retried once, not from scratch"
    assert executing[0].idempotency_key == executing[1].idempotency_key
    resumed = next(d for d in records(plan, RecoveryDecision) if d.subject == pending.call_id)
    assert resumed.found == "retry back-off after attempt 1"
    assert resumed.action.startswith("wait out the back-off")
    gap = resumed.at - pending.at  # how long the process was down (>= 1.5 s)
    assert gap >= 1.5
    # Not earlier than the recorded time ...
    assert executing[1].at >= pending.not_before
    # ... and not a whole back-off after the restart: the time already waited counted.
    assert executing[1].at - pending.not_before < gap / 2
    assert [e["attempt"] for e in ledger(plan, "flaky_book", "start")] == [1, 2]
    assert len(ledger(plan, "flaky_book", "effect")) == 1
    (done,) = records(plan, ToolCompleted)
    assert (done.attempt, done.output, done.is_error) == (2, "booked room", False)
    report = assert_sound(plan)
    assert report.counts["ToolRetryPending"] == 1


def test_a_sigkill_after_a_heartbeat_resumes_the_re_run_from_its_details(make_plan: Any) -> None:
    plan = make_plan(one_call("process_items", total=60), extra_tools=EXTRA)
    # commits 4 and 5 are the first two heartbeats (about a second apart): die after 5.
    first = run_child(plan, fault="commit@5")
    assert first.killed, first.stderr
    beats = records(plan, ToolHeartbeat)
    assert len(beats) == 2 and isinstance(last_record(plan), ToolHeartbeat)
    committed = beats[-1].details
    assert committed["done"] > beats[0].details["done"], "the last heartbeat, not the first"
    run_child(plan)
    starts = ledger(plan, "process_items", "start")
    assert [s["attempt"] for s in starts] == [1, 2]
    assert starts[0]["resumed_from"] is None
    assert starts[1]["resumed_from"] == committed, "the re-run got the last committed details"
    (effect,) = ledger(plan, "process_items", "effect")
    assert effect["first"] == committed["done"] + 1
    (done,) = records(plan, ToolCompleted)
    assert done.output == f"processed items {committed['done'] + 1}..60"
    assert any(d.subject == done.call_id for d in records(plan, RecoveryDecision))
    assert_sound(plan)


def test_a_hung_tool_is_stopped_and_retried_with_one_effect_through_its_key(
    make_plan: Any,
) -> None:
    script = [
        {
            "text": "both",
            "tool_uses": [
                {"name": "mirror", "input": {"repo": "perdure"}},
                {"name": "announce", "input": {"text": "mirrored"}},
            ],
        },
        {"text": "done"},
    ]
    plan = make_plan(script, extra_tools=EXTRA)
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "completed"
    by_call = {e.call_id: e.tool_name for e in records(plan, ToolExecuting)}
    mirror_call = next(c for c, name in by_call.items() if name == "mirror")
    announce_call = next(c for c, name in by_call.items() if name == "announce")
    # KEYED with a retry policy: stopped when it fell silent, retried with the same key;
    # the downstream service saw the key twice and applied it once.
    (pending,) = records(plan, ToolRetryPending)
    assert pending.call_id == mirror_call and "sent no heartbeat for 1s" in pending.error
    attempts = [e for e in records(plan, ToolExecuting) if e.call_id == mirror_call]
    assert [e.attempt for e in attempts] == [1, 2]
    assert len({e.idempotency_key for e in attempts}) == 1
    assert len(ledger(plan, "mirror", "effect")) == 1
    assert len(ledger(plan, "mirror", "deduplicated")) == 1
    # NEVER: stopped the same way, never retried; the model is told the outcome is unknown.
    assert [e.call_id for e in records(plan, ToolExecuting)].count(announce_call) == 1
    (unknown,) = records(plan, ToolOutcomeUnknown)
    assert unknown.call_id == announce_call and "sent no heartbeat" in unknown.output
    assert len(ledger(plan, "announce", "effect")) == 1
    assert_sound(plan)


def test_a_hung_tool_killed_during_its_retry_back_off_is_retried_after_restart(
    make_plan: Any,
) -> None:
    plan = make_plan(one_call("mirror", repo="perdure"), extra_tools=EXTRA)
    # commit 4: the first heartbeat; commit 5: the retry decided when it fell silent.
    first = run_child(plan, fault="commit@5")
    assert first.killed, first.stderr
    assert isinstance(last_record(plan), ToolRetryPending)
    run_child(plan)
    attempts = [e.attempt for e in records(plan, ToolExecuting)]
    assert attempts == [1, 2]
    assert len(ledger(plan, "mirror", "effect")) == 1
    assert_sound(plan)


def test_a_never_tool_that_fails_transiently_is_not_retried(make_plan: Any) -> None:
    plan = make_plan(one_call("flaky_notify", text="hi"), extra_tools=EXTRA)
    run_child(plan)
    assert len(records(plan, ToolExecuting)) == 1
    assert not records(plan, ToolRetryPending)
    (done,) = records(plan, ToolCompleted)
    assert done.is_error and "RetryableError: 503 after sending" in done.output
    assert len(ledger(plan, "flaky_notify", "effect")) == 1
    report = assert_sound(plan)
    assert report.never_calls, "the checker saw the NEVER call"


@pytest.mark.parametrize(
    ("action", "result", "expected", "effects"),
    [
        ("retry", None, "charged 250", 1),
        ("skip", "the customer paid cash", "the customer paid cash", 0),
        ("fail", "the customer walked away", "they chose to fail it", 0),
    ],
)
def test_a_call_that_needs_a_person_waits_across_a_restart_and_is_resolved(
    make_plan: Any, action: str, result: str | None, expected: str, effects: int
) -> None:
    plan = make_plan(one_call("charge_card", cents=250), extra_tools=EXTRA)
    # commit 4: the call waits for a person (ToolAwaitingHuman). Then the process dies.
    first = run_child(plan, fault="commit@4")
    assert first.killed, first.stderr
    (waiting,) = records(plan, ToolAwaitingHuman)
    assert "card was declined" in waiting.reason
    # A restart alone changes nothing: it keeps waiting (and spends no resume attempt).
    second = run_child({**plan, "wait": False})
    assert second.returncode == 0, second.stderr
    assert [e.attempt for e in records(plan, ToolExecuting)] == [1]
    kept = [d for d in records(plan, RecoveryDecision) if "awaiting a person" in d.found]
    assert kept and kept[-1].action == "keep waiting"
    # A third process, and a person's answer (sent twice: deduplicated by its request id).
    resolve = {
        "kind": "resolve",
        "session": "s1",
        "call_id": waiting.call_id,
        "action": action,
        "result": result,
        "request_id": "person-1",
    }
    plan["actions"] = [resolve, resolve]
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "completed"
    (decided,) = records(plan, ResolutionDecided)
    assert (decided.action, decided.result) == (action, result)
    (done,) = records(plan, ToolCompleted)
    assert expected in done.output
    assert done.is_error is (action == "fail")
    executing = records(plan, ToolExecuting)
    assert [e.attempt for e in executing] == ([1, 2] if action == "retry" else [1])
    assert len({e.idempotency_key for e in executing}) == 1
    assert len(ledger(plan, "charge_card", "effect")) == effects
    report = assert_sound(plan)
    assert ("s1", waiting.call_id) in report.never_calls


def test_a_never_call_killed_after_a_heartbeat_is_unknown_not_re_run(make_plan: Any) -> None:
    plan = make_plan(one_call("announce", text="release 2.0"), extra_tools=EXTRA)
    # commit 4: its heartbeat. The heartbeat says how far it got, not that it may run again.
    first = run_child(plan, fault="commit@4")
    assert first.killed, first.stderr
    assert isinstance(last_record(plan), ToolHeartbeat)
    run_child(plan)
    assert len(records(plan, ToolExecuting)) == 1
    (unknown,) = records(plan, ToolOutcomeUnknown)
    assert "UNKNOWN" in unknown.output
    assert len(ledger(plan, "announce", "effect")) <= 1
    assert_sound(plan)
