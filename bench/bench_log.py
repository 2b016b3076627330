"""Benchmark of perdure's durable log: the fsync floor, the Journal alone, the Journal shared.

Run from the repository root: ``python bench/bench_log.py [--quick] [--dir DIR]``.

In one run it measures, each in a fresh temporary directory on the same filesystem
(``--dir``, by default ``bench/results``), after a warm-up, repeated and reduced to
the median:

(a) the floor: raw LMDB (py-lmdb directly) committing one small value per
    transaction with the sync settings of perdure's default durability "full"
    (``sync=True, metasync=True``): what one fsync'ed commit costs on this disk;
(b) the Journal with a single appender: one small record per ``append``, each
    awaited before the next; target: at least 0.8 of the floor;
(c) the Journal with 100 concurrent appenders (trio tasks), one small record per
    append; target: at least 10 times (b), which only group commit can reach;

and, as a diagnostic that splits the gap between (a) and (b), ``LmdbLog.commit``
called directly from one thread (no Journal, no hand-off).

It prints a table and writes ``bench/results/log.json`` (figures, ratios, targets
met or not, date, machine). ``--quick`` runs a tiny version in seconds, to check
that the benchmark works, not to measure; it writes ``log-quick.json`` instead, so
it never overwrites a real measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perdure.storage.journal import Journal, open_journal  # noqa: E402
from perdure.storage.lmdb_log import DEFAULT_MAP_SIZE, LmdbLog  # noqa: E402
from perdure.storage.records import ToolCompleted  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SINGLE_TARGET = 0.8
CONCURRENT_TARGET = 10.0
APPENDERS = 100


def small_record(i: int) -> ToolCompleted:
    """A small, typical record (its frame is about 110 bytes)."""
    return ToolCompleted(session_id=f"s{i % 8}", call_id=f"call-{i}", output="ok", at=1.0)


@contextmanager
def fresh_dir(base: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bench-", suffix=".tmp", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- the three measurements, in blocks -----------------------------------------------
#
# The machine may be shared and its disk busy, so the three are measured in short
# blocks taken in turn (a, b, c, a, b, c, ...), each kind in its own fresh directory,
# and every figure is a median over blocks; each ratio is the median of the ratios
# of blocks measured back to back, so a change of load hits both sides of it alike.


class Floor:
    """(a) Raw LMDB: one small value per synced commit, the env opened as LmdbLog opens it."""

    def __init__(self, path: Path) -> None:
        self.env = lmdb.open(
            str(path),
            map_size=DEFAULT_MAP_SIZE,
            max_dbs=8,
            subdir=True,
            sync=True,  # durability "full", like LmdbLog's default
            metasync=True,
            writemap=False,
            lock=True,
            max_readers=512,
        )
        self.db = self.env.open_db(b"records")
        self.value = bytes(110)  # about the size of small_record's frame
        self.next = 0

    def block(self, n: int) -> float:
        """Commit ``n`` values one per transaction; return commits/s."""
        env, db, value = self.env, self.db, self.value
        start = time.perf_counter()
        for i in range(self.next, self.next + n):
            with env.begin(write=True) as txn:
                txn.put(i.to_bytes(8, "big"), value, db=db)
        self.next += n
        return n / (time.perf_counter() - start)


def direct_block(log: LmdbLog, n: int, first: int) -> float:
    """Diagnostic: ``LmdbLog.commit`` of one small record, called directly in one thread.

    The same transactions as (b) without the Journal, so (a) -> (direct) is the cost
    of the log's layout and bookkeeping (three B-trees written per commit instead of
    one, encoding, the session summary), and (direct) -> (b) the cost of handing
    each commit to the writer thread and its result back to trio.
    """
    start = time.perf_counter()
    for i in range(first, first + n):
        log.commit([([small_record(i)], None)])
    return n / (time.perf_counter() - start)


async def single_block(journal: Journal, n: int, first: int) -> float:
    """(b) ``n`` appends of one small record, each awaited before the next; appends/s."""
    start = time.perf_counter()
    for i in range(first, first + n):
        await journal.append([small_record(i)])
    return n / (time.perf_counter() - start)


async def concurrent_block(journal: Journal, each: int, first: int) -> tuple[float, float]:
    """(c) APPENDERS tasks appending ``each`` small records each; appends/s, appends/txn."""

    async def appender(k: int) -> None:
        for i in range(each):
            await journal.append([small_record(first + k * each + i)])

    before = journal.stats.transactions
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(APPENDERS):
            nursery.start_soon(appender, k)
    elapsed = time.perf_counter() - start
    appends = APPENDERS * each
    return appends / elapsed, appends / (journal.stats.transactions - before)


async def measure(base: Path, rounds: int, n: int, each: int) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {
        "floor": [],
        "direct": [],
        "single": [],
        "concurrent": [],
        "per_txn": [],
    }
    with (
        fresh_dir(base) as a,
        fresh_dir(base) as b,
        fresh_dir(base) as c,
        fresh_dir(base) as d,
    ):
        floor = Floor(a)
        single_log, concurrent_log, direct_log = LmdbLog(b), LmdbLog(c), LmdbLog(d)
        try:
            async with open_journal(single_log) as single, open_journal(concurrent_log) as shared:
                # Warm up: caches, the files' first pages, LMDB's free lists, trio's threads.
                await trio.to_thread.run_sync(floor.block, n)
                await trio.to_thread.run_sync(direct_block, direct_log, n, 0)
                await single_block(single, n, 0)
                await concurrent_block(shared, max(1, each // 2), 0)
                for r in range(1, rounds + 1):
                    runs["floor"].append(await trio.to_thread.run_sync(floor.block, n))
                    runs["direct"].append(
                        await trio.to_thread.run_sync(direct_block, direct_log, n, r * n)
                    )
                    runs["single"].append(await single_block(single, n, r * n))
                    rate, per_txn = await concurrent_block(shared, each, r * APPENDERS * each)
                    runs["concurrent"].append(rate)
                    runs["per_txn"].append(per_txn)
        finally:
            floor.env.close()
            single_log.close()
            direct_log.close()
            concurrent_log.close()
    return runs


# -- the run -------------------------------------------------------------------------


def filesystem_of(path: Path) -> str:
    """The filesystem type the temporary directories live on (from /proc/mounts)."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    resolved = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and resolved.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run, seconds long")
    parser.add_argument("--dir", type=Path, default=RESULTS, help="where temp logs go")
    parser.add_argument(
        "--out", type=Path, help="default: bench/results/log.json (log-quick.json if --quick)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        rounds, n, each = 3, 20, 3
    else:
        rounds, n, each = 15, 100, 20
    base: Path = args.dir
    base.mkdir(parents=True, exist_ok=True)

    print(f"perdure log benchmark ({'quick' if args.quick else 'full'}) in {base}", flush=True)
    runs = trio.run(measure, base, rounds, n, each)
    floor = statistics.median(runs["floor"])
    direct = statistics.median(runs["direct"])
    direct_ratio = statistics.median(
        b / a for a, b in zip(runs["floor"], runs["direct"], strict=True)
    )
    single = statistics.median(runs["single"])
    concurrent = statistics.median(runs["concurrent"])
    per_txn = statistics.median(runs["per_txn"])
    single_ratio = statistics.median(
        b / a for a, b in zip(runs["floor"], runs["single"], strict=True)
    )
    concurrent_ratio = statistics.median(
        c / b for b, c in zip(runs["single"], runs["concurrent"], strict=True)
    )

    rows = [
        ("(a) raw LMDB, 1 value per synced commit", floor, "commits/s", ""),
        (
            "    LmdbLog.commit directly (diagnostic)",
            direct,
            "commits/s",
            f"{direct_ratio:.2f} x (a)",
        ),
        (
            "(b) Journal, 1 appender",
            single,
            "appends/s",
            f"{single_ratio:.2f} x (a)  target >= {SINGLE_TARGET}",
        ),
        (
            f"(c) Journal, {APPENDERS} appenders",
            concurrent,
            "appends/s",
            f"{concurrent_ratio:.1f} x (b)  target >= {CONCURRENT_TARGET:g}",
        ),
    ]
    print()
    for name, value, unit, note in rows:
        print(f"  {name:<42} {value:>10,.0f} {unit:<10} {note}")
    print(f"\n  appends per transaction with {APPENDERS} appenders: {per_txn:.1f}")

    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "figures": {
            "floor_commits_per_s": round(floor, 1),
            "log_direct_commits_per_s": round(direct, 1),
            "journal_single_appends_per_s": round(single, 1),
            "journal_concurrent_appends_per_s": round(concurrent, 1),
            "concurrent_appends_per_transaction": round(per_txn, 2),
        },
        "blocks": {name: [round(x, 1) for x in values] for name, values in runs.items()},
        "ratios": {
            "single_to_floor": round(single_ratio, 3),
            "log_direct_to_floor": round(direct_ratio, 3),
            "concurrent_to_single": round(concurrent_ratio, 2),
        },
        "targets": {
            "single_to_floor": {"target": SINGLE_TARGET, "met": single_ratio >= SINGLE_TARGET},
            "concurrent_to_single": {
                "target": CONCURRENT_TARGET,
                "met": concurrent_ratio >= CONCURRENT_TARGET,
            },
        },
        "parameters": {
            "rounds": rounds,
            "commits_per_block": n,
            "appenders": APPENDERS,
            "appends_per_appender_per_block": each,
            "durability": "full (sync=True, metasync=True)",
        },
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "lmdb": ".".join(map(str, lmdb.version())),
            "py_lmdb": lmdb.__version__,
            "trio": trio.__version__,
            "filesystem": filesystem_of(base),
        },
    }
    out: Path = args.out or RESULTS / ("log-quick.json" if args.quick else "log.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n  wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
