"""Rebalancing between real node processes on one PostgreSQL log, joined and killed for real.

Each node is the child runtime of ``tests.support.child`` (lease TTL 2 s) on one
workspace whose ledger records every tool side effect.

* Join: three nodes run 100 sessions each (runs of many turns, with NEVER, SAFE and
  KEYED tools); a fourth node joins. Every node comes to hold 25 % +- 5 % of the
  active sessions; every run completes, the history checker finds no violation (no
  NEVER effect twice), and the moved sessions were handed over at safe points (the
  new owner's recovery found nothing in flight). How long it took is recorded, not
  asserted: the target (2 x TTL) is measured by ``bench/bench_rebalance.py``.
* Kill: a node that sessions are being handed to is SIGKILLed in the middle of the
  hand-over (some of its sessions taken and running, others still on their way).
  Every session goes on on the surviving node, with no NEVER effect twice.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.storage.records import RecoveryDecision
from tests.postgres.test_nodes import finished, read_all, record_figure, wait_until, written
from tests.support.checker import check
from tests.support.procs import NodeProcess

TTL = 2.0


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "input": args}


@perdure.tool(replay=ReplayPolicy.SAFE)
async def nap(ctx: ToolContext, seconds: float) -> str:
    """A step that takes a while and changes nothing (so it leaves no ledger entry)."""
    await trio.sleep(seconds)
    return "rested"


EXTRA_TOOLS = [nap]


def long_run(turns: int, delay: float) -> list[dict[str, Any]]:
    """Many short turns, each with a tool that takes a while; a NEVER note every third
    turn, a SAFE lookup every other, and a KEYED booking half-way (with the ledger)."""
    steps = []
    for i in range(turns):
        uses = [_call("nap", seconds=0.15)]
        if i % 3 == 0:
            uses.append(_call("send_note", text=f"n{i}"))
        elif i % 2 == 0:
            uses.append(_call("lookup", query=f"q{i}"))
        if i == turns // 2:
            uses.append(_call("book", item="room"))
        steps.append({"text": f"step {i}", "tool_uses": uses, "delay": delay})
    return [*steps, {"text": "done", "delay": delay}]


def plan(
    url: str, ws: Path, node: str, sessions: list[str], total: int, steps: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "log": url,
        "workspace": str(ws),
        "script": steps,
        "tools": ["send_note", "lookup", "book", "nap"],
        "extra_tools": ["tests.postgres.test_rebalance_nodes:EXTRA_TOOLS"],
        "sessions": {sid: [{"text": f"task {sid}", "request_id": f"r-{sid}"}] for sid in sessions},
        "options": {"retry_base": 0.05, "node_id": node, "lease_ttl": TTL},
        "linger": True,
        "expect_sessions": total,
    }


@pytest.fixture
def nodes() -> Iterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    for node in started:
        node.close()


def holdings(url: str) -> tuple[dict[str, int], int, dict[str, float]]:
    """Per live node: active sessions it holds an unexpired lease on; the active count;
    and how long each live node has been a member (database clock)."""
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT to_regclass('perdure_nodes')").fetchone()
        if found is None or found[0] is None:  # no node has created the schema yet
            return {}, 0, {}
        held = dict(
            conn.execute(
                """SELECT l.owner, count(*) FROM perdure_sessions s
                     JOIN perdure_leases l USING (session_id)
                    WHERE s.open_submissions > 0 AND l.expires_at > now()
                    GROUP BY l.owner"""
            ).fetchall()
        )
        row = conn.execute(
            "SELECT count(*) FROM perdure_sessions WHERE open_submissions > 0"
        ).fetchone()
        members = dict(
            conn.execute(
                "SELECT node_id, extract(epoch FROM now() - started_at)::float8 "
                "FROM perdure_nodes WHERE expires_at > now()"
            ).fetchall()
        )
    active = int(row[0]) if row else 0
    return {n: int(held.get(n, 0)) for n in members}, active, members


def test_a_joining_node_gets_a_quarter(
    pg_url: str, tmp_path: Path, nodes: list[NodeProcess]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    groups = {f"n{k}": [f"s{k}-{i:03d}" for i in range(100)] for k in range(3)}
    # Runs long enough (20 turns of over a second each) that most are still going when
    # the fourth node joins, however slowly a loaded machine starts the first three.
    steps = long_run(turns=20, delay=1.0)
    for name, sessions in groups.items():
        nodes.append(NodeProcess(plan(pg_url, ws, name, sessions, 300, steps), tmp_path, name))
    seen: list[tuple[dict[str, int], int]] = []

    def three_settled() -> bool:
        # The nodes started one after another, so the first ones may have shed some
        # sessions to the later ones meanwhile: wait until every node holds a third of
        # the active sessions, give or take 5 % of them, so that what follows measures
        # the join. (A run or two may have finished by then: the shares are of the
        # sessions still active, as in the join's own check below.)
        held, active, _ = holdings(pg_url)
        seen.append((held, active))
        return (
            active >= 200
            and len(held) == 3
            and all(abs(h - active / 3) <= 0.05 * active for h in held.values())
        )

    try:
        wait_until("the active sessions settled on three nodes", three_settled, 90, nodes)
    except AssertionError as exc:  # say how the holdings moved, not only that they did not settle
        raise AssertionError(f"{exc}\nlast holdings (per node, active): {seen[-10:]}") from None
    before = holdings(pg_url)[0]
    nodes.append(NodeProcess(plan(pg_url, ws, "n3", [], 300, steps), tmp_path, "n3"))

    samples: list[tuple[float, dict[str, int], int]] = []

    def quartered() -> bool:
        held, active, members = holdings(pg_url)
        if "n3" not in members:
            return False
        samples.append((members["n3"], held, active))
        shares = [h / active for h in held.values()] if active else []
        return len(held) == 4 and all(0.20 <= s <= 0.30 for s in shares)

    try:
        wait_until("the four nodes to hold a quarter each", quartered, 60, nodes)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nlast holdings (joined for, per node, active): {samples[-10:]}"
        ) from None
    joined_for, balanced, active = samples[-1]
    first_move = next((t for t, held, _ in samples if held.get("n3", 0) > 0), joined_for)
    half = next((t for t, held, n in samples if held.get("n3", 0) >= n / 8), joined_for)

    for node in nodes:
        assert node.wait(120) == 0, node.stderr()[-3000:]

    records = read_all(pg_url)
    everyone = {sid for group in groups.values() for sid in group}
    assert finished(records) == everyone
    report = check(pg_url, ws)
    assert report.violations == [], "\n".join(report.violations)
    assert report.counts["effects"] > 0
    assert {"never", "safe", "keyed"} <= report.replay_policies

    moved = [n.first("received") for n in nodes]
    received = set(moved[3]["received"]) if moved[3] else set()  # type: ignore[index]
    handed = [set(m["handed_over"]) for m in moved[:3] if m]  # type: ignore[index]
    assert received and received <= set().union(*handed)
    # The moves were clean: when n3 first ran a session it received, its recovery found
    # nothing in flight (each stopped at a step boundary on its old node). A session it
    # claimed as an orphan instead (a node that lost leases under load) is another case.
    claimed = set(nodes[3].first("taken_over")["taken_over"])  # type: ignore[index]
    by_seq = {c.seq: c.record for c in records}
    rows = written(pg_url)
    decisions = []
    for sid in received - claimed:
        mine = [(seq, node) for seq, s, node, _ in rows if s == sid]
        start = next(i for i, (_, node) in enumerate(mine) if node == "n3")
        for seq, node in mine[start:]:
            record = by_seq[seq]
            if node != "n3" or not isinstance(record, RecoveryDecision):
                break
            decisions.append(record)
    clean = Counter(d.reason == "nothing was in flight" for d in decisions)
    record_figure(
        "rebalance_join",
        {
            "lease_ttl": TTL,
            "sessions": 300,
            "before": before,
            "balanced": balanced,
            "active_when_balanced": active,
            "first_move_after_join_s": round(first_move, 2),
            "half_moved_after_join_s": round(half, 2),
            "balanced_after_join_s": round(joined_for, 2),
            "received_by_new_node": len(received),
            "recoveries_clean": clean[True],
            "recoveries_interrupted": clean[False],
        },
    )
    assert clean[True] >= len(received - claimed) > 0
    assert clean[False] == 0, [d for d in decisions if d.reason != "nothing was in flight"]


def test_a_target_killed_mid_hand_over_loses_nothing(
    pg_url: str, tmp_path: Path, nodes: list[NodeProcess]
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    sessions = [f"k{i:02d}" for i in range(24)]
    steps = long_run(turns=12, delay=0.5)
    nodes.append(NodeProcess(plan(pg_url, ws, "a", sessions, 24, steps), tmp_path, "a"))

    def all_running() -> bool:
        held, active, _ = holdings(pg_url)
        return active == 24 and held.get("a") == 24

    wait_until("a to run its 24 sessions", all_running, 60, nodes)
    nodes.append(NodeProcess(plan(pg_url, ws, "b", [], 24, steps), tmp_path, "b"))
    target = nodes[1]

    def b_mid_hand_over() -> bool:
        # b has taken some sessions and writes to them, and more are on their way.
        return any(node == "b" and sid for _, sid, node, _ in written(pg_url))

    wait_until("b to run sessions handed to it", b_mid_hand_over, 60, nodes)
    target.signal(signal.SIGKILL)
    killed_at = time.time()
    assert target.wait(10) == -signal.SIGKILL
    rows = written(pg_url)
    on_b = sorted({sid for _, sid, node, _ in rows if node == "b" and sid})
    with psycopg.connect(pg_url) as conn:
        query = "SELECT session_id FROM perdure_leases WHERE owner = 'b'"
        leased_to_b = sorted(sid for (sid,) in conn.execute(query))
    assert on_b, "b ran nothing before it was killed"
    unfinished = set(sessions) - finished(read_all(pg_url))
    assert set(on_b) & unfinished, "the kill came too late: b had finished its sessions"

    assert nodes[0].wait(120) == 0, nodes[0].stderr()[-3000:]
    records = read_all(pg_url)
    assert finished(records) == set(sessions)
    report = check(pg_url, ws)
    assert report.violations == [], "\n".join(report.violations)
    assert "never" in report.replay_policies

    # Whatever b held (run or only handed to it), a continued after the kill.
    rows = written(pg_url)
    for sid in set(leased_to_b) & unfinished:
        after = [node for _, s, node, t in rows if s == sid and t > killed_at]
        assert after and set(after) == {"a"}, f"{sid} was not continued on a: {after}"
    back = min(
        (t for _, s, node, t in rows if node == "a" and s in on_b and t > killed_at), default=None
    )
    record_figure(
        "rebalance_kill",
        {
            "lease_ttl": TTL,
            "sessions": 24,
            "run_by_b_before_kill": len(on_b),
            "leased_to_b_at_kill": len(leased_to_b),
            "continued_on_a_after_s": None if back is None else round(back - killed_at, 2),
        },
    )
