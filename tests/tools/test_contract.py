"""The tool contract through ``open_runtime``: every failure is a clear is_error result.

Invalid arguments, an unknown tool, a raising tool and a timeout each give the
model a result it can act on, and the run goes on to the next model turn. A
per-call approval policy asks a human only for the calls it selects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import perdure
from perdure import ReplayPolicy, ToolContext, ToolResult, tool
from perdure.providers.scripted import ToolUse
from perdure.storage.records import ToolAwaitingApproval
from tests.support.fold import fold_of
from tests.tools._inproc import SESSION, call_id, one_turn, provider, read_turn, wait_phase

CALLS: list[tuple[str, dict[str, Any]]] = []


@tool(replay=ReplayPolicy.SAFE, timeout=0.3)
async def lookup(ctx: ToolContext, query: str, limit: int = 3) -> dict[str, Any]:
    """Look something up."""
    CALLS.append(("lookup", {"query": query, "limit": limit}))
    if query == "slow":
        await trio.sleep(10)
    if query == "boom":
        raise LookupError(f"no index for {query!r}")
    return {"query": query, "hits": limit, "key": ctx.idempotency_key, "attempt": ctx.attempt}


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


async def test_each_failure_is_an_is_error_result_and_the_run_goes_on(tmp_path: Path) -> None:
    turn = await one_turn(
        tmp_path / "log",
        [lookup],
        [
            ToolUse("lookup", {"query": "ok"}),
            ToolUse("lookup", {"query": 7, "limt": 1}),  # invalid arguments
            ToolUse("search", {"query": "x"}),  # no such tool
            ToolUse("lookup", {"query": "boom"}),  # raises
            ToolUse("lookup", {"query": "slow"}),  # times out
        ],
    )
    assert turn.outcome is not None
    assert (turn.outcome.status, turn.outcome.final_text) == ("completed", "all done")
    content, is_error = turn.results[call_id(1)]
    assert not is_error
    assert '"hits": 3' in content
    assert turn.kind(1) == "ok"

    content, is_error = turn.results[call_id(2)]
    assert is_error
    assert turn.kind(2) == "invalid_args"
    assert "invalid arguments for 'lookup'" in content
    assert "query: Input should be a valid string, got 7" in content
    assert "limt: unexpected field (the tool's parameters: limit, query)" in content
    assert "Nothing was run" in content

    content, is_error = turn.results[call_id(3)]
    assert is_error
    assert turn.kind(3) == "unknown_tool"
    assert content == (
        "perdure: there is no tool named 'search' (available: lookup). Nothing was run."
    )

    content, is_error = turn.results[call_id(4)]
    assert is_error
    assert turn.kind(4) == "error"
    assert content == "The tool raised LookupError: no index for 'boom'"

    content, is_error = turn.results[call_id(5)]
    assert is_error
    assert turn.kind(5) == "timeout"
    assert "timed out after 0.3s" in content

    # Only the valid calls ran; the invalid one and the unknown tool never did.
    assert sorted(c[1]["query"] for c in CALLS) == ["boom", "ok", "slow"]


async def test_context_carries_a_stable_key_the_first_attempt_and_the_workspace(
    tmp_path: Path,
) -> None:
    seen: list[ToolContext] = []

    @tool(replay=ReplayPolicy.SAFE)
    async def probe(ctx: ToolContext) -> str:
        seen.append(ctx)
        ctx.progress("half way", percent=50)
        return "ok"

    ws = tmp_path / "ws"
    ws.mkdir()
    await one_turn(tmp_path / "log", [probe], [ToolUse("probe"), ToolUse("probe")], workspace=ws)
    first, second = sorted(seen, key=lambda c: c.call_id)
    assert (first.call_id, first.session_id, first.attempt) == (call_id(1), SESSION, 1)
    assert first.workspace == ws.resolve()
    assert first.idempotency_key.startswith("pdk_")
    assert first.idempotency_key != second.idempotency_key


async def test_tool_result_flags_an_error_or_ends_the_run(tmp_path: Path) -> None:
    @tool(replay=ReplayPolicy.SAFE)
    async def check(ctx: ToolContext, fine: bool) -> ToolResult:
        if fine:
            return ToolResult("all good", terminate=True)
        return ToolResult({"problem": "disk full"}, is_error=True)

    turn = await one_turn(tmp_path / "a", [check], [ToolUse("check", {"fine": False})])
    assert turn.results[call_id(1)] == ('{"problem": "disk full"}', True)
    assert turn.outcome is not None
    assert turn.outcome.final_text == "all done"
    turn = await one_turn(tmp_path / "b", [check], [ToolUse("check", {"fine": True})])
    assert turn.outcome is not None
    assert turn.outcome.final_text == "all good"  # ended by the tool: no second turn


# -- approval -------------------------------------------------------------------------------

PAID: list[int] = []


@tool(requires_approval=lambda args: args["amount"] > 100 or args["currency"] != "EUR")
async def pay(ctx: ToolContext, amount: int, currency: str = "EUR") -> str:
    """Pay an amount; big amounts or foreign currencies need a human's approval."""
    PAID.append(amount)
    return f"paid {amount} {currency}"


async def _approval_run(
    tmp_path: Path, uses: list[ToolUse], decide: dict[str, bool]
) -> tuple[Any, int]:
    PAID.clear()
    async with perdure.open_runtime(tmp_path / "log", provider=provider(uses), tools=[pay]) as rt:
        await rt.create_session(SESSION)
        await rt.submit(SESSION, "pay", request_id="r1")
        for call, approved in decide.items():
            await wait_phase(rt, call, "awaiting_approval")
            assert PAID == [5]  # the small payment did not wait for the big one's approval
            await rt.approve(SESSION, call, approved=approved, request_id=f"a-{call}")
        with trio.fail_after(10):
            outcome = await rt.wait_idle(SESSION)
        asked = 0
        async for event in rt.events(SESSION, live=False):
            asked += isinstance(event.record, ToolAwaitingApproval)
        return await read_turn(rt, outcome), asked


async def test_per_call_approval_policy_asks_only_for_the_calls_it_selects(
    tmp_path: Path,
) -> None:
    uses = [ToolUse("pay", {"amount": 5}), ToolUse("pay", {"amount": 500})]
    turn, asked = await _approval_run(tmp_path, uses, {call_id(2): True})
    assert asked == 1
    assert sorted(PAID) == [5, 500]
    assert turn.results[call_id(1)] == ("paid 5 EUR", False)
    assert turn.results[call_id(2)] == ("paid 500 EUR", False)


async def test_a_denied_call_is_never_run_and_the_model_is_told(tmp_path: Path) -> None:
    uses = [ToolUse("pay", {"amount": 5}), ToolUse("pay", {"amount": 500})]
    turn, _ = await _approval_run(tmp_path, uses, {call_id(2): False})
    assert PAID == [5]
    assert turn.kind(2) == "denied"
    assert turn.results[call_id(2)] == (
        "perdure: the user denied this call; it was not run.",
        True,
    )


async def test_approval_policy_sees_the_defaults_and_fails_closed(tmp_path: Path) -> None:
    @tool(requires_approval=lambda args: args["dry_run"] is False)
    async def deploy(ctx: ToolContext, dry_run: bool = False) -> str:
        return "deployed"

    def broken(args: dict[str, Any]) -> bool:
        raise KeyError("oops")

    @tool(requires_approval=broken)
    async def wipe(ctx: ToolContext) -> str:
        return "wiped"

    assert deploy.needs_approval({})  # the omitted default counts: not a dry run
    assert not deploy.needs_approval({"dry_run": True})
    assert wipe.needs_approval({})  # a broken policy asks the human
    assert not pay.needs_approval({"amount": 5})
    assert pay.needs_approval({"amount": 5, "currency": "USD"})


async def test_forget_runs_once_per_settled_call_and_cannot_break_the_run(
    tmp_path: Path,
) -> None:
    seen: list[tuple[str, str]] = []  # (event, idempotency key)

    async def forget(ctx: ToolContext) -> None:
        seen.append(("forget", ctx.idempotency_key))
        if ctx.call_id == call_id(2):
            raise OSError("the state is on a disk that went away")

    @tool(replay=ReplayPolicy.SAFE, forget=forget)
    async def stamp(ctx: ToolContext, n: int) -> str:
        """Stamp."""
        seen.append(("run", ctx.idempotency_key))
        await trio.sleep(0.05)
        assert ("forget", ctx.idempotency_key) not in seen  # never while it runs
        return f"stamped {n}"

    turn = await one_turn(
        tmp_path / "log",
        [stamp],
        [ToolUse("stamp", {"n": 1}), ToolUse("stamp", {"n": 2}), ToolUse("stamp", {"n": "x"})],
    )
    assert turn.outcome is not None
    assert turn.outcome.status == "completed"
    assert [turn.kind(n) for n in (1, 2, 3)] == ["ok", "ok", "invalid_args"]
    ran = [key for event, key in seen if event == "run"]
    forgotten = [key for event, key in seen if event == "forget"]
    # Each call that ran is forgotten once; the invalid one never ran, so has no state.
    assert sorted(forgotten) == sorted(ran) and len(ran) == 2


def test_forget_must_be_async() -> None:
    def forget(ctx: ToolContext) -> None: ...

    with pytest.raises(TypeError, match="forget must be an async function"):
        tool(forget=forget)(lookup.fn)  # type: ignore[arg-type]


async def test_cancelling_a_run_while_a_reconcile_runs_ends_the_run(tmp_path: Path) -> None:
    """The reconcile is stopped by the cancel; the call's outcome is unknown, said so."""
    started, reconciling = trio.Event(), trio.Event()

    async def slow_reconcile(ctx: ToolContext, target: str) -> perdure.Reconciled:
        reconciling.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    @tool(replay=ReplayPolicy.NEVER, reconcile=slow_reconcile, cancellable=True)
    async def ship(ctx: ToolContext, target: str) -> str:
        """Ship something (never returns here)."""
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    log = tmp_path / "log"
    async with perdure.open_runtime(
        log, provider=provider([ToolUse("ship", {"target": "x"})]), tools=[ship], shutdown_grace=0.1
    ) as rt:
        await rt.create_session(SESSION)
        await rt.submit(SESSION, "go", request_id="r1")
        with trio.fail_after(10):
            await started.wait()
    # Shut down mid-call: the log shows the call executing, as after a crash.
    async with perdure.open_runtime(
        log, provider=provider([ToolUse("ship", {"target": "x"})]), tools=[ship]
    ) as rt:
        with trio.fail_after(10):
            await reconciling.wait()
        await rt.cancel(SESSION, request_id="c1")
        with trio.fail_after(10):
            outcome = await rt.wait_idle(SESSION)
        assert outcome is not None
        assert outcome.status == "cancelled"
        task = (await fold_of(rt, SESSION)).tasks[call_id(1)]
        assert task.phase == "outcome_unknown"
        assert "the reconcile was cancelled" in task.result.reason  # type: ignore[union-attr]


async def test_a_tool_that_cannot_tell_reports_an_unknown_outcome(tmp_path: Path) -> None:
    @tool(replay=ReplayPolicy.KEYED)
    async def transfer(ctx: ToolContext, amount: int) -> str:
        """Move money through a service whose connection broke mid-call."""
        raise perdure.OutcomeUnknown("the connection to the bank broke after the request")

    turn = await one_turn(tmp_path / "log", [transfer], [ToolUse("transfer", {"amount": 5})])
    assert turn.state.tasks[call_id(1)].phase == "outcome_unknown"
    content, is_error = turn.results[call_id(1)]
    assert is_error and "UNKNOWN" in content and "broke after the request" in content
    assert turn.outcome is not None and turn.outcome.status == "completed"
