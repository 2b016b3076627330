"""Kill the CHANGELOG scenario after every single commit, restart, check the invariants.

A clean run counts its commits K. Then for every n in 1..K a fresh child is killed
right after its n-th commit is durable, a second child recovers on the same log,
and the history checker verifies the invariants of docs/DESIGN.md, including: the NEVER
note took effect at most once, and the input got exactly one outcome.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.support.checker import assert_sound
from tests.support.ledger_tools import effects
from tests.support.procs import run_child

SCRIPT: list[dict[str, Any]] = [
    {"text": "Appending.", "tool_uses": [{"name": "send_note", "input": {"text": "- entry"}}]},
    {"text": "Checking.", "tool_uses": [{"name": "lookup", "input": {"query": "changelog"}}]},
    {"text": "Appended one line and checked it."},
]


def test_kill_after_every_commit(make_plan: Any, tmp_path: Path) -> None:
    clean = make_plan(SCRIPT)
    commits = run_child(clean).appends
    assert commits >= 6, "the scenario is too small to be a meaningful sweep"
    tried = 0
    for n in range(1, commits + 1):
        shutil.rmtree(clean["log"], ignore_errors=True)
        ws = Path(clean["workspace"])
        shutil.rmtree(ws)
        ws.mkdir()
        first = run_child(clean, fault=f"commit@{n}")
        assert first.killed, f"commit@{n} did not fire"
        outcome = run_child(clean).outcome("s1")
        assert outcome["status"] == "completed", (n, outcome)
        notes = [e for e in effects(ws) if e["tool"] == "send_note"]
        assert len(notes) <= 1, f"commit@{n}: the NEVER note took effect {len(notes)} times"
        report = assert_sound(clean)
        assert report.counts["RunFinished"] >= 1
        tried += 1
    assert tried == commits
