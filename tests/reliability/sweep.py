"""The crash-sweep driver: kill a workload at every durable boundary, restart, check.

For a workload, a clean run counts its commits K. Then each fault point — every
``commit@n`` for n in 1..K (or a sample), ``tool.before``/``tool.after`` of each
of its tools, ``model.after``, and ``model.early`` (the model answered while the
commit that started its call was in flight: the child's commits are slowed to hold
that window open) — runs in a fresh directory: a child is killed at the
point, a second child recovers on the same log and finishes, and the history
checker verifies the invariants of docs/DESIGN.md. Compound crashes kill the recovering
child again after its m-th commit, for m in 1..M, before a final clean recovery.

On PostgreSQL (``cluster`` given) every run gets a fresh database, snapshots are
template copies of it, and every child opens with ``takeover=True``: a restart of
the only node takes the dead node's leases at once instead of waiting for them to
expire (the multi-node tests wait for real expiry).
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from attrs import define, field

from tests.reliability.workloads import Workload
from tests.support.checker import check
from tests.support.pg import PgCluster, database_of
from tests.support.procs import run_child

# How long each commit of a child killed at ``model.early`` is held in flight: far
# longer than the scripted model takes to answer, so the reply comes before the commit.
EARLY_WINDOW_MS = 60


@define
class SweepStats:
    workload: str
    commits: int = 0
    points: int = 0
    restarts: int = 0
    compound: int = 0
    not_fired: list[str] = field(factory=list)
    violations: list[str] = field(factory=list)
    policies: set[str] = field(factory=set)
    records: Counter[str] = field(factory=Counter)


class _Logs:
    """Fresh logs and snapshots: directories (LMDB) or databases (PostgreSQL)."""

    def __init__(self, root: Path, cluster: PgCluster | None) -> None:
        self.root = root
        self.cluster = cluster
        self._databases: dict[str, str] = {}

    def fresh(self, name: str) -> tuple[str, Path]:
        base = self.root / name
        shutil.rmtree(base, ignore_errors=True)
        (base / "ws").mkdir(parents=True)
        if self.cluster is None:
            return str(base / "log"), base / "ws"
        self._drop(name)
        url = self.cluster.new_database()
        self._databases[name] = url
        return url, base / "ws"

    def _drop(self, name: str) -> None:
        old = self._databases.pop(name, None)
        if old is not None and self.cluster is not None:
            self.cluster.drop_database(database_of(old))

    def snapshot(self, log: str, ws: Path, name: str) -> None:
        """Copy the run's directory (workspace, and LMDB log) and, on PostgreSQL, its database."""
        target = self.root / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(ws.parent, target)
        if self.cluster is not None:
            self._drop(name)
            self._databases[name] = self.cluster.new_database(template=database_of(log))

    def restore(self, log: str, ws: Path, name: str) -> None:
        shutil.rmtree(ws.parent)
        shutil.copytree(self.root / name, ws.parent)
        if self.cluster is not None:
            db = database_of(log)
            self.cluster.drop_database(db)
            self.cluster.new_database(db, template=database_of(self._databases[name]))

    def close(self) -> None:
        for name in list(self._databases):
            self._drop(name)


def _verify(stats: SweepStats, w: Workload, plan: dict[str, Any], outcome: Any, where: str) -> None:
    for sid in w.sessions:
        status = outcome.outcome(sid)["status"]
        if status != w.final_status:
            stats.violations.append(f"{w.name} @ {where}: {sid} ended {status}")
    report = check(plan["log"], Path(plan["workspace"]))
    stats.violations += [f"{w.name} @ {where}: {v}" for v in report.violations]
    stats.policies |= report.replay_policies
    stats.records.update(report.counts)


def sweep(
    w: Workload,
    root: Path,
    *,
    commit_sample: int | None = None,
    compound_sample: int = 2,
    compound_depth: int = 3,
    seed: int = 0,
    cluster: PgCluster | None = None,
) -> SweepStats:
    logs = _Logs(root, cluster)
    try:
        return _sweep(w, logs, commit_sample, compound_sample, compound_depth, seed)
    finally:
        logs.close()


def _sweep(
    w: Workload,
    logs: _Logs,
    commit_sample: int | None,
    compound_sample: int,
    compound_depth: int,
    seed: int,
) -> SweepStats:
    rng = random.Random(seed)
    stats = SweepStats(w.name)
    pg = logs.cluster is not None

    def plan_for(log: str, ws: Path) -> dict[str, Any]:
        plan = w.plan(log, str(ws))
        if pg:
            plan["options"] = {**plan["options"], "takeover": True}
        return plan

    log, ws = logs.fresh("clean")
    clean_plan = plan_for(log, ws)
    clean = run_child(clean_plan)
    stats.commits = clean.appends
    _verify(stats, w, clean_plan, clean, "clean run")
    commits = list(range(1, stats.commits + 1))
    if commit_sample is not None and commit_sample < len(commits):
        commits = sorted({1, stats.commits, *rng.sample(commits, commit_sample)})
    points = [f"commit@{n}" for n in commits]
    points += [f"tool.{when}:{t}" for t in w.tools for when in ("before", "after")]
    points += ["model.after", "model.early"]
    for point in points:
        log, ws = logs.fresh("point")
        plan = plan_for(log, ws)
        slow = EARLY_WINDOW_MS if point == "model.early" else None
        first = run_child(plan, fault=point, slow_commit_ms=slow)
        if not first.killed:
            stats.not_fired.append(point)
            continue
        stats.points += 1
        second = run_child(plan)
        stats.restarts += 1
        _verify(stats, w, plan, second, point)
    for n in rng.sample(range(1, stats.commits + 1), min(compound_sample, stats.commits)):
        log, ws = logs.fresh("compound")
        plan = plan_for(log, ws)
        if not run_child(plan, fault=f"commit@{n}").killed:
            continue
        logs.snapshot(log, ws, "snapshot")
        for m in range(1, compound_depth + 1):
            logs.restore(log, ws, "snapshot")
            recovering = run_child(plan, fault=f"commit@{m}")
            if recovering.killed:
                stats.compound += 1
            final = run_child(plan)
            stats.restarts += 1 + recovering.killed
            _verify(stats, w, plan, final, f"commit@{n} then commit@{m} during recovery")
    return stats
