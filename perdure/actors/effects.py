"""Performing a session's effects: each becomes a child task or a timer the session owns.

The core names what to do (``protocol.Effect``); the session actor commits the step's
records and then hands each effect to its ``Performer``, which starts it in the
session's nursery under a cancel scope registered in the session's ``InFlight``:

* ``CallModel`` / ``Summarize``: a generation actor (``generation.call_model``) for the
  model call or the compaction's summary. One whose ``not_before`` is still to come
  is held on a timer instead, which posts ``CallDue`` on the session's mailbox when
  the back-off is over; the session then starts it (``start_model_call``), unless a
  cancel or a revision stopped the timer meanwhile.
* ``BackOff``: a timer that posts ``BackOffOver`` when a tool call's back-off is over.
  With the timer above, the one way a session waits out a retry's back-off, whatever
  failed: the children never sleep for it.
* ``RunTool``, ``Reconcile``, ``RestoreWorkspace``: a tool actor (``perdure.actors.tool``);
  ``Forget``: a task nobody waits for.
* ``CancelTool``, ``CancelModel``, ``StopBackOff``: cancel what is registered for it.

Every child reports on the session's mailbox; a timer's scope is the one the session
cancels, so a cancelled wait posts nothing. The tasks inherit the ids of the run,
call, generation or compaction they serve, for their log lines.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import trio

from perdure import _faults
from perdure.actors import protocol
from perdure.actors.context import ActorContext
from perdure.actors.generation import call_model
from perdure.actors.inflight import InFlight, model_key
from perdure.actors.mailbox import CallDue, Inbox
from perdure.actors.tool import run_forget, run_reconcile, run_restore, run_tool
from perdure.observability import logs
from perdure.providers.base import ModelRequest

ModelCall = protocol.CallModel | protocol.Summarize


class Performer:
    """Starts one session's effects (see the module's docstring)."""

    def __init__(
        self,
        session_id: str,
        ctx: ActorContext,
        calls: InFlight,
        outbox: trio.MemorySendChannel[Inbox],
        request: Callable[[ModelCall], ModelRequest],
    ) -> None:
        self._session_id = session_id
        self._ctx = ctx
        self._calls = calls
        self._outbox = outbox
        self._request = request  # the model request of a call, built when it starts
        self.nursery: trio.Nursery | None = None  # the session's, once its actor runs

    def perform(
        self, effect: protocol.Effect, run_id: str | None, durable: trio.Event | None = None
    ) -> None:
        """Start what a step asks for; each effect carries what it needs. ``durable``:
        the step's commit is still in flight, and is durable once this event is set."""
        with logs.bound(**_ids(effect, run_id)):
            self._start(effect, durable)

    def start_model_call(
        self, effect: ModelCall, run_id: str | None, durable: trio.Event | None
    ) -> None:
        """Start the generation actor of a model call (or a summary's) that is due now."""
        with logs.bound(**_ids(effect, run_id)):
            self._start_model_call(effect, durable)

    def _start(self, effect: protocol.Effect, durable: trio.Event | None) -> None:
        nursery = self.nursery
        assert nursery is not None
        ctx, outbox, calls = self._ctx, self._outbox, self._calls
        if isinstance(effect, protocol.CallModel | protocol.Summarize):
            not_before = effect.not_before
            if not_before is not None and not_before > ctx.clock():
                # Held on a timer: the call's entry is the timer until it is due, so a
                # cancel or a revision meanwhile stops the wait, not a call.
                timer = calls.model_timer(model_key(effect))
                self._wait_until(not_before, timer, CallDue(effect, timer, durable))
            else:
                self._start_model_call(effect, durable)
        elif isinstance(effect, protocol.RunTool):
            scope = calls.tool_call(effect.call_id)
            nursery.start_soon(
                run_tool,
                ctx,
                effect.tool,
                effect.executing,
                outbox,
                scope,
                effect.last_heartbeat,
                effect.workspace_since,
            )
        elif isinstance(effect, protocol.BackOff):
            wait = calls.tool_timer(effect.call_id)
            over = protocol.BackOffOver(call_id=effect.call_id, attempt=effect.attempt)
            self._wait_until(effect.not_before, wait, over)
        elif isinstance(effect, protocol.StopBackOff):
            calls.stop_back_off(effect.call_id)
        elif isinstance(effect, protocol.Reconcile):
            scope = calls.tool_call(effect.call_id)
            nursery.start_soon(run_reconcile, ctx, effect.tool, effect.executing, outbox, scope)
        elif isinstance(effect, protocol.Forget):
            nursery.start_soon(run_forget, ctx, effect.tool, effect.executing)
        elif isinstance(effect, protocol.RestoreWorkspace):
            calls.tool_call(effect.call_id)
            nursery.start_soon(run_restore, ctx, self._session_id, effect, outbox)
        elif isinstance(effect, protocol.CancelTool):
            calls.cancel_tool(effect.call_id)
        elif isinstance(effect, protocol.CancelModel):
            calls.cancel_model(effect.generation_id)

    def _start_model_call(self, effect: ModelCall, durable: trio.Event | None) -> None:
        nursery = self.nursery
        assert nursery is not None
        ctx, outbox = self._ctx, self._outbox
        if isinstance(effect, protocol.Summarize) and _faults.ACTIVE:
            _faults.hit("summary.before")
        request = self._request(effect)
        scope = self._calls.model_call(model_key(effect))
        if isinstance(effect, protocol.CallModel):
            nursery.start_soon(partial(call_model, durable=durable), ctx, request, outbox, scope)
        else:
            summarize = partial(call_model, provider=ctx.compaction_provider, publish=False)
            nursery.start_soon(summarize, ctx, request, outbox, scope)

    # -- the timer: every retry's back-off is waited out here ----------------------------

    def _wait_until(self, not_before: float, timer: trio.CancelScope, due: Inbox) -> None:
        """Post ``due`` to the session's mailbox at the wall-clock time ``not_before``,
        unless ``timer`` is cancelled first.

        Cancelling the timer (``StopBackOff``, ``CancelModel``, a failed commit's
        ``InFlight.call_off``, a hand-over's ``InFlight.stop_timers``) ends the wait with
        nothing posted; a ``due`` message posted just before is dropped by the session,
        which finds the timer no longer registered.
        """
        assert self.nursery is not None
        self.nursery.start_soon(self._wake_at, not_before, timer, due)

    async def _wake_at(self, not_before: float, timer: trio.CancelScope, due: Inbox) -> None:
        with timer:
            await trio.sleep(max(0.0, not_before - self._ctx.clock()))
            await self._outbox.send(due)


def _ids(effect: protocol.Effect, run_id: str | None) -> dict[str, str]:
    """The ids the log lines of an effect's task carry."""
    ids: dict[str, str] = {}
    if run_id is not None:
        ids["run_id"] = run_id
    executing = getattr(effect, "executing", None)
    if executing is not None:
        ids.update(run_id=executing.run_id, call_id=executing.call_id)
    if isinstance(effect, protocol.CallModel):
        ids["generation_id"] = effect.generation_id
    elif isinstance(effect, protocol.Summarize):
        ids["compaction_id"] = effect.compaction_id
    return ids
