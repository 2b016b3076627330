"""Two runtimes (nodes) in one process on one PostgreSQL log: the API over leases.

* a command for a session another live node runs is refused with ``not_owner``,
  naming that node; the owner is not disturbed;
* ``events`` on one node follows a session another node runs: replay, then live
  through NOTIFY, in order, with no gap and no duplicate, ending in ``RunFinished``;
* a node that shuts down cleanly hands its unfinished session over at once: the
  other node's heartbeat claims it, recovers it (the approval it was waiting for
  is still awaited) and finishes it;
* a session whose lease is taken from under a node is stopped there alone: its
  waiters hear ``not_owner``; the node's other sessions go on.
"""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext
from perdure.providers.scripted import Reply, ScriptedProvider, ToolUse
from perdure.storage.bus import Event

TTL = 1.5


@perdure.tool(replay=ReplayPolicy.NEVER, requires_approval=True)
async def deploy(ctx: ToolContext, target: str) -> str:
    """Deploy (needs approval)."""
    return f"deployed {target}"


@perdure.tool(replay=ReplayPolicy.SAFE)
async def lookup(ctx: ToolContext, query: str) -> str:
    """Look up."""
    await trio.sleep(0.05)
    return f"found {query}"


def provider(delay: float = 0.0) -> ScriptedProvider:
    return ScriptedProvider(
        [
            Reply(text="looking", tool_uses=[ToolUse("lookup", {"query": "a"})], delay=delay),
            Reply(text="again", tool_uses=[ToolUse("lookup", {"query": "b"})], delay=delay),
            Reply(text="done", delay=delay),
        ]
    )


def node(url: str, name: str, prov: ScriptedProvider | None = None, **kw: object) -> object:
    return perdure.open_runtime(
        url,
        provider=prov or provider(),
        tools=[deploy, lookup],
        node_id=name,
        lease_ttl=TTL,
        **kw,  # type: ignore[arg-type]
    )


async def test_a_command_for_another_nodes_session_names_the_owner(pg_url: str) -> None:
    async with node(pg_url, "node-a", provider(delay=0.3)) as a, node(pg_url, "node-b") as b:  # type: ignore[attr-defined]
        sid = await a.create_session("s1")
        await a.submit(sid, "go", request_id="r1")
        with pytest.raises(perdure.Refused, match=r"owned by node node-a") as caught:
            await b.submit(sid, "hijack", request_id="r2")
        assert caught.value.code == "not_owner"
        with pytest.raises(perdure.Refused, match="node-a"):
            await b.wait_idle("s1")
        outcome = await a.wait_idle(sid)
        assert outcome is not None
        assert outcome.status == "completed"


async def test_events_follow_a_session_run_by_another_node(pg_url: str) -> None:
    async with node(pg_url, "writer", provider(delay=0.1)) as a, node(pg_url, "reader") as b:  # type: ignore[attr-defined]
        sid = await a.create_session("s1")
        seen: list[Event] = []

        async def follow() -> None:
            async with aclosing(b.events(sid)) as events:
                async for event in events:
                    assert event.seq is not None, "ephemeral deltas stay on their node"
                    seen.append(event)
                    if event.kind == "RunFinished":
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.sleep(0.2)  # the follower is live before the run starts
            await a.submit(sid, "go", request_id="r1")
            with trio.fail_after(20):
                await a.wait_idle(sid)
        in_log = await a._journal.read_session(sid)
        assert [e.seq for e in seen] == [c.seq for c in in_log]
        assert [e.record for e in seen] == [c.record for c in in_log]


async def test_clean_shutdown_hands_an_unfinished_session_over(pg_url: str) -> None:
    script = ScriptedProvider(
        [
            Reply(text="deploying", tool_uses=[ToolUse("deploy", {"target": "prod"})]),
            Reply(text="ok"),
        ]
    )
    async with node(pg_url, "b", script) as b:  # type: ignore[attr-defined]
        async with node(pg_url, "a", script) as a:  # type: ignore[attr-defined]
            sid = await a.create_session("s1")
            await a.submit(sid, "deploy it", request_id="r1")
            with trio.fail_after(10):
                async with aclosing(a.events(sid)) as events:
                    async for event in events:
                        if event.kind == "ToolAwaitingApproval":
                            break
        # a is gone (its leases released); b's heartbeat claims s1 within TTL/3.
        with trio.fail_after(TTL * 2):
            while "s1" not in b.taken_over_sessions:  # noqa: ASYNC110
                await trio.sleep(0.05)
        await b.approve(sid, "toolu_001_1", request_id="yes")
        outcome = await b.wait_idle(sid)
        assert outcome is not None
        assert outcome.status == "completed"


async def test_a_lost_lease_stops_that_session_alone(pg_url: str) -> None:
    script = ScriptedProvider(
        [Reply(text="deploying", tool_uses=[ToolUse("deploy", {"target": "x"})]), Reply(text="ok")]
    )
    async with node(pg_url, "a", script) as a:  # type: ignore[attr-defined]
        for sid in ("s1", "s2"):
            await a.create_session(sid)
            await a.submit(sid, "deploy", request_id="r")

        async def wait_s1() -> None:
            with pytest.raises(perdure.Refused, match="no longer run by this node") as caught:
                await a.wait_idle("s1")
            assert caught.value.code == "not_owner"

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_s1)
            await trio.sleep(0.2)
            # Another node takes s1 by force (as after a partition), fencing a.
            async with node(pg_url, "thief", script, takeover=True) as thief:  # type: ignore[attr-defined]
                await thief.approve("s1", "toolu_001_1", request_id="yes")
                assert (await thief.wait_idle("s1")).status == "completed"
        # a still runs s2 and finishes it.
        await a.approve("s2", "toolu_001_1", request_id="yes")
        assert (await a.wait_idle("s2")).status == "completed"


async def test_an_evicted_session_gives_its_lease_up_at_once(pg_url: str) -> None:
    script = ScriptedProvider([Reply(text="first"), Reply(text="second")])

    def open_node(name: str) -> object:
        # Leases far longer than the test: only the eviction can free the session.
        return perdure.open_runtime(
            pg_url, provider=script, node_id=name, lease_ttl=60, idle_timeout=1.0
        )

    async with open_node("a") as a, open_node("b") as b:  # type: ignore[attr-defined]
        sid = await a.create_session("s1")
        await a.submit(sid, "one", request_id="r1")
        assert (await a.wait_idle(sid)).final_text == "first"
        with pytest.raises(perdure.Refused, match="owned by node a"):
            await b.submit(sid, "two", request_id="r2")
        with trio.fail_after(10):
            while a.evictions == 0:  # noqa: ASYNC110
                await trio.sleep(0.05)
        await b.submit(sid, "two", request_id="r2")  # b acquires the released lease
        assert (await b.wait_idle(sid)).final_text == "second"  # with a's turn in view
        assert sid not in a.resident_sessions
