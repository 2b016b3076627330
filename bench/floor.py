"""The physical floor: raw LMDB through py-lmdb, no framework.

Per turn it performs the same number of synced write transactions that perdure
performs per turn, each holding values of the same sizes as perdure's records in
that transaction (measured from a perdure log in the same run and passed in), in an
environment opened with the same flags perdure uses for ``durability="full"``
(sync and metasync on, no writemap). Keys are 8-byte sequence numbers, as perdure's.

    python bench/floor.py DIR TURNS '[[410, 230, 520], [300, 260]]' [layout|plain] [THINK_MS]

The headline floor writes only the values. ``layout`` adds the index entries that
perdure's layout writes in the same transactions (see ``run``), to show how much of
perdure's cost is LMDB work for its indexes rather than Python. ``THINK_MS`` adds a
model that takes that long: each turn sleeps that long after its first commit (the
model's reply arrives between the turn's two commits, as in perdure's turn).
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


def run(
    directory: str, turns: int, commits: list[list[int]], layout: bool, think: float = 0.0
) -> dict[str, object]:
    """``layout``: also write perdure's index entries, in perdure's named databases.

    That is, per record a ``by_session`` key (session id + seq, empty value), and per
    commit the epoch read and the session's small JSON summary: what the log's layout
    costs LMDB, still without any of perdure's code.
    """
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
    records = env.open_db(b"records")
    by_session = env.open_db(b"by_session")
    sessions = env.open_db(b"sessions")
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"epoch", b"1", db=meta)
    values = [[os.urandom(size) for size in sizes] for sizes in commits]
    sid = b"turns"
    seq = 0
    per_turn: list[float] = []
    per_commit: list[float] = []
    # The model's think comes between the turn's two commits (before the only one).
    think_before = 1 if len(values) > 1 else 0
    for _ in range(turns):
        start = time.perf_counter()
        for i, batch in enumerate(values):
            if think and i == think_before:
                time.sleep(think)  # the model thinks between the turn's commits
            t = time.perf_counter()
            with env.begin(write=True) as txn:
                if layout:
                    txn.get(b"epoch", db=meta)
                for value in batch:
                    seq += 1
                    key = seq.to_bytes(8, "big")
                    txn.put(key, value, db=records)
                    if layout:
                        txn.put(sid + b"\x00" + key, b"", db=by_session)
                if layout:
                    summary = f'{{"first_seq":1,"last_seq":{seq},"records":{seq},"goal_rev":0}}'
                    txn.put(sid, summary.encode(), db=sessions)
            per_commit.append(time.perf_counter() - t)
        per_turn.append(time.perf_counter() - start)
    env.close()
    return {
        "system": "floor+layout" if layout else "floor",
        "turns": turns,
        "commits_per_turn": len(commits),
        "value_sizes": commits,
        "median_ms": median(per_turn) * 1e3,
        "p90_ms": quantile(per_turn, 0.9) * 1e3,
        "commit_median_ms": median(per_commit) * 1e3,
        "think_ms": think * 1e3,
    }


if __name__ == "__main__":
    layout = len(sys.argv) > 4 and sys.argv[4] == "layout"
    think = float(sys.argv[5]) / 1e3 if len(sys.argv) > 5 else 0.0
    emit(run(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), layout, think))
