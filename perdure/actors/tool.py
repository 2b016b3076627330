"""The tool actor: one execution (or reconciliation) of one tool call.

The session committed the call's ``executing`` record before starting this actor;
the actor runs the tool under its timeout and a cancel scope the session owns,
and reports what happened. The session commits the result. With several nodes,
it first confirms that this node still holds the session's lease (a node that was
paused past its lease must not start a tool the new owner is recovering).

How the attempt ended is reported as data: the exception a tool raised is turned
into an outcome here (``RetryableError`` or an exception its ``RetryPolicy`` lists:
retryable; ``NeedsHuman`` or one of ``needs_human_on``: needs a person), and the
session's core decides what follows. ``ctx.heartbeat`` never writes anything: the
latest details are relayed to the session's mailbox (the session commits them,
throttled), the last unsent ones just before the result; and with
``heartbeat_timeout`` each heartbeat pushes back a watchdog that cancels a silent tool.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from perdure import _faults, _threads
from perdure.actors.context import ActorContext, report_last
from perdure.actors.protocol import (
    AgentLinked,
    HeartbeatReported,
    ReconcileFinished,
    RestoreFinished,
    RestoreWorkspace,
    Result,
    ToolFinished,
    ToolOutcome,
    WorkspaceSeen,
)
from perdure.storage import SessionFenced
from perdure.storage.bus import Event
from perdure.storage.records import ToolExecuting
from perdure.tools.contract import (
    HostRunner,
    NeedsAsyncio,
    NeedsHuman,
    OutcomeUnknown,
    Reconciled,
    ResultNotSerializable,
    RetryableError,
    Tool,
    ToolContext,
    ToolResult,
    render_result,
)
from perdure.tools.history import HistoryError, Snapshot, WorkspaceHistory, ref_name

log = logging.getLogger("perdure.tool")


def make_context(
    ctx: ActorContext,
    executing: ToolExecuting,
    *,
    last_heartbeat: Any = None,
    beat: Callable[[Any], None] | None = None,
    link: Callable[[str], Awaitable[None]] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> ToolContext:
    """What the tool knows about the attempt its ``executing`` record describes.

    ``stopping`` says whether the session told this attempt to stop (a cancel, a
    revision), as opposed to the runtime shutting down: only the former stops the
    call's sub-agents.
    """
    bus = ctx.journal.bus
    session_id = executing.session_id
    beat_fn = beat if beat is not None else (lambda details: None)
    spawned = 0  # sub-agents started by this attempt, in order: part of each child's id

    async def no_link(child: str) -> None:
        pass

    link_fn = link if link is not None else no_link

    def emit(kind: str, data: dict[str, Any]) -> None:
        bus.publish(Event(session_id, kind, data=data))

    async def agents(task: str, system: str | None, tools: list[str] | None) -> str:
        nonlocal spawned
        if ctx.agents is None:
            raise RuntimeError("this runtime does not run sub-agents")
        spawned += 1
        return await ctx.agents(executing, spawned, task, system, tools, stopping, link_fn)

    return ToolContext(
        idempotency_key=executing.idempotency_key,
        call_id=executing.call_id,
        session_id=session_id,
        attempt=executing.attempt,
        workspace=ctx.workspace,
        last_heartbeat=last_heartbeat,
        emit=emit,
        beat=beat_fn,
        agents=agents,
        threads=ctx.tool_threads,
        host=_host_runner(),
    )


# ``perdure.embed.host_runner``, imported on first use (embed builds on the runtime,
# which builds on this module); kept so that an attempt does not pay an import (~3 us).
_embedded_host: Callable[[], HostRunner | None] | None = None


def _host_runner() -> HostRunner | None:
    """Under perdure.embed, what awaits a coroutine on the application's asyncio loop."""
    global _embedded_host
    if _embedded_host is None:
        from perdure import embed

        _embedded_host = embed.host_runner
    return _embedded_host()


class Heartbeats:
    """One attempt's heartbeats: the latest unsent details, and the hung-tool watchdog.

    ``beat`` is what ``ctx.heartbeat`` calls (from the trio thread, or from a worker
    thread the tool started); ``relay`` forwards the latest details to the session's
    mailbox, skipping the ones superseded meanwhile (latest wins). The relay starts with
    the first heartbeat (most tools send none), in the nursery ``relay_in`` gives (the
    session's: a nursery of the attempt's own cost every call more than the rest of
    its trio machinery), and ``stop_relay`` ends it (the caller waits until it has:
    with no relay started, nothing is waited for). Details
    are only dropped from here once the session's mailbox has them, so ``take`` after
    the relay stopped yields a final heartbeat it had not sent yet.
    """

    def __init__(self, executing: ToolExecuting, timeout: float | None) -> None:
        self.call_id = executing.call_id
        self.attempt = executing.attempt
        self.timeout = timeout
        # Most tools have no heartbeat timeout and send no heartbeat: the trio objects
        # that only those need are made when they are (each costs every call otherwise).
        self.watchdog: trio.CancelScope | None = trio.CancelScope() if timeout is not None else None
        self._latest: HeartbeatReported | None = None
        self._wake: trio.Event | None = None  # made by the first heartbeat
        self._token = trio.lowlevel.current_trio_token()
        # Where the relay is started by the first heartbeat, while the tool runs.
        self.relay_in: tuple[trio.Nursery, trio.MemorySendChannel[Result]] | None = None
        self._relay_scope: trio.CancelScope | None = None  # once a relay was started
        self._relay_done: trio.Event | None = None
        self.arm()

    def arm(self) -> None:
        """Give the tool ``timeout`` more seconds to say it is alive."""
        if self.watchdog is not None and self.timeout is not None:
            self.watchdog.deadline = trio.current_time() + self.timeout

    def beat(self, details: Any) -> None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:  # a worker thread of the tool's
            trio.from_thread.run_sync(self._on_beat, details, trio_token=self._token)
        else:
            self._on_beat(details)

    def _on_beat(self, details: Any) -> None:
        self._latest = HeartbeatReported(
            call_id=self.call_id, attempt=self.attempt, details=details
        )
        if self._wake is None:
            self._wake = trio.Event()
        self._wake.set()
        if self.relay_in is not None:
            (nursery, outbox), self.relay_in = self.relay_in, None
            self._relay_scope = trio.CancelScope()
            self._relay_done = trio.Event()
            nursery.start_soon(self._relay, outbox, self._relay_scope, self._relay_done)
        self.arm()

    async def _relay(
        self, outbox: trio.MemorySendChannel[Result], scope: trio.CancelScope, done: trio.Event
    ) -> None:
        try:
            with scope:
                while True:
                    assert self._wake is not None  # the heartbeat that started the relay
                    await self._wake.wait()
                    self._wake = trio.Event()
                    latest = self._latest
                    if latest is None:
                        continue
                    await outbox.send(latest)
                    if self._latest is latest:
                        self._latest = None
        finally:
            done.set()

    def stop_relay(self) -> trio.Event | None:
        """No relay from now on. A relay already started is told to stop: the event it
        sets once it is over (it may be sending) is returned, to be waited for."""
        self.relay_in = None
        if self._relay_scope is None:
            return None
        self._relay_scope.cancel()
        return self._relay_done

    def take(self) -> HeartbeatReported | None:
        latest, self._latest = self._latest, None
        return latest


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def run_tool(
    ctx: ActorContext,
    tool: Tool,
    executing: ToolExecuting,
    outbox: trio.MemorySendChannel[Result],
    scope: trio.CancelScope,
    last_heartbeat: Any = None,
    workspace_since: str = "",
) -> None:
    if _faults.ACTIVE:
        _faults.hit("tool.before", tool.name)
    if not await ctx.journal.confirm(executing.session_id):
        # Another node took the session over while this one was paused or cut off:
        # the new owner recovers the call from its executing record. Never run it here.
        raise SessionFenced(executing.session_id, "its lease was lost before the tool started")
    beats = Heartbeats(executing, tool.heartbeat_timeout)

    async def link(child: str) -> None:
        """A sub-agent started: the session records the link (``AgentStarted``); like a
        heartbeat, it says the tool is alive."""
        beats.arm()
        await outbox.send(
            AgentLinked(call_id=executing.call_id, attempt=executing.attempt, child=child)
        )

    tctx = make_context(
        ctx,
        executing,
        last_heartbeat=last_heartbeat,
        beat=beats.beat,
        link=link,
        stopping=lambda: scope.cancel_called,
    )
    history = _history(ctx, tool)
    async with ctx.workspace_calls if history is not None else contextlib.nullcontext():
        await _attempt_between_snapshots(
            ctx, tool, executing, outbox, scope, history, tctx, beats, workspace_since
        )


async def _attempt_between_snapshots(
    ctx: ActorContext,
    tool: Tool,
    executing: ToolExecuting,
    outbox: trio.MemorySendChannel[Result],
    scope: trio.CancelScope,
    history: WorkspaceHistory | None,
    tctx: ToolContext,
    beats: Heartbeats,
    workspace_since: str = "",
) -> None:
    """The attempt, with a workspace call's snapshots before and after it."""
    before: Snapshot | None = None
    if history is not None:
        try:
            before = await _threads.run_sync(history.snapshot, _ref(executing, "before"))
        except HistoryError as exc:
            # No checkpoint, no call: the promise of a rewind to before it would be broken.
            said = f"perdure could not checkpoint the workspace, so the call did not run: {exc}"
            log.error("%s", said)
            await report_last(outbox, _attempt(executing, "error", said))
            return
        if _faults.ACTIVE:
            _faults.hit("workspace.before", tool.name)
    started = time.monotonic()
    # Built once the attempt is over (not a placeholder first: an outcome costs ~3 us).
    finished: ToolFinished | None = None
    # This task runs in the session's nursery: the relay, if a heartbeat starts one, too.
    session_nursery = trio.lowlevel.current_task().parent_nursery
    assert session_nursery is not None
    beats.relay_in = (session_nursery, outbox)
    with scope:
        try:
            finished = await _invoke(tool, tctx, executing, beats)
        finally:
            relay_over = beats.stop_relay()
            if relay_over is not None:  # a shielded wait only where a relay runs
                with trio.CancelScope(shield=True):
                    await relay_over.wait()
    if finished is None or scope.cancelled_caught:
        finished = _attempt(executing, "cancelled", "cancelled")
    final_beat = beats.take()
    if final_beat is not None:  # before the result, so that a retry resumes from it
        await outbox.send(final_beat)
    if history is not None and before is not None:
        with trio.CancelScope(shield=True):  # a stopped call's files changed too
            seen = await _after(history, executing, before)
            if workspace_since and workspace_since != before.tree:
                outside = await _outside(history, workspace_since, before)
                seen = attrs.evolve(seen, outside=outside)
        finished = attrs.evolve(finished, workspace=seen)
        if _faults.ACTIVE:
            _faults.hit("workspace.after", tool.name)
    if _faults.ACTIVE:
        _faults.hit("tool.after", tool.name)
    await report_last(
        outbox,
        attrs.evolve(finished, duration=time.monotonic() - started, jitter=ctx.rng.random()),
    )


def _history(ctx: ActorContext, tool: Tool) -> WorkspaceHistory | None:
    """The checkpoint store, for a tool that may change a configured workspace."""
    if not tool.changes_workspace or ctx.workspace is None:
        return None
    return WorkspaceHistory(ctx.workspace)


def _ref(executing: ToolExecuting, when: str) -> str:
    """Where an attempt's snapshot is kept: found again by the call's key and attempt."""
    label = f"{executing.idempotency_key}/{executing.attempt}/{when}"
    return ref_name(executing.session_id, label)


async def _after(
    history: WorkspaceHistory, executing: ToolExecuting, before: Snapshot
) -> WorkspaceSeen:
    """The workspace after an attempt, and what changed since its before-snapshot."""
    try:
        after = await _threads.run_sync(history.snapshot, _ref(executing, "after"))
        changes = await _threads.run_sync(history.changes, before.tree, after.tree)
    except HistoryError as exc:
        log.error("the after-snapshot of call %s failed: %s", executing.call_id, exc)
        return WorkspaceSeen(before=before.tree, after="", skipped=before.skipped)
    return WorkspaceSeen(
        before=before.tree,
        after=after.tree,
        changed=tuple(c.path for c in changes),
        skipped=tuple(sorted(set(before.skipped) | set(after.skipped))),
    )


async def _outside(history: WorkspaceHistory, since: str, before: Snapshot) -> tuple[str, ...]:
    """Files changed between the session's previous checkpoint and this call's
    before-snapshot: none of its own calls ran meanwhile, so other hands did."""
    try:
        changes = await _threads.run_sync(history.changes, since, before.tree)
    except HistoryError as exc:
        log.error("the workspace diff since the last checkpoint failed: %s", exc)
        return ()
    return tuple(c.path for c in changes)


async def _workspace_since(
    history: WorkspaceHistory, executing: ToolExecuting
) -> WorkspaceSeen | None:
    """An interrupted attempt's workspace: its before-snapshot (if it was taken) and now.

    No before-snapshot means the attempt never reached its tool (the snapshot precedes
    it). None when the store itself failed: nothing can be said from it then.
    """
    try:
        before = await _threads.run_sync(history.lookup, _ref(executing, "before"))
        if before is None:
            return WorkspaceSeen(before="", after="")
        return await _after(history, executing, Snapshot(tree=before))
    except HistoryError as exc:
        log.error("the workspace diff of call %s failed: %s", executing.call_id, exc)
        return None


async def _invoke(
    tool: Tool, tctx: ToolContext, executing: ToolExecuting, beats: Heartbeats
) -> ToolFinished:
    """One attempt under the tool's timeout and heartbeat watchdog, as an outcome."""
    # Scopes only where they can fire: most tools have neither a timeout nor a watchdog.
    limit = trio.move_on_after(tool.timeout) if tool.timeout is not None else None
    watchdog = beats.watchdog
    finished: ToolFinished | None = None
    with limit or contextlib.nullcontext(), watchdog or contextlib.nullcontext():
        try:
            value = await tool.invoke(tctx, dict(executing.args))
        except OutcomeUnknown as exc:
            finished = _attempt(executing, "unknown", exc.reason)
        except Exception as exc:
            finished = _failed(tool, executing, exc)
        else:
            flagged = value if isinstance(value, ToolResult) else ToolResult(value)
            try:
                output, is_error = tool.render(flagged.content), flagged.is_error
            except ResultNotSerializable as exc:
                # The tool ran (its effect may be done): the call is not a failure to
                # re-run, it is a result the model cannot read. Say so to both.
                log.error("%s", exc)
                output, is_error = f"perdure: the tool ran, but {exc}", True
            finished = _attempt(
                executing,
                "ok",
                output,
                is_error=is_error,
                terminate=flagged.terminate or tool.terminates,
            )
    if watchdog is not None and watchdog.cancelled_caught:
        silent = f"sent no heartbeat for {tool.heartbeat_timeout:g}s; treated as hung and stopped"
        return _attempt(executing, "timeout", silent)
    if finished is None:  # only the time limit stops a call without an outcome here
        return _attempt(executing, "timeout", f"timed out after {tool.timeout:g}s")
    return finished


def _failed(tool: Tool, executing: ToolExecuting, exc: Exception) -> ToolFinished:
    """What the exception a tool raised says about its call (the core decides the rest)."""
    if isinstance(exc, NeedsAsyncio):
        # The runtime cannot run this tool: say so to whoever runs it, and to the model
        # in words that do not blame the tool.
        log.error("%s", exc)
        return _attempt(executing, "error", f"perdure could not run this tool here: {exc}")
    if isinstance(exc, concurrent.futures.CancelledError):
        # Its task on the application's asyncio loop was cancelled there.
        return _attempt(executing, "cancelled", "cancelled on the asyncio loop")
    if isinstance(exc, NeedsHuman):
        return _attempt(executing, "needs_human", exc.reason)
    if tool.needs_human_on and isinstance(exc, tool.needs_human_on):
        return _attempt(executing, "needs_human", _describe(exc))
    said = f"The tool raised {_describe(exc)}"
    if isinstance(exc, RetryableError):
        return attrs.evolve(_attempt(executing, "retryable", said), retry_after=exc.retry_after)
    if tool.retry is not None and tool.retry.retries(type(exc)):
        return _attempt(executing, "retryable", said)
    return _attempt(executing, "error", said)


def _attempt(
    executing: ToolExecuting,
    outcome: ToolOutcome,
    output: str,
    *,
    is_error: bool = False,
    terminate: bool = False,
) -> ToolFinished:
    return ToolFinished(
        call_id=executing.call_id,
        attempt=executing.attempt,
        outcome=outcome,
        output=output,
        is_error=is_error,
        terminate=terminate,
    )


async def run_reconcile(
    ctx: ActorContext,
    tool: Tool,
    executing: ToolExecuting,
    outbox: trio.MemorySendChannel[Result],
    scope: trio.CancelScope,
) -> None:
    # Whatever happens, the session hears back: a call left without an answer would keep
    # its run (and the session's eviction, and a drain) waiting forever.
    call_id = executing.call_id
    finished = ReconcileFinished(
        call_id=call_id, status="unknown", reason="the reconcile was cancelled"
    )
    tctx = make_context(ctx, executing)
    history = _history(ctx, tool)
    with scope:
        seen = None
        if history is not None:
            async with ctx.workspace_calls:
                seen = await _workspace_since(history, executing)
        limit = tool.timeout if tool.timeout is not None else math.inf
        with trio.move_on_after(limit) as timer:
            try:
                if tool.reconcile is None:  # a workspace tool: the diff is all there is
                    found = Reconciled.unknown("")
                else:
                    found = await tool.run_reconcile(tctx, dict(executing.args))
            except Exception as exc:
                finished = ReconcileFinished(
                    call_id=call_id, status="unknown", reason=f"reconcile raised {_describe(exc)}"
                )
            else:
                value = found.result
                flagged = value if isinstance(value, ToolResult) else ToolResult(value)
                finished = ReconcileFinished(
                    call_id=call_id,
                    status=found.status,
                    output=render_result(flagged.content),
                    reason=found.reason,
                    is_error=flagged.is_error,
                    terminate=found.status == "applied" and (flagged.terminate or tool.terminates),
                )
        if timer.cancelled_caught:
            finished = ReconcileFinished(
                call_id=call_id, status="unknown", reason="reconcile timed out"
            )
        finished = attrs.evolve(finished, workspace=seen)
    await report_last(outbox, finished)


FORGET_TIMEOUT = 60.0


async def run_forget(ctx: ActorContext, tool: Tool, executing: ToolExecuting) -> None:
    """Let a settled call's tool drop its reconcile state; a failure only leaves it."""
    assert tool.forget is not None
    tctx = make_context(ctx, executing)
    with trio.move_on_after(FORGET_TIMEOUT) as limit:
        try:
            await tool.forget(tctx)
        except Exception as exc:
            log.warning("forget of %s (%s) raised %s", tool.name, tctx.call_id, _describe(exc))
    if limit.cancelled_caught:
        log.warning("forget of %s (%s) timed out", tool.name, tctx.call_id)


async def run_restore(
    ctx: ActorContext,
    session_id: str,
    effect: RestoreWorkspace,
    outbox: trio.MemorySendChannel[Result],
) -> None:
    """Put the workspace's files back as ``effect.tree`` (a rewind), and report it.

    The store refuses a tree it cannot prove whole, and then nothing is written; the
    session records that refusal. The state just before is kept under the request's
    ref, so a rewind can itself be undone.
    """
    finished = RestoreFinished(request_id=effect.request_id, tree=effect.tree)
    if ctx.workspace is None:
        finished = attrs.evolve(finished, error="this runtime has no workspace to restore")
    else:
        history = WorkspaceHistory(ctx.workspace)
        keep = ref_name(session_id, f"rewind/{effect.request_id}/before")
        if _faults.ACTIVE:
            _faults.hit("workspace.restore")
        try:
            async with ctx.workspace_calls:
                before = await _threads.run_sync(history.restore, effect.tree, keep)
        except HistoryError as exc:
            finished = attrs.evolve(finished, error=str(exc))
        else:
            finished = attrs.evolve(finished, before=before.tree)
            if _faults.ACTIVE:
                _faults.hit("workspace.restored")
    await report_last(outbox, finished)
