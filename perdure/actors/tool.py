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

import trio

from perdure import _faults
from perdure.actors.context import ActorContext
from perdure.actors.decide import ReconcileFinished, Result, ToolFinished
from perdure.storage.backend import SessionFenced
from perdure.storage.bus import Event
from perdure.tools.contract import OutcomeUnknown, Tool, ToolContext, ToolResult, render_result

log = logging.getLogger("perdure.tool")


def make_context(
    ctx: ActorContext, session_id: str, call_id: str, key: str, attempt: int
) -> ToolContext:
    bus = ctx.journal.bus

    def emit(kind: str, data: dict[str, Any]) -> None:
        bus.publish(Event(session_id, kind, data=data))

    return ToolContext(
        idempotency_key=key,
        call_id=call_id,
        session_id=session_id,
        attempt=attempt,
        workspace=ctx.workspace,
        emit=emit,
    )


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def run_tool(
    ctx: ActorContext,
    tool: Tool,
    tctx: ToolContext,
    args: dict[str, Any],
    outbox: trio.MemorySendChannel[Any],
    scope: trio.CancelScope,
) -> None:
    if _faults.ACTIVE:
        _faults.hit("tool.before", tool.name)
    if not await ctx.journal.confirm(tctx.session_id):
        # Another node took the session over while this one was paused or cut off:
        # the new owner recovers the call from its executing record. Never run it here.
        raise SessionFenced(tctx.session_id, "its lease was lost before the tool started")
    started = time.monotonic()
    report: dict[str, Any]
    with scope:
        with trio.move_on_after(tool.timeout if tool.timeout is not None else math.inf) as limit:
            try:
                value = await tool.invoke(tctx, args)
            except OutcomeUnknown as exc:
                report = {"outcome": "unknown", "output": exc.reason}
            except Exception as exc:
                report = {"outcome": "error", "output": f"The tool raised {_describe(exc)}"}
            else:
                if isinstance(value, ToolResult):
                    report = {
                        "outcome": "ok",
                        "output": render_result(value.content),
                        "is_error": value.is_error,
                        "terminate": value.terminate or tool.terminates,
                    }
                else:
                    report = {
                        "outcome": "ok",
                        "output": render_result(value),
                        "terminate": tool.terminates,
                    }
        if limit.cancelled_caught:
            report = {"outcome": "timeout", "output": f"timed out after {tool.timeout:g}s"}
    if scope.cancelled_caught:
        report = {"outcome": "cancelled", "output": "cancelled"}
    if _faults.ACTIVE:
        _faults.hit("tool.after", tool.name)
    duration = time.monotonic() - started
    result: Result = ToolFinished(
        call_id=tctx.call_id, attempt=tctx.attempt, duration=duration, **report
    )
    await outbox.send(result)


async def run_reconcile(
    tool: Tool,
    tctx: ToolContext,
    args: dict[str, Any],
    outbox: trio.MemorySendChannel[Any],
    scope: trio.CancelScope,
) -> None:
    # Whatever happens, the session hears back: a call left without an answer would keep
    # its run (and the session's eviction, and a drain) waiting forever.
    finished = ReconcileFinished(
        call_id=tctx.call_id, status="unknown", reason="the reconcile was cancelled"
    )
    with scope:
        limit = tool.timeout if tool.timeout is not None else math.inf
        with trio.move_on_after(limit) as timer:
            try:
                found = await tool.run_reconcile(tctx, args)
            except Exception as exc:
                finished = ReconcileFinished(
                    call_id=tctx.call_id,
                    status="unknown",
                    reason=f"reconcile raised {_describe(exc)}",
                )
            else:
                value = found.result
                flagged = value if isinstance(value, ToolResult) else ToolResult(value)
                finished = ReconcileFinished(
                    call_id=tctx.call_id,
                    status=found.status,
                    output=render_result(flagged.content),
                    reason=found.reason,
                    is_error=flagged.is_error,
                    terminate=found.status == "applied" and (flagged.terminate or tool.terminates),
                )
        if timer.cancelled_caught:
            finished = ReconcileFinished(
                call_id=tctx.call_id, status="unknown", reason="reconcile timed out"
            )
    await outbox.send(finished)


FORGET_TIMEOUT = 60.0


async def run_forget(tool: Tool, tctx: ToolContext) -> None:
    """Let a settled call's tool drop its reconcile state; a failure only leaves it."""
    assert tool.forget is not None
    with trio.move_on_after(FORGET_TIMEOUT) as limit:
        try:
            await tool.forget(tctx)
        except Exception as exc:
            log.warning("forget of %s (%s) raised %s", tool.name, tctx.call_id, _describe(exc))
    if limit.cancelled_caught:
        log.warning("forget of %s (%s) timed out", tool.name, tctx.call_id)
