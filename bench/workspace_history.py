"""Workspace history: what a checkpoint costs on a 10,000-file workspace.

    python bench/workspace_history.py [--files 10000] [--calls 20] [--dulwich]

Builds a workspace of ``--files`` small source-like files (4 KB median, in 100
directories, plus a .gitignore'd build directory and one file over the size limit),
then measures with the store perdure uses (``perdure.tools.history``, a shadow git
repository driven by the git binary):

* the first snapshot (every file hashed and stored);
* an incremental snapshot per call (one file edited, then snapshotted: what the
  before/after checkpoints of a ``write_file`` call cost), median and p95;
* a snapshot with nothing changed (the cost a read-mostly ``bash`` call pays);
* the disk the store takes after the first snapshot, and per incremental checkpoint;
* verifying a checkpoint before a restore, and a restore of one changed file.

``--dulwich`` also times the same first and incremental snapshot through dulwich
(pure-Python git, installed separately: it is not a dependency of perdure), the
alternative the choice was measured against. Figures: bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from perdure.tools.history import WorkspaceHistory


def build(root: Path, files: int, seed: int = 7) -> list[Path]:
    rng = random.Random(seed)
    made: list[Path] = []
    for i in range(files):
        d = root / f"pkg{i % 100:03d}"
        d.mkdir(exist_ok=True)
        size = int(rng.lognormvariate(8.3, 0.8))  # median ~4 KB
        line = f"def f{i}(x):\n    return x + {i}\n"
        body = (line * (size // len(line) + 1))[:size]
        p = d / f"mod{i:05d}.py"
        p.write_text(body)
        made.append(p)
    (root / ".gitignore").write_text("build/\n")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_bytes(os.urandom(1 << 20))
    (root / "big.bin").write_bytes(os.urandom(11 << 20))
    return made


def du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for n in names:
            total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
    return total


def timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def bench_perdure(root: Path, made: list[Path], calls: int) -> dict[str, float]:
    h = WorkspaceHistory(root)
    first = timed(lambda: h.snapshot(keep_as="refs/perdure/bench/first"))
    after_first = du(h.store)
    rng = random.Random(1)
    incremental: list[float] = []
    before_tree = h.snapshot().tree
    for n in range(calls):
        target = rng.choice(made)
        with open(target, "a") as f:
            f.write(f"# edit {n}\n")
        incremental.append(timed(lambda n=n: h.snapshot(keep_as=f"refs/perdure/bench/c{n}")))
    per_checkpoint = (du(h.store) - after_first) / calls
    unchanged = [timed(h.snapshot) for _ in range(5)]
    verify = timed(lambda: h.verify(before_tree))
    restore = timed(lambda: h.restore(before_tree))
    return {
        "first_s": first,
        "incremental_median_ms": statistics.median(incremental) * 1000,
        "incremental_p95_ms": sorted(incremental)[int(0.95 * (len(incremental) - 1))] * 1000,
        "unchanged_median_ms": statistics.median(unchanged) * 1000,
        "store_after_first_mb": after_first / 1e6,
        "disk_per_checkpoint_kb": per_checkpoint / 1e3,
        "verify_ms": verify * 1000,
        "restore_ms": restore * 1000,
    }


def bench_dulwich(root: Path, made: list[Path], calls: int) -> dict[str, float]:
    from dulwich import porcelain  # type: ignore[import-not-found, import-untyped]
    from dulwich.repo import Repo  # type: ignore[import-not-found, import-untyped]

    repo = Repo.init(str(root))

    def snapshot() -> None:
        porcelain.add(repo, paths=None)
        repo.open_index().commit(repo.object_store)  # the tree

    try:
        first = timed(snapshot)
        rng = random.Random(2)
        incremental = []
        for n in range(calls):
            target = rng.choice(made)
            with open(target, "a") as f:
                f.write(f"# dulwich edit {n}\n")
            incremental.append(timed(snapshot))
    finally:
        shutil.rmtree(root / ".git", ignore_errors=True)
    return {
        "first_s": first,
        "incremental_median_ms": statistics.median(incremental) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--dulwich", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="perdure-wh-") as tmp:
        root = Path(tmp) / "ws"
        root.mkdir()
        made = build(root, args.files)
        print(f"workspace: {args.files} files, {du(root) / 1e6:.1f} MB on disk")
        for key, value in bench_perdure(root, made, args.calls).items():
            print(f"git store    {key:24} {value:10.2f}")
        if args.dulwich:
            shutil.rmtree(root / ".perdure-tools", ignore_errors=True)
            for key, value in bench_dulwich(root, made, max(3, args.calls // 4)).items():
                print(f"dulwich      {key:24} {value:10.2f}")


if __name__ == "__main__":
    main()
