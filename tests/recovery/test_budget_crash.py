"""A budget survives a SIGKILL: the spend before the crash counts after the restart.

The runtime counts a run's spend from the usage in the log. A counter kept in memory
would restart at zero with the new process and let the run spend its budget again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perdure.storage.records import GenerationCompleted, RunFinished
from tests.support.checker import assert_sound, read_log
from tests.support.procs import run_child


def test_the_spend_before_a_crash_counts_after_the_restart(make_plan: Any) -> None:
    # Every scripted reply uses 15 tokens (10 in, 5 out); the budget allows 40.
    turn = {"text": "looking", "tool_uses": [{"name": "lookup", "input": {"query": "q"}}]}
    script = [turn, turn, turn, turn, turn, {"text": "done"}]
    plan = make_plan(script, options={"budget": {"session_tokens": 40}})
    first = run_child(plan, fault="tool.after:lookup@2")  # killed in turn 2: 30 spent
    assert first.killed, first.stderr
    before = [c.record for c in read_log(Path(plan["log"]))]
    assert len([r for r in before if isinstance(r, GenerationCompleted)]) == 2
    plan["sessions"] = {"s1": []}  # nothing re-submitted: the run goes on by itself
    outcome = run_child(plan).outcome("s1")
    assert outcome["status"] == "stopped"
    assert outcome["reason"] == "the session's token budget is spent: 45 of 40 tokens used"
    records = [c.record for c in read_log(Path(plan["log"]))]
    replies = [r for r in records if isinstance(r, GenerationCompleted)]
    assert len(replies) == 3, "one model call after the restart, not three more"
    finals = [r for r in records if isinstance(r, RunFinished) and r.status != "interrupted"]
    assert [r.status for r in finals] == ["stopped"]
    assert_sound(plan)
