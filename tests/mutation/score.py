"""The score of a mutmut campaign over the core, per file, from mutmut's own result files.

mutmut (the ``mutation`` extra, configured in pyproject's ``[tool.mutmut]``) leaves one
``mutants/<path>.meta`` JSON file per mutated source file: the exit code of the tests
run against each mutant. This script reads them (it does not import mutmut), takes the
mutants that a person classified as EQUIVALENT (``equivalent.toml`` beside this file:
the mutant's name and why no test can tell it from the original), and prints, per file:
killed, survived, equivalent, timeout, no tests, not checked, and the score::

    score = killed / (killed + survived + no tests)

over the non-equivalent mutants (a timeout counts as killed: the mutant made the suite
hang, which a run notices). ``--survivors`` lists every survivor left; ``--diffs``
adds each one's diff (that part needs mutmut installed). Run from the repository root,
after ``mutmut run``; see docs/RELIABILITY.md, "Mutation testing".
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
EQUIVALENT = HERE / "equivalent.toml"

# mutmut's exit codes (mutmut.stats.status_by_exit_code), grouped as this report counts them.
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "killed",  # caught by a type check (only if one is configured)
    None: "not checked",
}
COLUMNS = ("killed", "survived", "equivalent", "timeout", "no tests", "not checked", "other")


def load_equivalent(path: Path = EQUIVALENT) -> dict[str, str]:
    """Mutant name -> the reason it is equivalent. Every entry must give a reason."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text("utf-8"))
    reasons: dict[str, str] = {}
    for section in data.values():
        for name, why in section.items():
            if not isinstance(why, str) or not why.strip():
                raise SystemExit(f"{path}: {name} has no reason")
            reasons[name] = why
    return reasons


def classify(
    root: Path, equivalent: dict[str, str]
) -> dict[str, tuple[Counter[str], dict[str, str]]]:
    """Per source file: the counts, and each mutant's status."""
    out: dict[str, tuple[Counter[str], dict[str, str]]] = {}
    for meta in sorted((root / "mutants").rglob("*.py.meta")):
        source = str(meta.relative_to(root / "mutants"))[: -len(".meta")]
        codes = json.loads(meta.read_text("utf-8"))["exit_code_by_key"]
        if not codes:
            continue
        counts: Counter[str] = Counter()
        statuses: dict[str, str] = {}
        for name, code in sorted(codes.items()):
            status = STATUS.get(code, "other")
            if status == "survived" and name in equivalent:
                status = "equivalent"
            counts[status] += 1
            statuses[name] = status
        out[source] = (counts, statuses)
    return out


def score(counts: Counter[str]) -> float | None:
    """Killed over the non-equivalent mutants that were run or had no test (timeouts kill)."""
    killed = counts["killed"] + counts["timeout"]
    judged = killed + counts["survived"] + counts["no tests"]
    return None if judged == 0 else killed / judged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("--survivors", action="store_true", help="list the survivors left")
    parser.add_argument("--diffs", action="store_true", help="with each survivor's diff")
    parser.add_argument("--min", type=float, default=None, help="fail below this score")
    args = parser.parse_args(argv)
    equivalent = load_equivalent()
    files = classify(args.root, equivalent)
    if not files:
        print("no mutmut results under mutants/: run `mutmut run` first", file=sys.stderr)
        return 2
    width = max(len(f) for f in files)
    print(f"{'file':<{width}}  " + "  ".join(f"{c:>11}" for c in COLUMNS) + "    score")
    low = False
    for source, (counts, _) in files.items():
        value = score(counts)
        shown = "-" if value is None else f"{value:.1%}"
        print(
            f"{source:<{width}}  "
            + "  ".join(f"{counts[c]:>11}" for c in COLUMNS)
            + f"  {shown:>7}"
        )
        low = low or (args.min is not None and value is not None and value < args.min)
    stale = set(equivalent) - {n for _, st in files.values() for n in st}
    if stale:
        print(f"\n{len(stale)} equivalent entries name no mutant (source changed?):")
        for name in sorted(stale):
            print("  " + name)
    if args.survivors or args.diffs:
        for source, (_, statuses) in files.items():
            left = [n for n, st in statuses.items() if st in ("survived", "no tests")]
            if not left:
                continue
            print(f"\n{source}: {len(left)} survivors")
            for name in left:
                print(f"  {name}  ({statuses[name]})")
                if args.diffs:
                    print(_diff(name, source))
    return 1 if low else 0


def _diff(name: str, source: str) -> str:
    from mutmut.__main__ import get_diff_for_mutant  # only for --diffs

    return "\n".join(
        "      " + line for line in get_diff_for_mutant(name, path=source).splitlines()
    )


if __name__ == "__main__":
    sys.exit(main())
