"""Benchmark of the PostgreSQL log beside LMDB's, in one run on one machine.

Run from the repository root: ``python bench/bench_pg.py [--quick] [--url URL]``.

Without ``--url`` it starts a throwaway PostgreSQL server (``tests/support/pg.py``:
initdb into a temporary directory, a unix socket, ``fsync=on`` so that commits are
as durable as LMDB's ``durability="full"``); with ``--url`` it uses that database
(it creates perdure's tables in it). The LMDB logs live in temporary directories
under ``--dir`` (default ``bench/results``). Figures, each a median over rounds:

(a) commit: one small record per ``log.commit`` call, from one thread (the cost
    of one durable transaction with perdure's bookkeeping, leases included);
(b) per-turn cost: one session, runs one after another through the whole runtime
    (submit -> model turn with one tool call -> tool -> model turn -> finished;
    scripted model, trivial SAFE tool), reported per run and per model turn;
(c) one node, 100 sessions at once: runs/s (group commit at work);
(d) several nodes (PostgreSQL only): 1, 2 and 3 node processes on one database, each
    running its share of the sessions at once; total runs/s. LMDB's figure for the
    same number of sessions is (c)'s, one process (one process owns an LMDB log).

It prints a table and writes ``bench/results/pg.json`` (``pg-quick.json`` with
``--quick``, a seconds-long check that the benchmark works, not a measurement).

``--node`` is internal: the node processes of (d) run this file with it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import perdure  # noqa: E402
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse  # noqa: E402
from perdure.storage import LogBackend, open_log  # noqa: E402
from perdure.storage.records import ToolCompleted  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TURNS_PER_RUN = 2


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def lookup(ctx: perdure.ToolContext, query: str) -> str:
    """A trivial read-only tool."""
    return f"found {query}"


def provider() -> ScriptedProvider:
    # The script is indexed by assistant turns in the conversation: runs after the
    # first see earlier turns, so the script repeats the same two-turn pattern.
    replies = []
    for _ in range(2000):
        replies.append(Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "q"})]))
        replies.append(Reply(text="done"))
    return ScriptedProvider(replies)


@asynccontextmanager
async def runtime(location: str, **kw: Any) -> AsyncIterator[perdure.Runtime]:
    async with perdure.open_runtime(
        location, provider=provider(), tools=[lookup], shutdown_grace=5, **kw
    ) as rt:
        yield rt


@contextmanager
def fresh_dir(base: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bench-", suffix=".tmp", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- (a) commit ----------------------------------------------------------------------


def commit_rate(log: LogBackend, n: int, first: int) -> float:
    log.acquire("bench")
    start = time.perf_counter()
    for i in range(first, first + n):
        log.commit(
            [([ToolCompleted(session_id="bench", call_id=f"c{i}", output="ok", at=1.0)], None)]
        )
    return n / (time.perf_counter() - start)


# -- (b) and (c) through the runtime -------------------------------------------------


async def run_one(rt: perdure.Runtime, sid: str, k: int) -> None:
    await rt.submit(sid, f"task {k}", request_id=f"{sid}-{k}")
    outcome = await rt.wait_idle(sid)
    assert outcome is not None and outcome.status == "completed", outcome


async def sequential(rt: perdure.Runtime, sid: str, n: int, first: int) -> tuple[float, float]:
    """Runs one after another in one session: seconds per run, appends per run."""
    appends = rt.stats().appends
    start = time.perf_counter()
    for k in range(first, first + n):
        await run_one(rt, sid, k)
    elapsed = time.perf_counter() - start
    return elapsed / n, (rt.stats().appends - appends) / n


async def concurrent(rt: perdure.Runtime, prefix: str, sessions: int, runs: int) -> float:
    """``sessions`` sessions at once, ``runs`` runs each; runs/s."""
    sids = [await rt.create_session(f"{prefix}-{i}") for i in range(sessions)]

    async def worker(sid: str) -> None:
        for k in range(runs):
            await run_one(rt, sid, k)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for sid in sids:
            nursery.start_soon(worker, sid)
    return sessions * runs / (time.perf_counter() - start)


async def measure_runtime(
    location: str, rounds: int, n: int, sessions: int, runs: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"run_s": [], "appends_per_run": [], "concurrent_runs_s": []}
    async with runtime(location) as rt:
        sid = await rt.create_session("seq")
        await sequential(rt, sid, max(2, n // 4), 0)  # warm-up
        await concurrent(rt, "warm", min(sessions, 10), 1)
        for r in range(rounds):
            per_run, appends = await sequential(rt, sid, n, 1000 + r * n)
            out["run_s"].append(per_run)
            out["appends_per_run"].append(appends)
            out["concurrent_runs_s"].append(await concurrent(rt, f"c{r}", sessions, runs))
    return out


# -- (d) several node processes ------------------------------------------------------


async def node_main(url: str, prefix: str, sessions: int, runs: int) -> None:
    async with runtime(url, node_id=prefix, lease_ttl=10) as rt:
        sids = [await rt.create_session(f"{prefix}-{i}") for i in range(sessions)]
        print(json.dumps({"ready": True}), flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # "go", to every node at once

        async def worker(sid: str) -> None:
            for k in range(runs):
                await run_one(rt, sid, k)

        start = time.time()
        async with trio.open_nursery() as nursery:
            for sid in sids:
                nursery.start_soon(worker, sid)
        print(json.dumps({"start": start, "end": time.time()}), flush=True)


def multi_node(url: str, nodes: int, sessions: int, runs: int, tag: str) -> float:
    """``nodes`` processes, ``sessions`` sessions in all; total runs/s."""
    procs = []
    each = sessions // nodes
    for k in range(nodes):
        args = [sys.executable, __file__, "--node", url, f"{tag}n{k}", str(each), str(runs)]
        procs.append(
            subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
            )
        )
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert "ready" in line, f"a node failed to start: {line!r}"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    spans = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, f"a node failed: {out}"
        spans.append(json.loads(out.strip().splitlines()[-1]))
    elapsed = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    return each * nodes * runs / elapsed


# -- the run -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run, seconds long")
    parser.add_argument("--url", help="a PostgreSQL database to use (default: a throwaway one)")
    parser.add_argument("--dir", type=Path, default=RESULTS, help="where LMDB temp logs go")
    parser.add_argument("--out", type=Path, help="default: bench/results/pg.json")
    parser.add_argument("--node", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.node:
        url, prefix, sessions, runs = args.node
        trio.run(node_main, url, prefix, int(sessions), int(runs))
        return 0
    if args.quick:
        rounds, n, commits, sessions, runs, node_counts = 2, 5, 50, 20, 1, (1, 2)
    else:
        rounds, n, commits, sessions, runs, node_counts = 5, 40, 300, 100, 3, (1, 2, 3)
    base: Path = args.dir
    base.mkdir(parents=True, exist_ok=True)

    cluster = None
    if args.url:
        url_for = lambda _name: args.url  # noqa: E731 - the one database given
    else:
        from tests.support.pg import PgCluster

        cluster = PgCluster(fsync=True).start()
        url_for = cluster.new_database
    print(f"perdure PostgreSQL vs LMDB benchmark ({'quick' if args.quick else 'full'})", flush=True)
    try:
        figures: dict[str, dict[str, Any]] = {"lmdb": {}, "postgres": {}}
        blocks: dict[str, Any] = {}
        with fresh_dir(base) as d1, fresh_dir(base) as d2:
            locations = {"lmdb": (str(d1 / "c"), str(d2 / "r")), "postgres": (None, None)}
            pg_commit_url = url_for("bench_commit")
            pg_runtime_url = url_for("bench_runtime")
            locations["postgres"] = (pg_commit_url, pg_runtime_url)
            for backend, (commit_loc, runtime_loc) in locations.items():
                assert commit_loc is not None and runtime_loc is not None
                log = open_log(commit_loc)
                try:
                    commit_rate(log, max(10, commits // 5), 0)  # warm-up
                    rates = [commit_rate(log, commits, (r + 1) * commits) for r in range(rounds)]
                finally:
                    log.close()
                got = trio.run(measure_runtime, runtime_loc, rounds, n, sessions, runs)
                blocks[backend] = {"commit_per_s": rates, **got}
                run_s = statistics.median(got["run_s"])
                figures[backend] = {
                    "commit_per_s": round(statistics.median(rates), 1),
                    "ms_per_run": round(run_s * 1000, 2),
                    "ms_per_turn": round(run_s * 1000 / TURNS_PER_RUN, 2),
                    "appends_per_run": round(statistics.median(got["appends_per_run"]), 1),
                    "ms_per_append_in_a_run": round(
                        run_s * 1000 / statistics.median(got["appends_per_run"]), 3
                    ),
                    f"runs_per_s_{sessions}_sessions_one_node": round(
                        statistics.median(got["concurrent_runs_s"]), 1
                    ),
                }
                print(f"  {backend}: {figures[backend]}", flush=True)
        multi: dict[str, float] = {}
        for count in node_counts:
            url = url_for(f"bench_nodes_{count}")
            rates = [multi_node(url, count, sessions, runs, f"r{r}") for r in range(rounds)]
            multi[str(count)] = round(statistics.median(rates), 1)
            print(f"  postgres, {count} node(s), {sessions} sessions: {multi[str(count)]} runs/s")
        figures["postgres"]["runs_per_s_by_nodes"] = multi
    finally:
        if cluster is not None:
            cluster.stop()

    print()
    rows = [
        ("(a) commits/s, 1 record per commit", "commit_per_s"),
        ("(b) ms per run (2 model turns, 1 tool)", "ms_per_run"),
        ("    ms per model turn", "ms_per_turn"),
        ("    appends per run", "appends_per_run"),
        (f"(c) runs/s, {sessions} sessions, 1 node", f"runs_per_s_{sessions}_sessions_one_node"),
    ]
    print(f"  {'':<44} {'LMDB':>10} {'PostgreSQL':>12}")
    for label, key in rows:
        print(f"  {label:<44} {figures['lmdb'][key]:>10} {figures['postgres'][key]:>12}")
    for count, rate in multi.items():
        label = f"(d) runs/s, {sessions} sessions, {count} node(s)"
        lmdb = figures["lmdb"][f"runs_per_s_{sessions}_sessions_one_node"] if count == "1" else "-"
        print(f"  {label:<44} {lmdb:>10} {rate:>12}")

    import lmdb
    import psycopg

    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "figures": figures,
        "blocks": blocks,
        "parameters": {
            "rounds": rounds,
            "sequential_runs_per_round": n,
            "commits_per_round": commits,
            "sessions": sessions,
            "runs_per_session": runs,
            "turns_per_run": TURNS_PER_RUN,
            "postgres": "given URL" if args.url else "throwaway cluster, fsync=on, unix socket",
            "durability": "full (LMDB sync+metasync; PostgreSQL synchronous_commit=on)",
        },
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "lmdb": ".".join(map(str, lmdb.version())),
            "psycopg": psycopg.__version__,
            "libpq": psycopg.pq.version(),
        },
    }
    out: Path = args.out or RESULTS / ("pg-quick.json" if args.quick else "pg.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n  wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
