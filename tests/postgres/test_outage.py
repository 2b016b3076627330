"""A database outage is waited out: sessions pause, nothing is parked, runs go on.

The database refuses every connection for several seconds (``ALLOW_CONNECTIONS
false`` and every backend terminated) while a session's tool runs and another
session is idle. A command meanwhile gets ``LogUnavailable`` and nothing of it is
recorded. Afterwards the run finishes by itself, nothing is parked, the NEVER tool
ran exactly once, and both sessions take new commands.
"""

from __future__ import annotations

import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from tests.support.fold import fold_of
from tests.support.pg import PgCluster, database_of

RUNS: list[str] = []


@perdure.tool(replay=ReplayPolicy.NEVER)
async def deploy(ctx: ToolContext, target: str) -> str:
    """Deploy (slowly)."""
    RUNS.append(ctx.idempotency_key)
    await trio.sleep(1.0)
    return f"deployed {target}"


def set_outage(cluster: PgCluster, database: str, down: bool) -> None:
    with cluster.admin() as conn:
        conn.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS {'false' if down else 'true'}")
        if down:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )


async def test_a_database_outage_is_waited_out(pg_url: str, pg_cluster: PgCluster) -> None:
    RUNS.clear()
    database = database_of(pg_url)
    script = ScriptedProvider(
        [
            Reply(text="deploying", tool_uses=[ToolUse("deploy", {"target": "prod"})]),
            Reply(text="deployed"),
            Reply(text="again"),
        ]
    )
    async with perdure.open_runtime(
        pg_url, provider=script, tools=[deploy], node_id="a", lease_ttl=2.0
    ) as rt:
        await rt.create_session("busy")
        await rt.create_session("quiet")
        await rt.submit("busy", "deploy it", request_id="r1")
        with trio.fail_after(10):
            while not RUNS:  # noqa: ASYNC110
                await trio.sleep(0.01)

        await trio.to_thread.run_sync(set_outage, pg_cluster, database, True)
        try:
            with trio.fail_after(30):
                with pytest.raises(perdure.LogUnavailable):  # a clear error, at once
                    await rt.submit("quiet", "during the outage", request_id="lost")
            await trio.sleep(5.0)  # longer than the lease and every restart back-off
        finally:
            await trio.to_thread.run_sync(set_outage, pg_cluster, database, False)

        with trio.fail_after(30):
            outcome = await rt.wait_idle("busy")
        assert outcome is not None
        assert (outcome.status, outcome.final_text) == ("completed", "deployed")
        assert len(RUNS) == 1  # the NEVER tool was not run again
        for sid in ("busy", "quiet"):
            state = await fold_of(rt, sid)
            assert state.parked is None, state.parked
        assert "lost" not in (await fold_of(rt, "quiet")).requests
        with trio.fail_after(30):
            await rt.submit("quiet", "hello", request_id="r2")
            assert (await rt.wait_idle("quiet")).final_text == "deployed"  # turn 1 script
