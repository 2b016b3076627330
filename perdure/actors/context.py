"""What every actor of one runtime shares: the Journal, the bus, the provider, the tools."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import trio
from attrs import define, field

from perdure.actors.protocol import Env, Overlap, Result
from perdure.observability.hooks import CommitObserver
from perdure.providers.base import Provider
from perdure.settings import Settings
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
    # The runtime's settings, checked once by ``open_runtime``; read here, never copied.
    settings: Settings = field(factory=Settings)
    compaction_provider: Provider | None = None  # makes the summaries (None: ``provider``)
    # Runs a sub-agent for a tool call (``ctx.run_agent``): given by the supervisor,
    # which owns the sessions (``supervisor.agents``). Called with (the call's
    # executing record, its n-th sub-agent, task, system, tools, whether the call was
    # told to stop, the link that records the child in the parent).
    agents: AgentRunner | None = None
    # Telemetry (perdure.observability): shown every commit; they never decide anything.
    observers: tuple[CommitObserver, ...] = ()
    # The worker threads that plain ``def`` tools run in, at most this many at once for
    # the whole runtime (a thread left running by a timed-out call keeps its place).
    tool_threads: trio.CapacityLimiter = field(factory=lambda: trio.CapacityLimiter(40))
    # Workspace calls run one at a time, each between its two snapshots, so that a
    # checkpoint's diff is that call's alone (a rewind to before it, a reconcile).
    workspace_calls: trio.Lock = field(factory=trio.Lock)
    # Which effects start while the commit that asks for them is in flight, and whether
    # such a commit waits for them to run first (``Journal.append``'s ``overlap``: the
    # loop commits it once they wait, so that its fsync overlaps the model's time).
    overlap: Overlap = field(factory=Overlap)
    overlap_commit_after: bool = True
    # The names of the tools with secret parameters, whose live argument text a model
    # call does not publish: made once here, not at every call (an MCP server brings
    # dozens of tools, and a walk over them cost ~26 us per model call for 50).
    secret_tools: frozenset[str] = field(init=False)

    def __attrs_post_init__(self) -> None:
        self.secret_tools = frozenset(n for n, t in self.tools.items() if t.secret_params)

    def env(self, tools: Mapping[str, Tool]) -> Env:
        """What a decision may know of the world now, with the tools it may use."""
        return Env(tools=tools, now=self.clock(), limits=self.settings.limits)


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
