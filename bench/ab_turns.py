"""One session's turn, A/B across source trees, interleaved in the same minutes.

    python bench/ab_turns.py ROUNDS LABEL=TREE[:LEVERS] ... [--log-dir DIR] [--think-ms N]
                             [--no-skeleton]

Each round runs, for every tree in turn (the order rotating from round to round), that
tree's own ``bench/perdure_bench.py turns LOG 50 [LEVERS] [THINK_MS]`` and, unless
``--no-skeleton``, its ``bench/skeleton.py LOG 1 50``, each in a process of its own on
a fresh log under ``--log-dir`` (``/dev/shm`` keeps the CPU and the thread hand-offs and
drops the fsync, whose time moves from minute to minute on a shared disk). A TREE is
any checkout, such as a detached worktree of an older commit
(``git worktree add --detach /tmp/old REV``); its own scripts run with its own code
first on the path, so a tree's bench may use API the others lack. LEVERS only for
trees whose ``turns`` takes them (``perdure_bench.py``'s ``LEVERS``); with
``--think-ms`` the skeleton still answers at once, so pass ``--no-skeleton``.

Prints each round (ms per turn, the median of the run's turns; perdure / skeleton), then
per label the median with the range and quartiles of the rounds, and the median of the
rounds' own ratios. A shared machine's noise shows as single rounds far above the
rest: report the spread, not one figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _run(tree: Path, args: list[str], log_dir: str) -> float:
    """Median ms per turn of one child run of ``tree``'s bench script ``args``."""
    scratch = tempfile.mkdtemp(prefix="ab-turns-", dir=log_dir)
    log = str(Path(scratch) / "log")
    try:
        env = dict(os.environ, PYTHONPATH=str(tree))
        out = subprocess.run(
            [sys.executable, *(log if a == "{log}" else a for a in args)],
            cwd=tree,
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if out.returncode:
        raise SystemExit(f"{tree}: {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["median_ms"])


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (
        f"{statistics.median(values):.3f} (rounds {min(values):.3f}-{max(values):.3f}, "
        f"quartiles {q1:.3f}-{q3:.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rounds", type=int)
    parser.add_argument("trees", nargs="+", metavar="LABEL=TREE[:LEVERS]")
    parser.add_argument("--log-dir", default=tempfile.gettempdir())
    parser.add_argument("--think-ms", default="0")
    parser.add_argument("--no-skeleton", action="store_true")
    args = parser.parse_args()
    specs: list[tuple[str, Path, str]] = []
    for spec in args.trees:
        label, sep, rest = spec.partition("=")
        if not sep:
            raise SystemExit(f"{spec!r}: expected LABEL=TREE[:LEVERS]")
        tree, _, levers = rest.partition(":")
        if not (Path(tree) / "bench" / "perdure_bench.py").is_file():
            raise SystemExit(f"{spec!r}: {tree} has no bench/perdure_bench.py")
        specs.append((label, Path(tree).resolve(), levers))
    think = args.think_ms != "0"
    perdure: dict[str, list[float]] = {label: [] for label, _, _ in specs}
    skeleton: dict[str, list[float]] = {label: [] for label, _, _ in specs}
    for n in range(args.rounds):
        turn = n % len(specs)
        cells = []
        for label, tree, levers in specs[turn:] + specs[:turn]:
            turns = ["bench/perdure_bench.py", "turns", "{log}", "50"]
            if levers or think:
                turns.append(levers or "model")
            if think:
                turns.append(args.think_ms)
            p = _run(tree, turns, args.log_dir)
            perdure[label].append(p)
            cell = f"{label} {p:.3f}"
            if not args.no_skeleton:
                s = _run(tree, ["bench/skeleton.py", "{log}", "1", "50"], args.log_dir)
                skeleton[label].append(s)
                cell += f" / {s:.3f} = {p / s:.2f}"
            cells.append(cell)
        print(f"round {n} (load {os.getloadavg()[0]:.1f}): " + " | ".join(cells), flush=True)
    for label, _, _ in specs:
        line = f"{label}: perdure {_spread(perdure[label])}"
        if skeleton[label]:
            ratios = [p / s for p, s in zip(perdure[label], skeleton[label], strict=True)]
            line += f"; skeleton {_spread(skeleton[label])}; perdure / skeleton {_spread(ratios)}"
        print(line)


if __name__ == "__main__":
    main()
