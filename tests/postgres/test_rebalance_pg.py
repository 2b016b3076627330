"""Rebalancing between two runtimes (nodes) in one process on one PostgreSQL log.

* a node that joins receives its share of a busy node's sessions: each moves at a
  safe point (its step finished where it began, nothing was in flight for the new
  owner to recover), the old node names the new owner to a later command, and every
  run completes;
* a session whose step does not reach a safe point within the hand-over deadline
  stays where it is and goes on;
* with ``rebalance=False`` a node that joins receives nothing.

The subprocess tests (real nodes, SIGKILL) are in ``test_rebalance_nodes.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.records import RecoveryDecision, RunFinished, ToolCompleted, ToolExecuting

TTL = 1.0


@perdure.tool(replay=ReplayPolicy.NEVER)
async def step(ctx: ToolContext, n: int, seconds: float = 0.1) -> str:
    """A step with an effect that must not happen twice."""
    await trio.sleep(seconds)
    return f"step {n} done"


def turns(count: int, delay: float, seconds: float = 0.1) -> ScriptedProvider:
    replies = [
        Reply(text=f"t{i}", tool_uses=[ToolUse("step", {"n": i, "seconds": seconds})], delay=delay)
        for i in range(count)
    ]
    return ScriptedProvider([*replies, Reply(text="done", delay=delay)])


def node(url: str, name: str, prov: ScriptedProvider, **kw: Any) -> Any:
    return perdure.open_runtime(
        url, provider=prov, tools=[step], node_id=name, lease_ttl=TTL, retry_base=0.05, **kw
    )


def writers(url: str) -> list[tuple[str, str]]:
    """(session, node) of every record, in seq order."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT session_id, node FROM perdure_records ORDER BY seq").fetchall()
    return [(sid, n) for sid, n in rows]


async def finished(rt: Any, sessions: list[str]) -> bool:
    for sid in sessions:
        records = await rt._journal.read_session(sid)
        if not any(
            isinstance(c.record, RunFinished) and c.record.status == "completed" for c in records
        ):
            return False
    return True


async def test_a_joining_node_receives_its_share_at_safe_points(pg_url: str) -> None:
    sessions = [f"s{i}" for i in range(8)]
    async with node(pg_url, "a", turns(10, delay=0.15)) as a:
        for sid in sessions:
            await a.create_session(sid)
            await a.submit(sid, "go", request_id="r")
        async with node(pg_url, "b", turns(10, delay=0.15)) as b:
            with trio.fail_after(TTL * 6):
                while len(b.received_sessions) < 4:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            moved = sorted(b.received_sessions)
            assert sorted(a.handed_over_sessions) == moved
            assert len(moved) == 4  # 8 sessions, 2 nodes: a sheds down to its share
            # The old node names the new owner.
            with pytest.raises(perdure.Refused, match="owned by node b") as caught:
                await a.submit(moved[0], "more", request_id="r2")
            assert caught.value.code == "not_owner"
            with trio.fail_after(30):
                while not await finished(a, sessions):  # noqa: ASYNC110
                    await trio.sleep(0.1)
            # Rebalanced once: nothing moves back (hysteresis, cooldown).
            assert sorted(b.received_sessions) == moved
            assert a.received_sessions == []

    by_node = writers(pg_url)
    for sid in moved:
        seq_nodes = [n for s, n in by_node if s == sid]
        first_b = seq_nodes.index("b")
        assert "a" not in seq_nodes[first_b:], f"{sid}: a wrote after the hand-over"
        records = [c.record for c in read_session(pg_url, sid)]
        # Every call a started, a finished: the step ended where it began.
        started_on_a = {
            r.call_id
            for r, n in zip(records, seq_nodes, strict=True)
            if isinstance(r, ToolExecuting) and n == "a"
        }
        done_on_a = {
            r.call_id
            for r, n in zip(records, seq_nodes, strict=True)
            if isinstance(r, ToolCompleted) and n == "a"
        }
        assert started_on_a == done_on_a
        # b's recovery found nothing in flight: no run was interrupted by the move.
        decisions = [r for r in records if isinstance(r, RecoveryDecision)]
        assert decisions, f"{sid}: b recorded no recovery decision"
        assert all(d.reason == "nothing was in flight" for d in decisions), decisions
        assert not any(isinstance(r, RunFinished) and r.status == "interrupted" for r in records)
    # Each call ran once (NEVER), on one node.
    for sid in sessions:
        records = [c.record for c in read_session(pg_url, sid)]
        calls = [r.call_id for r in records if isinstance(r, ToolExecuting)]
        assert len(calls) == len(set(calls)) == 10


def read_session(url: str, sid: str) -> list[Any]:
    from perdure.storage.pg_log import PgLog

    log = PgLog(url, readonly=True)
    try:
        return log.read_session(sid)
    finally:
        log.close()


async def test_a_session_with_no_safe_point_in_time_stays(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # One tool call of 3.5 s per session: longer than the hand-over deadline (2 TTL).
    slow = turns(1, delay=0.05, seconds=3.5)
    sessions = ["s1", "s2", "s3", "s4"]
    with caplog.at_level(logging.INFO, logger="perdure.supervisor"):
        async with node(pg_url, "a", slow) as a, node(pg_url, "b", slow):
            for sid in sessions:
                await a.create_session(sid)
                await a.submit(sid, "go", request_id="r")
            with trio.fail_after(20):
                while not await finished(a, sessions):  # noqa: ASYNC110
                    await trio.sleep(0.1)
    gave_up = [r.getMessage() for r in caplog.records if "no safe point" in r.getMessage()]
    assert gave_up, "no hand-over was asked while the tools ran"
    # The long calls were neither cut short nor run again: each ran once, on a.
    by_node = writers(pg_url)
    for sid in sessions:
        records = [c.record for c in read_session(pg_url, sid)]
        seq_nodes = [n for s, n in by_node if s == sid]
        ran = [
            (type(r).__name__, n)
            for r, n in zip(records, seq_nodes, strict=True)
            if isinstance(r, ToolExecuting | ToolCompleted)
        ]
        assert ran == [("ToolExecuting", "a"), ("ToolCompleted", "a")], ran


async def test_rebalancing_can_be_turned_off(pg_url: str) -> None:
    prov = turns(6, delay=0.1)
    async with node(pg_url, "a", prov, rebalance=False) as a:
        for sid in ("s1", "s2", "s3", "s4"):
            await a.create_session(sid)
            await a.submit(sid, "go", request_id="r")
        async with node(pg_url, "b", prov, rebalance=False) as b:
            with trio.fail_after(30):
                while not await finished(a, ["s1", "s2", "s3", "s4"]):  # noqa: ASYNC110
                    await trio.sleep(0.1)
            assert b.received_sessions == [] and a.handed_over_sessions == []
