"""Every build reads the logs of every released record format and decides the same.

The fixtures under ``tests/golden/`` are real LMDB logs: ``v1/`` of the first
record format, ``perdure-<version>/`` of each release (``make_golden.py`` made
them; the crash scenarios were left by killed runtimes, ``features`` by a runtime
over the real providers, holding reasoning blocks, retries, heartbeats, a budget,
a fallback and calls waiting for a person; ``sub-agents`` by a runtime killed just after
a tool call linked the sub-agent it started). Reading them checks the storage layout
and decodes every record (checksums included); folding them checks that today's
state machine accepts yesterday's facts and reads them the same
(``expected_replay.json``); recomputing their recovery plan checks that a new build
would continue an old log exactly as the build that wrote it would have.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from perdure.actors.state import SessionState
from perdure.storage.lmdb_log import LmdbLog
from perdure.storage.records import (
    AgentStarted,
    Committed,
    GenerationCompleted,
    InputAccepted,
    RedactedThinkingBlock,
    RetryPending,
    RunFinished,
    SessionCreated,
    ThinkingBlock,
)
from tests.golden.features import REQUIRED_TYPES, describe
from tests.golden.plan import recovery_plan

HERE = Path(__file__).resolve().parent
FIXTURES = sorted(p for p in HERE.glob("*/*") if (p / "data.mdb").exists())
CURRENT = HERE / "perdure-0.1.0"


def _copy(fixture: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "log"
    copy.mkdir()
    shutil.copy(fixture / "data.mdb", copy / "data.mdb")
    return copy


def _records(log_dir: Path) -> list[Committed]:
    reader = LmdbLog(log_dir, readonly=True)
    try:
        return reader.read_global()
    finally:
        reader.close()


def test_there_are_golden_logs() -> None:
    assert len([f for f in FIXTURES if f.parent.name == "v1"]) >= 6
    assert len([f for f in FIXTURES if f.parent == CURRENT]) >= 7


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_log_gives_the_same_recovery_plan(fixture: Path, tmp_path: Path) -> None:
    expected = json.loads((fixture / "expected_plan.json").read_text())
    assert recovery_plan(_copy(fixture, tmp_path)) == expected


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_log_decodes_and_folds_the_same(fixture: Path, tmp_path: Path) -> None:
    records = _records(_copy(fixture, tmp_path))
    assert [c.seq for c in records] == list(range(1, len(records) + 1))
    expected = json.loads((fixture / "expected_replay.json").read_text())
    assert json.loads(json.dumps(describe(records))) == expected


def test_the_current_golden_log_holds_every_newer_kind_of_fact(tmp_path: Path) -> None:
    records = [c.record for c in _records(_copy(CURRENT / "features", tmp_path))]
    assert {type(r).__name__ for r in records} >= REQUIRED_TYPES
    blocks = {type(b) for r in records if isinstance(r, GenerationCompleted) for b in r.thinking}
    assert blocks == {ThinkingBlock, RedactedThinkingBlock}
    assert all(
        b.signature
        for r in records
        if isinstance(r, GenerationCompleted)
        for b in r.thinking
        if isinstance(b, ThinkingBlock)
    )
    retries = [r for r in records if isinstance(r, RetryPending)]
    assert any(r.fallback and r.provider == "anthropic" for r in retries)
    assert {r.provider for r in records if isinstance(r, GenerationCompleted)} == {
        "anthropic",
        "openai",
    }
    assert any(r.budget is not None for r in records if isinstance(r, InputAccepted))
    assert "stopped" in {r.status for r in records if isinstance(r, RunFinished)}


def test_the_sub_agent_golden_log_links_the_call_and_its_child(tmp_path: Path) -> None:
    """``sub-agents``: killed right after the parent's call recorded its child. Today's
    fold must read the link from both ends (the parent's ``AgentStarted``, the child's
    ``SessionCreated.parent``), since pause, resume, cancel and deletion follow it."""
    records = _records(_copy(CURRENT / "sub-agents", tmp_path))
    (link,) = [c.record for c in records if isinstance(c.record, AgentStarted)]
    (created,) = [
        c.record
        for c in records
        if isinstance(c.record, SessionCreated) and c.record.session_id == link.child
    ]
    assert created.parent == f"{link.session_id}/{link.call_id}"
    parent = SessionState.fold(
        link.session_id, [c for c in records if c.record.session_id == link.session_id]
    )
    assert parent.tasks[link.call_id].children == (link.child,)
    assert not parent.tasks[link.call_id].terminal  # the call still waits for its child


def test_the_compaction_golden_log_holds_a_summary_and_one_in_progress(tmp_path: Path) -> None:
    log = _copy(CURRENT / "compaction", tmp_path)
    records = [c.record for c in _records(log)]
    kinds = [type(r).__name__ for r in records]
    assert kinds.count("CompactionStarted") == 2 and kinds.count("ContextCompacted") == 1
    assert kinds.count("CompactionRetryPending") == 1
    plan = recovery_plan(log)["compacted"]
    assert plan["effects"][0].startswith("Summarize('compacted.compaction2', 2,")
    assert not any(r["type"] == "GenerationStarted" for r in plan["records"])
