"""Session control across real crashes: a child runtime SIGKILLed at every commit.

* a fork taken while the source runs: after any crash, the fork exists once (one
  ``SessionForked``, the same position), the source and the fork both finish, and no
  call copied into the fork runs again;
* a parent whose call runs two sub-agents: after any crash, exactly one child session
  per spawning call, no NEVER effect doubled in any child, and the parent completes
  with both children's answers;
* an ``interrupt`` arriving while a NEVER tool executes: whatever commit the crash hit,
  the call's effect happens once, its outcome is reported (its result, or UNKNOWN), it
  is never re-run, and the interrupting input gets exactly one final outcome.

Each scenario is run once per commit point (``PERDURE_FAULT=commit@n``) until a run
is no longer killed; every restart is checked with the history checker (``perdure
check`` + the side-effect ledger).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from perdure.storage.records import (
    CancelRequested,
    InputAccepted,
    RunFinished,
    SessionCreated,
    SessionForked,
    ToolCompleted,
    ToolExecuting,
    ToolOutcomeUnknown,
)
from tests.support.checker import assert_sound, read_log
from tests.support.ledger_tools import read_ledger
from tests.support.procs import run_child

EXTRA = ["tests.recovery.session_tools:TOOLS"]


def fresh(plan: dict[str, Any]) -> None:
    shutil.rmtree(plan["log"], ignore_errors=True)
    for item in Path(plan["workspace"]).iterdir():
        item.unlink()


def each_commit(plan: dict[str, Any], check: Any, limit: int = 40) -> int:
    """Kill the child at commit n, restart it to the end, check; for n = 1, 2, ..."""
    for n in range(1, limit):
        fresh(plan)
        first = run_child(plan, fault=f"commit@{n}")
        if not first.killed:
            assert first.returncode == 0, first.stderr
            return n - 1
        run_child(plan)
        assert_sound(plan)
        check(n)
    raise AssertionError(f"still killed after {limit} commits")


def of(plan: dict[str, Any], session: str, kind: type) -> list[Any]:
    return [
        c.record
        for c in read_log(Path(plan["log"]))
        if isinstance(c.record, kind) and c.record.session_id == session
    ]


def test_a_fork_taken_during_a_run_survives_a_kill_at_every_commit(make_plan: Any) -> None:
    send = {"name": "send_note", "input": {"text": "x"}}
    script = [
        {"text": "answer one"},
        {"text": "sending", "tool_uses": [send]},
        {"text": "done"},
        {"text": "done again"},
    ]
    plan = make_plan(
        script,
        inputs=["one", "two"],
        actions=[
            {
                "kind": "wait_for",
                "session": "s1",
                "record": "RunFinished",
                "where": {"submission_id": "in1", "status": "completed"},
            },
            {
                "kind": "fork",
                "session": "s1",
                "at": "in1.r0",
                "fork": "f1",
                "request_id": "fork-1",
                "inputs": [{"text": "elsewhere", "request_id": "fr1"}],
            },
        ],
        also_wait=["f1"],
    )

    def check(n: int) -> None:
        (lineage,) = of(plan, "f1", SessionForked)
        assert lineage.source == "s1"
        source_end = next(
            c.seq
            for c in read_log(Path(plan["log"]))
            if isinstance(c.record, RunFinished)
            and c.record.submission_id == "in1"
            and c.record.status == "completed"
        )
        assert lineage.position == source_end, f"commit {n}: forked at the end of in1's run"
        # in2 may have been accepted (queued) before in1's run ended, depending on the
        # timing: then the prefix holds it and the fork runs it as the source does.
        copied = [
            c.record.submission_id
            for c in read_log(Path(plan["log"]))
            if isinstance(c.record, InputAccepted)
            and c.record.session_id == "s1"
            and c.seq <= lineage.position
        ]
        own = f"in{len(copied) + 1}"
        inputs = {"s1": ["in1", "in2"], "f1": [*copied, own]}
        for sid, subs in inputs.items():
            assert [i.submission_id for i in of(plan, sid, InputAccepted)] == subs
            finals = [f for f in of(plan, sid, RunFinished) if f.status != "interrupted"]
            assert [f.status for f in finals] == ["completed"] * len(subs), (n, sid)
        sends = [e for e in read_ledger(Path(plan["workspace"])) if e["event"] == "effect"]
        # A NEVER call whose executing record the crash caught is reported unknown, not
        # run again: each session's send happened at most once.
        by_session = [e["session_id"] for e in sends]
        assert all(by_session.count(sid) <= 1 for sid in ("s1", "f1")), f"commit {n}: {sends}"

    assert each_commit(plan, check) >= 6


def test_an_interrupt_while_a_never_tool_runs_survives_a_kill_at_every_commit(
    make_plan: Any,
) -> None:
    slow = {"name": "slow_send", "input": {"text": "hello", "seconds": 1.0}}
    script = [
        {"text": "sending", "tool_uses": [slow]},
        {"text": "did the other thing"},
        {"text": "later answer"},
    ]
    plan = make_plan(
        script,
        extra_tools=EXTRA,
        actions=[
            {"kind": "wait_for", "session": "s1", "record": "ToolExecuting"},
            {
                "kind": "submit",
                "session": "s1",
                "text": "stop; do the other thing",
                "request_id": "r-int",
                "if_busy": "interrupt",
            },
        ],
    )
    interrupted_once = []

    def check(n: int) -> None:
        executing = of(plan, "s1", ToolExecuting)
        assert len(executing) == 1, f"commit {n}: the NEVER call ran again"
        call = executing[0].call_id
        outcomes = [
            r
            for r in of(plan, "s1", ToolCompleted) + of(plan, "s1", ToolOutcomeUnknown)
            if r.call_id == call
        ]
        assert len(outcomes) == 1, f"commit {n}: its outcome is reported once"
        if isinstance(outcomes[0], ToolOutcomeUnknown):
            assert "UNKNOWN" in outcomes[0].output
        effects = [e for e in read_ledger(Path(plan["workspace"])) if e["event"] == "effect"]
        assert len(effects) <= 1, f"commit {n}: the effect happened at most once"
        if isinstance(outcomes[0], ToolCompleted):
            assert len(effects) == 1 and outcomes[0].output == "sent hello"
        (interrupt,) = [i for i in of(plan, "s1", InputAccepted) if i.request_id == "r-int"]
        finals = [
            f
            for f in of(plan, "s1", RunFinished)
            if f.submission_id == interrupt.submission_id and f.status != "interrupted"
        ]
        assert [f.status for f in finals] == ["completed"], f"commit {n}"
        if interrupt.interrupts is not None:
            interrupted_once.append(n)
            first = [f for f in of(plan, "s1", RunFinished) if f.submission_id == "in1"]
            assert first[-1].status == "cancelled", f"commit {n}: the busy run was cancelled"

    assert each_commit(plan, check) >= 5
    assert interrupted_once, "some crash points came after the interrupt was accepted"


def test_a_parent_with_two_sub_agents_survives_a_kill_at_every_commit(make_plan: Any) -> None:
    ask = [{"name": "research", "input": {"task": t}} for t in ("first", "second")]
    plan = make_plan(
        [{"text": "delegating", "tool_uses": ask}, {"text": "both answered"}],
        extra_tools=["tests.recovery.session_tools:AGENT_TOOLS"],
        by_system={
            "researcher": [
                {"text": "noting", "tool_uses": [{"name": "send_note", "input": {"text": "n"}}]},
                {"text": "child done"},
            ]
        },
    )

    def check(n: int) -> None:
        log = read_log(Path(plan["log"]))
        children = [
            c.record for c in log if isinstance(c.record, SessionCreated) and c.record.parent
        ]
        parents = sorted(c.parent for c in children if c.parent)
        calls = sorted(f"s1/{r.call_id}" for r in of(plan, "s1", ToolExecuting))
        assert parents == sorted(set(calls)) and len(parents) == 2, f"commit {n}: one per call"
        for child in children:
            assert len(of(plan, child.session_id, InputAccepted)) == 1, f"commit {n}"
            finals = [
                f for f in of(plan, child.session_id, RunFinished) if f.status != "interrupted"
            ]
            assert [f.status for f in finals] == ["completed"], f"commit {n}: {child.session_id}"
        sends = [e for e in read_ledger(Path(plan["workspace"])) if e["event"] == "effect"]
        per_child = [e["session_id"] for e in sends]
        assert all(per_child.count(c.session_id) <= 1 for c in children), f"commit {n}"
        answers = [r.output for r in of(plan, "s1", ToolCompleted)]
        assert answers == ["child done", "child done"], f"commit {n}: {answers}"
        finals = [f for f in of(plan, "s1", RunFinished) if f.status != "interrupted"]
        assert [f.final_text for f in finals] == ["both answered"], f"commit {n}"
        if len(of(plan, "s1", ToolExecuting)) > 2:
            rerun.append(n)

    rerun: list[int] = []
    assert each_commit(plan, check, limit=60) >= 10
    assert rerun, "some crashes hit a spawning call while it waited: it was re-run"


def test_a_sub_agent_whose_parent_was_cancelled_around_a_crash_is_stopped(
    make_plan: Any,
) -> None:
    ask = {"name": "research", "input": {"task": "slowly"}}
    plan = make_plan(
        [{"text": "delegating", "tool_uses": [ask]}, {"text": "unused"}],
        extra_tools=["tests.recovery.session_tools:AGENT_TOOLS"],
        by_system={"researcher": [{"text": "thought long", "delay": 2.0}]},
        actions=[
            {"kind": "wait_for", "session": "s1", "record": "AgentStarted"},  # the child is linked
            {"kind": "cancel", "session": "s1", "request_id": "c1"},
        ],
        linger=True,  # until every session of the log is idle, the child's too
    )
    orphans: list[int] = []

    def check(n: int) -> None:
        log = read_log(Path(plan["log"]))
        children = [
            c.record.session_id
            for c in log
            if isinstance(c.record, SessionCreated) and c.record.parent
        ]
        calls = of(plan, "s1", ToolCompleted) + of(plan, "s1", ToolOutcomeUnknown)
        for child in children:
            finals = [f for f in of(plan, child, RunFinished) if f.status != "interrupted"]
            assert len(finals) == 1, f"commit {n}: {child} has one outcome"
            answered = any(isinstance(r, ToolCompleted) and not r.is_error for r in calls)
            if not answered:
                assert finals[0].status == "cancelled", f"commit {n}: {child} was stopped"
            decisions = [
                c.record
                for c in log
                if isinstance(c.record, CancelRequested)
                and c.record.session_id == child
                and c.record.request_id.startswith("orphan:")
            ]
            if decisions:
                orphans.append(n)

    each_commit(plan, check)
    assert orphans, "some crash left a child whose parent call was over: it was stopped"
