"""CI-sized crash sweeps over every reference workload: the proof of crash safety.

Every commit point of each single-session workload on LMDB (30 sampled points, plus
the first and the last, of the 20-session one), every ``tool.before``/``tool.after``
point of its tools, ``model.after`` and ``model.early``, and sampled compound crashes
(a second kill during recovery). Any violation fails. The larger run is
``PERDURE_SWEEP=full python -m pytest tests/reliability/test_sweeps.py`` (every commit
point everywhere, more compound crashes, every workload on PostgreSQL too).

The same sweeps run on the PostgreSQL backend for two workloads, at 6 sampled commit
points each (all of them, at every point, with ``PERDURE_SWEEP=full``): the recovery
rules must not depend on the log.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.reliability import workloads
from tests.reliability.sweep import sweep
from tests.support.stats import record_stat

FULL = os.environ.get("PERDURE_SWEEP") == "full"
ON_POSTGRES = workloads.ALL if FULL else (workloads.SEQUENTIAL, workloads.REVISION)
CASES = [pytest.param(w, "lmdb", id=f"lmdb-{w.name.replace(' ', '-')}") for w in workloads.ALL] + [
    pytest.param(w, "postgres", id=f"postgres-{w.name.replace(' ', '-')}") for w in ON_POSTGRES
]


def sample(backend: str) -> int:
    """Commit points a CI-sized sweep samples where it does not take them all."""
    return 30 if backend == "lmdb" else 6


@pytest.mark.parametrize(("workload", "backend"), CASES)
def test_sweep(
    workload: workloads.Workload, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    many = len(workload.sessions) > 1
    cluster = request.getfixturevalue("pg_cluster") if backend == "postgres" else None
    stats = sweep(
        workload,
        tmp_path,
        # CI takes every commit point of each single-session workload on LMDB. It samples
        # the 20-session one (~10x the commits; its points interleave the same
        # per-session windows) at 30 points, and on PostgreSQL, where each point needs a
        # fresh database and the same workloads were swept whole on LMDB, 6 points per
        # workload (the first and last always among them); the full run takes them all.
        commit_sample=None if FULL or (backend == "lmdb" and not many) else sample(backend),
        compound_sample=8 if FULL else 2,
        compound_depth=6 if FULL else 3,
        cluster=cluster,
    )
    assert stats.violations == [], "\n".join(stats.violations)
    assert stats.not_fired == [], f"fault points that never fired: {stats.not_fired}"
    # Non-vacuity: the sweep really crashed, restarted, and exercised what it claims.
    if FULL or (backend == "lmdb" and not many):
        assert stats.points >= stats.commits
    else:
        assert stats.points >= min(stats.commits, sample(backend))
    assert stats.compound >= 1
    assert workload.policies <= stats.policies, f"policies exercised: {stats.policies}"
    missing = {r for r in workload.records if stats.records[r] == 0}
    assert not missing, f"record types never produced: {missing}"
    assert stats.records["RecoveryDecision"] > 0, "no recovery decision was ever taken"
    record_stat(
        "sweep",
        workloads=1,
        commits=stats.commits,
        points=stats.points,
        restarts=stats.restarts,
        compound=stats.compound,
    )
