"""The golden logs of every released format move only along the lifecycle tables.

The fold refuses a phase change that ``perdure.actors.lifecycle`` does not list; this
folds every golden log, session by session, and names the rows they take, so a table
too narrow for what an older build wrote fails here with the row it lacks.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from perdure.actors import state as state_module
from perdure.actors.lifecycle import TASK_TRANSITIONS, TaskPhase
from perdure.actors.state import SessionState
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import Committed

HERE = Path(__file__).resolve().parent
FIXTURES = sorted(p for p in HERE.glob("*/*") if (p / "data.mdb").exists())


def _sessions(fixture: Path, tmp_path: Path) -> dict[str, list[Committed]]:
    copy = tmp_path / "log"
    copy.mkdir(parents=True)
    shutil.copy(fixture / "data.mdb", copy / "data.mdb")
    reader = LmdbLog(copy, readonly=True)
    try:
        committed = reader.read_global()
    finally:
        reader.close()
    by_session: dict[str, list[Committed]] = defaultdict(list)
    for c in committed:
        by_session[c.record.session_id].append(c)
    return by_session


def test_every_golden_log_folds_along_the_task_lifecycle_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: set[tuple[TaskPhase | None, str]] = set()
    moves = state_module.task_moves

    def noting(session_id: str, call_id: str, phase: TaskPhase | None, event: str) -> TaskPhase:
        after = moves(session_id, call_id, phase, event)  # raises on a row the table lacks
        taken.add((phase, event))
        return after

    monkeypatch.setattr(state_module, "task_moves", noting)
    for n, fixture in enumerate(FIXTURES):
        for session_id, committed in _sessions(fixture, tmp_path / str(n)).items():
            SessionState.fold(session_id, committed)
    assert taken <= set(TASK_TRANSITIONS)
    # The logs hold calls run, heartbeating, resolved by a person, retried and finished.
    assert {
        (None, "ToolTaskCreated"),
        ("created", "ToolExecuting"),
        ("executing", "ToolCompleted"),
        ("executing", "ToolHeartbeat"),
        ("awaiting_human", "ResolutionDecided(retry)"),
        ("retry_pending", "ToolExecuting"),
        ("created", "ToolAwaitingApproval"),
        ("awaiting_approval", "ToolCancelled"),
    } <= taken
