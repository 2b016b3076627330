"""perdure's side of the workload: the fake provider and the real ``@tool``.

The provider answers instantly and deterministically (``workload.wants_tool``) and
notes the time of every model call per session; those timestamps are the whole
per-turn measurement, so the measurement costs one ``perf_counter`` per turn.
"""

from __future__ import annotations

import time
from typing import Any

import trio

import perdure
from bench import workload
from perdure.providers.base import Emit, ModelReply, ModelRequest
from perdure.storage.records import ToolCall, Usage

_USAGE = Usage(input_tokens=10, output_tokens=5)


class BenchProvider:
    """Returns the workload's tool call until turn K, then the final answer."""

    name = "bench"

    def __init__(self, k: int, *, record: bool = True) -> None:
        self.k = k
        self.k_by_session: dict[str, int] = {}  # sessions that run another K (warm-up)
        self.record = record
        self.starts: dict[str, list[float]] = {}

    async def complete(self, request: ModelRequest, emit: Emit) -> ModelReply:
        if self.record:
            self.starts.setdefault(request.session_id, []).append(time.perf_counter())
        turns = sum(1 for m in request.messages if m.role == "assistant")
        if workload.wants_tool(turns, self.k_by_session.get(request.session_id, self.k)):
            call = ToolCall(
                call_id=workload.call_id(turns + 1),
                name=workload.TOOL_NAME,
                input=dict(workload.TOOL_ARGS),
            )
            return ModelReply(
                text=workload.REPLY_TEXT, tool_calls=(call,), stop_reason="tool_use", usage=_USAGE
            )
        return ModelReply(text=workload.FINAL_TEXT, usage=_USAGE)


class ToolControl:
    """Switches for the recovery benchmark (the tool is a plain module-level function)."""

    block_at_turn: int | None = None  # block forever in the call of this turn
    started: int = 0  # calls that have started (any turn)
    blocked: int = 0  # calls now blocked
    reruns: dict[str, float] = {}  # session id -> perf_counter of its first re-run
    all_blocked: trio.Event | None = None
    expected_blocked: int = 0
    all_rerun: trio.Event | None = None  # set once ``expected_reruns`` sessions re-ran
    expected_reruns: int = 0


@perdure.tool(replay=perdure.ReplayPolicy.SAFE)
async def lookup(ctx: perdure.ToolContext, query: str) -> str:
    """Look an order up (read-only: safe to re-run after a crash)."""
    control = ToolControl
    if ctx.attempt > 1 and ctx.session_id not in control.reruns:
        control.reruns[ctx.session_id] = time.perf_counter()
        if control.all_rerun is not None and len(control.reruns) >= control.expected_reruns:
            control.all_rerun.set()
    if control.block_at_turn is not None and ctx.call_id == workload.call_id(control.block_at_turn):
        control.blocked += 1
        if control.all_blocked is not None and control.blocked >= control.expected_blocked:
            control.all_blocked.set()
        await trio.sleep_forever()
    return workload.TOOL_OUTPUT


def runtime_options(k: int) -> dict[str, Any]:
    """Options every perdure benchmark opens its runtime with (defaults otherwise)."""
    return {"max_turns": k + 1, "durability": "full"}
