"""Run the reliability suites and add up what they did: the figures of RELIABILITY.md.

    python -m tests.reliability.report            # the CI-sized run (~10 min)
    python -m tests.reliability.report --full     # every commit point everywhere, longer soak

It runs the crash sweeps, the soak, the takeover and disk-fault tests, the
corruption and golden-log tests, the pure-core state machine, the decoder and HTTP
fuzzing and the storage crash tests, with PERDURE_RELIABILITY_STATS set so each
reports its counts; then prints a table and writes docs/reliability-figures.json
(docs/reliability-figures-full.json for ``--full``).
A failing test fails the command: the figures are only written for a clean run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = [
    "tests/reliability",
    "tests/recovery",
    "tests/course",
    "tests/golden",
    "tests/core/test_fuzz.py",
    "tests/storage/test_codec.py",
    "tests/storage/test_crash_atomicity.py",
    "tests/storage/test_ownership.py",
    "tests/storage/test_disk_full.py",
    "tests/server/test_fuzz_api.py",
]

ROWS = [
    ("sweep", "workloads", "reference workloads swept"),
    ("sweep", "points", "crash points tried (commit, tool.before/after, model.after, model.early)"),
    ("sweep", "compound", "compound crashes (a second kill during recovery)"),
    ("sweep", "restarts", "restarts checked by the history checker"),
    ("soak", "kills", "random SIGKILLs of a live daemon"),
    ("soak", "pauses", "random SIGSTOP/SIGCONT pauses of a live daemon"),
    ("soak", "inputs", "inputs submitted during the soak"),
    ("mid_commit_kills", "kills", "SIGKILLs in the middle of LMDB commits"),
    ("takeover", "takeovers", "takeovers of a log (dead or stopped owner)"),
    ("takeover", "fenced", "stopped owners fenced after a takeover"),
    ("takeover", "refused", "second live owners refused"),
    ("core_fuzz", "histories", "random histories of the pure core"),
    ("core_fuzz", "steps", "steps checked (state == refold, invariants)"),
    ("core_fuzz", "crashes", "crashes + recoveries within those histories"),
    ("decoder_fuzz", "inputs", "arbitrary inputs fed to the record decoder"),
    ("decoder_fuzz", "bit_flips", "single-bit flips of stored records, all detected"),
    ("http_fuzz", "requests", "arbitrary HTTP payloads (no 500, no crash)"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the larger run")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: docs/reliability-figures.json (-full.json with --full)",
    )
    args = parser.parse_args()
    if args.out is None:
        name = "reliability-figures-full.json" if args.full else "reliability-figures.json"
        args.out = ROOT / "docs" / name
    stats_file = Path(tempfile.mkstemp(suffix=".jsonl")[1])
    env = dict(os.environ, PERDURE_RELIABILITY_STATS=str(stats_file))
    if args.full:
        env.update(PERDURE_SWEEP="full", PERDURE_SOAK_CYCLES="40", PERDURE_FUZZ_EXAMPLES="2000")
    started = datetime.datetime.now(datetime.UTC)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
        cwd=ROOT,
        env=env,
        text=True,
        capture_output=True,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:])
        print("FAILED: no figures written")
        return 1
    totals: dict[str, Counter[str]] = defaultdict(Counter)
    for line in stats_file.read_text().splitlines():
        entry = json.loads(line)
        kind = entry.pop("kind")
        totals[kind].update(entry)
    stats_file.unlink()
    machine = f"{platform.platform()}, {os.cpu_count()} cpus, Python {platform.python_version()}"
    figures = {
        "command": "python -m tests.reliability.report" + (" --full" if args.full else ""),
        "date": started.strftime("%Y-%m-%d"),
        "machine": machine,
        "pytest": summary,
        "violations": 0,
        "totals": {kind: dict(c) for kind, c in sorted(totals.items())},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1) + "\n")
    print("| what | count |\n|---|---|")
    for kind, key, label in ROWS:
        print(f"| {label} | {totals[kind][key]:,} |")
    print(f"\n{summary}; lost, duplicated or unexpected effects: 0 (any would have failed the run)")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
