"""The physical floor: raw LMDB through py-lmdb, no framework.

Per turn it performs the same number of synced write transactions that perdure
performs per turn, each holding values of the same sizes as perdure's records in
that transaction (measured from a perdure log in the same run and passed in), in an
environment opened with the same flags perdure uses for ``durability="full"``
(sync and metasync on, no writemap). Keys are 8-byte sequence numbers, as perdure's.

    python bench/floor.py DIR TURNS '[[410, 230, 520], [300, 260]]'
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import lmdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit
from bench.workload import median, quantile


def run(directory: str, turns: int, commits: list[list[int]]) -> dict[str, object]:
    env = lmdb.open(
        directory,
        map_size=256 << 20,
        max_dbs=8,
        subdir=True,
        sync=True,
        metasync=True,
        writemap=False,
        lock=True,
    )
    db = env.open_db(b"records")
    values = [[os.urandom(size) for size in sizes] for sizes in commits]
    seq = 0
    per_turn: list[float] = []
    per_commit: list[float] = []
    for _ in range(turns):
        start = time.perf_counter()
        for batch in values:
            t = time.perf_counter()
            with env.begin(write=True, db=db) as txn:
                for value in batch:
                    seq += 1
                    txn.put(seq.to_bytes(8, "big"), value)
            per_commit.append(time.perf_counter() - t)
        per_turn.append(time.perf_counter() - start)
    env.close()
    return {
        "system": "floor",
        "turns": turns,
        "commits_per_turn": len(commits),
        "value_sizes": commits,
        "median_ms": median(per_turn) * 1e3,
        "p90_ms": quantile(per_turn, 0.9) * 1e3,
        "commit_median_ms": median(per_commit) * 1e3,
    }


if __name__ == "__main__":
    emit(run(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])))
