"""What every actor of one runtime shares: the Journal, the bus, the provider, the tools."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import trio
from attrs import define, field

from perdure.actors.protocol import Env, Result
from perdure.budget import DEFAULT_PRICES, Budget, Price
from perdure.observability.hooks import CommitObserver
from perdure.providers.base import Provider
from perdure.storage.journal import Journal
from perdure.storage.records import ToolExecuting
from perdure.tools.contract import Tool

AgentRunner = Callable[
    [
        ToolExecuting,
        int,
        str,
        str | None,
        list[str] | None,
        Callable[[], bool],
        Callable[[str], Awaitable[None]],  # link: tell the session a child started
    ],
    Awaitable[str],
]


@define(kw_only=True)
class ActorContext:
    journal: Journal
    provider: Provider
    tools: Mapping[str, Tool]
    workspace: Path | None = None
    clock: Callable[[], float]  # wall-clock seconds; injectable for deterministic tests
    rng: random.Random = field(factory=random.Random)
    resume_budget: int = 3
    max_turns: int = 100
    max_model_attempts: int = 8
    retry_base: float = 1.0
    retry_cap: float = 60.0
    # A running call's heartbeats are committed at most once per this many seconds.
    heartbeat_interval: float = 1.0
    max_restarts: int = 3  # actor crashes within restart_window before a session is parked
    restart_window: float = 60.0
    # Seconds an idle session stays in memory before it is evicted (its state lives
    # in the log; the next message starts it again, from the log). None: never.
    idle_timeout: float | None = 300.0
    # Seconds an idle session's actor runs before it hibernates: its task, mailbox and
    # scopes go, its folded state stays in memory, and the next message starts a new
    # actor on that state without reading the log. None (or not below idle_timeout):
    # the actor stays until it is evicted. Only on a single-owner log (LMDB).
    hibernate_after: float | None = 1.0
    # Let tools drop a settled call's reconcile state. Only when every commit is
    # synced ("full" durability): a terminal record that a power loss could still undo
    # must not outlive the evidence its reconcile would need.
    forget_settled: bool = True
    # With a multi-node log: move sessions between nodes so each runs its fair share
    # (perdure.actors.balance); off, a node only gets orphans and what it starts.
    rebalance: bool = True
    budget: Budget | None = None  # the default budget of every session (perdure.budget)
    prices: Mapping[str, Price] = field(factory=lambda: DEFAULT_PRICES)
    # Runs a sub-agent for a tool call (``ctx.run_agent``): set by the runtime, which
    # owns the sessions. Called with (the call's executing record, its n-th sub-agent,
    # task, system, tools, whether the call was told to stop).
    agents: AgentRunner | None = None
    # Telemetry (perdure.observability): shown every commit; they never decide anything.
    observers: tuple[CommitObserver, ...] = ()
    # The worker threads that plain ``def`` tools run in, at most this many at once for
    # the whole runtime (a thread left running by a timed-out call keeps its place).
    tool_threads: trio.CapacityLimiter = field(factory=lambda: trio.CapacityLimiter(40))
    # Workspace calls run one at a time, each between its two snapshots, so that a
    # checkpoint's diff is that call's alone (a rewind to before it, a reconcile).
    workspace_calls: trio.Lock = field(factory=trio.Lock)

    def env(self, tools: Mapping[str, Tool]) -> Env:
        """What a decision may know of the world now, with the tools it may use."""
        return Env(
            tools=tools,
            now=self.clock(),
            resume_budget=self.resume_budget,
            max_model_attempts=self.max_model_attempts,
            max_turns=self.max_turns,
            retry_base=self.retry_base,
            retry_cap=self.retry_cap,
            forget_settled=self.forget_settled,
            budget=self.budget,
            prices=self.prices,
        )


async def report_last(outbox: trio.MemorySendChannel[Result], message: Result) -> None:
    """Send a child actor's last message to its session, and return.

    The same cancel point as ``outbox.send`` (a cancelled child reports nothing: after
    a restart a stale result must not reach the session's mailbox, which outlives
    the actor), without the schedule point it adds after a send that did not block:
    the task ends here, so that yield would only cost the loop one more step.
    """
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        outbox.send_nowait(message)
    except trio.WouldBlock:
        await outbox.send(message)
