"""A golden log that holds every kind of fact the current build writes, through real parts.

``write_features_log(path)`` runs a runtime on a real LMDB directory with the real
providers, ``FallbackProvider([AnthropicProvider, OpenAIProvider], after=1)``, over
the fake vendor servers of ``tests/fake_anthropic.py`` and ``tests/fake_openai.py``
(real SDKs, real sockets; extended thinking on). One session at a time, so the
servers' scripts are taken in order:

``reasoning``       a tool call and an answer, both with signed thinking blocks, one
                    of them redacted
``fallback``        the primary is overloaded; the turn moves on to the secondary
``tool-retry``      a tool heartbeats, fails, and its retry resumes from the heartbeat
``needs-human``     a tool asks for a person; ``rt.resolve(action="retry")`` runs it again
``budget``          a run stopped by its token budget
``awaiting-human``  left waiting for a person (recovery keeps it waiting)
``approval``        left awaiting an approval
``model-back-off``  both providers failed; the turn waits out a long back-off

The runtime then shuts down cleanly: the last three sessions still have work, and
their recovery plan is part of the golden fixture. ``describe(log)`` is what every
later build must fold from it (``expected_replay.json``).
"""

from __future__ import annotations

from collections import Counter
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anthropic
import openai
import trio
import trio.lowlevel

import perdure
from perdure import NeedsHuman, ReplayPolicy, RetryableError, RetryPolicy, ToolContext
from perdure.actors.state import SessionState
from perdure.providers import FallbackProvider
from perdure.providers.anthropic import AnthropicProvider
from perdure.providers.openai import OpenAIProvider
from perdure.storage.records import Budget, Committed, GenerationCompleted
from tests import fake_anthropic as fa
from tests import fake_openai as fo

# Every record type the current build writes in these sessions (LogOpened included),
# and the newer fields that must be present with a non-default value.
REQUIRED_TYPES = frozenset(
    {
        "LogOpened",
        "SessionCreated",
        "InputAccepted",
        "RunStarted",
        "RunFinished",
        "GenerationStarted",
        "RetryPending",
        "GenerationCompleted",
        "ToolTaskCreated",
        "ToolAwaitingApproval",
        "ToolExecuting",
        "ToolHeartbeat",
        "ToolRetryPending",
        "ToolAwaitingHuman",
        "ResolutionDecided",
        "ToolCompleted",
    }
)


@perdure.tool(replay=ReplayPolicy.SAFE)
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@perdure.tool(replay=ReplayPolicy.SAFE, retry=RetryPolicy(max_attempts=3, initial=0.01))
async def crawl(ctx: ToolContext, pages: int) -> str:
    """Crawl ``pages`` pages, heartbeating after each; the first attempt fails at the end."""
    start = ctx.last_heartbeat["page"] if ctx.last_heartbeat else 0
    for page in range(start + 1, pages + 1):
        ctx.heartbeat({"page": page})
        await trio.lowlevel.checkpoint()
    if ctx.attempt == 1:
        raise RetryableError("the last page timed out")
    return f"crawled from page {start + 1}"


@perdure.tool(replay=ReplayPolicy.NEVER)
async def pay(ctx: ToolContext, cents: int) -> str:
    """Pay; the card is declined on the first attempt, and a person must decide."""
    if ctx.attempt == 1:
        raise NeedsHuman("the card was declined; ask the customer for another one")
    return f"paid {cents}"


@perdure.tool(replay=ReplayPolicy.NEVER, requires_approval=True)
async def deploy(target: str) -> str:
    """Deploy (needs approval)."""
    return f"deployed {target}"


def _thought(text: str) -> fa.Thinking:
    return fa.Thinking(text)


def _use(n: int, name: str, **args: Any) -> fa.ToolUse:
    return fa.ToolUse(f"toolu_g{n}", name, args)


def _script(a: fa.FakeAnthropic, o: fo.FakeOpenAI) -> None:
    overloaded = fa.HttpError(status=529, type="overloaded_error", message="Overloaded")
    a.script(
        # reasoning
        fa.Reply(content=[_thought("The user wants a sum."), _use(1, "add", a=2, b=3)]),
        fa.Reply(
            content=[
                _thought("The tool said 5."),
                fa.RedactedThinking("ZW5jcnlwdGVkIHJlYXNvbmluZw=="),
                fa.Text("2 + 3 = 5"),
            ]
        ),
        # fallback: overloaded, the next attempt goes to OpenAI
        overloaded,
        # tool-retry
        fa.Reply(content=[_thought("Crawl it."), _use(2, "crawl", pages=3)]),
        fa.Reply(content=[fa.Text("crawled")]),
        # needs-human
        fa.Reply(content=[_thought("Pay it."), _use(3, "pay", cents=5)]),
        fa.Reply(content=[fa.Text("paid")]),
        # budget: the first turn spends more than the run may
        fa.Reply(
            content=[_thought("Add first."), _use(4, "add", a=1, b=1)],
            usage=fa.FakeUsage(input_tokens=40, output_tokens=20),
        ),
        # awaiting-human, approval
        fa.Reply(content=[_thought("Pay a lot."), _use(5, "pay", cents=900)]),
        fa.Reply(content=[_thought("Ship it."), _use(6, "deploy", target="prod")]),
        # model-back-off: overloaded, and then OpenAI asks for ten minutes
        overloaded,
    )
    o.script(
        fo.Reply(content=[fo.Text("Answered by the secondary.")]),
        fo.HttpError(
            status=429,
            type="rate_limit_error",
            code="rate_limit_exceeded",
            message="Rate limit reached",
            headers={"retry-after": "600"},
        ),
    )


async def _until(rt: perdure.Runtime, sid: str, kind: str) -> None:
    with trio.fail_after(60):
        async with aclosing(rt.events(sid)) as events:
            async for event in events:
                if event.record is not None and type(event.record).__name__ == kind:
                    return


async def _run(log: Path, a: fa.FakeAnthropic, o: fo.FakeOpenAI) -> None:
    a_client = anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=a.url, max_retries=0)
    o_client = openai.AsyncOpenAI(api_key="sk-test", base_url=o.url, max_retries=0)
    primary = AnthropicProvider(
        model="claude-test",
        max_tokens=2048,
        client=a_client,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    secondary = OpenAIProvider(model="gpt-test", client=o_client)
    provider = FallbackProvider([primary, secondary], after=1, sticky=False)
    tools = [add, crawl, pay, deploy]
    async with (
        a_client,
        o_client,
        perdure.open_runtime(
            log, provider=provider, tools=tools, retry_base=0.01, shutdown_grace=1.0
        ) as rt,
    ):

        async def finished(sid: str, text: str, **kw: Any) -> None:
            await rt.create_session(sid, system="You are the golden log.")
            await rt.submit(sid, text, request_id=f"{sid}-1", **kw)
            with trio.fail_after(60):
                await rt.wait_idle(sid)

        await finished("reasoning", "What is 2 + 3?")
        await finished("fallback", "Anyone there?")
        await finished("tool-retry", "Crawl three pages.")

        await rt.create_session("needs-human")
        await rt.submit("needs-human", "Pay five cents.", request_id="needs-human-1")
        await _until(rt, "needs-human", "ToolAwaitingHuman")
        await rt.resolve("needs-human", "toolu_g3", action="retry", request_id="h1")
        with trio.fail_after(60):
            await rt.wait_idle("needs-human")

        await finished("budget", "Add, then more.", budget=Budget(run_tokens=30))

        for sid, text, kind in (
            ("awaiting-human", "Pay nine dollars.", "ToolAwaitingHuman"),
            ("approval", "Deploy to prod.", "ToolAwaitingApproval"),
            ("model-back-off", "Anyone at all?", "RetryPending"),
        ):
            await rt.create_session(sid)
            await rt.submit(sid, text, request_id=f"{sid}-1")
            await _until(rt, sid, kind)
        # Both providers failed; wait for the second, long back-off to be recorded.
        with trio.fail_after(60):
            while True:
                stored = await rt._journal.read_session("model-back-off")
                if sum(type(c.record).__name__ == "RetryPending" for c in stored) >= 2:
                    break
                await trio.sleep(0.01)


def write_features_log(log: Path) -> None:
    """Write the log (module docstring) into the new directory ``log``."""
    with fa.FakeAnthropic() as a, fo.FakeOpenAI() as o:
        _script(a, o)
        trio.run(_run, log, a, o)


def describe(records: list[Committed]) -> dict[str, Any]:
    """What the log says, folded as today's build folds it; compared across builds."""
    by_session: dict[str, list[Committed]] = {}
    for c in records:
        by_session.setdefault(c.record.session_id, []).append(c)
    out: dict[str, Any] = {"types": dict(sorted(Counter(_name(c) for c in records).items()))}
    for sid, mine in sorted(by_session.items()):
        if not sid:
            continue
        state = SessionState.fold(sid, mine)
        out[sid] = {
            "runs": [run.finished.status if run.finished else None for run in state.runs.values()],
            "tasks": {
                cid: [task.phase, task.attempt, getattr(task.result, "kind", None)]
                for cid, task in sorted(state.tasks.items())
            },
            "thinking": [
                [type(block).__name__ for block in c.record.thinking]
                for c in mine
                if isinstance(c.record, GenerationCompleted)
            ],
            "providers": [
                c.record.provider for c in mine if isinstance(c.record, GenerationCompleted)
            ],
        }
        if state.compactions or state.compacting is not None:  # only logs that compacted
            out[sid]["context"] = {
                "summaries": [[c.start, c.end, c.summary] for c in state.compactions],
                "compacting": None
                if state.compacting is None
                else [
                    state.compacting.started.start,
                    state.compacting.started.end,
                    state.compacting.attempt,
                ],
            }
    return out


def _name(c: Committed) -> str:
    return type(c.record).__name__
