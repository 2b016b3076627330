"""The crash-sweep driver: kill a workload at every durable boundary, restart, check.

For a workload, a clean run counts its commits K. Then each fault point — every
``commit@n`` for n in 1..K (or a sample), ``tool.before``/``tool.after`` of each
of its tools, ``model.after`` — runs in a fresh directory: a child is killed at the
point, a second child recovers on the same log and finishes, and the history
checker verifies DESIGN.md's invariants. Compound crashes kill the recovering
child again after its m-th commit, for m in 1..M, before a final clean recovery.
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
from tests.support.procs import run_child


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


def _fresh(root: Path, name: str) -> tuple[Path, Path]:
    base = root / name
    shutil.rmtree(base, ignore_errors=True)
    (base / "ws").mkdir(parents=True)
    return base / "log", base / "ws"


def _verify(stats: SweepStats, w: Workload, plan: dict[str, Any], outcome: Any, where: str) -> None:
    for sid in w.sessions:
        status = outcome.outcome(sid)["status"]
        if status != w.final_status:
            stats.violations.append(f"{w.name} @ {where}: {sid} ended {status}")
    report = check(Path(plan["log"]), Path(plan["workspace"]))
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
) -> SweepStats:
    rng = random.Random(seed)
    stats = SweepStats(w.name)
    log, ws = _fresh(root, "clean")
    clean_plan = w.plan(str(log), str(ws))
    clean = run_child(clean_plan)
    stats.commits = clean.appends
    _verify(stats, w, clean_plan, clean, "clean run")
    commits = list(range(1, stats.commits + 1))
    if commit_sample is not None and commit_sample < len(commits):
        commits = sorted({1, stats.commits, *rng.sample(commits, commit_sample)})
    points = [f"commit@{n}" for n in commits]
    points += [f"tool.{when}:{t}" for t in w.tools for when in ("before", "after")]
    points.append("model.after")
    for point in points:
        log, ws = _fresh(root, "point")
        plan = w.plan(str(log), str(ws))
        first = run_child(plan, fault=point)
        if not first.killed:
            stats.not_fired.append(point)
            continue
        stats.points += 1
        second = run_child(plan)
        stats.restarts += 1
        _verify(stats, w, plan, second, point)
    for n in rng.sample(range(1, stats.commits + 1), min(compound_sample, stats.commits)):
        log, ws = _fresh(root, "compound")
        plan = w.plan(str(log), str(ws))
        if not run_child(plan, fault=f"commit@{n}").killed:
            continue
        snapshot = root / "snapshot"
        shutil.rmtree(snapshot, ignore_errors=True)
        shutil.copytree(log.parent, snapshot)
        for m in range(1, compound_depth + 1):
            shutil.rmtree(log.parent)
            shutil.copytree(snapshot, log.parent)
            recovering = run_child(plan, fault=f"commit@{m}")
            if recovering.killed:
                stats.compound += 1
            final = run_child(plan)
            stats.restarts += 1 + recovering.killed
            _verify(stats, w, plan, final, f"commit@{n} then commit@{m} during recovery")
    return stats
