"""Benchmark: how long a PostgreSQL cluster of perdure nodes takes to rebalance.

Run from the repository root: ``python bench/bench_rebalance.py [--quick] [--url URL]``.

Each round, on a fresh database (a throwaway PostgreSQL server unless ``--url``,
``fsync=on``): ``--nodes`` node processes (default 3) start ``--sessions`` sessions
each (default 100) whose runs last far longer than the round (many short turns of a
scripted model, each with a tool that takes 0.1 s). Once every session is active:

(join)  one more node starts. Measured on the database's clock from the moment it
        joins (its entry in ``perdure_nodes``): when it holds its first session, and
        when every node holds its fair share within 5 points (25 % +- 5 % of the
        sessions for four nodes), which is the figure the tests bound by 2 x TTL;
(leave) the baseline, interleaved in the same round: the node that joined stops
        cleanly (it hands its leases back at once) and the time until the others
        hold every session again is measured the same way. It is the older way a
        session moves between live nodes, through the same heartbeats.

It prints a table and writes ``bench/results/rebalance.json`` (``rebalance-quick.json``
with ``--quick``: a seconds-long check that the benchmark works, not a measurement).
``--node`` is internal: the node processes run this file with it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import perdure  # noqa: E402
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TURNS = 200  # far more than a round lasts: every session stays active throughout


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def nap(ctx: perdure.ToolContext, seconds: float) -> str:
    """A tool call that takes a while."""
    await trio.sleep(seconds)
    return "rested"


def provider(delay: float) -> ScriptedProvider:
    step = Reply(text="step", tool_uses=[ToolUse("nap", {"seconds": 0.1})], delay=delay)
    return ScriptedProvider([step] * TURNS + [Reply(text="done")])


async def node_main(url: str, name: str, sessions: int, ttl: float, delay: float) -> None:
    """One node: start its sessions, say so, serve until told to stop (on stdin)."""
    async with perdure.open_runtime(
        url,
        provider=provider(delay),
        tools=[nap],
        node_id=name,
        lease_ttl=ttl,
        shutdown_grace=2,
    ) as rt:
        for i in range(sessions):
            sid = await rt.create_session(f"{name}-{i:04d}")
            await rt.submit(sid, "go", request_id="r")
        print(json.dumps({"ready": True}), flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)


class Node:
    def __init__(self, url: str, name: str, sessions: int, ttl: float, delay: float) -> None:
        args = [sys.executable, __file__, "--node", url, name, str(sessions), str(ttl), str(delay)]
        self.name = name
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )

    def ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "ready" in line, f"node {self.name} failed to start: {line!r}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()

    def wait(self) -> None:
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def holdings(conn: Any) -> tuple[float, dict[str, int], dict[str, float], int]:
    """(database time, active sessions held per live node, live nodes' join times, active)."""
    now, active = conn.execute(
        "SELECT extract(epoch FROM now())::float8, "
        "(SELECT count(*) FROM perdure_sessions WHERE open_submissions > 0)"
    ).fetchone()
    joined = dict(
        conn.execute(
            "SELECT node_id, extract(epoch FROM started_at)::float8 FROM perdure_nodes "
            "WHERE expires_at > now()"
        ).fetchall()
    )
    held = dict(
        conn.execute(
            """SELECT l.owner, count(*) FROM perdure_sessions s
                 JOIN perdure_leases l USING (session_id)
                WHERE s.open_submissions > 0 AND l.expires_at > now() GROUP BY l.owner"""
        ).fetchall()
    )
    return float(now), {n: int(held.get(n, 0)) for n in joined}, joined, int(active)


def balanced(held: dict[str, int], active: int, points: float = 0.05) -> bool:
    if not held or not active:
        return False
    fair = 1 / len(held)
    return all(abs(h / active - fair) <= points for h in held.values())


def one_round(url: str, nodes: int, sessions: int, ttl: float, delay: float) -> dict[str, Any]:
    import psycopg

    total = nodes * sessions
    cluster = [Node(url, f"n{k}", sessions, ttl, delay) for k in range(nodes)]
    joiner: Node | None = None
    try:
        for node in cluster:
            node.ready()
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while True:  # every session active, and the first nodes settled among themselves
                _, held, _, active = holdings(conn)
                if active == total and len(held) == nodes and balanced(held, active):
                    break
                assert time.monotonic() < deadline, f"the cluster never settled: {held}"
                time.sleep(0.05)
            joiner = Node(url, "joiner", 0, ttl, delay)
            first = done = None
            arrived: dict[str, float] = {}  # session -> when it was first seen handed to it
            deadline = time.monotonic() + 120
            while done is None:
                now, held, joined, active = holdings(conn)
                if "joiner" in joined:
                    since = now - joined["joiner"]
                    for (sid,) in conn.execute(
                        "SELECT session_id FROM perdure_leases WHERE owner = 'joiner'"
                    ):
                        arrived.setdefault(sid, since)
                    if first is None and held.get("joiner", 0) > 0:
                        first = since
                    if len(held) == nodes + 1 and balanced(held, active):
                        done, at_join = since, dict(held)
                assert time.monotonic() < deadline, f"never balanced: {held}"
                time.sleep(0.02)
            moved = at_join["joiner"]
            times = sorted(arrived.values())
            # The baseline: the node that joined leaves cleanly; its sessions go back.
            left_at = float(conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()[0])
            joiner.stop()
            back = None
            deadline = time.monotonic() + 120
            while back is None:
                now, held, _, active = holdings(conn)
                if "joiner" not in held and sum(held.values()) == active == total:
                    back = now - left_at
                assert time.monotonic() < deadline, f"never taken back: {held}"
                time.sleep(0.02)
        return {
            "join_first_move_s": round(first if first is not None else done, 3),
            "join_half_moved_s": round(times[len(times) // 2], 3),
            "join_balanced_s": round(done, 3),
            "sessions_moved_to_joiner": moved,
            "leave_taken_back_s": round(back, 3),
        }
    finally:
        for node in [*cluster, *([joiner] if joiner else [])]:
            node.stop()
        for node in [*cluster, *([joiner] if joiner else [])]:
            node.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run, seconds long")
    parser.add_argument("--url", help="a PostgreSQL server's database URL (default: throwaway)")
    parser.add_argument("--nodes", type=int, default=3, help="nodes before the join")
    parser.add_argument("--sessions", type=int, default=100, help="sessions per node")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease TTL, seconds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="default: bench/results/rebalance.json")
    parser.add_argument("--node", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    delay = 0.5  # seconds per model turn
    if args.node:
        url, name, sessions, ttl, turn = args.node
        trio.run(node_main, url, name, int(sessions), float(ttl), float(turn))
        return 0
    nodes, sessions, rounds = args.nodes, args.sessions, args.rounds
    if args.quick:
        nodes, sessions, rounds = 2, 10, 1

    cluster = None
    if args.url:
        url_for = lambda _name: args.url  # noqa: E731 - the one database given
    else:
        from tests.support.pg import PgCluster

        cluster = PgCluster(fsync=True).start()
        url_for = cluster.new_database
    print(
        f"perdure rebalancing benchmark ({'quick' if args.quick else 'full'}): {nodes} nodes x "
        f"{sessions} sessions, one joins; lease TTL {args.ttl} s",
        flush=True,
    )
    load_before = os.getloadavg()[0]
    results = []
    try:
        for r in range(rounds):
            got = one_round(url_for(f"bench_rebalance_{r}"), nodes, sessions, args.ttl, delay)
            print(f"  round {r + 1}: {got}", flush=True)
            results.append(got)
    finally:
        if cluster is not None:
            cluster.stop()

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in results), 2)

    figures = {k: median(k) for k in results[0]}
    print()
    rows = [
        (f"median over {rounds} round(s)", "seconds"),
        ("(join) first session on the new node", figures["join_first_move_s"]),
        ("(join) half of its sessions on the new node", figures["join_half_moved_s"]),
        ("(join) every node at its share +- 5 points", figures["join_balanced_s"]),
        ("       (bound in the tests: 2 x TTL)", 2 * args.ttl),
        ("(leave, baseline) its sessions taken back", figures["leave_taken_back_s"]),
        ("sessions moved to the new node", figures["sessions_moved_to_joiner"]),
    ]
    for label, value in rows:
        print(f"  {label:<52} {value:>8}")

    import psycopg

    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "figures": figures,
        "rounds": results,
        "parameters": {
            "nodes_before_join": nodes,
            "sessions_per_node": sessions,
            "lease_ttl_s": args.ttl,
            "model_turn_s": delay,
            "tool_call_s": 0.1,
            "balanced_means": "every live node holds 1/N of the active sessions +- 5 points",
            "postgres": "given URL" if args.url else "throwaway cluster, fsync=on, unix socket",
        },
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "load_avg_at_start": round(load_before, 2),
            "load_avg_at_end": round(os.getloadavg()[0], 2),
            "psycopg": psycopg.__version__,
        },
    }
    out: Path = args.out or RESULTS / ("rebalance-quick.json" if args.quick else "rebalance.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n  wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
