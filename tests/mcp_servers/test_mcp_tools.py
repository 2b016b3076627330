"""MCP servers as perdure tools, against the real shop server (``shop_server.py``).

The runtime runs in this process; the server runs in a subprocess, over stdio or
streamable HTTP on loopback. Each test checks what was recorded, what the model
reads, and what the server's ledger says really happened.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import mcp.types as mt
import pytest
import trio

import perdure
from perdure import ReplayPolicy, RetryPolicy, tool
from perdure.check import check_log
from perdure.tools.mcp import (
    IDEMPOTENCY_META_KEY,
    McpServer,
    McpStartError,
    policy_for,
    tool_name,
)
from tests.mcp_servers._shop import (
    HttpShop,
    first_call,
    http_shop_process,
    read_ledger,
    results,
    run_turns,
    script,
    stdio_shop,
    wait_ledger,
    wait_phase,
)
from tests.support.fold import fold_of

# -- the policy table, row by row (no server needed) ----------------------------------------


def _hints(**kw: Any) -> mt.ToolAnnotations:
    return mt.ToolAnnotations(**kw)


@pytest.mark.parametrize(
    ("hints", "trusted", "replay", "approval"),
    [
        # untrusted: the hints are ignored, whatever they say
        ({"read_only_hint": True}, False, ReplayPolicy.NEVER, False),
        ({"idempotent_hint": True, "destructive_hint": False}, False, ReplayPolicy.NEVER, False),
        ({}, False, ReplayPolicy.NEVER, False),
        # trusted
        ({"read_only_hint": True}, True, ReplayPolicy.SAFE, False),
        ({"read_only_hint": True, "destructive_hint": True}, True, ReplayPolicy.SAFE, False),
        ({"idempotent_hint": True, "destructive_hint": False}, True, ReplayPolicy.KEYED, False),
        ({"idempotent_hint": True}, True, ReplayPolicy.KEYED, True),  # destructive by default
        ({"destructive_hint": False}, True, ReplayPolicy.NEVER, False),
        ({}, True, ReplayPolicy.NEVER, True),  # the spec's defaults: destructive
        (None, True, ReplayPolicy.NEVER, True),
    ],
)
def test_policy_table(
    hints: dict[str, Any] | None, trusted: bool, replay: ReplayPolicy, approval: bool
) -> None:
    policy = policy_for(None if hints is None else _hints(**hints), trusted=trusted)
    assert (policy.replay, policy.requires_approval) == (replay, approval)
    assert ("untrusted" in policy.reason) is (not trusted)


def test_overrides_always_win() -> None:
    policy = policy_for(
        _hints(read_only_hint=True),
        trusted=True,
        override={"replay": "never", "requires_approval": True, "timeout": 3},
    )
    assert (policy.replay, policy.requires_approval, policy.timeout) == (
        ReplayPolicy.NEVER,
        True,
        3,
    )
    assert policy.reason.startswith("override: replay=never, requires_approval=True")
    untrusted = policy_for(_hints(), trusted=False, override={"replay": ReplayPolicy.KEYED})
    assert untrusted.replay is ReplayPolicy.KEYED
    with pytest.raises(ValueError, match="unknown option"):
        McpServer.stdio("shop", "x", overrides={"lookup": {"replayy": "safe"}})
    with pytest.raises(ValueError, match="safe, keyed or never"):
        McpServer.stdio("shop", "x", overrides={"lookup": {"replay": "sometimes"}})


def test_names_fit_every_provider() -> None:
    assert tool_name("shop", "lookup") == "shop__lookup"
    assert tool_name("fs", "read.file/v2") == "fs__read_file_v2"
    long = tool_name("srv", "t" * 100)
    assert len(long) == 64 and long.startswith("srv__ttt")
    assert long != tool_name("srv", "t" * 101)
    for bad in ("a__b", "with space", "", "x" * 40, "_lead"):
        with pytest.raises(ValueError, match="MCP server name"):
            McpServer.stdio(bad, "cmd")


# -- listing and calling ---------------------------------------------------------------------


def _table(tools: dict[str, Any], prefix: str) -> dict[str, tuple[ReplayPolicy, Any]]:
    return {
        n.removeprefix(prefix): (t.replay, t.requires_approval)
        for n, t in tools.items()
        if n.startswith(prefix)
    }


TRUSTED_TABLE = {
    "lookup": (ReplayPolicy.SAFE, False),  # readOnlyHint
    "book": (ReplayPolicy.KEYED, False),  # idempotentHint, not destructive
    "delete": (ReplayPolicy.NEVER, True),  # destructive by default, not idempotent
    "append": (ReplayPolicy.NEVER, False),  # not destructive, not idempotent
    "plain": (ReplayPolicy.NEVER, True),  # no annotations: the spec's defaults
}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_tools_are_listed_with_their_policies(tmp_path: Path, transport: str) -> None:
    ledger = tmp_path / "ledger"
    overrides = {"delete": {"requires_approval": False}, "lookup": {"replay": "never"}}
    with http_shop_process(ledger) as (url, _pid):
        if transport == "stdio":
            trusted = stdio_shop(ledger, trust_annotations=True)
            untrusted = McpServer.stdio(
                "other", sys.executable, list(trusted.args), env=dict(trusted.env or {})
            )
            overridden = McpServer.stdio(
                "over", trusted.command, list(trusted.args), env=trusted.env,
                trust_annotations=True, overrides=overrides,
            )  # fmt: skip
        else:
            trusted = McpServer.http("shop", url, trust_annotations=True)
            untrusted = McpServer.http("other", url)
            overridden = McpServer.http("over", url, trust_annotations=True, overrides=overrides)
        async with perdure.open_runtime(
            tmp_path / "log", provider=script(), mcp_servers=[trusted, untrusted, overridden]
        ) as rt:
            tools = rt.tools
    shop = _table(tools, "shop__")
    assert {name: shop[name] for name in TRUSTED_TABLE} == TRUSTED_TABLE
    # the same server, untrusted: every hint ignored
    others = _table(tools, "other__")
    assert set(others) == set(shop) and len(others) >= 10
    assert set(others.values()) == {(ReplayPolicy.NEVER, False)}
    # overrides win over trusted annotations
    over = _table(tools, "over__")
    assert over["delete"] == (ReplayPolicy.NEVER, False)
    assert over["lookup"] == (ReplayPolicy.NEVER, False)
    assert over["book"] == TRUSTED_TABLE["book"]
    assert tools["shop__lookup"].description == "The weather in a city."
    assert tools["shop__lookup"].input_schema["required"] == ["city"]


async def test_an_http_server_that_goes_away_is_reconnected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = tmp_path / "ledger"
    shop = HttpShop(ledger)
    hub: list[Any] = []

    @tool
    async def bounce_shop() -> str:
        """Kill the shop server, start a newer one, wait until perdure reconnected."""
        conn = hub[0].connections["shop"]
        shop.kill()
        while conn.up:  # noqa: ASYNC110 (the probe notices)
            await trio.sleep(0.02)
        await trio.to_thread.run_sync(shop.start, "changed")
        await conn.wait_connects(2)
        return "bounced"

    provider = script(
        [("shop__lookup", {"city": "F"})],
        [("bounce_shop", {})],
        [("shop__book", {"room": "3"})],
    )
    shop.start()
    try:
        server = McpServer.http(
            "shop", shop.url, trust_annotations=True, probe_interval=0.2, backoff_initial=0.2
        )
        async with perdure.open_runtime(
            tmp_path / "log", provider=provider, tools=[bounce_shop], mcp_servers=[server]
        ) as rt:
            hub.append(rt.mcp)
            state = await run_turns(rt)
    finally:
        shop.kill()
    got = results(state)
    assert got[first_call(1, 1)] == ("F: sunny", False)
    assert got[first_call(1, 2)] == ("bounced", False)
    assert got[first_call(1, 3)][0].startswith("booked 3 (booking B")
    assert len({e["pid"] for e in read_ledger(ledger)}) == 2
    # the newer server's lookup differs: said, and the registry stays as it was at start
    warned = [r.getMessage() for r in caplog.records if "changed its tools" in r.getMessage()]
    assert warned and "(lookup)" in warned[0]


async def test_a_cancelled_run_sends_cancelled_to_the_server(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    provider = script([("shop__slow", {"seconds": 60})])
    server = stdio_shop(ledger, trust_annotations=True)  # slow is read-only: cancellable
    log = tmp_path / "log"
    async with perdure.open_runtime(log, provider=provider, mcp_servers=[server]) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        await wait_ledger(ledger, "slow.start")
        await rt.cancel("s")
        with trio.fail_after(30):
            await rt.wait_idle("s")
        await wait_ledger(ledger, "slow.cancelled")
        state = await fold_of(rt, "s")
    assert state.tasks[first_call()].phase == "cancelled"
    assert state.last_outcome is not None and state.last_outcome.status == "cancelled"


async def test_calls_carry_the_key_and_record_the_policy_and_why(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    provider = script(
        [
            ("shop__lookup", {"city": "Oslo"}),
            ("shop__book", {"room": "7"}),
            ("shop__append", {"line": "hello"}),
        ]
    )
    async with perdure.open_runtime(
        tmp_path / "log",
        provider=provider,
        mcp_servers=[stdio_shop(ledger, trust_annotations=True)],
    ) as rt:
        state = await run_turns(rt)
        transcript = await rt.transcript("s")
    got = results(state)
    assert got[first_call(1)] == ("Oslo: sunny", False)
    assert got[first_call(2)][0].startswith("booked 7 (booking B")
    assert got[first_call(3)] == ("appended hello", False)
    executing = {cid: state.tasks[cid].executing for cid in got}
    assert all(e is not None for e in executing.values())
    lookup, book, append = (executing[first_call(i)] for i in (1, 2, 3))
    assert lookup is not None and book is not None and append is not None
    assert (lookup.replay, book.replay, append.replay) == ("safe", "keyed", "never")
    assert lookup.policy_reason == "MCP shop/lookup: trusted annotations: readOnlyHint"
    assert "idempotentHint" in book.policy_reason
    # the server received each call's idempotency key in _meta
    by_tool = {e["tool"]: e for e in read_ledger(ledger)}
    assert by_tool["book"]["key"] == book.idempotency_key
    assert by_tool["lookup"]["key"] == lookup.idempotency_key
    assert IDEMPOTENCY_META_KEY == "perdure/idempotency-key"
    assert state.last_outcome is not None and state.last_outcome.status == "completed"
    assert any("Oslo: sunny" in str(m.content) for m in transcript)


async def test_calls_over_streamable_http(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    provider = script([("shop__lookup", {"city": "Rome"}), ("shop__book", {"room": "9"})])
    with http_shop_process(ledger) as (url, _pid):
        server = McpServer.http("shop", url, headers={"X-Test": "1"}, trust_annotations=True)
        async with perdure.open_runtime(
            tmp_path / "log", provider=provider, mcp_servers=[server]
        ) as rt:
            assert rt.tools["shop__book"].replay is ReplayPolicy.KEYED
            state = await run_turns(rt)
    got = results(state)
    assert got[first_call(1)] == ("Rome: sunny", False)
    assert got[first_call(2)][0].startswith("booked 9")
    book = state.tasks[first_call(2)].executing
    assert book is not None
    assert [e["key"] for e in read_ledger(ledger) if e["tool"] == "book"] == [book.idempotency_key]


async def test_invalid_arguments_are_told_to_the_model_and_nothing_runs(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    provider = script([("shop__lookup", {"city": 5}), ("shop__book", {})])
    async with perdure.open_runtime(
        tmp_path / "log", provider=provider, mcp_servers=[stdio_shop(ledger)]
    ) as rt:
        state = await run_turns(rt)
    got = results(state)
    assert got[first_call(1)][1] is True
    assert "city: 5 is not of type 'string'" in got[first_call(1)][0]
    assert "'room' is a required property" in got[first_call(2)][0]
    assert all(state.tasks[c].executing is None for c in got)
    assert read_ledger(ledger) == []


async def test_results_errors_media_and_truncation(tmp_path: Path) -> None:
    provider = script([("shop__fail", {}), ("shop__media", {}), ("shop__big", {"n": 5000})])
    server = stdio_shop(tmp_path / "ledger", max_result_chars=1000)
    async with perdure.open_runtime(
        tmp_path / "log", provider=provider, mcp_servers=[server]
    ) as rt:
        state = await run_turns(rt)
    got = results(state)
    assert got[first_call(1)] == ("no stock", True)
    media, media_error = got[first_call(2)]
    assert not media_error
    assert "[image content: image/png, about 100 bytes, not shown]" in media
    assert '{"rooms": 3, "free": true}' in media
    big, _ = got[first_call(3)]
    assert big.startswith("x" * 1000)
    assert "[truncated: the result had 5000 characters; the first 1000 are shown]" in big


async def test_a_trusted_destructive_tool_waits_for_approval(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    provider = script([("shop__delete", {"item": "cart"})])
    async with perdure.open_runtime(
        tmp_path / "log",
        provider=provider,
        mcp_servers=[stdio_shop(ledger, trust_annotations=True)],
    ) as rt:
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        await wait_phase(rt, first_call(), "awaiting_approval")
        assert read_ledger(ledger) == []
        await rt.approve("s", first_call(), approved=True)
        with trio.fail_after(30):
            await rt.wait_idle("s")
        state = await fold_of(rt, "s")
    assert results(state)[first_call()] == ("deleted cart", False)
    assert [e["tool"] for e in read_ledger(ledger)] == ["delete"]


async def test_an_override_wins_over_annotations(tmp_path: Path) -> None:
    server = stdio_shop(
        tmp_path / "ledger",
        trust_annotations=True,
        overrides={"delete": {"requires_approval": False, "replay": "keyed", "timeout": 5}},
    )
    async with perdure.open_runtime(
        tmp_path / "log", provider=script(), mcp_servers=[server]
    ) as rt:
        delete = rt.tools["shop__delete"]
    assert (delete.replay, delete.requires_approval, delete.timeout) == (
        ReplayPolicy.KEYED,
        False,
        5,
    )
    assert delete.policy_reason.startswith("MCP shop/delete: override: replay=keyed")


# -- start-up errors ------------------------------------------------------------------------


async def test_a_name_collision_is_an_error_naming_both(tmp_path: Path) -> None:
    @tool(name="shop__lookup")
    async def mine(city: str) -> str:
        return city

    with pytest.raises(McpStartError, match="collision") as caught:
        async with perdure.open_runtime(
            tmp_path / "log",
            provider=script(),
            tools=[mine],
            mcp_servers=[stdio_shop(tmp_path / "ledger")],
        ):
            pass
    said = str(caught.value)
    assert "the tool 'shop__lookup' of MCP server 'shop'" in said
    assert "the perdure tool 'shop__lookup'" in said


async def test_a_schema_that_is_not_json_schema_leaves_only_that_tool_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = stdio_shop(tmp_path / "ledger", broken_schema=True)
    async with perdure.open_runtime(
        tmp_path / "log", provider=script(), mcp_servers=[server]
    ) as rt:
        names = set(rt.tools)
    assert "shop__broken" not in names and "shop__lookup" in names
    (said,) = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert "MCP server 'shop', tool 'broken' is left out" in said
    assert "not valid JSON Schema" in said


async def test_a_program_that_is_not_an_mcp_server_fails_the_start_clearly(
    tmp_path: Path,
) -> None:
    server = McpServer.stdio(
        "junk",
        sys.executable,
        ["-c", "import time; print('hello, not json', flush=True); time.sleep(60)"],
        connect_timeout=3,
    )
    with pytest.raises(McpStartError, match=r"MCP server 'junk' \(.*\) could not be started") as e:
        async with perdure.open_runtime(tmp_path / "log", provider=script(), mcp_servers=[server]):
            pass
    assert "no answer within 3s; it sent something that is not MCP" in str(e.value)
    report = check_log(tmp_path / "log", settled="all")
    assert report.ok and report.sessions == 0  # nothing ran


async def test_servers_start_together_and_one_that_cannot_stops_the_start(
    tmp_path: Path,
) -> None:
    missing = McpServer.stdio("gone", str(tmp_path / "no-such-program"))
    shop = stdio_shop(tmp_path / "ledger")
    with pytest.raises(McpStartError, match=r"MCP server 'gone' .* could not be started"):
        async with perdure.open_runtime(
            tmp_path / "log", provider=script(), mcp_servers=[shop, missing]
        ):
            pass
    with pytest.raises(ValueError, match="two MCP servers are named 'shop'"):
        async with perdure.open_runtime(
            tmp_path / "log", provider=script(), mcp_servers=[shop, shop]
        ):
            pass


# -- a server that dies ---------------------------------------------------------------------


async def test_a_killed_server_is_restarted_and_a_call_meanwhile_is_an_error(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    hub: list[Any] = []

    @tool
    async def kill_shop() -> str:
        """Kill the shop server; return once perdure saw it go down."""
        conn = hub[0].connections["shop"]
        os.kill(read_ledger(ledger)[-1]["pid"], signal.SIGKILL)
        while conn.up:  # noqa: ASYNC110 (the probe notices the death)
            await trio.sleep(0.02)
        return "killed"

    @tool
    async def await_shop() -> str:
        """Wait until the shop server is connected again."""
        await hub[0].connections["shop"].wait_connects(2)
        return "back"

    provider = script(
        [("shop__lookup", {"city": "A"})],
        [("kill_shop", {})],
        [("shop__lookup", {"city": "B"})],
        [("await_shop", {})],
        [("shop__lookup", {"city": "C"})],
    )
    server = stdio_shop(
        ledger, trust_annotations=True, backoff_initial=2, probe_interval=0.2, retry=None
    )
    async with perdure.open_runtime(
        tmp_path / "log", provider=provider, tools=[kill_shop, await_shop], mcp_servers=[server]
    ) as rt:
        hub.append(rt.mcp)
        state = await run_turns(rt)
    got = results(state)
    assert got[first_call(1, 1)] == ("A: sunny", False)
    assert got[first_call(1, 2)] == ("killed", False)
    # the third call met the server down: not sent, an error that says so
    text, is_error = got[first_call(1, 3)]
    assert is_error
    assert text.startswith("MCP server 'shop' is down (probe failed:")
    assert "The call was not sent" in text
    assert got[first_call(1, 4)] == ("back", False)
    assert got[first_call(1, 5)] == ("C: sunny", False)
    assert state.last_outcome is not None and state.last_outcome.status == "completed"
    assert [e["city"] for e in read_ledger(ledger)] == ["A", "C"]
    assert len({e["pid"] for e in read_ledger(ledger)}) == 2


async def test_a_server_killed_mid_call_gives_unknown_for_never_and_error_for_safe(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    hub: list[Any] = []

    @tool
    async def await_shop(connects: int) -> str:
        """Wait until the shop server has been connected this many times."""
        await hub[0].connections["shop"].wait_connects(connects)
        return "back"

    async def kill_when(tool_name: str) -> None:
        os.kill((await wait_ledger(ledger, tool_name))["pid"], signal.SIGKILL)

    provider = script(
        [("shop__hold", {"item": "x"})],  # NEVER (trusted: not read-only, not idempotent)
        [("await_shop", {"connects": 2})],
        [("shop__slow", {"seconds": 60})],  # SAFE (read-only)
        [("await_shop", {"connects": 3})],
        [("shop__lookup", {"city": "D"})],
    )
    server = stdio_shop(ledger, trust_annotations=True, backoff_initial=0.2, retry=None)
    async with perdure.open_runtime(
        tmp_path / "log", provider=provider, tools=[await_shop], mcp_servers=[server]
    ) as rt:
        hub.append(rt.mcp)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_when, "hold")
            nursery.start_soon(kill_when, "slow.start")
            state = await run_turns(rt)
    got = results(state)
    hold = state.tasks[first_call(1, 1)]
    assert hold.phase == "outcome_unknown"
    assert "the connection to MCP server 'shop' closed" in got[first_call(1, 1)][0]
    assert "may have taken effect" in got[first_call(1, 1)][0]
    slow = state.tasks[first_call(1, 3)]
    assert slow.phase == "completed"
    assert got[first_call(1, 3)] == (
        "the connection to MCP server 'shop' closed during the call of 'slow'",
        True,
    )
    assert got[first_call(1, 5)] == ("D: sunny", False)
    assert state.last_outcome is not None and state.last_outcome.status == "completed"
    assert len({e["pid"] for e in read_ledger(ledger)}) == 3


async def test_a_keyed_call_cut_off_is_retried_with_the_same_key(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    provider = script([("shop__reserve", {"table": "4", "seconds": 3600})])
    # Many short attempts: a restarted server takes a while to answer on a busy machine.
    retry = RetryPolicy(max_attempts=40, initial=0.25, max_interval=0.5, retry_timeouts=False)
    server = stdio_shop(ledger, trust_annotations=True, backoff_initial=0.2, retry=retry)
    log = tmp_path / "log"
    async with perdure.open_runtime(log, provider=provider, mcp_servers=[server]) as rt:
        assert rt.tools["shop__reserve"].retry is retry
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        os.kill((await wait_ledger(ledger, "reserve"))["pid"], signal.SIGKILL)
        with trio.fail_after(60):
            await rt.wait_idle("s")
        state = await fold_of(rt, "s")
    task = state.tasks[first_call()]
    # attempt 2, or later if earlier retries found the server still restarting
    assert task.phase == "completed" and task.attempt >= 2
    assert results(state)[first_call()] == ("reserved 4 (already)", False)
    (entry,) = read_ledger(ledger)  # one effect: the retry carried the same _meta key
    assert task.executing is not None and entry["key"] == task.executing.idempotency_key
    assert task.last_error  # what the last failed attempt met


async def test_without_retries_a_keyed_call_cut_off_is_unknown(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    provider = script([("shop__reserve", {"table": "4", "seconds": 3600})])
    server = stdio_shop(ledger, trust_annotations=True, retry=None)
    log = tmp_path / "log"
    async with perdure.open_runtime(log, provider=provider, mcp_servers=[server]) as rt:
        assert rt.tools["shop__reserve"].retry is None
        assert stdio_shop(ledger).retry == RetryPolicy(max_attempts=5, retry_timeouts=False)
        await rt.create_session("s")
        await rt.submit("s", "go", request_id="r1")
        os.kill((await wait_ledger(ledger, "reserve"))["pid"], signal.SIGKILL)
        with trio.fail_after(60):
            await rt.wait_idle("s")
        state = await fold_of(rt, "s")
    assert state.tasks[first_call()].phase == "outcome_unknown"
    assert "it may have taken effect" in results(state)[first_call()][0]


async def test_garbage_from_a_server_is_a_clear_error_and_it_is_restarted(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    hub: list[Any] = []

    @tool
    async def await_shop(connects: int) -> str:
        """Wait until the shop server has been connected this many times."""
        await hub[0].connections["shop"].wait_connects(connects)
        return "back"

    provider = script(
        [("shop__garble", {"mode": "line"})],  # a line that is not JSON-RPC at all
        [("await_shop", {"connects": 2})],
        [("shop__garble", {"mode": "shape"})],  # an answer of the wrong shape
        [("await_shop", {"connects": 3})],
        [("shop__lookup", {"city": "E"})],
    )
    server = stdio_shop(ledger, trust_annotations=True, backoff_initial=0.2)
    async with perdure.open_runtime(
        tmp_path / "log", provider=provider, tools=[await_shop], mcp_servers=[server]
    ) as rt:
        hub.append(rt.mcp)
        state = await run_turns(rt)
    got = results(state)
    line, shape = state.tasks[first_call(1, 1)], state.tasks[first_call(1, 3)]
    # garble is NEVER (not read-only, not idempotent): its effect is unknown, said plainly
    assert (line.phase, shape.phase) == ("outcome_unknown", "outcome_unknown")
    assert "MCP server 'shop' sent something that is not MCP" in got[first_call(1, 1)][0]
    assert "during the call of 'garble'; it may have taken effect" in got[first_call(1, 1)][0]
    assert "MCP server 'shop' sent a reply that could not be read" in got[first_call(1, 3)][0]
    assert "ValidationError" in got[first_call(1, 3)][0]
    assert got[first_call(1, 5)] == ("E: sunny", False)
    assert state.last_outcome is not None and state.last_outcome.status == "completed"


async def test_a_timeout_sends_cancelled_to_the_server(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    provider = script([("shop__slow", {"seconds": 60})])
    server = stdio_shop(ledger, trust_annotations=True, overrides={"slow": {"timeout": 1}})
    async with perdure.open_runtime(
        tmp_path / "log", provider=provider, mcp_servers=[server]
    ) as rt:
        state = await run_turns(rt)
        await wait_ledger(ledger, "slow.cancelled")
    text, is_error = results(state)[first_call()]
    assert is_error and "timed out after 1s" in text
