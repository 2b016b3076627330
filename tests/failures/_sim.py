"""The pure-core driver of ``tests.core.sim``, taught the shell's back-off timers.

``Session`` here also keeps the calls whose back-off the shell is waiting out
(``View.waiting``, from ``BackOff`` / ``StopBackOff`` effects) and lets a test move
the clock and report the end of a back-off, as the session actor's timer would.
"""

from __future__ import annotations

from typing import Any

import perdure
from perdure import ReplayPolicy, RetryPolicy
from perdure.actors import decide, protocol
from perdure.actors.protocol import View
from tests.core import sim

FETCH_POLICY = RetryPolicy(max_attempts=3, initial=2.0, multiplier=2.0, max_interval=60.0)


@perdure.tool(replay=ReplayPolicy.SAFE, retry=FETCH_POLICY)
async def fetch(url: str) -> str:
    """Fetch a page (read-only; transient failures retried)."""
    return url


@perdure.tool(replay=ReplayPolicy.KEYED, retry=RetryPolicy(max_attempts=4, initial=1.0))
async def charge(ctx: perdure.ToolContext, cents: int) -> str:
    """Charge a card once per idempotency key."""
    return str(cents)


@perdure.tool(
    replay=ReplayPolicy.KEYED,
    retry=RetryPolicy(max_attempts=3, initial=1.0, retry_timeouts=False),
)
async def upload(ctx: perdure.ToolContext, name: str) -> str:
    """Upload a file; a timeout is not retried."""
    return name


@perdure.tool(replay=ReplayPolicy.KEYED)
async def plain_keyed(ctx: perdure.ToolContext, item: str) -> str:
    """KEYED without a retry policy."""
    return item


TOOLS: dict[str, Any] = {
    **sim.TOOLS,
    **{t.name: t for t in (fetch, charge, upload, plain_keyed)},
}


class Session(sim.Session):
    def __init__(self, tools: dict[str, Any] | None = None, **env: Any) -> None:
        super().__init__(TOOLS if tools is None else tools, **env)

    def _commit(self, first: protocol.Step, *, recovering: bool = False) -> protocol.Step:
        step = decide.settle(self.state, self.env(), self.view, first, recovering=recovering)
        self.log += step.records
        models, tools = set(self.view.models), set(self.view.tools)
        waiting = set(self.view.waiting)
        for effect in step.effects:  # what the shell would start or stop
            if isinstance(effect, protocol.CallModel):
                models.add(effect.generation_id)
            elif isinstance(effect, protocol.RunTool | protocol.Reconcile):
                tools.add(effect.call_id)
            elif isinstance(effect, protocol.BackOff):
                waiting.add(effect.call_id)
            elif isinstance(effect, protocol.StopBackOff):
                waiting.discard(effect.call_id)
        self.view = View(
            models=frozenset(models), tools=frozenset(tools), waiting=frozenset(waiting)
        )
        return step

    def result(self, result: protocol.Result) -> protocol.Step:
        models, tools = set(self.view.models), set(self.view.tools)
        waiting = set(self.view.waiting)
        if isinstance(result, protocol.ModelReplied | protocol.ModelFailed):
            models.discard(result.generation_id)
        elif isinstance(result, protocol.BackOffOver):
            waiting.discard(result.call_id)
        elif not isinstance(result, protocol.HeartbeatReported):
            tools.discard(result.call_id)
        self.view = View(
            models=frozenset(models), tools=frozenset(tools), waiting=frozenset(waiting)
        )
        return self._commit(decide.on_result(self.state, self.env(), result))

    def fail_tool(self, call_id: str, error: str = "503 from upstream", **kw: Any) -> protocol.Step:
        """The current attempt of ``call_id`` raised a transient error."""
        kw.setdefault("outcome", "retryable")
        return self.finish_tool(call_id, output=f"The tool raised RetryableError: {error}", **kw)

    def back_off_over(self, call_id: str, *, at: float | None = None) -> protocol.Step:
        """The shell's timer fired (at the recorded not_before unless told otherwise)."""
        task = self.state.tasks[call_id]
        assert task.not_before is not None
        self.now = task.not_before if at is None else at
        return self.result(protocol.BackOffOver(call_id=call_id, attempt=task.attempt))

    def beat(self, call_id: str, details: Any) -> protocol.Step:
        task = self.state.tasks[call_id]
        return self.result(
            protocol.HeartbeatReported(call_id=call_id, attempt=task.attempt, details=details)
        )


def back_offs(step: protocol.Step) -> list[protocol.BackOff]:
    return [e for e in step.effects if isinstance(e, protocol.BackOff)]


def run_tools(step: protocol.Step) -> list[protocol.RunTool]:
    return [e for e in step.effects if isinstance(e, protocol.RunTool)]
