"""Retention across real crashes: ``perdure prune`` SIGKILLed at every commit.

A log with several finished sessions is pruned by the command line with
``PERDURE_FAULT=commit@k``: after each kill every session is either whole (all its
records) or gone, and ``perdure check`` passes. Then a full prune deletes the rest,
``perdure compact`` shrinks the file, and the log still checks. ``export`` then
``import`` into another log round-trips a session exactly.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from perdure.check import check_log
from perdure.storage.lmdb_log import LmdbLog
from tests.server.test_cli import perdure
from tests.support.procs import run_child

SESSIONS = ["s1", "s2", "s3", "s4"]


def sessions(log_dir: Path) -> dict[str, int]:
    log = LmdbLog(log_dir, readonly=True)
    try:
        return {i.session_id: i.records for i in log.sessions()}
    finally:
        log.close()


def sound(log_dir: Path) -> None:
    report = check_log(log_dir)
    assert report.violations == [], "\n".join(report.violations)


def test_a_prune_killed_at_every_commit_leaves_sessions_whole_or_gone(
    make_plan: Any, tmp_path: Path
) -> None:
    turn = {"text": "noting", "tool_uses": [{"name": "send_note", "input": {"text": "n"}}]}
    plan = make_plan([turn, {"text": "done"}])
    plan["sessions"] = {sid: [{"text": "go", "request_id": "r1"}] for sid in SESSIONS}
    run_child(plan)
    pristine = tmp_path / "pristine"
    shutil.copytree(plan["log"], pristine)
    whole = sessions(pristine)
    assert sorted(whole) == SESSIONS

    log_dir = Path(plan["log"])
    args = ["prune", "--finished-before", "2999-01-01", "--log", str(log_dir)]
    killed = 0
    for k in range(1, 20):
        shutil.rmtree(log_dir)
        shutil.copytree(pristine, log_dir)
        proc = perdure(*args, env={"PERDURE_FAULT": f"commit@{k}"})
        if proc.returncode == 0:
            break
        assert proc.returncode == -9, proc.stderr
        killed += 1
        left = sessions(log_dir)
        assert all(left[sid] == whole[sid] for sid in left), f"commit {k}: a session in part"
        assert len(left) == len(SESSIONS) - k, f"commit {k}: {sorted(left)}"
        sound(log_dir)
        again = perdure(*args)  # the rest, after the crash
        assert again.returncode == 0, again.stderr
        assert sessions(log_dir) == {}
        sound(log_dir)
    assert killed == len(SESSIONS), "killed once per session's deletion"

    size = (log_dir / "data.mdb").stat().st_size
    compacted = perdure("compact", "--log", str(log_dir))
    assert compacted.returncode == 0, compacted.stderr
    assert (log_dir / "data.mdb").stat().st_size < size
    assert perdure("check", "--log", str(log_dir)).returncode == 0
    sound(log_dir)


def test_export_then_import_round_trips_a_session(make_plan: Any, tmp_path: Path) -> None:
    turn = {"text": "noting", "tool_uses": [{"name": "send_note", "input": {"text": "n"}}]}
    plan = make_plan([turn, {"text": "done"}])
    run_child(plan)
    out = tmp_path / "s1.jsonl"
    exported = perdure("export", "s1", "-o", str(out), "--log", plan["log"])
    assert exported.returncode == 0, exported.stderr
    other = tmp_path / "other"
    imported = perdure("import", str(out), "--log", str(other))
    assert imported.returncode == 0, imported.stderr
    assert "imported session s1" in imported.stdout
    copies = []
    for where in (Path(plan["log"]), other):
        log = LmdbLog(where, readonly=True)
        try:
            copies.append([c.record for c in log.read_session("s1")])
        finally:
            log.close()
    assert copies[0] == copies[1] and len(copies[0]) > 5, "the same records, in order"
    again = perdure("import", str(out), "--log", str(other))
    assert again.returncode == 1 and "already has a session" in again.stderr
    sound(other)
