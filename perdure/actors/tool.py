"""The tool actor: one execution (or reconciliation) of one tool call.

The session committed the call's ``executing`` record before starting this actor;
the actor runs the tool under its timeout and a cancel scope the session owns,
and reports what happened. The session commits the result. With several nodes,
it first confirms that this node still holds the session's lease (a node that was
paused past its lease must not start a tool the new owner is recovering).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import attrs
import trio

from perdure import _faults
from perdure.actors.context import ActorContext
from perdure.actors.protocol import ReconcileFinished, ToolFinished, ToolOutcome
from perdure.storage.backend import SessionFenced
from perdure.storage.bus import Event
from perdure.storage.records import ToolExecuting
from perdure.tools.contract import OutcomeUnknown, Tool, ToolContext, ToolResult, render_result

log = logging.getLogger("perdure.tool")


def make_context(ctx: ActorContext, executing: ToolExecuting) -> ToolContext:
    """What the tool knows about the attempt its ``executing`` record describes."""
    bus = ctx.journal.bus
    session_id = executing.session_id

    def emit(kind: str, data: dict[str, Any]) -> None:
        bus.publish(Event(session_id, kind, data=data))

    return ToolContext(
        idempotency_key=executing.idempotency_key,
        call_id=executing.call_id,
        session_id=session_id,
        attempt=executing.attempt,
        workspace=ctx.workspace,
        emit=emit,
    )


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def run_tool(
    ctx: ActorContext,
    tool: Tool,
    executing: ToolExecuting,
    outbox: trio.MemorySendChannel[Any],
    scope: trio.CancelScope,
) -> None:
    if _faults.ACTIVE:
        _faults.hit("tool.before", tool.name)
    if not await ctx.journal.confirm(executing.session_id):
        # Another node took the session over while this one was paused or cut off:
        # the new owner recovers the call from its executing record. Never run it here.
        raise SessionFenced(executing.session_id, "its lease was lost before the tool started")
    tctx = make_context(ctx, executing)
    started = time.monotonic()
    finished = _attempt(executing, "cancelled", "cancelled")
    with scope:
        with trio.move_on_after(tool.timeout if tool.timeout is not None else math.inf) as limit:
            try:
                value = await tool.invoke(tctx, dict(executing.args))
            except OutcomeUnknown as exc:
                finished = _attempt(executing, "unknown", exc.reason)
            except Exception as exc:
                finished = _attempt(executing, "error", f"The tool raised {_describe(exc)}")
            else:
                flagged = value if isinstance(value, ToolResult) else ToolResult(value)
                finished = _attempt(
                    executing,
                    "ok",
                    render_result(flagged.content),
                    is_error=flagged.is_error,
                    terminate=flagged.terminate or tool.terminates,
                )
        if limit.cancelled_caught:
            finished = _attempt(executing, "timeout", f"timed out after {tool.timeout:g}s")
    if scope.cancelled_caught:
        finished = _attempt(executing, "cancelled", "cancelled")
    if _faults.ACTIVE:
        _faults.hit("tool.after", tool.name)
    await outbox.send(attrs.evolve(finished, duration=time.monotonic() - started))


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
    outbox: trio.MemorySendChannel[Any],
    scope: trio.CancelScope,
) -> None:
    # Whatever happens, the session hears back: a call left without an answer would keep
    # its run (and the session's eviction, and a drain) waiting forever.
    call_id = executing.call_id
    finished = ReconcileFinished(
        call_id=call_id, status="unknown", reason="the reconcile was cancelled"
    )
    tctx = make_context(ctx, executing)
    with scope:
        limit = tool.timeout if tool.timeout is not None else math.inf
        with trio.move_on_after(limit) as timer:
            try:
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
    await outbox.send(finished)


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
